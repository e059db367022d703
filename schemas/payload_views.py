"""Payload views: the fast path for the fields services read (SubMaster's ``sm[s]``).

:meth:`PayloadViews.view` gives, for a received message of a struct service, a
:class:`msgq.schemas._typed_reader.StructView` (a ``StructListView`` for a list of
structs): its fields are read straight from the
message's bytes when asked (a few hundred nanoseconds, no decode), values identical to
pycapnp's; whatever the view does not read itself (``which()``, ``to_dict()``, union
members, lists of structs, ...) it asks of a pycapnp reader made once, on first need.
:meth:`PayloadViews.identify` is :meth:`msgq.schemas.framing.EventLayout.identify` in one
C call for the common message (one segment), the same answer for every message.

Layer: the Event layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from msgq.schemas import _typed_reader as reader
from msgq.schemas.reader_layouts import Layout, view_member_layout

__all__ = ["FALLBACK", "PayloadViews"]

#: What :meth:`PayloadViews.view` returns for a message it leaves to pycapnp.
FALLBACK = reader.FALLBACK


class PayloadViews:
    """The views of one schema's payloads (a :class:`msgq.schemas.Schema`); layouts are
    compiled once per service, on its first message."""

    def __init__(self, schema: Any) -> None:
        self._schema = schema
        self._root = schema.event.schema
        self._members: dict[str, Any] = {}
        self._memo: dict[int, Layout | None] = {}
        layout = schema.layout
        #: Where an Event's logMonoTime, valid and union lie (what
        #: ``_typed_reader.identify`` reads; SubMaster's compiled update calls it with this).
        self.event_fields = reader.EventFields(
            layout.mono_byte, layout.valid_byte, layout.valid_bit, layout.discriminant_byte,
            tuple(layout.services), layout.mono_default, layout.valid_default)
        self._identify_slow = layout.identify

    def identify(self, data: bytes) -> tuple[int, bool, str] | None:
        """``(logMonoTime, valid, service)`` when ``data`` is exactly one well-framed
        Event, else None (:meth:`msgq.schemas.framing.EventLayout.identify`'s answer)."""
        peeked = reader.identify(data, self.event_fields)
        if peeked is FALLBACK:
            return self._identify_slow(data)
        return peeked  # type: ignore[no-any-return]

    def member(self, service: str) -> Any:
        """The compiled layout of ``service``'s payload; None when it has no view (a
        list, text or data payload)."""
        try:
            return self._members[service]
        except KeyError:
            layout = view_member_layout(self._root, service, self._memo)
            compiled = None if layout is None else reader.compile_member(layout)
            self._members[service] = compiled
            return compiled

    def view(self, service: str, data: bytes, decode: Callable[[], Any]) -> Any:
        """A view of ``service``'s payload in ``data`` (one Event of that service), or
        FALLBACK when the typed reader does not follow the message that far (decode it
        with pycapnp then). ``decode()`` gives the payload's pycapnp reader, for what the
        view does not read itself."""
        member = self._members.get(service)
        if member is None:
            member = self.member(service)
            if member is None:
                return FALLBACK
        return reader.view_member(data, member, decode)
