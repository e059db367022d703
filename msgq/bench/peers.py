"""The transports the core benchmark compares, as small adapter classes with the same
methods (``make_pub``, ``make_sub``, ``send``, ``recv``, ``recv_into``, ``close``): msgq
itself (and ``msgq-zmq`` when msgq has a ``zmq`` backend), raw pyzmq over ``ipc://``,
kickmsg and iceoryx2; and the geometry (window, queue sizes) each run uses. Peers that
are not importable are skipped with a note.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import struct
import time
from dataclasses import dataclass
from typing import Any

import zmq

import msgq
from msgq.version import DISTRIBUTION
from msgq.zmq.security import create_keys

KIB = 1024
MIB = 1024 * KIB

DEFAULT_SIZES: tuple[int, ...] = (8, KIB, 64 * KIB, MIB)
DEFAULT_SUBS: tuple[int, ...] = (1, 4)
#: Payload sizes of the recv_into and view rows and of the round-trip rows (kept if in
#: --sizes).
INTO_SIZES: tuple[int, ...] = (64 * KIB, MIB)
RTT_SIZES: tuple[int, ...] = (8, 64 * KIB)
#: Every backend the benchmark knows, in table order; pyzmq is the reference of the ratios.
BACKEND_ORDER: tuple[str, ...] = (
    "msgq", "msgq-ring", "msgq-zmq", "msgq-zmq-curve", "pyzmq", "kickmsg", "iceoryx2")
REFERENCE = "pyzmq"
TESTS: tuple[str, ...] = ("throughput", "recv_into", "view", "rtt", "rtt_async")
#: Payload sizes of the asyncio round-trip rows.
ASYNC_RTT_SIZES: tuple[int, ...] = (8,)

#: Seconds each measurement runs (throughput rows and round-trip rows).
DEFAULT_DURATION = 0.4
QUICK_DURATION = 0.15
DEFAULT_REPEAT = 3

#: Sequence numbers: the stream counts from 0; hello, start and end markers sit far above.
HEADER = struct.Struct("<Q")
HELLO_BASE = 1 << 62
START_SEQ = (1 << 63) - 1
END_SEQ = 1 << 63

#: Untimed traffic before each timed throughput run: this share of it, at least WARM_MIN_S.
WARM_FRACTION = 0.2
WARM_MIN_S = 0.05
#: ... and, for payloads from WARM_RING_FROM bytes, one msgq segment's worth of payload,
#: unless that takes longer than WARM_MAX_S.
WARM_RING_FROM = 4 * KIB
WARM_MAX_S = 1.0
#: How long one blocking receive waits before the loop checks the shared board (ms).
RECV_TIMEOUT_MS = 100
#: Bytes allowed in flight between the publisher and its slowest subscriber.
INFLIGHT_BUDGET = 4 * MIB
MIN_WINDOW = 16
MAX_WINDOW = 1024
#: msgq puts payloads from this size into chunks (MSGQ_POOL_THRESHOLD, msgq_ring.h) and
#: reuses a free chunk only while it lies within a quarter ring of the write position
#: (MSGQ_POOL_REUSE_SPAN_DIVISOR): a window of chunks stays reusable in a ring of four.
CHUNKED_FROM = 256 * KIB
CHUNK_SPAN_RINGS = 4
#: Extra queue room beyond the window, for hello/start/end markers (messages).
QUEUE_MARGIN = 16
#: Publisher pacing: yields first, then sleeps this long while the window is full.
PACE_YIELDS = 4
PACE_SLEEP_S = 50e-6
#: Round trips timed per measurement at most, and untimed ones first.
RTT_MAX_SAMPLES = 20000
RTT_WARMUP = 200
#: Limits that turn a hung process into an error instead of a hung benchmark (s).
STARTUP_TIMEOUT_S = 20.0
STALL_TIMEOUT_S = 10.0
JOB_SLACK_S = 40.0
#: kickmsg: payloads from this size are written in place (allocate/publish).
KICKMSG_ZERO_COPY_FROM = 64 * KIB


# --------------------------------------------------------------------------- geometry


def _segment_for(ring_bytes: int) -> int:
    """A ring of at least ``ring_bytes``: whole MiB, at least msgq's 10 MiB default."""
    return max(10 * MIB, -(-ring_bytes // MIB) * MIB)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Geometry:
    """Sizes every backend derives its queue settings from, for one payload size.

    ``window`` is the pacing window W (messages). ``ring_segment_size`` is the plain
    ring's size (``msgq-ring``): one and a half windows of messages (at least the 10 MiB
    default), so a paced subscriber is never overtaken — the same in-flight room the
    peers get (kickmsg and iceoryx2 queues of W + 16 entries). A larger plain ring only
    walks more memory per pass, which costs it its cache hits (4 windows: 64 KiB x 1 sub
    ran at half the speed). ``segment_size`` is msgq's (chunks): the same below
    CHUNKED_FROM; from there four windows of chunks and two more, because a free chunk
    is reused only while it lies within a quarter ring of the write position, so a
    subscriber a whole window behind keeps every chunk reusable (in a ring of 1.5
    windows most sends take a fresh chunk at the write position and the ring walks as
    the plain ring does: 1 MiB x 1 ran at 0.6 of the bound instead of 0.9 whenever the
    subscriber fell a window behind). A reused chunk is not walked, so the larger ring
    costs no cache.
    """

    size: int
    subs: int
    window: int
    segment_size: int
    ring_segment_size: int

    @classmethod
    def for_payload(cls, size: int, subs: int) -> Geometry:
        """The geometry of ``subs`` subscribers of ``size``-byte payloads."""
        window = max(MIN_WINDOW, min(MAX_WINDOW, INFLIGHT_BUDGET // max(size, 1)))
        ring = _segment_for(int(1.5 * window * (size + 64)))
        chunked = ring
        if size >= CHUNKED_FROM:
            chunked = _segment_for(CHUNK_SPAN_RINGS * (window + 2) * (size + 64))
        return cls(size=size, subs=subs, window=window, segment_size=chunked,
                   ring_segment_size=ring)

    @property
    def queue_depth(self) -> int:
        """Messages a per-subscriber queue must hold: the window plus room for markers."""
        return self.window + QUEUE_MARGIN


# --------------------------------------------------------------------------- backends


class Backend:
    """One library's pub/sub, seen through the same small set of methods.

    An instance lives in one benchmark process and owns what that process creates; the
    handles returned by :meth:`make_pub` / :meth:`make_sub` are opaque to the caller.
    ``recv`` and ``recv_into`` block up to ``RECV_TIMEOUT_MS`` with the library's own
    blocking primitive and return None when nothing came.
    """

    #: Row label.
    name = ""
    #: Footnote: how a subscriber waits for data.
    wait_note = ""
    #: Footnote: how a message is written and read.
    io_note = ""
    #: The module the adapter imports (a peer's is preloaded by the forkserver) and the
    #: distribution that installs it.
    import_name = ""
    dist_name = ""

    def __init__(self, run_dir: str, prefix: str) -> None:
        self.run_dir = run_dir
        self.prefix = prefix

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this backend cannot run here (None: it can)."""
        if cls.import_name:
            try:
                importlib.import_module(cls.import_name)
            except ImportError as e:
                return f"{cls.dist_name} not importable ({e}); pip install {cls.dist_name}"
        return None

    @classmethod
    def version(cls) -> str:
        """The version of the library measured."""
        return _dist_version(cls.dist_name) if cls.dist_name else ""

    def make_pub(self, topic: str, geo: Geometry) -> Any:
        """The publisher of ``topic``."""
        raise NotImplementedError

    def make_sub(self, topic: str, geo: Geometry) -> Any:
        """A subscriber of ``topic`` that sees everything published after this returns."""
        raise NotImplementedError

    def send(self, pub: Any, data: bytes | bytearray) -> None:
        """Publishes ``data`` (the caller may reuse ``data`` as soon as this returns)."""
        raise NotImplementedError

    def recv(self, sub: Any) -> bytes | None:
        """The next message, or None after the receive timeout."""
        raise NotImplementedError

    def recv_into(self, sub: Any, buf: bytearray) -> int | None:
        """Copies the next message into ``buf``; its size, or None after the timeout."""
        raise NotImplementedError

    #: Footnote: how an asyncio task waits for a message ("" : the library has no asyncio
    #: receive, and its async round-trip rows are n/a).
    async_note = ""

    def use_asyncio(self) -> None:
        """Called before any socket is made when the sockets serve asyncio tasks."""

    async def recv_async(self, sub: Any) -> bytes | None:
        """The next message for an asyncio task, or None after the receive timeout."""
        raise NotImplementedError

    async def send_async(self, pub: Any, data: bytes | bytearray) -> None:
        """Publishes ``data`` from an asyncio task."""
        self.send(pub, data)

    def recv_peek(self, sub: Any, tail: int) -> tuple[int, int, int] | None:
        """The next message read where the library hands it out, without copying it when
        the library can: (size, the u64 at 0, the u64 at ``tail``, or at 0 when
        ``tail`` < 0), or None after the timeout. This default copies (``recv``)."""
        msg = self.recv(sub)
        if msg is None:
            return None
        seq = HEADER.unpack_from(msg, 0)[0]
        return len(msg), seq, HEADER.unpack_from(msg, tail)[0] if tail >= 0 else seq

    def close(self) -> None:
        """Releases every socket this instance made."""


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


class MsgqBackend(Backend):
    """msgq through its upstream-compatible socket API, on one of its own backends."""

    name = "msgq"
    module_name = "msgq"
    wait_note = (
        "receive() looks for data for up to 10 µs (spin, then sched_yield) unless its last "
        "wait took 100 µs or more, then sleeps on a futex in the shared ring (setTimeout)"
    )
    io_note = (
        "send(bytearray) copies once into the ring (256 KiB and more into a chunk of the "
        "ring, reused once every reader read it); receive() copies once into bytes; "
        "view rows: receive_view() reads in the ring, overwrite checked on leaving")
    dist_name = DISTRIBUTION

    def __init__(self, run_dir: str, prefix: str) -> None:
        super().__init__(run_dir, prefix)

        self.module = msgq.select_backend(self.module_name)
        self.context = self.module.Context()
        self.sockets: list[Any] = []

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            if cls.module_name not in msgq.BACKENDS:
                return f"msgq has no {cls.module_name!r} backend (msgq.BACKENDS)"
            msgq.select_backend(cls.module_name)
        except Exception as e:  # noqa: BLE001 - any import failure means "skip"
            return f"cannot load: {e}"
        return None

    def segment_size(self, geo: Geometry) -> int:
        """The ring size this backend's queues are created with (chunks: msgq's own)."""
        return geo.segment_size

    def make_pub(self, topic: str, geo: Geometry) -> Any:
        sock = self.module.PubSocket()
        sock.connect(self.context, topic, self.segment_size(geo))
        self.sockets.append(sock)
        return sock

    def make_sub(self, topic: str, geo: Geometry) -> Any:
        sock = self.module.SubSocket()
        sock.connect(self.context, topic, b"127.0.0.1", False, self.segment_size(geo))
        sock.setTimeout(RECV_TIMEOUT_MS)
        self.sockets.append(sock)
        return sock

    def send(self, pub: Any, data: bytes | bytearray) -> None:
        pub.send(data)

    def recv(self, sub: Any) -> bytes | None:
        return sub.receive()

    async_note = (
        "await receive_async(): the task sleeps; one thread per event loop sleeps on the "
        "queue's futex and wakes the loop (call_soon_threadsafe)")

    async def recv_async(self, sub: Any) -> bytes | None:
        return await sub.receive_async()

    def recv_peek(self, sub: Any, tail: int) -> tuple[int, int, int] | None:
        unpack_from = HEADER.unpack_from
        try:
            with sub.receive_view() as view:
                if view is None:
                    return None
                seq = unpack_from(view, 0)[0]
                return len(view), seq, unpack_from(view, tail)[0] if tail >= 0 else seq
        except msgq.MessageOverwritten:
            return (-1, 0, 0)  # counted as a bad message (paced runs never lap a reader)

    def recv_into(self, sub: Any, buf: bytearray) -> int | None:
        if hasattr(sub, "receive_into"):
            return sub.receive_into(buf)
        data = sub.receive()  # a backend without receive_into: same result, one more copy
        if data is None:
            return None
        buf[: len(data)] = data
        return len(data)

    def close(self) -> None:
        for sock in self.sockets:
            close = getattr(sock, "close", None)
            if close is not None:
                close()
        self.sockets.clear()


class MsgqRingBackend(MsgqBackend):
    """msgq without chunks (``MSGQ_POOL=0``; chunks are the default): every message inline
    in the ring, for a comparison with the default in one run."""

    name = "msgq-ring"
    io_note = (
        "as msgq, with MSGQ_POOL=0: queues are created without chunks, so every message "
        "is copied inline into the ring (the plain ring of before)")

    def __init__(self, run_dir: str, prefix: str) -> None:
        # Read by whichever process creates the queue (each benchmark process is fresh).
        os.environ["MSGQ_POOL"] = "0"
        super().__init__(run_dir, prefix)

    def segment_size(self, geo: Geometry) -> int:
        """The plain ring's size: the larger ring of chunks would only walk more memory."""
        return geo.ring_segment_size


class MsgqZmqBackend(MsgqBackend):
    """msgq's own ZMQ backend (appears when ``"zmq" in msgq.BACKENDS``)."""

    name = "msgq-zmq"
    module_name = "zmq"
    wait_note = "receive() blocks in ZMQ (setTimeout)"
    io_note = (
        "msgq's socket API on its zmq backend (TCP to 127.0.0.1), high-water marks raised to "
        "100000 through MSGQ_ZMQ_SNDHWM/MSGQ_ZMQ_RCVHWM"
    )

    def __init__(self, run_dir: str, prefix: str) -> None:
        # Its default high-water mark (1000 messages) is below the 8 B / 1 KiB window.
        os.environ.setdefault("MSGQ_ZMQ_SNDHWM", str(PyzmqBackend.HWM))
        os.environ.setdefault("MSGQ_ZMQ_RCVHWM", str(PyzmqBackend.HWM))
        super().__init__(run_dir, prefix)


class MsgqZmqCurveBackend(MsgqZmqBackend):
    """msgq's ZMQ backend with CurveZMQ keys (``MSGQ_ZMQ_KEYS``): the cost of encryption
    and authentication beside the ``msgq-zmq`` rows."""

    name = "msgq-zmq-curve"
    io_note = MsgqZmqBackend.io_note + "; CurveZMQ keys (encrypted, authenticated)"

    def __init__(self, run_dir: str, prefix: str) -> None:
        super().__init__(run_dir, prefix)
        # One key directory per run, shared by its publisher and subscriber processes:
        # made aside and renamed into place (the first process to finish wins).
        self.keys = os.path.join(run_dir, "curve-keys")
        if not os.path.isdir(self.keys):
            scratch = os.path.join(run_dir, f"curve-keys.{os.getpid()}")
            create_keys(scratch, ["bench"])
            try:
                os.rename(scratch, self.keys)
            except OSError:
                shutil.rmtree(scratch, ignore_errors=True)

    def make_pub(self, topic: str, geo: Geometry) -> Any:
        sock = self.module.PubSocket(keys=self.keys)
        sock.connect(self.context, topic, geo.segment_size)
        self.sockets.append(sock)
        return sock

    def make_sub(self, topic: str, geo: Geometry) -> Any:
        sock = self.module.SubSocket(keys=self.keys, client="bench")
        sock.connect(self.context, topic, b"127.0.0.1", False, geo.segment_size)
        sock.setTimeout(RECV_TIMEOUT_MS)
        self.sockets.append(sock)
        return sock


class PyzmqBackend(Backend):
    """Raw pyzmq PUB/SUB over ``ipc://`` (the reference of the ratio column)."""

    name = "pyzmq"
    wait_note = "recv() blocks in libzmq (RCVTIMEO)"
    io_note = (
        "PUB/SUB over ipc://, SNDHWM/RCVHWM 100000, send(copy=True), recv() -> bytes, "
        "recv_into() for the recv_into rows"
    )
    HWM = 100_000
    import_name = "zmq"
    dist_name = "pyzmq"

    def __init__(self, run_dir: str, prefix: str) -> None:
        super().__init__(run_dir, prefix)

        self.zmq = zmq
        self.context = zmq.Context()
        self.asyncio = False
        self.sockets: list[Any] = []

    @classmethod
    def version(cls) -> str:
        return f"{zmq.__version__} (libzmq {zmq.zmq_version()})"

    def _address(self, topic: str) -> str:
        return f"ipc://{self.run_dir}/zmq-{topic}.ipc"

    async_note = "zmq.asyncio sockets: await recv() (the loop watches the socket's FD)"

    def use_asyncio(self) -> None:
        import zmq.asyncio  # only the asyncio rows need it

        self.context.term()
        self.context = zmq.asyncio.Context()
        self.asyncio = True

    async def recv_async(self, sub: Any) -> bytes | None:
        try:
            return await asyncio.wait_for(sub.recv(), RECV_TIMEOUT_MS / 1000)
        except asyncio.TimeoutError:
            return None

    async def send_async(self, pub: Any, data: bytes | bytearray) -> None:
        await pub.send(data, copy=True)

    def make_pub(self, topic: str, geo: Geometry) -> Any:
        zmq = self.zmq
        sock = self.context.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, self.HWM)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self._address(topic))
        self.sockets.append(sock)
        return sock

    def make_sub(self, topic: str, geo: Geometry) -> Any:
        zmq = self.zmq
        sock = self.context.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, self.HWM)
        if not self.asyncio:  # the asyncio rows time out with wait_for instead
            sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
        sock.setsockopt(zmq.RECONNECT_IVL, 5)  # the publisher binds after we connect
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self._address(topic))
        self.sockets.append(sock)
        return sock

    def send(self, pub: Any, data: bytes | bytearray) -> None:
        pub.send(data, copy=True)

    def recv(self, sub: Any) -> bytes | None:
        try:
            return sub.recv()
        except self.zmq.Again:
            return None

    def recv_into(self, sub: Any, buf: bytearray) -> int | None:
        try:
            return sub.recv_into(buf)
        except self.zmq.Again:
            return None

    def recv_peek(self, sub: Any, tail: int) -> tuple[int, int, int] | None:
        try:
            frame = sub.recv(copy=False)
        except self.zmq.Again:
            return None
        view = frame.buffer
        seq = HEADER.unpack_from(view, 0)[0]
        return len(view), seq, HEADER.unpack_from(view, tail)[0] if tail >= 0 else seq

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
        self.sockets.clear()
        self.context.term()


