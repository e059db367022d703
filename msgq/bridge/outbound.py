"""The robot side of the bridge: local services and VisionIPC frames out to ZMQ.

:class:`Outbound` subscribes to local services (one Poller, no conflation: every message
is forwarded) and to VisionIPC streams (a thread per stream, conflating: the newest frame
wins when the link is slower than the camera), and publishes them on two ZMQ PUB sockets
(see :mod:`msgq.bridge.wire`), with an announcement of the schema they are Events of
(the schema in force, or the one given) every :data:`~msgq.bridge.wire.HELLO_INTERVAL_S`,
so that the receiving side can refuse another schema's messages. pyzmq only: no
Linux-only call on the network side.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
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

__all__ = ["Outbound"]

#: Messages queued per remote subscriber on the services socket before ZMQ drops.
SERVICES_HWM = 10_000


class Outbound:
    """Forwards ``services`` and VisionIPC ``vision`` streams (``[(name, [stream, …])]``)
    to ZMQ on ``bind``:``port`` (services) and ``port + 1`` (frames). ``compression``:
    ``"none"`` or ``"zstd"`` for frames; ``schema``: the schema the services' messages
    are Events of, announced to the other side (default: the schema in force). Call
    :meth:`run` (until ``stop()``), then :meth:`close`; ``counts`` tells what went out."""

    def __init__(self, services: list[str], vision: list[tuple[str, list[int]]] | None = None,
                 bind: str = "*", port: int = DEFAULT_PORT, compression: str = "none",
                 level: int = 1, schema: Schema | None = None) -> None:

        if compression not in ("none", "zstd"):
            raise ValueError("compression must be 'none' or 'zstd'")
        self._hello = schema_hello(schema_in_force(schema))
        self._hello_at = 0.0
        self.compression = compression
        self.level = level
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._zmq = zmq.Context()
        self._lock = threading.Lock()
        self._services_pub = self._bind(bind, port, SERVICES_HWM)
        self._vision_pub = self._bind(bind, port + 1, VISION_HWM * FRAME_PARTS)
        self.poller = msgq.Poller()
        self._sockets: dict[int, tuple[bytes, Any]] = {}
        for s in services:
            sock = msgq.sub_sock(s, poller=self.poller)
            self._sockets[id(sock)] = (service_topic(s), sock)
        self._threads = [threading.Thread(target=self._forward_stream, args=(name, stream),
                                          name=f"bridge-{name}-{stream}", daemon=True)
                         for name, streams in (vision or []) for stream in streams]

    def _bind(self, bind: str, port: int, hwm: int) -> Any:
        sock = self._zmq.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.LINGER, 0)
        host = f"[{bind}]" if ":" in bind else bind
        try:
            sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as e:
            sock.close()
            raise OSError(e.errno, f"cannot bind tcp://{host}:{port}: {e.strerror}") from None
        return sock

    def stop(self) -> None:
        """Makes :meth:`run` return (from any thread or a signal handler)."""
        self._stop.set()

    def run(self) -> None:
        """Forwards until :meth:`stop`."""
        for thread in self._threads:
            thread.start()
        while not self._stop.is_set():
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
        topic = vision_topic(name, stream)
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
        self._zmq.term()
