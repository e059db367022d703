"""The laptop side of the bridge: services and VisionIPC frames from a remote
:class:`~msgq.bridge.outbound.Outbound`, re-published locally so that unchanged local
subscribers (``sub_sock``, SubMaster, ``VisionIpcClient``) work.

Services are re-published byte for byte on local publishers (made on first message).
Frames are re-served by a local ``VisionIpcServer`` per VisionIPC name, with buffers of
the remote stream's geometry (made on its first frame, re-made if the geometry changes),
frame ids and timestamps preserved. Everything received is validated against the schema
in force (msgq's own, or the application's: :func:`msgq.schemas.use_schema`, or
MSGQ_SCHEMA/MSGQ_REGISTRY); anything that is not a well-formed Event of a service of its
registry, received on that service's topic, or a well-formed frame, is counted in
``counts`` and dropped. A well-formed Event of another service than its topic's is counted
as ``mislabeled`` and ``last_service_error`` says which.

The other side announces its schema (:func:`msgq.bridge.wire.schema_hello`); service
messages wait for the announcement (at most :data:`HELLO_WAIT_S`, then an older sender
that announces nothing is taken unchecked), after each connection to it. When it is
another schema
(:func:`msgq.bridge.wire.schema_difference`), no message is re-published — each is counted
as ``wrong_schema`` — ``schema_problem`` says what differs, and ``notify`` (when given) is
called with it once, instead of re-publishing messages mislabeled.

With keys (``keys=DIR``, else ``MSGQ_ZMQ_KEYS``; ``client`` picks the client key) both
sockets are CURVE clients that accept only DIR's server key; a failed handshake (the
other side refused this key, or is not the bridge of that key) is counted in
``counts["failed_handshakes"]`` and logged once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import zmq
import zstandard

import msgq
from msgq.bridge.wire import (
    COMPRESSION_ZSTD,
    DEFAULT_PORT,
    FRAME_PARTS,
    HELLO_INTERVAL_S,
    HELLO_TOPIC,
    VISION_HWM,
    FrameHeader,
    WireError,
    parse_hello,
    parse_service_topic,
    parse_vision_topic,
    schema_difference,
    schema_hello,
    service_topic,
)
from msgq.schemas import Schema, schema_in_force
from msgq.visionipc import VisionIpcServer
from msgq.zmq.security import handshake_problem, keys_setting, load_keys, make_curve_client

__all__ = ["FRAME_BUFFERS", "HELLO_WAIT_S", "HOLD_LIMIT", "Inbound"]

#: Buffers per re-served stream.
FRAME_BUFFERS = 4
#: Seconds service messages wait for the other side's schema announcement before they
#: are taken unchecked (a sender of an older msgq announces nothing).
HELLO_WAIT_S = 3 * HELLO_INTERVAL_S
#: Service messages kept while waiting for the announcement (more are dropped, counted).
HOLD_LIMIT = 10_000
log = logging.getLogger("msgq.bridge")
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
# Largest frame accepted from the wire (bytes), as VisionIPC's own limit.
_MAX_FRAME = 1 << 30


class Inbound:
    """Subscribes to the bridge at ``address``:``port`` (and ``port + 1`` for frames)
    and re-publishes locally. ``services``: only these (default: every registry service
    that arrives); ``vision``: also re-serve VisionIPC frames; ``schema``: the schema the
    remote side must send (default: the schema in force); ``notify``: called (from
    :meth:`run`) with one line when the other side announces another schema; ``keys``
    and ``client``: CurveZMQ (see the module docstring). Call :meth:`run` (until
    ``stop()``), then :meth:`close`."""

    def __init__(self, address: str, port: int = DEFAULT_PORT,
                 services: list[str] | None = None, vision: bool = True,
                 schema: Schema | None = None,
                 notify: Callable[[str], None] | None = None,
                 keys: str | os.PathLike[str] | None = None,
                 client: str | None = None) -> None:

        schema = schema_in_force(schema)
        self._ours = parse_hello(schema_hello(schema))
        self._notify = notify
        #: What differs when the other side announced another schema, else None.
        self.schema_problem: str | None = None
        self._announced = False  # an announcement came, or the wait for one ended
        self._held: list[tuple[str, bytes]] = []
        self._held_since = 0.0
        self._registry = schema.services
        self._layout = schema.layout
        if services is not None:
            for name in services:
                self._registry[name]  # KeyError naming close matches
        #: Why the last frame was dropped.
        self.last_error = ""
        #: Why the last service message of an unknown service or another service's Event
        #: was dropped (the other side's schema is not the one in force).
        self.last_service_error = ""
        self.counts: Counter[str] = Counter()
        directory = keys_setting(keys)
        self._keys = load_keys(directory, client) if directory else None
        if self._keys is not None:
            self._keys.client_keys_or_raise()
        self._handshake_said = False
        self._stop = threading.Event()
        self._zmq = zmq.Context()
        host = f"[{address}]" if ":" in address else address
        self._services_sub = self._zmq.socket(zmq.SUB)
        self._services_sub.setsockopt(zmq.LINGER, 0)
        if self._keys is not None:
            make_curve_client(self._services_sub, self._keys)
        self._services_sub.setsockopt(zmq.SUBSCRIBE, HELLO_TOPIC)
        for s in services or [""]:
            topic = service_topic(s, self._keys is not None) if s else b"s"
            self._services_sub.setsockopt(zmq.SUBSCRIBE, topic)
        self._services_sub.connect(f"tcp://{host}:{port}")
        self.wanted = None if services is None else set(services)
        self._vision_sub = None
        if vision:
            self._vision_sub = self._zmq.socket(zmq.SUB)
            self._vision_sub.setsockopt(zmq.LINGER, 0)
            self._vision_sub.setsockopt(zmq.RCVHWM, VISION_HWM * FRAME_PARTS)
            if self._keys is not None:
                make_curve_client(self._vision_sub, self._keys)
            self._vision_sub.setsockopt(zmq.SUBSCRIBE, b"v")
            self._vision_sub.connect(f"tcp://{host}:{port + 1}")
        # A (re)connection to the other side: its schema is unknown until it announces
        # it (a robot side restarted with another schema must not slip messages through
        # under the last one's verdict). The monitor comes first in the poller, so its
        # event, which precedes the new connection's first message by the ZMTP
        # handshake, is handled first.
        self._monitor = self._services_sub.get_monitor_socket(
            zmq.EVENT_CONNECTED | _HANDSHAKE_FAILED)
        self._handlers: dict[Any, Callable[[list[bytes]], None]] = {
            self._monitor: self._on_connected, self._services_sub: self._on_service}
        if self._vision_sub is not None:
            self._handlers[self._vision_sub] = self._on_frame
        self._poller = zmq.Poller()
        for sock in self._handlers:
            self._poller.register(sock, zmq.POLLIN)
        self._publishers: dict[str, Any] = {}
        self._servers: dict[str, Any] = {}
        self._geometry: dict[tuple[str, int], tuple[int, int, int, int, int]] = {}
        self._decompressor: Any = None

    def stop(self) -> None:
        """Makes :meth:`run` return."""
        self._stop.set()

    def run(self) -> None:
        """Re-publishes until :meth:`stop`."""
        while not self._stop.is_set():
            for sock, _ in self._poller.poll(100):
                handle = self._handlers[sock]
                while True:
                    try:
                        parts = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    handle(parts)
            if self._held and time.monotonic() - self._held_since >= HELLO_WAIT_S:
                self._announced = True  # an older sender: nothing to check against
                self._release_held()

    def _on_connected(self, parts: list[bytes]) -> None:
        event = int.from_bytes(parts[0][:2], "little")
        if event & _HANDSHAKE_FAILED:
            self.counts["failed_handshakes"] += 1
            if not self._handshake_said:
                self._handshake_said = True
                value = int.from_bytes(parts[0][2:6], "little")
                log.warning("bridge: the other side at %s: %s (further failures are counted "
                            "in failed_handshakes)", parts[1].decode("utf-8", "replace"),
                            handshake_problem(event, value, self._keys is not None,
                                              "subscriber"))
            return
        self._announced = False

    def _on_hello(self, parts: list[bytes]) -> None:
        try:
            if len(parts) != 2:
                raise WireError("a schema announcement has 2 parts")
            theirs = parse_hello(parts[1])
        except WireError:
            self.counts["bad_messages"] += 1
            return
        self._announced = True
        difference = schema_difference(self._ours, theirs)
        if difference is None:
            self.schema_problem = None
        else:
            problem = (f"the other side sends Events of another schema: {difference} "
                       f"(fingerprint {theirs.get('fingerprint')}, this side's "
                       f"{self._ours['fingerprint']}); run this side with its schema "
                       "(--schema FILE.capnp --registry FILE, or MSGQ_SCHEMA/MSGQ_REGISTRY)")
            if problem != self.schema_problem:
                self.schema_problem = problem
                if self._notify is not None:
                    self._notify(problem)
        self._release_held()

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for service, data in held:
            self._republish(service, data)

    def _on_service(self, parts: list[bytes]) -> None:
        if parts and parts[0] == HELLO_TOPIC:
            self._on_hello(parts)
            return
        try:
            if len(parts) != 2:
                raise WireError("a service message has 2 parts")
            service = parse_service_topic(parts[0])
        except WireError:
            self.counts["bad_messages"] += 1
            return
        if not self._announced:  # wait for the other side's schema
            if len(self._held) >= HOLD_LIMIT:
                self.counts["dropped_waiting_for_schema"] += 1
                return
            if not self._held:
                self._held_since = time.monotonic()
            self._held.append((service, parts[1]))
            return
        self._republish(service, parts[1])

    def _republish(self, service: str, data: bytes) -> None:
        if self.schema_problem is not None:
            self.counts["wrong_schema"] += 1
            return
        if service not in self._registry:
            self.counts["unknown_services"] += 1
            self.last_service_error = (f"{service!r} is not a service of the schema in "
                                       "force: does the other side use the same schema?")
            return
        if self.wanted is not None and service not in self.wanted:
            self.counts["unknown_services"] += 1
            return
        identity = self._layout.identify(data)
        if identity is None:
            self.counts["bad_messages"] += 1
            return
        if identity[2] != service:
            self.counts["mislabeled"] += 1
            self.last_service_error = (f"a message on {service} is a {identity[2]} Event "
                                       "of the schema in force: does the other side use "
                                       "the same schema?")
            return
        pub = self._publishers.get(service)
        if pub is None:
            pub = self._publishers[service] = msgq.pub_sock(service)
        pub.send(data)
        self.counts["messages"] += 1

    def _on_frame(self, parts: list[bytes]) -> None:
        try:
            if len(parts) != 3:
                raise WireError("a frame message has 3 parts")
            name, stream = parse_vision_topic(parts[0])
            header = FrameHeader.unpack(parts[1], _MAX_FRAME)
            frame = parts[2]
            if header.compression == COMPRESSION_ZSTD:
                frame = self._decompress(frame, header.size)
            if len(frame) != header.size:
                raise WireError(f"frame of {len(frame)} bytes, header says {header.size}")
            self._serve(name, stream, header, frame)
        except (WireError, ValueError) as e:  # ValueError: a geometry VisionIPC refuses
            self.counts["bad_frames"] += 1
            self.last_error = str(e)
            return
        self.counts["frames"] += 1

    def _decompress(self, data: bytes, size: int) -> bytes:
        if self._decompressor is None:
            self._decompressor = zstandard.ZstdDecompressor()
        try:
            return self._decompressor.decompress(data, max_output_size=size)
        except zstandard.ZstdError as e:
            raise WireError(f"frame does not decompress: {e}") from None

    def _serve(self, name: str, stream: int, h: FrameHeader, frame: bytes) -> None:
        geometry = (h.width, h.height, h.stride, h.uv_offset, h.size)
        server = self._servers.get(name)
        if server is not None and self._geometry.get((name, stream), geometry) != geometry:
            # buffers cannot be re-sized: a new server (clients follow the restart)
            server.close()
            server = None
            self._geometry = {k: v for k, v in self._geometry.items() if k[0] != name}
            self.counts["geometry_changes"] += 1
        if server is None:
            server = self._servers[name] = VisionIpcServer(name)
            server.start_listener()
        if (name, stream) not in self._geometry:
            server.create_buffers_with_sizes(stream, FRAME_BUFFERS, h.width, h.height, h.size,
                                             h.stride, h.uv_offset)
            self._geometry[(name, stream)] = geometry
        server.send(stream, frame, h.frame_id, h.timestamp_sof, h.timestamp_eof,
                    valid=h.valid)

    def close(self) -> None:
        """Stops and closes every socket and server."""
        self.stop()
        for pub in self._publishers.values():
            pub.close()
        for server in self._servers.values():
            server.close()
        self._services_sub.disable_monitor()
        self._monitor.close()
        self._services_sub.close()
        if self._vision_sub is not None:
            self._vision_sub.close()
        self._zmq.term()