class KickmsgBackend(Backend):
    """kickmsg pub/sub topics (per-subscriber rings over a shared slot pool)."""

    name = "kickmsg"
    wait_note = "Subscriber.receive(timeout) blocks on a futex, GIL released"
    io_note = (
        "send(bytes) below 64 KiB, allocate()+memoryview+publish() from 64 KiB; "
        "receive() -> bytes, receive_view() copied into the buffer for recv_into"
    )
    import_name = dist_name = "kickmsg"

    def __init__(self, run_dir: str, prefix: str) -> None:
        super().__init__(run_dir, prefix)
        import kickmsg  # an optional peer: imported only when it is measured

        self.kickmsg = kickmsg
        self.node = kickmsg.Node(f"bench{os.getpid()}", prefix)
        self.topics: list[str] = []

    def _config(self, geo: Geometry) -> Any:
        cfg = self.kickmsg.Config()
        ring = _pow2_at_least(geo.queue_depth)
        cfg.max_subscribers = max(geo.subs, 1)
        cfg.sub_ring_capacity = ring
        # kickmsg's sizing advice: pool_size = sub_ring_capacity * max_subscribers * 2 (a
        # ring entry keeps its slot until overwritten, so ring * subs alone runs dry).
        cfg.pool_size = 2 * ring * max(geo.subs, 1)
        cfg.max_payload_size = max(geo.size, HEADER.size)
        return cfg

    def make_pub(self, topic: str, geo: Geometry) -> Any:
        pub = self.node.advertise_or_join(topic, self._config(geo))
        self.topics.append(topic)
        return pub

    def make_sub(self, topic: str, geo: Geometry) -> Any:
        return self.node.subscribe_or_create(topic, self._config(geo))

    def send(self, pub: Any, data: bytes | bytearray) -> None:
        n = len(data)
        if n < KICKMSG_ZERO_COPY_FROM:
            pub.send(bytes(data))
            return
        slot = pub.allocate()
        if slot is None:  # pool exhausted: should not happen while paced
            deadline = time.monotonic() + STALL_TIMEOUT_S
            while slot is None:
                if time.monotonic() >= deadline:
                    raise BlockingIOError("kickmsg slot pool stayed exhausted")
                time.sleep(PACE_SLEEP_S)
                slot = pub.allocate()
        view = memoryview(slot)
        view[:n] = data
        view.release()
        slot.publish(n)

    def recv(self, sub: Any) -> bytes | None:
        return sub.receive(RECV_TIMEOUT_MS / 1000)

    def recv_peek(self, sub: Any, tail: int) -> tuple[int, int, int] | None:
        sample = sub.receive_view(RECV_TIMEOUT_MS / 1000)
        if sample is None:
            return None
        with sample:
            view = memoryview(sample)
            seq = HEADER.unpack_from(view, 0)[0]
            result = (view.nbytes, seq, HEADER.unpack_from(view, tail)[0] if tail >= 0 else seq)
            view.release()
        return result

    def recv_into(self, sub: Any, buf: bytearray) -> int | None:
        sample = sub.receive_view(RECV_TIMEOUT_MS / 1000)
        if sample is None:
            return None
        with sample:
            view = memoryview(sample)
            n = view.nbytes
            buf[:n] = view
            view.release()
        return n

    def close(self) -> None:
        for topic in self.topics:
            try:
                self.node.unlink_topic(topic)
            except Exception:  # noqa: BLE001, S110 - already gone
                pass
        self.topics.clear()


