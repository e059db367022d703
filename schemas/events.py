"""Making and parsing Event messages: ``new_message``, ``log_from_bytes`` (trusted bytes,
no traversal limit, as upstream) and ``decode_event`` (bytes from other processes, the
bounded decoder of :meth:`msgq.schemas.Schema.decode`).

Layer: the Event layer (over :mod:`msgq.clock`, whose time stamps new messages).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from msgq import clock
from msgq.errors import MessageDecodeError
from msgq.schemas._event_builder import StructBuilder, built_bytes
from msgq.schemas.schema import NO_TRAVERSAL_LIMIT, Schema, read_struct
from msgq.schemas.selection import schema_in_force
from msgq.schemas.services import unknown_service_error

__all__ = [
    "NO_TRAVERSAL_LIMIT",
    "MessageDecodeError",
    "decode_event",
    "log_from_bytes",
    "new_message",
    "take_built",
]

#: The builder the last new_message call made and its schema (a reference to the builder
#: is kept until the next call or until PubMaster sends it: its identity cannot be reused
#: meanwhile).
_NOTHING_BUILT: tuple[Any, Schema | None] = (None, None)
_last_built = _NOTHING_BUILT


def take_built(msg: Any, schema: Schema, service: str,
               identify: Callable[[bytes], Any] | None = None) -> bytes | None:
    """The bytes of ``msg`` when it is the builder the latest :func:`new_message` call of
    this process made with ``schema`` and it carries ``service`` — which msgq's builder
    answers itself, and for pycapnp's builder ``identify`` reads from its bytes with this
    schema's layout (one C call instead of pycapnp's ``which()``, 2 us of a 100 Hz tick)
    — and then lets go of it (a large message is not kept alive until the next
    new_message); None otherwise: ask pycapnp. PubMaster.send sends what it returns."""
    global _last_built
    last = _last_built  # one tuple: read whole, whichever thread stored it
    if last[0] is not msg or last[1] is not schema:
        return None
    if type(msg) is StructBuilder:
        data = built_bytes(msg, service)
        if data is None:
            return None
    else:
        if identify is None:
            return None
        data = msg.to_bytes()
        peeked = identify(data)
        if peeked is None or peeked[2] != service:
            return None
    _last_built = _NOTHING_BUILT
    return data


def new_message(service: str | None = None, size: int | None = None,
                schema: Schema | None = None, **kwargs: Any) -> Any:
    """A new Event builder of the schema in force (or ``schema``): ``logMonoTime`` = now
    (ns; CLOCK_MONOTONIC, or the replayed time under the lockstep harness, see
    :mod:`msgq.clock`), ``valid`` False (as cereal's), ``kwargs`` set as fields; with
    ``service``, that union member is initialised (``size`` elements when it is a list).
    Unknown service → KeyError with close matches.

    Without ``kwargs``, for a struct member or none, it is msgq's builder
    (:class:`msgq.schemas._typed_reader.StructBuilder`): pycapnp's builder API, with
    numbers, bools, enums set by name, nested structs, groups, union members, which()
    and to_bytes() written straight into the message's bytes; the first call of any other
    kind turns the message into a pycapnp builder of those bytes, which answers it and
    everything after it. Otherwise it is pycapnp's builder."""
    global _last_built
    schema = schema_in_force(schema)
    if kwargs:
        kwargs.setdefault("logMonoTime", clock.monotonic_ns())
        kwargs.setdefault("valid", False)
        try:
            msg = schema.event.new_message(**kwargs)
        except Exception:
            unknown = [name for name in kwargs if name not in schema.event.schema.fields]
            if unknown:  # pycapnp's error names no struct; this one does
                # imports pycapnp's error type: loaded on this error path only
                from msgq.schemas.field_errors import unknown_field_error

                raise unknown_field_error(schema.event.schema, unknown[0]) from None
            raise
    else:
        factory = schema.builder
        if size is None and (service is None or service in factory.members):
            # the common call: msgq's builder (see _event_builder.pxi), no pycapnp in it
            msg = factory.new(service, clock.monotonic_ns())
            _last_built = (msg, schema)
            return msg
        # (a list member, or an error to report below) without pycapnp's keyword loop
        msg = schema.event.new_message()
        msg._set_by_field(schema.mono_field, clock.monotonic_ns())
        msg._set_by_field(schema.valid_field, False)
    if service is not None:
        field = schema.member_fields.get(service)
        if field is None:
            raise unknown_service_error(service, schema.union_fields)
        if service in schema.sized_fields:
            msg._init_by_field(field, size or 0)
        elif size is not None:
            raise ValueError(f"{service!r} is a struct: it takes no size")
        else:
            msg._init_by_field(field)
    _last_built = (msg, schema)
    return msg


def log_from_bytes(dat: bytes, struct: Any = None) -> Any:
    """The Event (or ``struct``) reader over ``dat``, without a traversal limit (trusted
    bytes). Raises pycapnp's error on malformed bytes."""
    return read_struct(struct if struct is not None else schema_in_force().event, dat,
                       NO_TRAVERSAL_LIMIT)


def decode_event(data: bytes, schema: Schema | None = None) -> Any:
    """The Event reader over ``data`` (bytes from another process), with a traversal limit
    proportional to its size. Malformed bytes → :class:`MessageDecodeError`."""
    return schema_in_force(schema).decode(data)
