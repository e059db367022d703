"""The ZMQ backend: the msgq socket protocol over pyzmq TCP sockets.

This is the portable backend (no Linux-only calls) and the one that reaches other
machines. Each endpoint maps to one TCP port (:func:`endpoint_port`); its publisher binds
that port on ``bind_address`` (default every interface) and subscribers connect to
``tcp://<addr>:<port>``.

Behaviour that differs from the shared-memory backend, by nature of ZMQ:

* A second publisher of an endpoint fails in ``connect`` with
  :class:`~msgq.errors.MultiplePublishersError` (the port is taken); the first one keeps
  the endpoint. The shared-memory backend lets the newcomer take over instead.
* Delivery starts once a subscriber's connection is up. ``SubSocket.connect`` waits
  (at most ``connect_wait_ms``) until the publisher answered, and ``PubSocket.send``
  waits (at most ``join_wait_ms``) for the subscription of a connection it has accepted
  but not yet heard from, so a message sent after ``sub_sock()`` returned reaches that
  subscriber. A subscriber that connects after a send does not get that message.
* ``all_readers_updated()`` means what it means on shared memory: at least one
  subscriber is connected and every subscriber has read everything sent to it. ZMQ has
  no read acknowledgements of its own, so msgq's subscribers send one upstream (a
  subscription they drop at once, which filters nothing: ``ACK_TOPIC``) when they have
  read everything that arrived, naming the last message they read by its fingerprint
  (length and the CRC-32 of its first and last 32 bytes); the publisher compares it with
  the last message it sent. The acknowledgement travels like a message, so the publisher
  learns of a read a moment after it happened: ``wait_for_readers`` / ``wait_until_read``
  wait for it. A subscriber that is not msgq's (another ZMQ program) tells nothing of its
  reads and counts as up to date once subscribed. ``num_readers`` counts subscribed
  connections.
* Queues are bounded by message count, not bytes: ``sndhwm`` messages per subscriber on
  the publisher side and ``rcvhwm`` on the subscriber side; past them messages to that
  subscriber are dropped, so a stalled or dead subscriber never grows the publisher's
  memory without bound. Heartbeats drop connections to peers that vanished.
* ``segment_size`` is checked like the shared-memory backend does and otherwise ignored.

Environment, read when a socket is created (keyword arguments of the socket win):

``MSGQ_ZMQ_BASE_PORT`` / ``MSGQ_ZMQ_PORT_SPAN``
    The port range (default 8023, 24745 ports: 8023..32767, below Linux's ephemeral range).
``MSGQ_PREFIX`` / ``OPENPILOT_PREFIX``
    Part of the port hash, so runs with different prefixes use different ports.
``MSGQ_ZMQ_BIND``
    Address publishers bind (default ``*``: every interface).
``MSGQ_ZMQ_SNDHWM`` / ``MSGQ_ZMQ_RCVHWM``
    High-water marks in messages (default 1000 each).
``MSGQ_ZMQ_LINGER``
    Milliseconds ``close`` (and process exit) may spend flushing unsent messages
    (default 1000).
``MSGQ_ZMQ_CONNECT_WAIT_MS`` / ``MSGQ_ZMQ_JOIN_WAIT_MS``
    The two waits above (defaults 500 and 200; 0 turns a wait off).

Messages that did not come from a publisher of this endpoint are dropped and counted in
``SubSocket.dropped_messages``, with one logged warning per socket: multi-part messages
(msgq messages are one frame), messages from a msgq publisher of another endpoint (two
names hashed to one port) and messages from peers without ZMTP 3 metadata (legacy ZMQ,
or a non-ZMQ program on the port whose bytes libzmq parsed as ZMTP 1.0). Single-frame
messages from other ZMQ 4 publishers carry no endpoint tag and are delivered as they are.

The modules: :mod:`~msgq.zmq.publisher` (PubSocket), :mod:`~msgq.zmq.subscriber`
(SubSocket, receive views, asyncio), :mod:`~msgq.zmq.poller`, :mod:`~msgq.zmq.context`
(contexts, the flush at exit, fork, monitor sockets), :mod:`~msgq.zmq.ports` (the port of
an endpoint, binding, what holds a refused port), :mod:`~msgq.zmq.reads` (read
acknowledgements), :mod:`~msgq.zmq.options` and :mod:`~msgq.zmq.security` (CurveZMQ keys,
the ZAP handler, per-service permissions; the bridge uses it too). Every import here is
absolute, so ``import zmq`` in them is pyzmq, never this package.

Layer: a backend — over the queue namespace (:mod:`msgq.queues`: names, the prefix),
the Event layer (the registry's ports) and the foundation (the Reservation base); it
imports nothing of the shared-memory extension itself.
"""

