"""The robot side of the bridge: local services and VisionIPC frames out to ZMQ.

:class:`Outbound` subscribes to local services (one Poller, no conflation: every message
is forwarded) and to VisionIPC streams (a thread per stream, conflating: the newest frame
wins when the link is slower than the camera), and publishes them on two ZMQ PUB sockets
(see :mod:`msgq.bridge.wire`), with an announcement of the schema they are Events of
(the schema in force, or the one given) every :data:`~msgq.bridge.wire.HELLO_INTERVAL_S`,
so that the receiving side can refuse another schema's messages. pyzmq only: no
Linux-only call on the network side.

With keys (``keys=DIR``, else ``MSGQ_ZMQ_KEYS``) both sockets are CURVE servers (XPUB in
manual mode): a client whose key DIR does not allow any carried service (or stream) is
refused at the handshake, and each subscription of an admitted client is granted only
for the exact topics (:data:`~msgq.bridge.wire.TOPIC_END`) of the services and streams
its grant in ``DIR/permissions.toml`` covers; the others are counted
(``refused_subscriptions``) and the first refusal of each client is logged.
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
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    DEFAULT_PORT,
    FRAME_PARTS,
    HELLO_INTERVAL_S,
    HELLO_TOPIC,
    VISION_HWM,
    FrameHeader,
    schema_hello,
    service_topic,
    vision_topic,
)
from msgq.schemas import Schema, schema_in_force
from msgq.visionipc import VisionIpcClient
from msgq.zmq.security import (
    ClientGrant,
    Keys,
    keys_setting,
    load_keys,
    make_curve_server,
    stop_zap_handler,
    zap_handler,
)

__all__ = ["Outbound"]

#: Messages queued per remote subscriber on the services socket before ZMQ drops.
SERVICES_HWM = 10_000
#: ZAP domains of the two sockets (what their refusals are counted under).
SERVICES_DOMAIN = "bridge-services"
VISION_DOMAIN = "bridge-vision"

log = logging.getLogger("msgq.bridge")


class Outbound:
    """Forwards ``services`` and VisionIPC ``vision`` streams (``[(name, [stream, …])]``)
    to ZMQ on ``bind``:``port`` (services) and ``port + 1`` (frames). ``compression``:
    ``"none"`` or ``"zstd"`` for frames; ``schema``: the schema the services' messages
    are Events of, announced to the other side (default: the schema in force); ``keys``:
    a key directory (else ``MSGQ_ZMQ_KEYS``; ``""``: none) for CurveZMQ and permissions.
    Call :meth:`run` (until ``stop()``), then :meth:`close`; ``counts`` tells what went
    out."""

    def __init__(self, services: list[str], vision: list[tuple[str, list[int]]] | None = None,
                 bind: str = "*", port: int = DEFAULT_PORT, compression: str = "none",
                 level: int = 1, schema: Schema | None = None,
                 keys: str | os.PathLike[str] | None = None) -> None:

        if compression not in ("none", "zstd"):
            raise ValueError("compression must be 'none' or 'zstd'")
        self._hello = schema_hello(schema_in_force(schema))
        self._hello_at = 0.0
        self.compression = compression
        self.level = level
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        directory = keys_setting(keys)
        #: The key directory in force (None: open, upstream's bridge).
        self.keys: Keys | None = load_keys(directory) if directory else None
        self._refusal_said: set[str] = set()
        streams = [(name, stream) for name, ids in (vision or []) for stream in ids]
        # Topic -> who may have it, per socket (with keys).
        self._services_grants: dict[bytes, Callable[[ClientGrant], bool]] = {
            service_topic(s, True): (lambda g, s=s: g.may_read(s)) for s in services}
        self._services_grants[HELLO_TOPIC] = lambda g: True
        self._vision_grants: dict[bytes, Callable[[ClientGrant], bool]] = {
            vision_topic(n, i, True): (lambda g, n=n, i=i: g.may_watch(n, i))
            for n, i in streams}
        self._zmq = zmq.Context()
        self._lock = threading.Lock()
        self._services_pub = self._bind(bind, port, SERVICES_HWM, SERVICES_DOMAIN,
                                        lambda g: any(g.may_read(s) for s in services))
        try:
            self._vision_pub = self._bind(bind, port + 1, VISION_HWM * FRAME_PARTS,
                                          VISION_DOMAIN,
                                          lambda g: any(g.may_watch(*x) for x in streams))
        except BaseException:
            self._services_pub.close()
            self._close_context()
            raise
        self.poller = msgq.Poller()
        self._sockets: dict[int, tuple[bytes, Any]] = {}
        for s in services:
            sock = msgq.sub_sock(s, poller=self.poller)
            self._sockets[id(sock)] = (service_topic(s, self.keys is not None), sock)
        self._threads = [threading.Thread(target=self._forward_stream, args=(name, stream),
                                          name=f"bridge-{name}-{stream}", daemon=True)
                         for name, streams in (vision or []) for stream in streams]

    def _bind(self, bind: str, port: int, hwm: int, domain: str,
              admits: Callable[[ClientGrant], bool]) -> Any:
        keys = self.keys
        sock = self._zmq.socket(zmq.PUB if keys is None else zmq.XPUB)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.LINGER, 0)
        host = f"[{bind}]" if ":" in bind else bind
        try:
            if keys is not None:
                # Subscriptions come up to run(), which grants each the topics the
                # client's permissions allow.
                sock.setsockopt(zmq.XPUB_MANUAL, 1)

                def decide(public: bytes) -> tuple[str | None, str]:
                    grant = keys.grant(public)
                    if grant is None:
                        return None, (f"client key {public[:8].decode()}... is not in "
                                      f"{keys.directory}")
                    if not admits(grant):
                        return None, (f"permissions.toml lets client {grant.name!r} read "
                                      "none of what this bridge carries")
                    return public.decode(), ""

                make_curve_server(sock, keys, domain, decide)
            sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as e:
            sock.close()
            raise OSError(e.errno, f"cannot bind tcp://{host}:{port}: {e.strerror}") from None
        except BaseException:
            sock.close()
            raise
        return sock

    def _grant(self, sock: Any, topics: dict[bytes, Callable[[ClientGrant], bool]]) -> None:
        """Applies the (un)subscriptions that came on ``sock`` (XPUB in manual mode), each
        only for the topics its client may have."""
        keys = self.keys
        assert keys is not None
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frame = sock.recv(zmq.NOBLOCK, copy=False)
            data = frame.bytes
            if not data or data[0] > 1:
                continue  # not a (un)subscription
            subscribe, prefix = data[0] == 1, data[1:]
            try:
                grant = keys.grant(frame.get("User-Id").encode())
            except zmq.ZMQError:
                grant = None
            for topic, allowed in topics.items():
                if not topic.startswith(prefix):
                    continue
                if grant is not None and allowed(grant):
                    sock.setsockopt(zmq.SUBSCRIBE if subscribe else zmq.UNSUBSCRIBE, topic)
                elif subscribe:
                    self.counts["refused_subscriptions"] += 1
                    name = grant.name if grant is not None else "?"
                    if name not in self._refusal_said:
                        self._refusal_said.add(name)
                        what_name = topic[1:].removesuffix(b"\x00").decode("utf-8", "replace")
                        log.warning("bridge: client %r may not read %s (permissions.toml); "
                                    "it gets only what it may (further refusals are "
                                    "counted in refused_subscriptions)", name, what_name)

    def stop(self) -> None:
        """Makes :meth:`run` return (from any thread or a signal handler)."""
        self._stop.set()

    def run(self) -> None:
        """Forwards until :meth:`stop`."""
        for thread in self._threads:
            thread.start()
        while not self._stop.is_set():
            if self.keys is not None:
                self._grant(self._services_pub, self._services_grants)
                with self._lock:
                    self._grant(self._vision_pub, self._vision_grants)
            self._announce()
            for sock in self.poller.poll(100):
                topic, s = self._sockets[id(sock)]
                while (data := s.receive(non_blocking=True)) is not None:
                    with self._lock:
                        self._services_pub.send_multipart([topic, data], copy=False)
                    self.counts["messages"] += 1

    def _announce(self) -> None:
        """Sends the schema announcement when it is due (at the start, then every
        HELLO_INTERVAL_S; ZMQ gives a subscriber only what is sent after it joined)."""
        now = time.monotonic()
        if now - self._hello_at < HELLO_INTERVAL_S:
            return
        self._hello_at = now
        with self._lock:
            self._services_pub.send_multipart([HELLO_TOPIC, self._hello])

    def _forward_stream(self, name: str, stream: int) -> None:

        compressor = None
        if self.compression == "zstd":
            compressor = zstandard.ZstdCompressor(level=self.level)
        topic = vision_topic(name, stream, self.keys is not None)
        client = VisionIpcClient(name, stream, conflate=True)
        try:
            while not self._stop.is_set():
                buf = client.recv(100)
                if buf is None:
                    continue
                frame = bytes(buf.data)
                if not buf.is_current():  # the server recycled it while we copied
                    self.counts["frames_recycled"] += 1
                    continue
                header = FrameHeader(
                    COMPRESSION_ZSTD if compressor else COMPRESSION_NONE, client.frame_id,
                    buf.width, buf.height, buf.stride, buf.uv_offset, len(frame),
                    client.timestamp_sof, client.timestamp_eof, bool(client.valid))
                payload = compressor.compress(frame) if compressor else frame
                with self._lock:
                    # Reading EVENTS makes libzmq take in its subscribers' read reports now;
                    # send() alone takes them in about once a millisecond, so a subscriber
                    # that keeps up could still look a whole high-water mark behind.
                    self._vision_pub.getsockopt(zmq.EVENTS)
                    self._vision_pub.send_multipart([topic, header.pack(), payload], copy=False)
                self.counts["frames"] += 1
                self.counts["frame_bytes"] += len(payload)
        finally:
            client.close()

    def close(self) -> None:
        """Stops, joins the frame threads and closes every socket."""
        self.stop()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(5)
        for _, sock in self._sockets.values():
            sock.close()
        self._services_pub.close()
        self._vision_pub.close()
        self._close_context()

    def _close_context(self) -> None:
        if self.keys is not None:
            refusals = zap_handler(self._zmq).refusals
            refused = refusals[SERVICES_DOMAIN] + refusals[VISION_DOMAIN]
            if refused:
                self.counts["refused_clients"] = refused
            stop_zap_handler(self._zmq)
        self._zmq.term()
