"""The processes of the core benchmark: the shared board they coordinate through, and
the publisher, subscriber, ping and pong programs that each run in a process of their own
(started by :mod:`msgq.bench.runner`).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any

from msgq.bench.peers import (
    BACKENDS,
    END_SEQ,
    HEADER,
    HELLO_BASE,
    PACE_SLEEP_S,
    PACE_YIELDS,
    RTT_MAX_SAMPLES,
    RTT_WARMUP,
    STALL_TIMEOUT_S,
    START_SEQ,
    STARTUP_TIMEOUT_S,
    WARM_FRACTION,
    WARM_MAX_S,
    WARM_MIN_S,
    WARM_RING_FROM,
    Backend,
    Geometry,
)

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

    kind: str  # "throughput", "recv_into", "view", "rtt" or "rtt_async"
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


def publisher_main(job: Job, board: Board, results: Any) -> None:
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


def subscriber_main(job: Job, board: Board, index: int, results: Any) -> None:
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
    in_place = job.kind == "view"
    buf = bytearray(size)
    tail = size - HEADER.size if size >= 2 * HEADER.size else -1
    unpack_from = HEADER.unpack_from
    recv = backend.recv
    recv_into = backend.recv_into
    recv_peek = backend.recv_peek
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
        if in_place:
            peeked = recv_peek(sub, tail)
            msg: Any = peeked
            if peeked is not None:
                n, seq, tail_seq = peeked
        elif into:
            n = recv_into(sub, buf)
            msg = buf if n is not None else None
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
        if not in_place:
            seq = unpack_from(msg, 0)[0]
            tail_seq = unpack_from(msg, tail)[0] if tail > 0 else seq
        if n != size or tail_seq != seq:
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


def ping_main(job: Job, board: Board, results: Any) -> None:
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


def _check_asyncio(job: Job, backend: Backend) -> bool:
    """Whether ``job`` runs under asyncio; NotApplicableError when the library has none."""
    if job.kind != "rtt_async":
        return False
    if not backend.async_note:
        raise NotApplicableError(f"{backend.name} has no asyncio receive")
    backend.use_asyncio()
    return True


def _ping(job: Job, board: Board, backend: Backend) -> dict[str, Any]:
    if _check_asyncio(job, backend):
        return asyncio.run(_ping_async(job, board, backend))
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


async def _ping_async(job: Job, board: Board, backend: Backend) -> dict[str, Any]:
    """:func:`_ping` for asyncio tasks on both sides (hellos, untimed round trips, then
    the timed ones; 8-byte payloads)."""
    sub = _setup(backend.make_sub, f"{job.topic}-pong", job.geo)
    board.put(0, CONNECTED, 1)
    if not board.wait_all(CONNECTED, 1, [1], STARTUP_TIMEOUT_S):
        raise TimeoutError("the pong process did not connect")
    pub = _setup(backend.make_pub, f"{job.topic}-ping", job.geo)
    buf = bytearray(job.geo.size)
    clock = time.perf_counter_ns

    async def trip(seq: int, patience_ns: float) -> int | None:
        """ns from send to the echo of ``seq``; None when it did not come in time."""
        HEADER.pack_into(buf, 0, seq)
        t0 = clock()
        await backend.send_async(pub, buf)
        while True:
            msg = await backend.recv_async(sub)
            if msg is not None and HEADER.unpack_from(msg, 0)[0] == seq:
                return clock() - t0
            if clock() - t0 > patience_ns:
                return None

    k = 0
    while await trip(HELLO_BASE + k, 50e6) is None:  # until the path is connected
        k += 1
        if k * 0.05 > STARTUP_TIMEOUT_S:
            raise TimeoutError("no echo from the pong process")
    samples: list[int] = []
    deadline = time.monotonic() + job.duration
    for seq in range(RTT_WARMUP + RTT_MAX_SAMPLES):
        took = await trip(seq, STALL_TIMEOUT_S * 1e9)
        if took is None:
            raise TimeoutError(f"round trip {seq}: no echo for {STALL_TIMEOUT_S:.0f} s")
        if seq >= RTT_WARMUP:
            samples.append(took)
            if (seq & 63) == 0 and time.monotonic() >= deadline:
                break
    await trip(END_SEQ, 1e9)  # pong keeps its publisher until it echoed the end marker
    samples.sort()
    return {"samples": len(samples), "p50_ns": _percentile(samples, 50),
            "p99_ns": _percentile(samples, 99), "min_ns": samples[0]}


async def _pong_async(job: Job, board: Board, backend: Backend, sub: Any,
                      pub: Any) -> int:
    """The echo loop of :func:`pong_main` as an asyncio task."""
    echoed = 0
    while True:
        msg = await backend.recv_async(sub)
        if msg is None:
            if board.cells[STOP]:
                return echoed
            continue
        await backend.send_async(pub, msg)
        echoed += 1
        if HEADER.unpack_from(msg, 0)[0] == END_SEQ:
            return echoed


def pong_main(job: Job, board: Board, results: Any) -> None:
    """Process B of a round trip (participant 1): republishes every ping as a pong."""

    def body() -> dict[str, Any]:
        _pin(job.cpus[1])
        backend = _child_backend(job)
        try:
            in_loop = _check_asyncio(job, backend)
            sub = _setup(backend.make_sub, f"{job.topic}-ping", job.geo)
            pub = _setup(backend.make_pub, f"{job.topic}-pong", job.geo)
            board.put(1, CONNECTED, 1)
            if in_loop:
                return {"echoed": asyncio.run(_pong_async(job, board, backend, sub, pub))}
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
