"""Benchmark of the msgqlog Spark source: ``python -m msgq.spark.bench``.

Writes a recording of the 20 services of a controller-style process at their registry
rates (realistic list sizes), then reads it back:

* with a plain Python loop over the LogReader — peeked only (``raw()``), decoded by
  pycapnp (``for event in LogReader``), and decoded and turned into rows by the same
  converters the source uses;
* with the data source in local Spark sessions of 1 and 2 executor cores
  (``local[1]``, ``local[2]``), raw columns only and with every service decoded into
  typed columns. Every row is materialised (the ``noop`` writer), after a warm-up read
  that starts the Python workers.

Prints one table: events/s, events/s per core and the ratio to the LogReader loop that
does the same work, then the speed-up from 1 to 2 cores. ``--seconds`` sizes the
recording (the default run takes about a minute); ``--tiny`` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from msgq.tables import format_table

__all__ = ["main", "make_recording"]


def make_recording(folder: str, seconds: float, rotate_seconds: float) -> int:
    """Writes ``seconds`` of simulated time of the benchmark's services at their
    registry rates to ``folder``; returns the number of events written."""
    from msgq.logs import LogWriter
    from msgq.messaging.bench import SERVICES, filled_message
    from msgq.schemas import SERVICE_LIST

    builders = {s: filled_message(s) for s in SERVICES}
    periods = {s: int(1e9 / SERVICE_LIST[s].frequency) for s in SERVICES}
    start = 1_000_000_000
    due = dict.fromkeys(SERVICES, start)
    end = start + int(seconds * 1e9)
    written = 0
    with LogWriter(folder, rotate_seconds=rotate_seconds) as writer:
        while True:
            service = min(due, key=due.__getitem__)
            t = due[service]
            if t >= end:
                break
            msg = builders[service]
            msg.logMonoTime = t
            msg.valid = written % 50 != 0
            writer.write(msg.to_bytes())
            msg.clear_write_flag()
            due[service] = t + periods[service]
            written += 1
    return written


def _time(fn: Callable[[], int], repeat: int) -> tuple[int, float]:
    """(events, best seconds) of ``fn`` run ``repeat`` times."""
    best = float("inf")
    count = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - t0)
    return count, best


def _reader_raw(folder: str) -> int:
    from msgq.logs import LogReader

    return sum(1 for _ in LogReader(folder).raw())


def _reader_decode(folder: str) -> int:
    from msgq.logs import LogReader

    count = 0
    for event in LogReader(folder):
        event.which()
        count += 1
    return count


def _reader_rows(folder: str) -> int:
    """Decode and convert every event the way the source's typed columns do."""
    from msgq.logs import LogReader
    from msgq.schemas import default_schema
    from msgq.spark.capnp_types import member_plan

    root = default_schema().event.schema
    plans: dict[str, Any] = {}
    count = 0
    for event in LogReader(folder):
        service = event.which()
        plan = plans.get(service)
        if plan is None:
            plan = plans[service] = (root.fields[service], member_plan(root, service))
        field, type_plan = plan
        value = event._get_by_field(field)
        if type_plan is not None and type_plan.convert is not None:
            type_plan.convert(value)
        count += 1
    return count


def _spark_runs(folder: str, cores: int, services: Sequence[str],
                repeat: int) -> dict[str, tuple[int, float]]:
    from msgq.spark import read_logs
    from msgq.spark.session import spark_session

    spark = spark_session(f"local[{cores}]", app_name="msgq spark bench")
    try:
        results = {}
        for name, decode in (("raw", False), ("typed", True)):
            df = read_logs(spark, folder, services=services if decode else None,
                           decode=decode)
            df.write.format("noop").mode("overwrite").save()  # warm-up: workers, imports

            def materialise(df: Any = df) -> int:
                df.write.format("noop").mode("overwrite").save()
                return 0

            _, seconds = _time(materialise, repeat)
            results[name] = (df.count(), seconds)
        return results
    finally:
        spark.stop()


