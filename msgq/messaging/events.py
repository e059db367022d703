"""Making and parsing Event messages: ``new_message``, ``log_from_bytes`` and the bounded
decoder used on bytes that arrive from other processes.

Traversal limits: pycapnp refuses to walk more than a traversal limit of words per
message, which stops a crafted message whose pointers all point at the same data from
costing unbounded CPU. ``log_from_bytes`` uses ``NO_TRAVERSAL_LIMIT`` (as upstream does:
for trusted bytes such as logs of our own, where large messages are legitimate).
:func:`decode_event`, used by SubMaster and the recv helpers, bounds the walk to a few
times the message's own size (at least capnp's default of 8 Mi words), so a message can be
read completely but not amplified.
"""

from __future__ import annotations

from typing import Any

from msgq.lockstep import clock
from msgq.schemas import Schema, default_schema

__all__ = ["MessageDecodeError", "decode_event", "log_from_bytes", "new_message"]

NO_TRAVERSAL_LIMIT = 2**64 - 1
# Words a message may make the decoder visit, per word of the message.
_TRAVERSAL_FACTOR = 4
_MIN_TRAVERSAL_WORDS = 8 * 1024 * 1024


class MessageDecodeError(ValueError):
    """Bytes that are not a valid Event (what pycapnp reported is in the message)."""


def new_message(service: str | None = None, size: int | None = None,
                schema: Schema | None = None, **kwargs: Any) -> Any:
    """A new Event builder: ``logMonoTime`` = now (ns; CLOCK_MONOTONIC, or the replayed time
    under the lockstep harness, see :mod:`msgq.lockstep.clock`), ``valid`` False,
    ``kwargs`` set as fields; with ``service``, that union member is initialised (``size``
    elements when it is a list). Unknown service → KeyError with close matches."""
    schema = schema or default_schema()
    kwargs.setdefault("logMonoTime", clock.monotonic_ns())
    kwargs.setdefault("valid", False)
    msg = schema.event.new_message(**kwargs)
    if service is not None:
        if service not in schema.union_fields:
            from msgq.schemas.services import unknown_service_error

            raise unknown_service_error(service, schema.union_fields)
        schema.init_payload(msg, service, size)
    return msg


def _from_bytes(struct: Any, data: Any, traversal_limit: int) -> Any:
    with struct.from_bytes(data, traversal_limit_in_words=traversal_limit) as msg:
        return msg


def log_from_bytes(dat: bytes, struct: Any = None) -> Any:
    """The Event (or ``struct``) reader over ``dat``, without a traversal limit (trusted
    bytes). Raises pycapnp's error on malformed bytes."""
    return _from_bytes(struct if struct is not None else default_schema().event, dat,
                       NO_TRAVERSAL_LIMIT)


def decode_event(data: bytes, schema: Schema | None = None) -> Any:
    """The Event reader over ``data`` (bytes from another process), with a traversal limit
    proportional to its size. Malformed bytes → :class:`MessageDecodeError`."""
    event = (schema or default_schema()).event
    limit = max(_MIN_TRAVERSAL_WORDS, _TRAVERSAL_FACTOR * (len(data) // 8))
    try:
        msg = _from_bytes(event, data, limit)
        msg.which()  # touches the root: a bad root pointer fails here, not later
    except Exception as e:  # pycapnp raises KjException, ValueError or TypeError
        raise MessageDecodeError(f"{len(data)} bytes are not a valid Event: {e}") from None
    return msg
