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
    "sendable_bytes",
]


def sendable_bytes(msg: Any, service: str, event: Any = None,
                   identify: Callable[[bytes], Any] | None = None) -> bytes:
    """The bytes of the Event builder ``msg`` to send on ``service``: its union must hold
    ``service`` (else ValueError naming what it carries); anything else than a builder →
    TypeError. All of it comes from ``msg``: msgq's builder answers for itself in one
    call (no pycapnp); a pycapnp builder of ``event`` (the sender's Event struct schema)
    has its service read from its bytes by ``identify`` (one C call instead of pycapnp's
    ``which()``); any other builder answers through its ``which()`` (a builder of another
    struct could read as any service from its bytes). What
    :meth:`msgq.messaging.PubMaster.send` sends."""
    if type(msg) is StructBuilder:
        data = built_bytes(msg, service)
        if data is not None:
            return data
    elif identify is not None:
        try:
            of_event = msg.schema == event  # pycapnp compares the schemas in C
        except (AttributeError, TypeError):  # not a struct builder
            of_event = False
        if of_event:
            data = msg.to_bytes()
            peeked = identify(data)
            if peeked is not None and peeked[2] == service:
                return data
    which = getattr(msg, "which", None)
    if which is None or not hasattr(msg, "to_bytes"):
        raise TypeError(f"send({service!r}, ...) takes an Event builder or bytes, not "
                        f"{type(msg).__name__}")
    carried = which()
    if carried != service:
        raise ValueError(f"the message carries {carried!r} but was sent to {service!r}; "
                         f"use new_message({service!r})")
    return msg.to_bytes()


def new_message(service: str | None = None, size: int | None = None,
                schema: Schema | None = None, **kwargs: Any) -> Any:
    """A new Event builder of the schema in force (or ``schema``): ``logMonoTime`` = now
    (ns; CLOCK_MONOTONIC, or the replayed time under the lockstep harness, see
    :mod:`msgq.clock`), ``valid`` False (as cereal's), ``kwargs`` set as fields; with
    ``service``, that union member is initialised (``size`` elements when it is a list).
    Unknown service → KeyError with close matches.

    Without ``kwargs``, for a struct member or none, it is msgq's builder
    (:class:`msgq.schemas._event_builder.StructBuilder`): pycapnp's builder API, with
    numbers, bools, enums set by name, nested structs, groups, union members, which()
    and to_bytes() written straight into the message's bytes; the first call of any other
    kind turns the message into a pycapnp builder of those bytes, which answers it and
    everything after it (``as_pycapnp()`` gives it). Otherwise it is pycapnp's
    builder."""
    schema = schema_in_force(schema)
    if kwargs:
        kwargs.setdefault("logMonoTime", clock.monotonic_ns())
        kwargs.setdefault("valid", False)
        try:
            msg = schema.event.new_message(**kwargs)
        except Exception:
            unknown = [name for name in kwargs if name not in schema.event.schema.fields]
            if unknown:  # pycapnp's error names no struct; this one does
                # start-up cost: pycapnp's error type, loaded on this error path only
                from msgq.schemas.field_errors import unknown_field_error

                raise unknown_field_error(schema.event.schema, unknown[0]) from None
            raise
    else:
        factory = schema.builder
        if size is None and (service is None or service in factory.members):
            # the common call: msgq's builder (see _event_builder.pyx), no pycapnp in it
            return factory.new(service, clock.monotonic_ns())
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