def run(seconds: float, rotate_seconds: float, repeat: int,
        folder: str | None = None) -> dict[str, Any]:
    """Runs every measurement; returns the rows as dicts (and the recording's size)."""
    from msgq.messaging.bench import SERVICES

    with tempfile.TemporaryDirectory(prefix="msgq-spark-bench-") as tmp:
        folder = folder or os.path.join(tmp, "recording")
        written = make_recording(folder, seconds, rotate_seconds)
        files = sorted(n for n in os.listdir(folder) if n.startswith("segment-"))
        loops = {
            "raw": _time(lambda: _reader_raw(folder), repeat),
            "decode": _time(lambda: _reader_decode(folder), repeat),
            "typed": _time(lambda: _reader_rows(folder), repeat),
        }
        services = (*SERVICES, "logStart")  # every event, as the loops read them
        spark = {cores: _spark_runs(folder, cores, services, repeat) for cores in (1, 2)}
    rows = []

    def add(what: str, cores: int, events: int, secs: float, baseline: float | None) -> None:
        rate = events / secs
        rows.append({"what": what, "cores": cores, "events": events, "seconds": secs,
                     "events_per_s": rate, "events_per_s_per_core": rate / cores,
                     "vs_loop": None if baseline is None else rate / cores / baseline})

    add("LogReader.raw() loop (peek, no decode)", 1, *loops["raw"], None)
    add("LogReader loop (pycapnp decode)", 1, *loops["decode"], None)
    add("LogReader loop + typed rows", 1, *loops["typed"], None)
    raw_rate = loops["raw"][0] / loops["raw"][1]
    typed_rate = loops["typed"][0] / loops["typed"][1]
    for cores in (1, 2):
        add(f"msgqlog raw columns, local[{cores}]", cores, *spark[cores]["raw"], raw_rate)
    for cores in (1, 2):
        add(f"msgqlog typed columns, local[{cores}]", cores, *spark[cores]["typed"],
            typed_rate)
    speedup = {kind: spark[1][kind][1] / spark[2][kind][1] for kind in ("raw", "typed")}
    return {"events_written": written, "segments": len(files), "rows": rows,
            "speedup_1_to_2_cores": speedup, "cpu_count": os.cpu_count()}


def _table(result: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [("reader", "cores", "events", "s", "events/s",
                                    "events/s/core", "per core vs loop")]
    for r in result["rows"]:
        rows.append((r["what"], str(r["cores"]), str(r["events"]), f"{r['seconds']:.2f}",
                     f"{r['events_per_s']:,.0f}", f"{r['events_per_s_per_core']:,.0f}",
                     "-" if r["vs_loop"] is None else f"{r['vs_loop']:.2f}x"))
    s = result["speedup_1_to_2_cores"]
    return (f"{result['events_written']} events written in {result['segments']} segments "
            f"(+ a logStart each); {result['cpu_count']} CPUs\n" + format_table(rows) +
            f"\nspeed-up local[1] -> local[2]: raw {s['raw']:.2f}x, typed {s['typed']:.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: prints the table (or JSON)."""
    parser = argparse.ArgumentParser(prog="python -m msgq.spark.bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=90.0,
                        help="simulated seconds of recording (default 90: ~70k events)")
    parser.add_argument("--rotate", type=float, default=15.0,
                        help="segment length in simulated seconds (default 15)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs (default 3)")
    parser.add_argument("--tiny", action="store_true",
                        help="a smoke run: 4 simulated seconds in 2 segments")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    seconds, rotate, repeat = (4.0, 2.0, 1) if args.tiny else \
        (args.seconds, args.rotate, args.repeat)
    if seconds <= 0 or rotate <= 0 or repeat < 1:
        parser.error("--seconds and --rotate must be positive, --repeat at least 1")
    result = run(seconds, rotate, repeat)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
