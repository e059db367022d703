"""Throughput and round-trip benchmark of msgq against its peers, printed as one table.

Run ``python -m msgq.bench`` (or the ``msgq-bench`` command); ``--help`` lists the options.

Every publisher and subscriber runs in a process of its own (multiprocessing, "forkserver"
start method where available, else "spawn"); sockets are created inside those processes.
What is measured:

* **throughput** — one publisher, N subscribers, fixed payload size, for a fixed time.
  Each payload carries its sequence number in its first and last 8 bytes; subscribers
  check both and count gaps (``drops``). Publishing is *paced* the same way for every
  backend: every subscriber writes how many messages it has received into its own cache
  line of a shared array, and the publisher never runs more than a window of W messages
  ahead of the slowest subscriber (W is chosen per payload so the window fits every
  queue), so nothing should ever be dropped. Hello messages first make sure every
  subscriber is connected (ZMQ's slow joiners), then untimed warm-up traffic runs before
  the timed part, which starts and ends with marker messages.
* **recv_into** — the same, with subscribers copying into one preallocated buffer.
* **round trip** — process A publishes on "ping", process B receives and republishes on
  "pong"; A times each round trip. Both pinned to one CPU, then to two CPUs.

Backends are small adapter classes with the same methods (``make_pub``, ``make_sub``,
``send``, ``recv``, ``recv_into``, ``close``): msgq itself (and ``msgq-zmq`` when msgq
has a ``zmq`` backend), raw pyzmq over ``ipc://``, kickmsg and iceoryx2. Peers that are
not importable are skipped with a note.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import queue
import shutil
import statistics
import struct
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.context import BaseContext
from typing import Any

from msgq.cli.output import number

KIB = 1024
MIB = 1024 * KIB

DEFAULT_SIZES: tuple[int, ...] = (8, KIB, 64 * KIB, MIB)
DEFAULT_SUBS: tuple[int, ...] = (1, 4)
#: Payload sizes of the recv_into rows and of the round-trip rows (kept if in --sizes).
INTO_SIZES: tuple[int, ...] = (64 * KIB, MIB)
RTT_SIZES: tuple[int, ...] = (8, 64 * KIB)
#: Every backend the benchmark knows, in table order; pyzmq is the reference of the ratios.
BACKEND_ORDER: tuple[str, ...] = ("msgq", "msgq-zmq", "pyzmq", "kickmsg", "iceoryx2")
REFERENCE = "pyzmq"
TESTS: tuple[str, ...] = ("throughput", "recv_into", "rtt")

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


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Geometry:
    """Sizes every backend derives its queue settings from, for one payload size.

    ``window`` is the pacing window W (messages); ``segment_size`` is the msgq ring size:
    one and a half windows of messages (at least the 10 MiB default), so a paced
    subscriber is never overtaken — the same in-flight room the peers get (kickmsg and
    iceoryx2 queues of W + 16 entries). A larger ring only walks more memory per pass,
    which costs msgq its cache hits (4 windows: 64 KiB x 1 sub ran at half the speed).
    """

    size: int
    subs: int
    window: int
    segment_size: int

    @classmethod
    def for_payload(cls, size: int, subs: int) -> Geometry:
        """The geometry of ``subs`` subscribers of ``size``-byte payloads."""
        window = max(MIN_WINDOW, min(MAX_WINDOW, INFLIGHT_BUDGET // max(size, 1)))
        ring_bytes = int(1.5 * window * (size + 64))
        segment = max(10 * MIB, -(-ring_bytes // MIB) * MIB)
        return cls(size=size, subs=subs, window=window, segment_size=segment)

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
        "receive() looks for data for up to 10 µs (spin, then sched_yield), then sleeps on "
        "a futex in the shared ring (setTimeout)"
    )
    io_note = "send(bytearray) copies once into the ring; receive() copies once into bytes"
    dist_name = "msgq"

    def __init__(self, run_dir: str, prefix: str) -> None:
        super().__init__(run_dir, prefix)
        import msgq

        self.module = msgq.select_backend(self.module_name)
        self.context = self.module.Context()
        self.sockets: list[Any] = []

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            import msgq

            if cls.module_name not in msgq.BACKENDS:
                return f"msgq has no {cls.module_name!r} backend (msgq.BACKENDS)"
            msgq.select_backend(cls.module_name)
        except Exception as e:  # noqa: BLE001 - any import failure means "skip"
            return f"cannot load: {e}"
        return None

    def make_pub(self, topic: str, geo: Geometry) -> Any:
        sock = self.module.PubSocket()
        sock.connect(self.context, topic, geo.segment_size)
        self.sockets.append(sock)
        return sock

    def make_sub(self, topic: str, geo: Geometry) -> Any:
        sock = self.module.SubSocket()
        sock.connect(self.context, topic, b"127.0.0.1", False, geo.segment_size)
        sock.setTimeout(RECV_TIMEOUT_MS)
        self.sockets.append(sock)
        return sock

    def send(self, pub: Any, data: bytes | bytearray) -> None:
        pub.send(data)

    def recv(self, sub: Any) -> bytes | None:
        return sub.receive()

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
        import zmq

        self.zmq = zmq
        self.context = zmq.Context()
        self.sockets: list[Any] = []

    @classmethod
    def version(cls) -> str:
        import zmq

        return f"{zmq.__version__} (libzmq {zmq.zmq_version()})"

    def _address(self, topic: str) -> str:
        return f"ipc://{self.run_dir}/zmq-{topic}.ipc"

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
        import kickmsg

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
        import iceoryx2

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
    for cls in (MsgqBackend, MsgqZmqBackend, PyzmqBackend, KickmsgBackend, Iceoryx2Backend)
}


# --------------------------------------------------------------------------- shared board

#: int64 cells per line: one cache line per participant, so counters never share a line.
LINE = 8
# Line 0 (control): when the timed stream started, how many messages it has, abort flag.
START_NS, TOTAL, STOP = 0, 1, 2
# Line 1 + i (participant i): ready to receive, last hello seen, stream messages received
# (the next sequence number due), done.
CONNECTED, ACK, PROGRESS, DONE = 0, 1, 2, 3


class Board:
    """The shared counters of one measurement, in an anonymous shared mapping.

    Plain int64 stores and loads (aligned, so never torn on the platforms we run on);
    each value has a single writer.
    """

    def __init__(self, ctx: BaseContext, participants: int) -> None:
        self.participants = participants
        self.cells = ctx.RawArray(ctypes.c_int64, LINE * (participants + 1))
        self.cells[TOTAL] = -1
        for i in range(participants):
            self.cells[self.at(i, ACK)] = -1

    @staticmethod
    def at(participant: int, field_index: int) -> int:
        """Index of ``field_index`` of ``participant`` in :attr:`cells`."""
        return LINE * (participant + 1) + field_index

    def put(self, participant: int, field_index: int, value: int) -> None:
        """Sets ``field_index`` of ``participant``."""
        self.cells[self.at(participant, field_index)] = value

    def all_at_least(self, field_index: int, value: int, who: Iterable[int]) -> bool:
        """Whether every participant in ``who`` has ``field_index`` >= ``value``."""
        cells = self.cells
        return all(cells[self.at(i, field_index)] >= value for i in who)

    def wait_all(self, field_index: int, value: int, who: Sequence[int], timeout: float) -> bool:
        """Waits (sleeping) until every participant in ``who`` reached ``value``."""
        deadline = time.monotonic() + timeout
        while not self.all_at_least(field_index, value, who):
            if self.cells[STOP] or time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)
        return True


# --------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class Job:
    """One measurement: what every process of it needs to know."""

    kind: str  # "throughput", "recv_into" or "rtt"
    backend: str
    geo: Geometry
    duration: float
    topic: str
    run_dir: str
    prefix: str
    cpus: tuple[int, ...] = ()  # rtt: CPU of A, CPU of B

    @property
    def subs(self) -> int:
        return self.geo.subs


class NotApplicableError(Exception):
    """A backend cannot set up this row (e.g. a size it does not take): shown as n/a."""


def _setup(make: Callable[[str, Geometry], Any], topic: str, geo: Geometry) -> Any:
    """``make(topic, geo)``, with any failure turned into :class:`NotApplicableError`."""
    try:
        return make(topic, geo)
    except Exception as e:  # noqa: BLE001 - whatever the library raises
        raise NotApplicableError(f"{type(e).__name__}: {e}") from e


def _child_backend(job: Job) -> Backend:
    os.environ["MSGQ_PREFIX"] = job.prefix
    return BACKENDS[job.backend](job.run_dir, job.prefix)


def _report(results: Any, role: str, body: Callable[[], dict[str, Any]]) -> None:
    """Runs ``body`` and puts its result (or the error) on ``results`` exactly once."""
    try:
        out = body()
        out["role"] = role
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
        text = str(e) if isinstance(e, NotApplicableError) else f"{type(e).__name__}: {e}"
        out = {
            "role": role,
            "error": text,
            "trace": traceback.format_exc(),
            "not_applicable": isinstance(e, NotApplicableError),
        }
    results.put(out)


def _pace_wait(board: Board, subs: range, seq: int, window: int) -> int:
    """Blocks until ``seq`` is inside the window of the slowest subscriber; the new limit."""
    cells = board.cells
    lines = [Board.at(i, PROGRESS) for i in subs]
    allowed = min([cells[i] for i in lines]) + window
    spins = 0
    deadline = 0.0
    while seq >= allowed:
        if cells[STOP]:
            raise RuntimeError("stopped by the parent")
        if spins < PACE_YIELDS:
            os.sched_yield()
        else:
            if not deadline:
                deadline = time.monotonic() + STALL_TIMEOUT_S
            elif time.monotonic() >= deadline:
                raise TimeoutError(f"a subscriber made no progress for {STALL_TIMEOUT_S:.0f} s")
            time.sleep(PACE_SLEEP_S)
        spins += 1
        allowed = min([cells[i] for i in lines]) + window
    return allowed


def _handshake(backend: Backend, pub: Any, buf: bytearray, board: Board, subs: range) -> int:
    """Sends hello messages until every subscriber has received the latest one.

    Delivery is in order, so once every subscriber acknowledged hello k nothing is queued
    any more and the stream starts on empty queues. ZMQ's slow joiners lose the first
    hellos; shared-memory subscribers acknowledge the first. Returns how many were sent.
    """
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    size = len(buf)
    k = 0
    while True:
        seq = HELLO_BASE + k
        HEADER.pack_into(buf, 0, seq)
        if size >= 2 * HEADER.size:
            HEADER.pack_into(buf, size - HEADER.size, seq)
        backend.send(pub, buf)
        if board.wait_all(ACK, k, subs, 0.005):
            return k + 1
        if board.cells[STOP] or time.monotonic() >= deadline:
            raise TimeoutError("subscribers did not acknowledge the hello messages")
        k += 1


def _publisher_main(job: Job, board: Board, results: Any) -> None:
    """The publisher of a throughput/recv_into measurement (participant ``job.subs``)."""

    def body() -> dict[str, Any]:
        backend = _child_backend(job)
        try:
            return _publish(job, board, backend)
        finally:
            backend.close()

    _report(results, "pub", body)


def _publish(job: Job, board: Board, backend: Backend) -> dict[str, Any]:
    subs = range(job.subs)
    if not board.wait_all(CONNECTED, 1, subs, STARTUP_TIMEOUT_S):
        raise TimeoutError("subscribers did not connect")
    pub = _setup(backend.make_pub, job.topic, job.geo)
    size = job.geo.size
    window = job.geo.window
    buf = bytearray(size)
    hellos = _handshake(backend, pub, buf, board, subs)

    tail = size - HEADER.size if size >= 2 * HEADER.size else -1
    pack_into = HEADER.pack_into
    send = backend.send
    clock = time.monotonic_ns
    cells = board.cells

    def stream(
        seq: int, allowed: int, until_ns: int, min_seq: int = 0, cap_ns: int = 0
    ) -> tuple[int, int]:
        """Publishes seq, seq + 1, ... (paced) until ``until_ns`` and, within ``cap_ns``,
        up to ``min_seq``; returns the next seq and pacing limit."""
        while (seq & 15) or clock() < until_ns or (seq < min_seq and clock() < cap_ns):
            if seq >= allowed:
                allowed = _pace_wait(board, subs, seq, window)
            pack_into(buf, 0, seq)
            if tail > 0:
                pack_into(buf, tail, seq)
            send(pub, buf)
            seq += 1
        return seq, allowed

    def marker(seq: int, value: int) -> None:
        _pace_wait(board, subs, seq, window)
        pack_into(buf, 0, value)
        if tail > 0:
            pack_into(buf, tail, value)
        send(pub, buf)

    # Untimed warm-up traffic first: caches, CPU clocks and, for large payloads, one pass
    # over a fresh msgq ring (its pages fault in on first use, in every process).
    began = clock()
    warm_s = max(WARM_MIN_S, job.duration * WARM_FRACTION)
    ring_pass = -(-job.geo.segment_size // size) if size >= WARM_RING_FROM else 0
    seq, allowed = stream(
        0, window, began + int(warm_s * 1e9), ring_pass, began + int(WARM_MAX_S * 1e9)
    )
    timed_from = seq
    start = clock()
    cells[START_NS] = start
    marker(seq, START_SEQ)
    seq, allowed = stream(seq, allowed, start + int(job.duration * 1e9))
    end = clock()
    cells[TOTAL] = seq
    marker(seq, END_SEQ)
    # Keep the publisher open until every subscriber is done (ZMQ would drop the rest).
    finished = board.wait_all(DONE, 1, subs, STALL_TIMEOUT_S + 5)
    return {
        "sent": seq,
        "timed": seq - timed_from,
        "elapsed_ns": end - start,
        "hellos": hellos,
        "subs_finished": finished,
    }


def _subscriber_main(job: Job, board: Board, index: int, results: Any) -> None:
    """Subscriber ``index`` of a throughput/recv_into measurement."""

    def body() -> dict[str, Any]:
        backend = _child_backend(job)
        try:
            return _subscribe(job, board, index, backend)
        finally:
            board.put(index, DONE, 1)
            backend.close()

    _report(results, "sub", body)


def _subscribe(job: Job, board: Board, index: int, backend: Backend) -> dict[str, Any]:
    sub = _setup(backend.make_sub, job.topic, job.geo)
    board.put(index, CONNECTED, 1)
    size = job.geo.size
    into = job.kind == "recv_into"
    buf = bytearray(size)
    tail = size - HEADER.size if size >= 2 * HEADER.size else -1
    unpack_from = HEADER.unpack_from
    recv = backend.recv
    recv_into = backend.recv_into
    cells = board.cells
    progress_at = Board.at(index, PROGRESS)
    ack_at = Board.at(index, ACK)
    clock = time.monotonic_ns

    expected = 0  # next sequence number due
    received = drops = bad = 0
    ended_ns = 0
    last_ns = clock()
    max_gap_ns = 0
    while True:
        if into:
            n = recv_into(sub, buf)
            msg: Any = buf if n is not None else None
        else:
            msg = recv(sub)
            n = len(msg) if msg is not None else None
        if msg is None:
            total = cells[TOTAL]
            if cells[STOP]:
                raise RuntimeError("stopped by the parent (timeout)")
            if clock() - last_ns > STALL_TIMEOUT_S * 1e9:
                if total >= 0:
                    break  # the end marker was lost: count what is missing below
                raise TimeoutError(f"no message for {STALL_TIMEOUT_S:.0f} s")
            continue
        now = clock()
        if now - last_ns > max_gap_ns and received:
            max_gap_ns = now - last_ns  # longest wait for a timed message (diagnostics)
        last_ns = now
        seq = unpack_from(msg, 0)[0]
        if n != size or (tail > 0 and unpack_from(msg, tail)[0] != seq):
            bad += 1  # wrong size or torn payload
            continue
        if seq >= HELLO_BASE:
            if seq == END_SEQ:
                ended_ns = clock()
                break
            if seq == START_SEQ:
                received = 0  # the timed part of the stream starts here
            else:
                cells[ack_at] = seq - HELLO_BASE
            continue
        if seq != expected:
            if seq < expected:
                bad += 1  # duplicate or out of order
                continue
            drops += seq - expected
        expected = seq + 1
        received += 1
        cells[progress_at] = expected
    if not ended_ns:
        ended_ns = clock()
    total = cells[TOTAL]
    if total > expected:
        drops += total - expected
    out: dict[str, Any] = {
        "received": received,
        "drops": drops,
        "bad": bad,
        "elapsed_ns": ended_ns - cells[START_NS],
        "max_gap_ns": max_gap_ns,
    }
    resets = getattr(sub, "resets", None)
    if isinstance(resets, int):
        out["resets"] = resets
    lost = getattr(sub, "lost", None)
    if isinstance(lost, int):
        out["lost"] = lost
    return out


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def _ping_main(job: Job, board: Board, results: Any) -> None:
    """Process A of a round trip (participant 0): times ping -> pong."""

    def body() -> dict[str, Any]:
        _pin(job.cpus[0])
        backend = _child_backend(job)
        try:
            return _ping(job, board, backend)
        finally:
            board.cells[STOP] = 1
            backend.close()

    _report(results, "ping", body)


def _ping(job: Job, board: Board, backend: Backend) -> dict[str, Any]:
    sub = _setup(backend.make_sub, f"{job.topic}-pong", job.geo)
    board.put(0, CONNECTED, 1)
    if not board.wait_all(CONNECTED, 1, [1], STARTUP_TIMEOUT_S):
        raise TimeoutError("the pong process did not connect")
    pub = _setup(backend.make_pub, f"{job.topic}-ping", job.geo)
    size = job.geo.size
    buf = bytearray(size)
    tail = size - HEADER.size if size >= 2 * HEADER.size else -1
    pack_into = HEADER.pack_into
    unpack_from = HEADER.unpack_from
    send = backend.send
    recv = backend.recv

    def stamp(seq: int) -> None:
        pack_into(buf, 0, seq)
        if tail > 0:
            pack_into(buf, tail, seq)

    def await_echo(seq: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            msg = recv(sub)
            if msg is not None and unpack_from(msg, 0)[0] == seq:
                if len(msg) != size or (tail > 0 and unpack_from(msg, tail)[0] != seq):
                    raise ValueError(f"round trip {seq}: wrong size or torn payload")
                return True
            if time.monotonic() >= deadline:
                return False

    # Hellos until one comes back: then every queue in between is connected and empty.
    start = time.monotonic()
    k = 0
    while True:
        stamp(HELLO_BASE + k)
        send(pub, buf)
        if await_echo(HELLO_BASE + k, 0.05):
            break
        if time.monotonic() - start > STARTUP_TIMEOUT_S:
            raise TimeoutError("no echo from the pong process")
        k += 1

    # Untimed round trips first; for large payloads at least one pass over a fresh msgq
    # ring, as in the throughput runs.
    untimed = RTT_WARMUP
    if size >= WARM_RING_FROM:
        untimed = max(untimed, -(-job.geo.segment_size // size) + 1)
    samples: list[int] = []
    clock = time.perf_counter_ns
    deadline = time.monotonic() + job.duration
    seq = 0
    while seq < untimed + RTT_MAX_SAMPLES:
        stamp(seq)
        t0 = clock()
        send(pub, buf)
        while True:
            msg = recv(sub)
            if msg is not None and unpack_from(msg, 0)[0] == seq:
                break
            if msg is None and clock() - t0 > STALL_TIMEOUT_S * 1e9:
                raise TimeoutError(f"round trip {seq}: no echo for {STALL_TIMEOUT_S:.0f} s")
        t1 = clock()
        if len(msg) != size or (tail > 0 and unpack_from(msg, tail)[0] != seq):
            raise ValueError(f"round trip {seq}: wrong size or torn payload")
        if seq >= untimed:
            samples.append(t1 - t0)
            if (seq & 63) == 0 and time.monotonic() >= deadline:
                break
        seq += 1
    stamp(END_SEQ)
    send(pub, buf)
    await_echo(END_SEQ, 1.0)  # pong keeps its publisher until it echoed the end marker
    samples.sort()
    return {
        "samples": len(samples),
        "p50_ns": _percentile(samples, 50),
        "p99_ns": _percentile(samples, 99),
        "min_ns": samples[0],
    }


def _pong_main(job: Job, board: Board, results: Any) -> None:
    """Process B of a round trip (participant 1): republishes every ping as a pong."""

    def body() -> dict[str, Any]:
        _pin(job.cpus[1])
        backend = _child_backend(job)
        try:
            sub = _setup(backend.make_sub, f"{job.topic}-ping", job.geo)
            pub = _setup(backend.make_pub, f"{job.topic}-pong", job.geo)
            board.put(1, CONNECTED, 1)
            echoed = 0
            while True:
                msg = backend.recv(sub)
                if msg is None:
                    if board.cells[STOP]:
                        break
                    continue
                backend.send(pub, msg)
                echoed += 1
                if HEADER.unpack_from(msg, 0)[0] == END_SEQ:
                    break
            return {"echoed": echoed}
        finally:
            backend.close()

    _report(results, "pong", body)


def _percentile(sorted_values: Sequence[int], pct: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return float(sorted_values[int(rank) - 1])


# --------------------------------------------------------------------------- parent side


@dataclass
class Measurement:
    """The outcome of one run of one (test, payload, subs/cpus, backend) cell."""

    kind: str
    backend: str
    size: int
    n: int  # subscribers (throughput, recv_into) or CPUs (rtt)
    msgs_per_s: float | None = None
    mb_per_s: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    drops: int = 0
    bad: int = 0
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class Runner:
    """Starts the processes of each measurement and turns their reports into results."""

    def __init__(self, ctx: BaseContext, run_dir: str, prefix: str, duration: float) -> None:
        self.ctx = ctx
        self.run_dir = run_dir
        self.prefix = prefix
        self.duration = duration
        self.counter = 0

    def _job(self, kind: str, backend: str, geo: Geometry, cpus: tuple[int, ...] = ()) -> Job:
        self.counter += 1
        topic = f"b{self.counter}"
        return Job(kind, backend, geo, self.duration, topic, self.run_dir, self.prefix, cpus)

    def _run(
        self,
        job: Job,
        targets: list[tuple[Callable[..., None], tuple[Any, ...]]],
        board: Board,
        results: Any,
    ) -> list[dict[str, Any]]:
        procs = [
            self.ctx.Process(target=target, args=(job, board, *extra, results), daemon=True)
            for target, extra in targets
        ]
        for proc in procs:
            proc.start()
        reports: list[dict[str, Any]] = []
        deadline = time.monotonic() + job.duration + JOB_SLACK_S
        while len(reports) < len(procs):
            try:
                report = results.get(timeout=0.2)
            except queue.Empty:
                pass
            else:
                reports.append(report)
                if "error" in report:
                    board.cells[STOP] = 1  # the others give up instead of waiting
                continue
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() >= deadline:
                why = f"a process died (exit code {dead[0].exitcode})" if dead else "timed out"
                board.cells[STOP] = 1
                reports.append({"role": "parent", "error": why})
                break
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        results.close()
        return reports

    def throughput(self, kind: str, backend: str, size: int, subs: int) -> Measurement:
        """One paced throughput (or recv_into) measurement."""
        job = self._job(kind, backend, Geometry.for_payload(size, subs))
        board = Board(self.ctx, subs + 1)
        results = self.ctx.Queue()
        targets: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            (_subscriber_main, (i,)) for i in range(subs)
        ]
        targets.append((_publisher_main, ()))
        reports = self._run(job, targets, board, results)
        m = Measurement(kind, backend, size, subs)
        errors = [r for r in reports if "error" in r]
        if errors:
            return _failed(m, errors)
        sub_reports = [r for r in reports if r["role"] == "sub"]
        pub = next(r for r in reports if r["role"] == "pub")
        m.drops = sum(r["drops"] for r in sub_reports)
        m.bad = sum(r["bad"] for r in sub_reports)
        rates = [r["received"] / (r["elapsed_ns"] / 1e9) for r in sub_reports if r["elapsed_ns"]]
        m.msgs_per_s = statistics.fmean(rates) if rates else 0.0
        m.mb_per_s = m.msgs_per_s * size / 1e6
        m.detail = {
            "sent": pub["sent"],
            "timed": pub["timed"],
            "publisher_msgs_per_s": pub["timed"] / (pub["elapsed_ns"] / 1e9),
            "received": [r["received"] for r in sub_reports],
            "window": job.geo.window,
            "hellos": pub["hellos"],
            "max_gap_ms": max(r["max_gap_ns"] for r in sub_reports) / 1e6,
        }
        for key in ("resets", "lost"):
            values = [r[key] for r in sub_reports if key in r]
            if values:
                m.detail[key] = sum(values)
        return m

    def round_trip(self, backend: str, size: int, cpus: tuple[int, int]) -> Measurement:
        """One ping-pong measurement with A on ``cpus[0]`` and B on ``cpus[1]``."""
        job = self._job("rtt", backend, Geometry.for_payload(size, 1), cpus)
        board = Board(self.ctx, 2)
        results = self.ctx.Queue()
        reports = self._run(job, [(_ping_main, ()), (_pong_main, ())], board, results)
        m = Measurement("rtt", backend, size, len(set(cpus)))
        errors = [r for r in reports if "error" in r]
        if errors:
            return _failed(m, errors)
        ping = next(r for r in reports if r["role"] == "ping")
        m.p50_us = ping["p50_ns"] / 1000
        m.p99_us = ping["p99_ns"] / 1000
        m.detail = {"samples": ping["samples"], "min_us": ping["min_ns"] / 1000, "cpus": cpus}
        return m


def _failed(m: Measurement, errors: list[dict[str, Any]]) -> Measurement:
    """``m`` marked with the first error reported (an n/a setup failure wins)."""
    first = next((e for e in errors if e.get("not_applicable")), errors[0])
    m.error = first["error"]
    m.detail["not_applicable"] = bool(first.get("not_applicable"))
    m.detail["trace"] = first.get("trace", "")
    return m


def _median_of(runs: list[Measurement]) -> Measurement:
    """The run that stands for a cell: the median run (by msgs/s or p50), drops summed."""
    good = [r for r in runs if r.error is None]
    if not good:
        return runs[0]
    if good[0].kind == "rtt":
        out = Measurement("rtt", good[0].backend, good[0].size, good[0].n)
        out.p50_us = statistics.median(r.p50_us or 0.0 for r in good)
        out.p99_us = statistics.median(r.p99_us or 0.0 for r in good)
        out.detail = {"samples": sum(r.detail.get("samples", 0) for r in good)}
    else:
        ordered = sorted(good, key=lambda r: r.msgs_per_s or 0.0)
        pick = ordered[(len(ordered) - 1) // 2]
        out = Measurement(
            pick.kind,
            pick.backend,
            pick.size,
            pick.n,
            pick.msgs_per_s,
            pick.mb_per_s,
            detail=dict(pick.detail),
        )
    out.drops = sum(r.drops for r in good)
    out.bad = sum(r.bad for r in good)
    for key in ("resets", "lost"):
        if any(key in r.detail for r in good):
            out.detail[key] = sum(r.detail.get(key, 0) for r in good)
    failed = [r for r in runs if r.error is not None]
    if failed:
        out.detail["failed_runs"] = len(failed)
        out.detail["first_error"] = failed[0].error
    return out


# --------------------------------------------------------------------------- table


def _fmt_size(size: int) -> str:
    if size >= MIB and size % MIB == 0:
        return f"{size // MIB} MiB"
    if size >= KIB and size % KIB == 0:
        return f"{size // KIB} KiB"
    return f"{size} B"


def _fmt_num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return ""
    return f"{value:,.{digits}f}"


class Notes:
    """Numbered footnotes, one number per distinct text."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"


