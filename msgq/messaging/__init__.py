"""The cereal-style messaging API: typed Event messages over msgq sockets.

``new_message``, ``log_from_bytes``, the socket helpers (``pub_sock``, ``sub_sock``,
``drain_sock``, ``drain_sock_raw``, ``recv_sock``, ``recv_one``, ``recv_one_or_none``,
``recv_one_retry``; ``recv_view`` decodes in place, without a copy), :class:`PubMaster`,
:class:`SubMaster` and the schema module ``log``.
Written once against the socket protocol, so it runs on every backend.

Everything here uses the schema in force (:func:`msgq.schemas.use_schema`, or the
``MSGQ_SCHEMA``/``MSGQ_REGISTRY`` environment variables; msgq's own by default): ``log`` is
its module, ``new_message`` builds its root struct, and sockets made by
``pub_sock``/``sub_sock`` for a service of its registry get the registry's queue size.
Messages received by the ``recv_*``/``drain_sock`` helpers are decoded with a traversal
limit proportional to their size (see :mod:`msgq.schemas.events`); bytes that are not an
Event raise :class:`MessageDecodeError` there (SubMaster counts and skips them instead).

Layer: a service — over the package's sockets, the Event layer (schemas, events) and
the clock; it imports neither ``msgq.logs`` nor ``msgq.visionipc``, its peers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from msgq import NO_TRAVERSAL_LIMIT, SubSocket, drain_sock_raw, pub_sock, sub_sock
from msgq.messaging.frequency import FrequencyTracker
from msgq.messaging.pub_master import PubMaster
from msgq.messaging.sub_master import AsyncSubMaster, SubMaster
from msgq.schemas import SERVICE_LIST, Schema, schema_in_force
from msgq.schemas.events import MessageDecodeError, decode_event, log_from_bytes, new_message

__all__ = [
    "NO_TRAVERSAL_LIMIT",
    "AsyncSubMaster",
    "SERVICE_LIST",
    "FrequencyTracker",
    "MessageDecodeError",
    "PubMaster",
    "SubMaster",
    "decode_event",
    "drain_sock",
    "drain_sock_raw",
    "log",
    "log_from_bytes",
    "new_message",
    "pub_sock",
    "recv_one",
    "recv_one_or_none",
    "recv_one_retry",
    "recv_sock",
    "recv_view",
    "sub_sock",
]


def __getattr__(name: str) -> Any:
    # ``log``: the schema in force's compiled module (``log.Event`` is the root struct),
    # looked up at each use so that a use_schema() after this import is followed.
    if name == "log":
        return schema_in_force().module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def drain_sock(sock: Any, wait_for_one: bool = False) -> list[Any]:
    """Every message waiting on ``sock``, decoded (after blocking for the first one when
    ``wait_for_one``)."""
    return [decode_event(data) for data in drain_sock_raw(sock, wait_for_one=wait_for_one)]


def recv_sock(sock: Any, wait: bool = False) -> Any:
    """The newest message on ``sock`` (older ones are read and dropped), decoded; None when
    there is none (after waiting for one when ``wait``)."""
    data = None
    while True:
        if wait and data is None:
            received = sock.receive()
        else:
            received = sock.receive(non_blocking=True)
        if received is None:
            break
        data = received
    return None if data is None else decode_event(data)


def recv_one(sock: Any) -> Any:
    """One message, waiting for it (up to the socket's timeout: then None)."""
    data = sock.receive()
    return None if data is None else decode_event(data)


def recv_one_or_none(sock: Any) -> Any:
    """One message if one is waiting, else None."""
    data = sock.receive(non_blocking=True)
    return None if data is None else decode_event(data)


@contextmanager
def recv_view(sock: SubSocket, non_blocking: bool = False,
              schema: Schema | None = None) -> Iterator[Any]:
    """The next message of ``sock`` as an Event reader over its bytes where they lie (in
    shared memory on the msgq backend: nothing is copied), for the ``with`` block::

        with recv_view(sock) as event:        # None as recv_one / recv_one_or_none
            speed = event.vehicleState.speed  # read inside the block

    Decoded with the bounded decoder (:class:`MessageDecodeError` on garbage). Leaving
    the block raises :class:`msgq.MessageOverwritten` when the publisher may have
    overwritten the message while it was read (see ``SubSocket.receive_view``): what was
    computed from it must be discarded. Read what is needed inside the block: the reader
    (and any sub-reader taken from it) reads the queue's memory directly, so after the
    block it sees whatever the publisher wrote there since (the memory stays readable: a
    misused reader never crashes the process)."""
    schema = schema_in_force(schema)
    message_view = sock.receive_view(non_blocking)
    with message_view as view:
        if view is None:
            yield None
            return
        message_view.keep_readable()  # pycapnp keeps raw pointers, no buffer, after this
        yield schema.decode(view)


def recv_one_retry(sock: Any) -> Any:
    """One message, waiting as long as it takes (across socket timeouts)."""
    while True:
        data = sock.receive()
        if data is not None:
            return decode_event(data)