class Iceoryx2Backend(Backend):
    """iceoryx2 publish-subscribe of ``Slice[c_uint8]``, woken by an event service."""

    name = "iceoryx2"
    wait_note = (
        "its pub/sub has no blocking receive: the publisher calls Notifier.notify() after "
        "each send and the subscriber blocks in Listener.timed_wait() (iceoryx2's "
        "event-based pattern)"
    )
    io_note = (
        "loan_slice_uninit()+memmove+send(); receive() then ctypes.string_at(payload_ptr) "
        "-> bytes (memmove into the buffer for recv_into)"
    )
    import_name = dist_name = "iceoryx2"

    def __init__(self, run_dir: str, prefix: str) -> None:
        super().__init__(run_dir, prefix)
        import iceoryx2  # an optional peer: imported only when it is measured

        self.iox = iceoryx2
        iceoryx2.set_log_level_from_env_or(iceoryx2.LogLevel.Error)
        self.node = iceoryx2.NodeBuilder.new().create(iceoryx2.ServiceType.Ipc)
        self.ports: list[Any] = []
        self.services: list[Any] = []
        self._source: Any = None
        self._source_addr = 0
        self._target: Any = None
        self._target_addr = 0

    def _open(self, topic: str, geo: Geometry) -> tuple[Any, Any]:
        iox = self.iox
        name = iox.ServiceName.new(f"{self.prefix}/{topic}")
        pubsub = (
            self.node.service_builder(name)
            .publish_subscribe(iox.Slice[ctypes.c_uint8])
            .max_publishers(1)
            .max_subscribers(max(geo.subs, 1))
            .subscriber_max_buffer_size(geo.queue_depth)
            .history_size(0)
            .open_or_create()
        )
        event = self.node.service_builder(name).event().open_or_create()
        self.services += [pubsub, event]
        return pubsub, event

    def make_pub(self, topic: str, geo: Geometry) -> Any:
        pubsub, event = self._open(topic, geo)
        publisher = pubsub.publisher_builder().initial_max_slice_len(max(geo.size, 8)).create()
        notifier = event.notifier_builder().create()
        self.ports += [publisher, notifier]
        return publisher, notifier

    def make_sub(self, topic: str, geo: Geometry) -> Any:
        pubsub, event = self._open(topic, geo)
        subscriber = pubsub.subscriber_builder().buffer_size(geo.queue_depth).create()
        listener = event.listener_builder().create()
        self.ports += [subscriber, listener]
        return subscriber, listener

    def _source_of(self, data: bytes | bytearray) -> Any:
        if isinstance(data, bytes):
            return data
        if data is not self._source:  # cache the address of the caller's reused buffer
            self._source = data
            self._source_addr = ctypes.addressof((ctypes.c_char * len(data)).from_buffer(data))
        return self._source_addr

    def send(self, pub: Any, data: bytes | bytearray) -> None:
        publisher, notifier = pub
        n = len(data)
        sample = publisher.loan_slice_uninit(n)
        ctypes.memmove(sample.payload_ptr, self._source_of(data), n)
        sample.assume_init().send()
        notifier.notify()

    def _receive(self, sub: Any) -> Any:
        subscriber, listener = sub
        sample = subscriber.receive()
        if sample is not None:
            return sample
        # A wake-up may be stale (its sample was taken already): wait out the timeout.
        deadline = time.monotonic() + RECV_TIMEOUT_MS / 1000
        while sample is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            listener.timed_wait(self.iox.Duration.from_secs_f64(remaining))
            sample = subscriber.receive()
        return sample

    def recv(self, sub: Any) -> bytes | None:
        sample = self._receive(sub)
        if sample is None:
            return None
        data = ctypes.string_at(sample.payload_ptr, sample.header.number_of_elements)
        sample.delete()
        return data

    def recv_peek(self, sub: Any, tail: int) -> tuple[int, int, int] | None:
        sample = self._receive(sub)
        if sample is None:
            return None
        n = sample.header.number_of_elements
        seq = HEADER.unpack(ctypes.string_at(sample.payload_ptr, HEADER.size))[0]
        last = seq if tail < 0 else HEADER.unpack(
            ctypes.string_at(sample.payload_ptr + tail, HEADER.size))[0]
        sample.delete()
        return n, seq, last

    def recv_into(self, sub: Any, buf: bytearray) -> int | None:
        sample = self._receive(sub)
        if sample is None:
            return None
        n = sample.header.number_of_elements
        if n > len(buf):
            sample.delete()
            raise ValueError(f"message of {n} bytes does not fit a {len(buf)}-byte buffer")
        if buf is not self._target:
            self._target = buf
            self._target_addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
        ctypes.memmove(self._target_addr, sample.payload_ptr, n)
        sample.delete()
        return n

    def close(self) -> None:
        for port in reversed(self.ports):
            port.delete()
        self.ports.clear()
        self.services.clear()


#: Backend name -> adapter class.
BACKENDS: dict[str, type[Backend]] = {
    cls.name: cls
    for cls in (MsgqBackend, MsgqRingBackend, MsgqZmqBackend, MsgqZmqCurveBackend, PyzmqBackend,
                KickmsgBackend,
                Iceoryx2Backend)
}
