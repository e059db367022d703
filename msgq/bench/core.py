"""The core suite: throughput and round trips of msgq against its peers, printed as one
table.

Run ``python -m msgq.bench`` (or ``msgq bench core``, or the ``msgq-bench`` command);
``--help`` lists the options.

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
* **view** — the same, with subscribers reading each message where the library hands it
  out, without a copy where it can (msgq ``receive_view``, kickmsg ``receive_view``,
  iceoryx2 samples, pyzmq frames): the sequence numbers are read in place.
* **round trip** — process A publishes on "ping", process B receives and republishes on
  "pong"; A times each round trip. Both pinned to one CPU, then to two CPUs.
* **async trip** — the same with both sides asyncio tasks (``await`` on receive; 8 B),
  for the libraries with an asyncio API (msgq, pyzmq's zmq.asyncio).

The peers are adapter classes in :mod:`msgq.bench.peers`, the processes' programs in
:mod:`msgq.bench.workers`, the parent side in :mod:`msgq.bench.runner` and the table in
:mod:`msgq.bench.report`; this module is the command line.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import glob
import importlib
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from multiprocessing.context import BaseContext
from typing import Any

from msgq.bench._bound import cache_bound, fanout_bound, view_bound
from msgq.bench.peers import (
    ASYNC_RTT_SIZES,
    BACKEND_ORDER,
    BACKENDS,
    DEFAULT_DURATION,
    DEFAULT_REPEAT,
    DEFAULT_SIZES,
    DEFAULT_SUBS,
    HEADER,
    INTO_SIZES,
    KIB,
    MIB,
    QUICK_DURATION,
    RTT_SIZES,
    TESTS,
    Geometry,
)
from msgq.bench.report import TEST_LABEL, fmt_size, render_table
from msgq.bench.runner import Measurement, Runner, median_of
from msgq.cli.output import number
from msgq.queues import queue_dir

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

Peers are measured only when importable: pip install 'msgq-shm[bench]'
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
        preload = ["msgq", "msgq.bench.workers"]
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


#: Payloads from this size get a "× memcpy" column (the memory's speed on this machine).
MEMCPY_FROM = 64 * 1024


def memcpy_bandwidth(size: int, rounds: int = 5, seconds: float = 0.05) -> float:
    """MB/s (10^6 bytes) of one ``memcpy`` of ``size`` bytes between two warm buffers on
    this CPU: the best of ``rounds`` timed loops of about ``seconds`` each."""
    src = (ctypes.c_char * size)()
    dst = (ctypes.c_char * size)()
    ctypes.memset(src, 1, size)
    ctypes.memmove(dst, src, size)
    best = 0.0
    for _ in range(rounds):
        n = 0
        start = time.perf_counter()
        while True:
            for _ in range(8):
                ctypes.memmove(dst, src, size)
            n += 8
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = max(best, n * size / elapsed / 1e6)
    return best


def _geometry_of(size: int) -> str:
    geo = Geometry.for_payload(size, 1)
    text = f"{fmt_size(size)}: W={geo.window}, {fmt_size(geo.segment_size)}"
    if geo.ring_segment_size != geo.segment_size:
        text += f" (msgq-ring {fmt_size(geo.ring_segment_size)})"
    return text


def cache_bound_bandwidth(
    sizes: Sequence[int], model: Callable[[int], float] = cache_bound
) -> dict[int, float]:
    """MB/s of a cache bound's model (:func:`msgq.bench._bound.cache_bound` for copying
    rows, :func:`~msgq.bench._bound.fanout_bound` bound to a subscriber count for those of
    several subscribers, :func:`~msgq.bench._bound.view_bound` for view rows) for each of
    ``sizes``;
    empty where it cannot run (fewer than two CPUs, no memory or threads for the model),
    said on stderr, and the table then leaves those rows' column empty. It is measured
    after the runs, so it must never cost their results."""
    try:
        return {size: model(size) * size / 1e6 for size in sizes}
    except (ValueError, OSError, MemoryError) as e:
        name = getattr(model, "__name__", None) or repr(model)
        print(f"msgq-bench: no × bound column ({name}): {e}", file=sys.stderr)
        return {}


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

    run_dir = queue_dir(create=True)  # the prefix folder msgq's queues go to

    plan: list[tuple[str, int, int]] = []
    if "throughput" in tests:
        plan += [("throughput", size, n) for size in sizes for n in subs_list]
    for kind in ("recv_into", "view"):
        if kind in tests:
            plan += [(kind, size, n) for size in sizes if size in INTO_SIZES for n in subs_list]
    pairs = _cpu_pairs()
    if "rtt" in tests:
        plan += [
            ("rtt", size, len(set(pair))) for size in sizes if size in RTT_SIZES for pair in pairs
        ]
        if len(pairs) < 2:
            skipped["2-cpu round trips"] = "this process may run on one CPU only"
    if "rtt_async" in tests:
        plan += [("rtt_async", size, len(set(pair)))
                 for size in sizes if size in ASYNC_RTT_SIZES for pair in pairs]

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
                    progress.step(f"{TEST_LABEL[kind]} {fmt_size(size)} ×{n} {name}")
                    if kind.startswith("rtt"):
                        pair = next(p for p in pairs if len(set(p)) == n)
                        m = runner.round_trip(name, size, pair, kind)
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
        key: {name: median_of(ms) for name, ms in by.items() if ms} for key, by in runs.items()
    }
    geometry_note = (
        "W and msgq's segment_size per payload: "
        + "; ".join(_geometry_of(s) for s in sizes)
        + ". From 256 KiB msgq's ring holds four windows of chunks and two more (a free "
        "chunk is reused only within a quarter ring of the write position); msgq-ring's "
        "is the plain ring's 1.5 windows."
    )
    large = [size for size in sizes if size >= MEMCPY_FROM]
    memcpy_mb_s = {size: memcpy_bandwidth(size) for size in large}
    # each model only where rows are reported against it (about 0.5 s per size)
    copying = {"throughput", "recv_into"} & set(tests)
    bound_mb_s = cache_bound_bandwidth(large) if copying else {}
    view_bound_mb_s = cache_bound_bandwidth(large, view_bound) if "view" in tests else {}
    fanout_mb_s = {
        (size, n): mb_s
        for n in (sorted({n for n in subs_list if n > 1}) if copying else [])
        for size, mb_s in cache_bound_bandwidth(
            large, functools.partial(fanout_bound, subscribers=n)).items()
    }
    table = render_table(cells, backends, skipped, geometry_note, memcpy_mb_s, bound_mb_s,
                         view_bound_mb_s, fanout_mb_s, pinned=runner.pin)
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
                "memcpy_mb_s": memcpy_mb_s,
                "cache_bound_mb_s": bound_mb_s,
                "view_bound_mb_s": view_bound_mb_s,
                "fanout_bound_mb_s": {f"{size}x{n}": v for (size, n), v in fanout_mb_s.items()},
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
    # a row a backend cannot run (n/a: e.g. a peer without asyncio) is not a failure
    failed = any(
        (m.error is not None and not m.detail.get("not_applicable")) or m.drops or m.bad
        for by in cells.values() for m in by.values()
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
