"""Frame rate and latency of VisionIPC, printed as one table.

Run ``python -m msgq.bench.visionipc`` (``--help`` lists the options). For each frame size
and number of client processes, the same frames go through three paths:

* **copy** — ``server.send(stream, frame)``: one copy into the next shared buffer;
* **zero-copy** — ``buf = server.get_buffer(stream)``, the producer writes into ``buf``,
  ``server.send(stream, buf)``: nothing is copied. The producer here writes only the frame
  stamps (16 bytes): the pixels are taken to be produced in place, as a camera or decoder
  writing into the buffer would;
* **msgq socket** — the frame as a message of a plain msgq socket: ``pub.send(frame)``
  (one copy into the ring), subscribers ``receive_into`` one preallocated buffer (one copy
  out). That is how frames would travel without VisionIPC.

The server (or publisher) is this process; each client is a process of its own. Every
frame carries its number in its first and last 8 bytes; clients check both (for
VisionIPC that touches two cache lines of the frame, not all of it: the point of the
buffers is that a reader reads only what it needs).

Definitions:

* **frames/s** — frames *every* client has received, per second: the timed phase runs
  for ``--seconds``, from the first send until the last client has the last frame. The
  sender is paced so that nothing is dropped: it never runs more than ``buffers - 1``
  frames ahead of the slowest client (every client counts its frames in a shared array),
  so a VisionIPC buffer is never refilled while a client may read it, and the msgq ring
  (sized for that window) never overruns.
* **latency** — from the moment the sender starts sending a frame (``time.monotonic_ns``
  before ``send`` / ``get_buffer``) to the moment a client has the frame (``recv`` or
  ``receive_into`` returned); CLOCK_MONOTONIC is the same clock in every process. Measured
  in a separate phase in lockstep (the next frame goes when every client has the last), so
  it is the latency of one frame, not of a queue. p50/p99 over all clients' samples.
* **GB/s** — frame bytes copied per second (frames/s x frame size; left empty for the
  zero-copy path, which copies none).
* **drops** — frames a client never got or got with wrong stamps (should be 0).

A second table measures the handshake (connect) of a well-behaved client while a process
makes ``--hostile`` connections that do everything but a proper handshake (garbage,
oversized and near-miss requests, fd passing, leaving mid-way) and holds ``--silent``
more that say nothing: p50, p99 and the slowest of the good handshakes, against the goal
that none takes 0.5 s or more. ``--hostile 0`` leaves it out.

The ratio columns compare with the ancestor (upstream VisionIPC, same kind of machine,
one client): copying send 4 444 fps @ 1928x1208 and 1 176 fps @ 3840x2160 with p50
240 µs / 1 098 µs; the same frames through a plain msgq socket 236 / 66 fps.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import json
import multiprocessing
import os
import platform
import random
import shutil
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np

import msgq
from msgq.queues import queue_dir
from msgq.tables import format_table as format_rows
from msgq.version import installed_version
from msgq.visionipc import VisionIpcClient, VisionIpcServer
from msgq.visionipc.handshake import KIND_BUFFERS, encode_request

PATHS: tuple[str, ...] = ("copy", "zero-copy", "socket")
PATH_LABELS = {"copy": "copy", "zero-copy": "zero-copy", "socket": "msgq socket"}
DEFAULT_SIZES: tuple[tuple[int, int], ...] = ((1928, 1208), (3840, 2160))
DEFAULT_CLIENTS: tuple[int, ...] = (1, 3)
DEFAULT_SECONDS = 1.0
DEFAULT_REPEAT = 3
DEFAULT_BUFFERS = 4
MAX_LATENCY_SAMPLES = 2000
WARMUP_FRAMES = 16

#: Frame ids: the throughput phase counts from 0, the latency phase from LATENCY_BASE; the
#: last frame (END) tells clients to stop.
LATENCY_BASE = 1 << 31
END = (1 << 32) - 1
#: Cache-line spacing of the per-client counters in the shared arrays (int64 slots).
SLOT = 8
RECV_TIMEOUT_MS = 100
STARTUP_TIMEOUT_S = 30.0
STALL_TIMEOUT_S = 20.0

#: The ancestor's numbers (one client): fps and p50 µs of the copying send, fps of the
#: plain msgq socket.
ANCESTOR_COPY_FPS = {(1928, 1208): 4444.0, (3840, 2160): 1176.0}
ANCESTOR_COPY_P50_US = {(1928, 1208): 240.0, (3840, 2160): 1098.0}
ANCESTOR_SOCKET_FPS = {(1928, 1208): 236.0, (3840, 2160): 66.0}
#: Goals: copy >= 1.3x the ancestor's fps, zero-copy p50 <= 30 µs, socket >= 5x.
GOAL_COPY_RATIO = 1.3
GOAL_ZERO_COPY_P50_US = 30.0
GOAL_SOCKET_RATIO = 5.0
#: Handshakes under hostile clients: defaults and the goal for the slowest good one.
DEFAULT_HOSTILE = 3000
DEFAULT_SILENT = 400
GOAL_HANDSHAKE_MAX_S = 0.5
MIN_HANDSHAKES = 20


def frame_size(width: int, height: int) -> int:
    """Bytes of an NV12 frame."""
    return width * height * 3 // 2


# --------------------------------------------------------------------------- shared state


@dataclass
class Board:
    """Counters shared by the sender and the clients of one run."""

    clients: int
    samples: int
    received: Any  # RawArray int64, clients * SLOT: frames each client has
    bad: Any  # RawArray int64, clients * SLOT: frames with wrong stamps, or skipped
    latency: Any  # RawArray int64, clients * samples: ns per latency frame
    stop: Any  # RawValue int: 1 tells clients to give up

    @classmethod
    def create(cls, ctx: BaseContext, clients: int, samples: int) -> Board:
        return cls(
            clients,
            samples,
            ctx.RawArray(ctypes.c_int64, clients * SLOT),
            ctx.RawArray(ctypes.c_int64, clients * SLOT),
            ctx.RawArray(ctypes.c_int64, clients * max(samples, 1)),
            ctx.RawValue(ctypes.c_int, 0),
        )

    def slowest(self) -> int:
        received = self.received
        return min(received[i * SLOT] for i in range(self.clients))


def _stamp_ok(frame: memoryview | np.ndarray, frame_id: int) -> bool:
    head = int.from_bytes(frame[:8], "little")
    tail = int.from_bytes(frame[-8:], "little")
    return head == frame_id and tail == frame_id


# --------------------------------------------------------------------------- clients


def _vipc_client(name: str, index: int, board: Board, ready: Any, env: dict[str, str]) -> None:
    """A VisionIPC client process: receive until END, check stamps, count, time."""
    os.environ.update(env)

    client = VisionIpcClient(name, 0, False)
    client.connect(True)
    ready.release()
    count = bad = 0
    slot = index * SLOT
    lat_offset = index * board.samples
    received, latency = board.received, board.latency
    while True:
        buf = client.recv(RECV_TIMEOUT_MS)
        if buf is None:
            if board.stop.value:
                break
            continue
        now = time.monotonic_ns()
        frame_id = client.frame_id
        if frame_id == END:
            break
        if not _stamp_ok(buf.data, frame_id):
            bad += 1
            board.bad[slot] = bad
        if frame_id >= LATENCY_BASE and frame_id - LATENCY_BASE < board.samples:
            latency[lat_offset + frame_id - LATENCY_BASE] = now - client.timestamp_sof
        count += 1
        received[slot] = count
    board.bad[slot] = bad + client.skipped_frames + client.bad_packets
    client.close()


def _socket_client(
    endpoint: str,
    segment: int,
    size: int,
    index: int,
    board: Board,
    ready: Any,
    env: dict[str, str],
) -> None:
    """A plain msgq subscriber process: receive_into one buffer until END."""
    os.environ.update(env)

    sub = msgq.sub_sock(endpoint, segment_size=segment)
    sub.setTimeout(RECV_TIMEOUT_MS)
    frame = bytearray(size)
    view = memoryview(frame)
    ready.release()
    count = bad = 0
    slot = index * SLOT
    lat_offset = index * board.samples
    received, latency = board.received, board.latency
    while True:
        n = sub.receive_into(frame)
        if n is None:
            if board.stop.value:
                break
            continue
        now = time.monotonic_ns()
        frame_id = int.from_bytes(view[:8], "little")
        if frame_id == END:
            break
        if n != size or not _stamp_ok(view, frame_id):
            bad += 1
            board.bad[slot] = bad
        if frame_id >= LATENCY_BASE and frame_id - LATENCY_BASE < board.samples:
            sent = int.from_bytes(view[8:16], "little")
            latency[lat_offset + frame_id - LATENCY_BASE] = now - sent
        count += 1
        received[slot] = count
    sub.close()


# --------------------------------------------------------------------------- senders


class _Sender:
    """Sends one frame by one path; ``send(frame_id)`` returns nothing, stamps inside."""

    def __init__(self, path: str, name: str, width: int, height: int, buffers: int) -> None:
        self.path = path
        self.size = frame_size(width, height)
        rng = np.random.default_rng(1)
        self.source = rng.integers(0, 256, self.size, dtype=np.uint8)
        self.head = self.source[:8].view("<u8")
        self.tail = self.source[-8:].view("<u8")
        self.server: Any = None
        self.pub: Any = None
        self.endpoint = f"vbench_{name}"
        self.segment = 0
        self.stamps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if path == "socket":
            # Room for the pacing window and the markers, with headroom.
            self.segment = -(-(buffers + 2) * (self.size + 64) // (1 << 20)) << 20
            self.pub = msgq.pub_sock(self.endpoint, self.segment)
            self.stamp = self.source[8:16].view("<u8")
        else:
            self.server = VisionIpcServer(name)
            self.server.create_buffers(0, buffers, width, height)
            self.server.start_listener()

    def send(self, frame_id: int) -> None:
        started = time.monotonic_ns()
        if self.path == "copy":
            self.head[0] = frame_id
            self.tail[0] = frame_id
            self.server.send(0, self.source, frame_id, started)
        elif self.path == "zero-copy":
            buf = self.server.get_buffer(0)
            stamps = self.stamps.get(buf.idx)
            if stamps is None:
                stamps = self.stamps[buf.idx] = (
                    buf.array[:8].view("<u8"),
                    buf.array[-8:].view("<u8"),
                )
            stamps[0][0] = frame_id
            stamps[1][0] = frame_id
            self.server.send(0, buf, frame_id, started)
        else:
            self.head[0] = frame_id
            self.tail[0] = frame_id
            self.stamp[0] = started
            self.pub.send(self.source)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.pub is not None:
            self.pub.close()


def _wait_for(board: Board, frames: int, what: str) -> None:
    """Spins (yielding the CPU) until every client has ``frames`` frames; RuntimeError
    after STALL_TIMEOUT_S."""
    if board.slowest() >= frames:
        return
    give_up = time.monotonic() + STALL_TIMEOUT_S
    while board.slowest() < frames:
        os.sched_yield()
        if time.monotonic() > give_up:
            board.stop.value = 1
            raise RuntimeError(f"stalled waiting for {what}")


# --------------------------------------------------------------------------- one run


@dataclass
class RunResult:
    """One measurement of one cell."""

    fps: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    frames: int = 0
    samples: int = 0
    drops: int = 0
    error: str | None = None


def run_once(
    ctx: BaseContext,
    path: str,
    width: int,
    height: int,
    clients: int,
    seconds: float,
    buffers: int,
) -> RunResult:
    """Measures one cell once: starts the sender and the client processes, runs the
    throughput phase and the latency phase, stops everything."""
    name = f"b{os.getpid()}_{uuid.uuid4().hex[:8]}"
    board = Board.create(ctx, clients, MAX_LATENCY_SAMPLES)
    ready = ctx.Semaphore(0)
    env = {k: v for k, v in os.environ.items() if k.startswith(("MSGQ_", "OPENPILOT_"))}
    sender = _Sender(path, name, width, height, buffers)
    procs = []
    result = RunResult()
    try:
        for i in range(clients):
            if path == "socket":
                args: tuple[Any, ...] = (
                    sender.endpoint,
                    sender.segment,
                    sender.size,
                    i,
                    board,
                    ready,
                    env,
                )
                target: Callable[..., None] = _socket_client
            else:
                args = (name, i, board, ready, env)
                target = _vipc_client
            proc = ctx.Process(target=target, args=args, daemon=True)
            proc.start()
            procs.append(proc)
        for _ in range(clients):
            if not ready.acquire(timeout=STARTUP_TIMEOUT_S):
                raise RuntimeError("a client did not start")
        window = buffers - 1
        sent = 0

        def paced_send(frame_id: int) -> None:
            nonlocal sent
            _wait_for(board, sent - window, "the slowest client")
            sender.send(frame_id)
            sent += 1

        for k in range(WARMUP_FRAMES):
            paced_send(k)
        _wait_for(board, sent, "warm-up frames")
        first = sent
        started = time.monotonic()
        frame_id = WARMUP_FRAMES
        while time.monotonic() - started < seconds:
            paced_send(frame_id)
            frame_id += 1
        _wait_for(board, sent, "the last timed frame")
        elapsed = time.monotonic() - started
        result.frames = sent - first
        result.fps = result.frames / elapsed

        samples = 0
        started = time.monotonic()
        while samples < board.samples and (samples < 50 or time.monotonic() - started < seconds):
            _wait_for(board, sent, "a latency frame")
            sender.send(LATENCY_BASE + samples)
            sent += 1
            samples += 1
        _wait_for(board, sent, "the last latency frame")
        sender.send(END)
        values = [
            board.latency[i * board.samples + k] / 1000.0
            for i in range(clients)
            for k in range(samples)
        ]
        values.sort()
        result.samples = len(values)
        result.p50_us = _percentile(values, 50)
        result.p99_us = _percentile(values, 99)
    except Exception as e:  # noqa: BLE001 - one failed cell must not end the benchmark
        result.error = f"{type(e).__name__}: {e}"
    finally:
        board.stop.value = 1
        for proc in procs:
            proc.join(STARTUP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        sender.close()
    received = [board.received[i * SLOT] for i in range(clients)]
    result.drops = sum(max(0, sent - 1 - r) for r in received) if result.error is None else 0
    result.drops += sum(board.bad[i * SLOT] for i in range(clients))
    if any(p.exitcode not in (0, None) for p in procs) and result.error is None:
        result.error = "a client process failed"
    return result


def _percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(pct / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[k]


# --------------------------------------------------------------------------- handshakes


def hostile_clients(path: str, seed: int, count: int, silent: int, connected: Any = None,
                    done: Any = None) -> None:
    """Client process: ``silent`` connections that say nothing (held until the end), then
    ``count`` connections doing everything but a proper handshake (random bytes, a request
    with a byte changed, oversized, leaving before speaking, asking and never reading,
    passing file descriptors). Sets ``connected`` once the silent ones are in and
    ``done`` at the end (events, when given). Also used by the safety tests."""

    rng = random.Random(seed)
    quiet = []
    for _ in range(silent):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(path)
        except OSError:
            s.close()
            continue
        quiet.append(s)
    if connected is not None:
        connected.set()
    devnull = os.open(os.devnull, os.O_RDONLY)
    request = encode_request(KIND_BUFFERS, 0)
    for i in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(path)
            kind = i % 6
            if kind == 0:  # random bytes
                s.send(rng.randbytes(rng.randrange(0, 80)))
            elif kind == 1:  # a valid request with one byte changed
                msg = bytearray(request)
                msg[rng.randrange(len(msg))] ^= 1 + rng.randrange(255)
                s.send(bytes(msg))
            elif kind == 2:  # oversized
                s.send(rng.randbytes(rng.randrange(17, 60000)))
            elif kind == 4:  # asks, never reads the answer
                s.send(request)
            elif kind == 5:  # passes file descriptors
                fds = array.array("i", [devnull] * rng.randrange(1, 8))
                s.sendmsg([rng.randbytes(16)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            # kind 3 leaves before speaking
        except OSError:
            pass  # the server may hang up first
        finally:
            s.close()
    for s in quiet:
        s.close()
    os.close(devnull)
    if done is not None:
        done.set()


@dataclass
class HandshakeResult:
    """Good-client handshakes while hostile clients connect (times in ms)."""

    hostile: int
    silent: int
    handshakes: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    listener: dict[str, int] = field(default_factory=dict)
    error: str | None = None


def run_handshakes(ctx: BaseContext, hostile: int, silent: int) -> HandshakeResult:
    """Times good clients' ``connect`` while a process makes ``hostile`` bad connections
    and holds ``silent`` quiet ones (at least MIN_HANDSHAKES, and until it is done)."""
    name = f"h{os.getpid()}_{uuid.uuid4().hex[:8]}"
    result = HandshakeResult(hostile, silent)
    times: list[float] = []
    with VisionIpcServer(name, handshake_timeout_s=0.5) as server:
        server.create_buffers(0, 3, 64, 32)
        server.start_listener()
        connected, done = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=hostile_clients,
                           args=(server.socket_path, 11, hostile, silent, connected, done),
                           daemon=True)
        proc.start()
        try:
            if not connected.wait(STARTUP_TIMEOUT_S):
                raise RuntimeError("the hostile client process did not start")
            while not done.is_set() or len(times) < MIN_HANDSHAKES:
                started = time.monotonic()
                client = VisionIpcClient(name, 0, False)
                ok = client.connect(False)
                times.append(time.monotonic() - started)
                client.close()
                if not ok:
                    raise RuntimeError("a good client's handshake failed")
                if time.monotonic() - started > STALL_TIMEOUT_S:
                    raise RuntimeError("a good client's handshake stalled")
        except Exception as e:  # noqa: BLE001 - report it in the table
            result.error = f"{type(e).__name__}: {e}"
        finally:
            proc.join(STALL_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        result.listener = dict(server.listener_stats)
    times.sort()
    result.handshakes = len(times)
    result.p50_ms = _percentile(times, 50) * 1000
    result.p99_ms = _percentile(times, 99) * 1000
    result.max_ms = (times[-1] if times else 0.0) * 1000
    return result


HANDSHAKE_HEADER = ("handshake", "hostile", "silent", "handshakes", "p50 ms", "p99 ms",
                    "max ms", "goal")


def format_handshake_table(result: HandshakeResult) -> str:
    """The handshake table: one row."""
    label = ["good client", str(result.hostile), str(result.silent)]
    if result.error:
        return format_rows([list(HANDSHAKE_HEADER), [*label, "error: " + result.error]])
    goal = _verdict(result.max_ms < GOAL_HANDSHAKE_MAX_S * 1000,
                    f"max < {GOAL_HANDSHAKE_MAX_S * 1000:g} ms")
    return format_rows([list(HANDSHAKE_HEADER), [
        *label, str(result.handshakes), f"{result.p50_ms:.2f}", f"{result.p99_ms:.2f}",
        f"{result.max_ms:.2f}", goal]])


# --------------------------------------------------------------------------- table


@dataclass
class Cell:
    """All runs of one (path, size, clients) and their medians."""

    path: str
    width: int
    height: int
    clients: int
    runs: list[RunResult] = field(default_factory=list)

    def median(self, attr: str) -> float:
        values = [getattr(r, attr) for r in self.runs if r.error is None]
        return statistics.median(values) if values else 0.0

    @property
    def error(self) -> str | None:
        errors = [r.error for r in self.runs if r.error]
        return errors[0] if len(errors) == len(self.runs) and errors else None

    @property
    def drops(self) -> int:
        return sum(r.drops for r in self.runs)

    def ratios(self) -> tuple[float | None, float | None, str]:
        """(fps vs ancestor, p50 vs ancestor, goal verdict)."""
        size = (self.width, self.height)
        fps, p50 = self.median("fps"), self.median("p50_us")
        fps_ratio = p50_ratio = None
        goal = ""
        if self.clients == 1 and size in ANCESTOR_COPY_FPS:
            if self.path == "socket":
                fps_ratio = fps / ANCESTOR_SOCKET_FPS[size]
                goal = _verdict(fps_ratio >= GOAL_SOCKET_RATIO, f"fps >= {GOAL_SOCKET_RATIO:g}x")
            else:
                fps_ratio = fps / ANCESTOR_COPY_FPS[size]
                p50_ratio = p50 / ANCESTOR_COPY_P50_US[size]
                if self.path == "copy":
                    goal = _verdict(fps_ratio >= GOAL_COPY_RATIO, f"fps >= {GOAL_COPY_RATIO:g}x")
        if self.path == "zero-copy":
            goal = _verdict(p50 <= GOAL_ZERO_COPY_P50_US, f"p50 <= {GOAL_ZERO_COPY_P50_US:g} µs")
        return fps_ratio, p50_ratio, goal


def _verdict(ok: bool, text: str) -> str:
    return f"{'met' if ok else 'MISSED'}: {text}"


HEADER = ("path", "frame", "clients", "frames/s", "GB/s", "p50 µs", "p99 µs", "drops",
          "fps × anc", "p50 × anc", "goal")


def format_table(cells: list[Cell]) -> str:
    """The result table, one row per cell, a blank line between frame sizes."""
    rows: list[list[str]] = [list(HEADER)]
    groups: list[tuple[int, int, int]] = []
    for cell in cells:
        groups.append((cell.width, cell.height, cell.clients))
        label = [PATH_LABELS[cell.path], f"{cell.width}x{cell.height}", str(cell.clients)]
        if cell.error:
            rows.append([*label, "error: " + cell.error])
            continue
        fps = cell.median("fps")
        gbs = fps * frame_size(cell.width, cell.height) / 1e9
        fps_ratio, p50_ratio, goal = cell.ratios()
        rows.append([
            *label,
            f"{fps:,.0f}",
            f"{gbs:.1f}" if cell.path != "zero-copy" else "",
            f"{cell.median('p50_us'):,.1f}",
            f"{cell.median('p99_us'):,.1f}",
            str(cell.drops),
            f"{fps_ratio:.2f}" if fps_ratio is not None else "",
            f"{p50_ratio:.3f}" if p50_ratio is not None else "",
            goal,
        ])
    header, *lines = format_rows(rows).split("\n")
    out = [header]
    for i, line in enumerate(lines):
        if i and groups[i] != groups[i - 1]:
            out.append("")
        out.append(line)
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def _context() -> BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["numpy", "msgq", "msgq.visionipc"])
        return ctx
    return multiprocessing.get_context("spawn")


def _sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        try:
            w, h = part.lower().split("x")
            sizes.append((int(w), int(h)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not WIDTHxHEIGHT") from None
    return sizes


def _ints(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers") from None


def _paths(text: str) -> list[str]:
    paths = [p.strip() for p in text.split(",")]
    for p in paths:
        if p not in PATHS:
            raise argparse.ArgumentTypeError(f"unknown path {p!r}; choose from {','.join(PATHS)}")
    return paths


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m msgq.bench.visionipc``."""
    parser = argparse.ArgumentParser(
        prog="python -m msgq.bench.visionipc",
        description="Frames/s and send-to-receive latency of VisionIPC (copying send, "
        "zero-copy send) and of a plain msgq socket, for NV12 frames.",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=list(DEFAULT_SIZES),
        metavar="WxH,...",
        help="frame sizes (default 1928x1208,3840x2160)",
    )
    parser.add_argument(
        "--clients",
        type=_ints,
        default=list(DEFAULT_CLIENTS),
        metavar="N,...",
        help="client process counts (default 1,3)",
    )
    parser.add_argument(
        "--paths",
        type=_paths,
        default=list(PATHS),
        metavar="LIST",
        help="subset of " + ",".join(PATHS) + " (default: all)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help=f"length of each timed phase (default {DEFAULT_SECONDS})",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        help=f"runs per cell; the table shows medians (default {DEFAULT_REPEAT})",
    )
    parser.add_argument(
        "--buffers",
        type=int,
        default=DEFAULT_BUFFERS,
        help=f"VisionIPC buffers per stream, and the pacing window + 1 (default {DEFAULT_BUFFERS})",
    )
    parser.add_argument(
        "--hostile",
        type=int,
        default=DEFAULT_HOSTILE,
        help=f"hostile connections during the handshake timing (default {DEFAULT_HOSTILE}; "
        "0 leaves the handshake table out)",
    )
    parser.add_argument(
        "--silent",
        type=int,
        default=DEFAULT_SILENT,
        help=f"silent connections held meanwhile (default {DEFAULT_SILENT})",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m msgq.bench.visionipc``."""
    args = build_parser().parse_args(argv)
    if args.buffers < 2 or args.repeat < 1 or args.seconds <= 0:
        print("--buffers must be >= 2, --repeat >= 1, --seconds > 0", file=sys.stderr)
        return 2
    if args.hostile < 0 or args.silent < 0:
        print("--hostile and --silent must be >= 0", file=sys.stderr)
        return 2
    own_prefix = not (os.environ.get("MSGQ_PREFIX") or os.environ.get("OPENPILOT_PREFIX"))
    if own_prefix:
        os.environ["MSGQ_PREFIX"] = f"vipcbench_{os.getpid()}"

    prefix_dir = queue_dir()
    ctx = _context()
    cells = [
        Cell(path, w, h, n) for (w, h) in args.sizes for n in args.clients for path in args.paths
    ]
    total = len(cells) * args.repeat
    began = time.monotonic()
    progress = sys.stderr.isatty()
    done = 0
    try:
        for _ in range(args.repeat):
            for cell in cells:
                if progress:
                    sys.stderr.write(
                        f"\r\x1b[K[{done + 1}/{total}] {cell.path} {cell.width}x{cell.height} "
                        f"{cell.clients} client(s)"
                    )
                    sys.stderr.flush()
                cell.runs.append(
                    run_once(
                        ctx,
                        cell.path,
                        cell.width,
                        cell.height,
                        cell.clients,
                        args.seconds,
                        args.buffers,
                    )
                )
                done += 1
        handshakes = None
        if args.hostile:
            if progress:
                sys.stderr.write(f"\r\x1b[Khandshakes under {args.hostile} hostile clients")
                sys.stderr.flush()
            handshakes = run_handshakes(ctx, args.hostile, args.silent)
    finally:
        if progress:
            sys.stderr.write("\r\x1b[K")
        if own_prefix:
            shutil.rmtree(prefix_dir, ignore_errors=True)
    elapsed = time.monotonic() - began
    version = installed_version()
    header = (
        f"visionipc-bench: {args.repeat} repeat(s), {args.seconds:g} s per phase, "
        f"{args.buffers} buffers, {os.cpu_count()} CPU(s), Python {platform.python_version()}, "
        f"msgq {version}, {elapsed:.0f} s in all"
    )
    print(header)
    print()
    print(format_table(cells))
    if handshakes is not None:
        print()
        print(format_handshake_table(handshakes))
    if args.json:
        document = {
            "meta": {
                "repeat": args.repeat,
                "seconds": args.seconds,
                "buffers": args.buffers,
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "msgq": version,
                "prefix": os.environ.get("MSGQ_PREFIX", ""),
            },
            "cells": [
                {
                    "path": c.path,
                    "width": c.width,
                    "height": c.height,
                    "clients": c.clients,
                    "fps": c.median("fps"),
                    "p50_us": c.median("p50_us"),
                    "p99_us": c.median("p99_us"),
                    "drops": c.drops,
                    "error": c.error,
                    "runs": [asdict(r) for r in c.runs],
                }
                for c in cells
            ],
            "handshakes": asdict(handshakes) if handshakes is not None else None,
        }
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)
    failed = any(c.error for c in cells) or (handshakes is not None and handshakes.error)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