TEST_LABEL = {"throughput": "throughput", "recv_into": "recv_into", "rtt": "round trip"}


def render_table(
    cells: dict[tuple[str, int, int], dict[str, Measurement]],
    backends: Sequence[str],
    skipped: dict[str, str],
    geometry_note: str,
) -> str:
    """The one table: a row per (test, payload, subs/CPUs, backend), then footnotes."""
    notes = Notes()
    header = [
        "test",
        "payload",
        "subs/cpus",
        "backend",
        "msgs/s",
        "MB/s",
        "p50 µs",
        "p99 µs",
        "drops",
        "× pyzmq",
    ]
    rows: list[list[str] | None] = []
    last_kind = None
    for (kind, size, n), by_backend in cells.items():
        if last_kind is not None:
            rows.append(None)  # separator
        last_kind = kind
        ref = by_backend.get(REFERENCE)
        for name in backends:
            m = by_backend.get(name)
            if m is None:
                continue
            n_label = f"{n} sub{'s' if n > 1 else ''}" if kind != "rtt" else f"{n} cpu"
            row = [TEST_LABEL[kind], _fmt_size(size), n_label, name, "", "", "", "", "", ""]
            if m.error is not None and m.msgs_per_s is None and m.p50_us is None:
                reason = m.error.splitlines()[0] if m.error else "failed"
                label = "n/a" if m.detail.get("not_applicable") else "error"
                row[4] = f"{label} {notes.ref(f'{name}: {reason}')}"
                rows.append(row)
                continue
            if kind == "rtt":
                row[6] = _fmt_num(m.p50_us, 1)
                row[7] = _fmt_num(m.p99_us, 1)
                row[8] = "-"
                if ref is not None and ref.p50_us and m.p50_us:
                    row[9] = f"{ref.p50_us / m.p50_us:.2f}"
            else:
                row[4] = _fmt_num(m.msgs_per_s)
                row[5] = _fmt_num(m.mb_per_s, 1)
                row[8] = str(m.drops)
                if m.bad:
                    bad = f"{name}: {m.bad} torn, wrong-size or repeated messages"
                    row[8] += f" {notes.ref(bad)}"
                if ref is not None and ref.msgs_per_s and m.msgs_per_s is not None:
                    row[9] = f"{m.msgs_per_s / ref.msgs_per_s:.2f}"
            for key, what in (
                ("resets", "reader resets (overtaken by the writer)"),
                ("lost", "messages its subscribers report lost"),
            ):
                if m.detail.get(key):
                    row[3] += " " + notes.ref(f"{name}: {m.detail[key]} {what}")
            if "failed_runs" in m.detail:
                row[3] += " " + notes.ref(
                    f"{name}: {m.detail['failed_runs']} run(s) failed: {m.detail['first_error']}"
                )
            rows.append(row)
    widths = [len(h) for h in header]
    for row in rows:
        if row is not None:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    right = {4, 5, 6, 7, 8, 9}

    def line(cols: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cols, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    out = [line(header), rule]
    for row in rows:
        out.append("" if row is None else line(row))
    paragraphs = [
        "msgs/s, MB/s: received per subscriber per second (mean over the subscribers; "
        "MB = 10^6 payload bytes), median of the repeats.",
        "drops: sequence gaps seen by the subscribers, summed over subscribers and repeats "
        "(must be 0).",
        "p50/p99 µs: round trip (A publishes ping, B receives it and publishes it back as "
        "pong); 1 cpu: A and B pinned to the same CPU, 2 cpu: one CPU each.",
        "× pyzmq: msgs/s ÷ pyzmq's msgs/s; round trips: pyzmq's p50 ÷ this p50. Same row, "
        "same run; > 1 means faster than pyzmq.",
        "Pacing (every backend alike): each subscriber stores its count of messages in a "
        "shared array; the publisher stays at most W messages ahead of the slowest one "
        f"(sched_yield() {PACE_YIELDS} times, then {PACE_SLEEP_S * 1e6:.0f} µs sleeps while "
        "it waits). " + geometry_note,
        f"Untimed warm-up first: throughput runs {WARM_FRACTION:.0%} of the run (at least "
        f"{WARM_MIN_S} s), round trips {RTT_WARMUP} round trips; for payloads from "
        f"{_fmt_size(WARM_RING_FROM)} also at least one msgq segment's worth of payload (a "
        f"fresh ring's pages fault in on first use; throughput: at most {WARM_MAX_S:g} s).",
    ]
    paragraphs += [
        f"{name}: waits: {BACKENDS[name].wait_note}; I/O: {BACKENDS[name].io_note}."
        for name in backends
    ]
    paragraphs += [f"skipped {name}: {why}" for name, why in skipped.items()]
    paragraphs += [f"[{i}] {text}" for i, text in enumerate(notes.texts, 1)]
    out.append("")
    out += [textwrap.fill(p, width=100, subsequent_indent="    ") for p in paragraphs]
    return "\n".join(out)


# --------------------------------------------------------------------------- command line


def _parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if t.endswith("K"):
        scale, t = KIB, t[:-1]
    elif t.endswith("M"):
        scale, t = MIB, t[:-1]
    value = int(t) * scale
    if value < HEADER.size:
        raise argparse.ArgumentTypeError(f"payload {text!r} is below {HEADER.size} bytes")
    return value


_positive_int = number(int, 1, "a positive integer")


def _csv(convert: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            return [convert(part) for part in text.split(",") if part.strip()]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


EPILOG = """\
examples:
  python -m msgq.bench                         full table, every available backend (~3 min)
  python -m msgq.bench --quick                 smoke run (~30 s): 1 repeat, short runs
  python -m msgq.bench --backends msgq,pyzmq --sizes 1K,1M --subs 4
  python -m msgq.bench --tests rtt --repeat 5  round trips only
  python -m msgq.bench --json results.json     also write machine-readable results

Peers are measured only when importable: pip install 'msgq[bench]'
(pyzmq, kickmsg, iceoryx2). Queues live under /dev/shm/bench_<pid>/ and are removed
at the end.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``msgq-bench`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="msgq-bench",
        description="Measure msgq's throughput and round-trip latency against pyzmq,\n"
        "kickmsg and iceoryx2 (each publisher and subscriber in its own process)\n"
        "and print one table.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"short runs ({QUICK_DURATION} s) and --repeat 1 unless given",
    )
    parser.add_argument(
        "--repeat",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"runs per cell, the median is shown (default {DEFAULT_REPEAT})",
    )
    parser.add_argument(
        "--duration",
        type=number(float, 0.0, "a positive number of seconds", exclusive=True),
        default=None,
        metavar="S",
        help=f"seconds per run (default {DEFAULT_DURATION}, {QUICK_DURATION} with --quick)",
    )
    parser.add_argument(
        "--backends",
        type=_csv(str),
        default=None,
        metavar="LIST",
        help="comma-separated subset of "
        + ",".join(BACKEND_ORDER)
        + " (default: every available one)",
    )
    parser.add_argument(
        "--sizes",
        type=_csv(_parse_size),
        default=None,
        metavar="LIST",
        help="payload sizes, e.g. 8,1K,64K,1M (default); the recv_into rows "
        "use those of 64K and 1M, the round trips those of 8 and 64K",
    )
    parser.add_argument(
        "--subs",
        type=_csv(_positive_int),
        default=None,
        metavar="LIST",
        help="subscriber counts (default 1,4)",
    )
    parser.add_argument(
        "--tests",
        type=_csv(str),
        default=None,
        metavar="LIST",
        help="subset of " + ",".join(TESTS) + " (default: all)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def _cpu_pairs() -> list[tuple[int, int]]:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    pairs = [(cpus[0], cpus[0])]
    if len(cpus) >= 2:
        pairs.append((cpus[0], cpus[1]))
    return pairs


def _context() -> BaseContext:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        preload = ["msgq"]
        preload += [
            cls.import_name
            for cls in BACKENDS.values()
            if cls.import_name and importlib.util.find_spec(cls.import_name) is not None
        ]
        ctx.set_forkserver_preload(preload)
        return ctx
    return multiprocessing.get_context("spawn")


class Progress:
    """One status line on stderr while a terminal watches."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.enabled = sys.stderr.isatty()
        self.started = time.monotonic()

    def step(self, text: str) -> None:
        self.done += 1
        if self.enabled:
            elapsed = time.monotonic() - self.started
            sys.stderr.write(f"\r\x1b[K[{self.done}/{self.total} {elapsed:.0f}s] {text}")
            sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _cleanup(run_dir: str, prefix: str) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)
    for path in glob.glob(os.path.join("/dev/shm", f"{prefix}_*")):  # kickmsg regions
        try:
            os.unlink(path)
        except OSError:
            pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m msgq.bench`` and ``msgq-bench``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    repeat = args.repeat or (1 if args.quick else DEFAULT_REPEAT)
    duration = args.duration or (QUICK_DURATION if args.quick else DEFAULT_DURATION)
    sizes = args.sizes or list(DEFAULT_SIZES)
    subs_list = args.subs or list(DEFAULT_SUBS)
    tests = args.tests or list(TESTS)
    for test in tests:
        if test not in TESTS:
            parser.error(f"unknown test {test!r}; choose from {','.join(TESTS)}")
    requested = args.backends or list(BACKEND_ORDER)
    for name in requested:
        if name not in BACKENDS:
            parser.error(f"unknown backend {name!r}; choose from {','.join(BACKEND_ORDER)}")

    skipped: dict[str, str] = {}
    backends: list[str] = []
    for name in BACKEND_ORDER:
        if name not in requested:
            continue
        why = BACKENDS[name].unavailable()
        if why is None:
            backends.append(name)
        else:
            skipped[name] = why
    if not backends:
        print(
            "no backend to measure: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()),
            file=sys.stderr,
        )
        return 2

    prefix = f"bench_{os.getpid()}"
    os.environ["MSGQ_PREFIX"] = prefix
    from msgq.queues import queue_dir

    run_dir = queue_dir(create=True)  # the prefix folder msgq's queues go to

    plan: list[tuple[str, int, int]] = []
    if "throughput" in tests:
        plan += [("throughput", size, n) for size in sizes for n in subs_list]
    if "recv_into" in tests:
        plan += [("recv_into", size, n) for size in sizes if size in INTO_SIZES for n in subs_list]
    pairs = _cpu_pairs()
    if "rtt" in tests:
        plan += [
            ("rtt", size, len(set(pair))) for size in sizes if size in RTT_SIZES for pair in pairs
        ]
        if len(pairs) < 2:
            skipped["2-cpu round trips"] = "this process may run on one CPU only"

    ctx = _context()
    runner = Runner(ctx, run_dir, prefix, duration)
    progress = Progress(len(plan) * repeat * len(backends))
    runs: dict[tuple[str, int, int], dict[str, list[Measurement]]] = {}
    began = time.monotonic()
    try:
        for kind, size, n in plan:
            cell = runs.setdefault((kind, size, n), {name: [] for name in backends})
            for _ in range(repeat):
                for name in backends:  # interleaved, so noise hits every backend alike
                    progress.step(f"{TEST_LABEL[kind]} {_fmt_size(size)} ×{n} {name}")
                    if kind == "rtt":
                        pair = next(p for p in pairs if len(set(p)) == n)
                        m = runner.round_trip(name, size, pair)
                    else:
                        m = runner.throughput(kind, name, size, n)
                    cell[name].append(m)
    except KeyboardInterrupt:
        progress.finish()
        print("interrupted; partial results follow", file=sys.stderr)
    finally:
        progress.finish()
        _cleanup(run_dir, prefix)

    cells = {
        key: {name: _median_of(ms) for name, ms in by.items() if ms} for key, by in runs.items()
    }
    geometry_note = (
        "W and msgq's segment_size per payload: "
        + "; ".join(
            f"{_fmt_size(s)}: W={Geometry.for_payload(s, 1).window}, "
            f"{_fmt_size(Geometry.for_payload(s, 1).segment_size)}"
            for s in sizes
        )
        + "."
    )
    table = render_table(cells, backends, skipped, geometry_note)
    elapsed = time.monotonic() - began
    if args.json:
        document = {
            "meta": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "repeat": repeat,
                "duration_s": duration,
                "elapsed_s": elapsed,
                "versions": {name: BACKENDS[name].version() for name in backends},
                "skipped": skipped,
                "start_method": ctx.get_start_method(),
                "prefix": prefix,
            },
            "results": [
                {"median": asdict(cells[key][name]), "runs": [asdict(m) for m in ms]}
                for key, by in runs.items()
                for name, ms in by.items()
                if ms
            ],
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    try:
        print(
            f"msgq-bench: {repeat} repeat(s) of {duration:g} s per cell, "
            f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, "
            f"{elapsed:.0f} s in all"
        )
        print(", ".join(f"{name} {BACKENDS[name].version()}" for name in backends))
        print()
        print(table, flush=True)
    except BrokenPipeError:  # e.g. piped into head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    failed = any(
        m.error is not None or m.drops or m.bad for by in cells.values() for m in by.values()
    )
    return 1 if failed else 0


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy, so that child processes find
    # their entry points as msgq.bench.* whatever the start method.
    from msgq.bench import main as _main

    sys.exit(_main())
