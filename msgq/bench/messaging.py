"""The messaging suite: ``python -m msgq.bench.messaging`` (``msgq bench messaging``).

Prints one table: the cost per call of ``SubMaster.update`` over 20 services and of
``PubMaster.send``, with the share of it spent in Cap'n Proto (decoding on the
subscriber, serialising on the publisher), measured on the shared-memory backend.

* ``update + read, at their rates``: a 100 Hz update loop; before each tick the services
  due at their registry rates are published (outside the timed call), so each update
  reads what a real 100 Hz consumer reads, and the timed call then reads the payload of
  every service it updated (``sm[s]``: SubMaster decodes payloads when they are read).
* ``update only``: the same without reading the payloads (a consumer that looks at the
  health flags, or at a few services only); its capnp share is "-": nothing is decoded.
* ``all 20 new``: every service has a new message at every update (worst case).
* ``update, nothing new``: the cost of an update that finds nothing.
* ``send``: ``PubMaster.send(service, builder)`` for a small and a large message; the
  capnp share is ``builder.to_bytes()``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from msgq.bench.fixtures import SERVICES, filled_message
from msgq.messaging import PubMaster, SubMaster, decode_event
from msgq.queues import queue_dir
from msgq.schemas import SERVICE_LIST
from msgq.tables import format_table

__all__ = ["main", "run"]

UPDATE_HZ = 100.0


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.fmean(ordered), ordered[len(ordered) // 2], p99


def _time_updates(sm: Any, ticks: int, publish: Callable[[int], list[bytes]],
                  read: bool = True) -> tuple[list[float], float]:
    """µs per ``sm.update(0)`` — followed, with ``read``, by reading the payload of every
    service it updated (``sm[s]``, as a consumer does; payloads are decoded when read) —
    over ``ticks`` ticks, and the µs pycapnp spends decoding those messages (measured
    separately on the same bytes)."""
    samples: list[float] = []
    decode_ns = 0
    services = sm.services
    for tick in range(ticks):
        sent = publish(tick)
        t0 = time.perf_counter_ns()
        sm.update(0)
        if read:
            for s in services:
                if sm.updated[s]:
                    sm[s]
        samples.append((time.perf_counter_ns() - t0) / 1000)
        t1 = time.perf_counter_ns()
        for data in sent:
            decode_event(data).which()
        decode_ns += time.perf_counter_ns() - t1
    return samples, decode_ns / 1000


def run(ticks: int) -> list[tuple[str, ...]]:
    """Runs every measurement; returns the table rows (header first)."""
    rows: list[tuple[str, ...]] = [
        ("operation", "msgs/call", "bytes/call", "mean µs", "p50 µs", "p99 µs", "capnp share")]
    pm = PubMaster(SERVICES)
    sm = SubMaster(SERVICES, frequency=UPDATE_HZ)
    payloads = {s: filled_message(s).to_bytes() for s in SERVICES}
    periods = {s: max(1, round(UPDATE_HZ / SERVICE_LIST[s].frequency)) for s in SERVICES}

    def at_rates(tick: int) -> list[bytes]:
        sent = [payloads[s] for s in SERVICES if tick % periods[s] == 0]
        for s in SERVICES:
            if tick % periods[s] == 0:
                pm.sock[s].send(payloads[s])
        return sent

    def all_new(tick: int) -> list[bytes]:
        for s in SERVICES:
            pm.sock[s].send(payloads[s])
        return list(payloads.values())

    def nothing(tick: int) -> list[bytes]:
        return []

    for label, publish, read in (
            ("SubMaster.update + read, 20 at their rates", at_rates, True),
            ("SubMaster.update only, 20 at their rates", at_rates, False),
            ("SubMaster.update + read, all 20 new", all_new, True),
            ("SubMaster.update only, all 20 new", all_new, False),
            ("SubMaster.update, nothing new", nothing, True)):
        _time_updates(sm, min(200, ticks), publish, read)  # warm-up
        counts: list[int] = []
        sizes: list[int] = []

        def counting(tick: int, publish: Callable[[int], list[bytes]] = publish,
                     counts: list[int] = counts, sizes: list[int] = sizes) -> list[bytes]:
            sent = publish(tick)
            counts.append(len(sent))
            sizes.append(sum(len(d) for d in sent))
            return sent

        samples, decode_us = _time_updates(sm, ticks, counting, read)
        mean, p50, p99 = _percentiles(samples)
        share = decode_us / sum(samples) if sum(samples) and read else None
        rows.append((label, f"{statistics.fmean(counts):.1f}", f"{statistics.fmean(sizes):.0f}",
                     f"{mean:.1f}", f"{p50:.1f}", f"{p99:.1f}",
                     "-" if share is None else f"{share:.0%}"))

    for service in ("vehicleState", "modelOutput"):
        msg = filled_message(service)
        size = len(msg.to_bytes())
        msg.clear_write_flag()
        samples = []
        serialise_ns = 0
        for _ in range(ticks):
            t0 = time.perf_counter_ns()
            pm.send(service, msg)
            samples.append((time.perf_counter_ns() - t0) / 1000)
            msg.clear_write_flag()  # re-sending one builder is what we measure
            t1 = time.perf_counter_ns()
            msg.to_bytes()
            serialise_ns += time.perf_counter_ns() - t1
            msg.clear_write_flag()
            sm.update(0)  # keeps the queue drained as a live reader would
        mean, p50, p99 = _percentiles(samples)
        rows.append((f"PubMaster.send {service}", "1", str(size),
                     f"{mean:.1f}", f"{p50:.1f}", f"{p99:.1f}",
                     f"{serialise_ns / 1000 / sum(samples):.0%}"))
    pm.close()
    sm.close()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m msgq.bench.messaging``."""
    parser = argparse.ArgumentParser(
        prog="python -m msgq.bench.messaging",
        description="Cost of SubMaster.update (20 services) and PubMaster.send per call.")
    parser.add_argument("--ticks", type=int, default=5000,
                        help="calls measured per row (default 5000)")
    args = parser.parse_args(argv)
    if args.ticks < 1:
        parser.error("--ticks must be >= 1")
    os.environ["MSGQ_PREFIX"] = f"bench_messaging_{os.getpid()}"
    os.environ["MSGQ_BACKEND"] = "msgq"
    os.environ.pop("ZMQ", None)

    run_dir = queue_dir(create=True)
    try:
        rows = run(args.ticks)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"messaging layer, shared-memory backend, {args.ticks} calls per row "
          f"(python {sys.version.split()[0]})")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
