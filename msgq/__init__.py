"""msgq: fast inter-process publish/subscribe for robotics-style Python services.

The socket API of upstream msgq/cereal: ``Context``, ``PubSocket``, ``SubSocket`` and
``Poller`` construct sockets of the backend the environment selects (see
:mod:`msgq.sockets`), plus the helpers ``pub_sock``, ``sub_sock`` and ``drain_sock_raw``
and upstream's fake-event functions.

The package's layers, lowest first (each imports only from layers below it, and the
packages of one layer do not import each other; the order is written once, in
``tests/test_layers.py``, which checks it):

1. foundation — :mod:`msgq.errors`, :mod:`msgq.tables`, then :mod:`msgq.clock`
2. the Event layer — :mod:`msgq.schemas` (registry, framing, schema, events)
3. the queue namespace — the extension :mod:`msgq.shm_backend`, then :mod:`msgq.queues`
4. backends — :mod:`msgq.zmq`, :mod:`msgq.fake_events`
5. the socket factory — :mod:`msgq.sockets`, then this package
6. services — :mod:`msgq.messaging`, :mod:`msgq.logs`, :mod:`msgq.visionipc`
7. tools — :mod:`msgq.lockstep`, :mod:`msgq.bridge`, :mod:`msgq.spark`
8. programs — :mod:`msgq.bench` (over ``msgq.cli.output``), then :mod:`msgq.cli`, then
   :mod:`msgq.demo` (the end-to-end demo runs msgq's commands)

Layer: the package — over the socket factory (:mod:`msgq.sockets`), the fake-event
backend and the Event layer's registry; the services, tools and programs build on it.
"""

from __future__ import annotations

from msgq.errors import IpcError, MessageOverwritten, MultiplePublishersError
from msgq.fake_events import (
    Event,
    SocketEventHandle,
    delete_fake_prefix,
    fake_event_handle,
    get_fake_prefix,
    set_fake_prefix,
    toggle_fake_events,
    wait_for_one_event,
)
from msgq.schemas.schema import NO_TRAVERSAL_LIMIT
from msgq.schemas.selection import find_service
from msgq.sockets import (
    BACKENDS,
    Context,
    Poller,
    ProcessContext,
    PubSocket,
    SubSocket,
    backend_name,
    select_backend,
)

__all__ = [
    "BACKENDS",
    "Context",
    "Event",
    "IpcError",
    "MessageOverwritten",
    "MultiplePublishersError",
    "NO_TRAVERSAL_LIMIT",
    "Poller",
    "PubSocket",
    "SocketEventHandle",
    "SubSocket",
    "backend_name",
    "context",
    "delete_fake_prefix",
    "drain_sock_raw",
    "fake_event_handle",
    "get_fake_prefix",
    "pub_sock",
    "select_backend",
    "set_fake_prefix",
    "sub_sock",
    "toggle_fake_events",
    "wait_for_one_event",
]

#: The process-wide context sockets made by pub_sock/sub_sock connect with. It chooses no
#: backend, so ``import msgq`` never fails on the environment.
context = ProcessContext()


def _registry_segment_size(endpoint: str | bytes, segment_size: int) -> int:
    """``segment_size``, or the registry's queue size of ``endpoint`` when it is 0."""
    if segment_size == 0:
        service = find_service(endpoint) if isinstance(endpoint, (str, bytes)) else None
        if service is not None:
            return service.queue_size
    return segment_size


def pub_sock(endpoint: str, segment_size: int = 0) -> PubSocket:
    """A connected publisher of ``endpoint``.

    ``segment_size`` 0 means: the service registry's queue size for a registry service,
    else the size of an existing queue, else the default.
    """
    sock = PubSocket()
    sock.connect(context, endpoint, _registry_segment_size(endpoint, segment_size))
    return sock


def sub_sock(
    endpoint: str,
    poller: Poller | None = None,
    addr: str = "127.0.0.1",
    conflate: bool = False,
    timeout: int | None = None,
    segment_size: int = 0,
) -> SubSocket:
    """A connected subscriber of ``endpoint``.

    ``addr`` is the publisher's host (ZMQ backend), ``conflate`` keeps only the newest
    message, ``timeout`` (ms) bounds a blocking ``receive``, and a ``poller`` gets the
    socket registered. ``segment_size`` 0: as for :func:`pub_sock`.
    """
    sock = SubSocket()
    sock.connect(
        context,
        endpoint,
        addr.encode("utf-8") if isinstance(addr, str) else addr,
        conflate,
        _registry_segment_size(endpoint, segment_size),
    )
    if timeout is not None:
        sock.setTimeout(timeout)
    if poller is not None:
        poller.registerSocket(sock)
    return sock


def drain_sock_raw(sock: SubSocket, wait_for_one: bool = False) -> list[bytes]:
    """Every message waiting on ``sock`` (after blocking for the first one when
    ``wait_for_one``)."""
    messages: list[bytes] = []
    while True:
        if wait_for_one and not messages:
            data = sock.receive()
        else:
            data = sock.receive(non_blocking=True)
        if data is None:
            break
        messages.append(data)
    return messages