from __future__ import annotations

try:
    import zmq  # noqa: F401 (pyzmq: absolute imports, never this package)
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the zmq backend needs pyzmq: pip install pyzmq (or choose MSGQ_BACKEND=msgq)"
    ) from e

from msgq.zmq.context import Context, default_context
from msgq.zmq.options import (
    DEFAULT_BIND_ADDRESS,
    DEFAULT_CONNECT_WAIT_MS,
    DEFAULT_JOIN_WAIT_MS,
    DEFAULT_LINGER_MS,
    DEFAULT_RCVHWM,
    DEFAULT_SNDHWM,
    PEER_CHECK_INTERVAL_S,
)
from msgq.zmq.poller import Poller
from msgq.zmq.ports import DEFAULT_BASE_PORT, DEFAULT_PORT_SPAN, ENDPOINT_PROPERTY, endpoint_port
from msgq.zmq.publisher import BufferReservation, PubSocket
from msgq.zmq.reads import ACK_TOPIC, BYE_TOPIC, READER_PROPERTY, READER_TOPIC, fingerprint
from msgq.zmq.security import (
    CLIENT_ENV,
    CLIENTS_FOLDER,
    KEYS_ENV,
    PERMISSIONS_FILE,
    SERVER_KEY_NAME,
    ZAP_ENDPOINT,
    ClientGrant,
    Keys,
    ZapHandler,
    create_keys,
    handshake_problem,
    keys_setting,
    load_keys,
    make_curve_client,
    make_curve_server,
    service_policy,
    stop_zap_handler,
    zap_handler,
)
from msgq.zmq.subscriber import FrameView, SubSocket, wait_readable_async

__all__ = [
    "ACK_TOPIC",
    "BufferReservation",
    "BYE_TOPIC",
    "CLIENT_ENV",
    "ClientGrant",
    "CLIENTS_FOLDER",
    "Context",
    "create_keys",
    "DEFAULT_BASE_PORT",
    "DEFAULT_BIND_ADDRESS",
    "DEFAULT_CONNECT_WAIT_MS",
    "default_context",
    "DEFAULT_JOIN_WAIT_MS",
    "DEFAULT_LINGER_MS",
    "DEFAULT_PORT_SPAN",
    "DEFAULT_RCVHWM",
    "DEFAULT_SNDHWM",
    "endpoint_port",
    "ENDPOINT_PROPERTY",
    "fingerprint",
    "FrameView",
    "handshake_problem",
    "Keys",
    "KEYS_ENV",
    "keys_setting",
    "load_keys",
    "make_curve_client",
    "make_curve_server",
    "PEER_CHECK_INTERVAL_S",
    "PERMISSIONS_FILE",
    "Poller",
    "PubSocket",
    "QUEUED_ON_SEND",
    "READER_PROPERTY",
    "READER_TOPIC",
    "SERVER_KEY_NAME",
    "service_policy",
    "stop_zap_handler",
    "SubSocket",
    "wait_readable_async",
    "ZAP_ENDPOINT",
    "zap_handler",
    "ZapHandler",
]

#: A message still travels (libzmq's I/O threads, TCP) when ``send`` returns: it is not
#: yet in the subscribers' queues (the backend protocol's flag; see msgq/sockets.py).
QUEUED_ON_SEND = False
