"""The floor of a lake build (issue 42): ``python -m msgq.bench.build_floor [RECORDING]``.

What building the lake costs at the least, with no Spark and no bookkeeping: the parts of
the work every build does, in one process, over every segment of a recording:

* **read**: read and decompress every segment (the log reader's scanner batches: each
  event's bytes, service, logMonoTime, valid);
* **decode**: and decode every service's events into its typed Arrow column, a scanner
  batch at a time into one column per table file (the typed reader's
  :class:`~msgq.schemas._typed_reader.MemberColumn`, as the build's tasks do);
* **write**: and make each table file's event columns (logMonoTime, valid, segment,
  file, offset, size, problem) and write it as Parquet with the lake's exact write
  options (:data:`msgq.spark.lake_files._PARQUET_OPTIONS`, the lake's table schemas), a
  file per service cut at the lake's :data:`~msgq.spark.lake_files.TARGET_FILE_BYTES`.

Each part is the CPU seconds of its pass less those of the pass before (one warm-up
segment first: imports, the reader's first call), per 1 M events. The floor's wall is the
whole work split over ``--cores`` processes by segment bytes (as a build's tasks share
a batch), timed from a common start once every process is warm. Not in the floor: the
lake's compact table (LAKEREAD's, a small fraction) and the problems table (none on an
undamaged recording).

:func:`measure` returns the numbers (the lake benchmark, :mod:`msgq.bench.lake`, prints
its row beside the build's); ``main`` prints them as a table.

Layer: programs (a benchmark); needs the spark extra (pyarrow, and pyspark's type
conversion for the lake's schemas).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from queue import Empty
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema, to_arrow_type
from pyspark.sql.types import StructType

from msgq.logs import LogReader, segment_paths
from msgq.logs.segment import VALID, MessageBatch
from msgq.schemas import spec_in_force
from msgq.spark.capnp_types import member_plan
from msgq.spark.datasource import member_decoder, segment_number
from msgq.spark.lake import PARTITION_COLUMNS, table_schema
from msgq.spark.lake_files import _PARQUET_OPTIONS, TARGET_FILE_BYTES, _without_empty
from msgq.spark.streaming import StreamPartition, spread_ranges
from msgq.tables import format_table

__all__ = ["measure", "main"]

_PASSES = ("read", "decode", "write")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Floor:
    """One process's passes over segment files (pass ``read``, ``decode`` or ``write``,
    see the module docstring), under the schema in force."""

    def __init__(self, out: str) -> None:
        self.pa = pa
        self.out = out
        spec = spec_in_force()
        self.schema = spec.load()
        self.plans: dict[str, tuple[Any, Any]] = {}
        for service in self.schema.union_fields:
            kind = table_schema(service, self.schema)
            stored = to_arrow_schema(StructType([f for f in kind.fields
                                                 if f.name not in PARTITION_COLUMNS]),
                                     timezone="UTC")
            decoder = member_decoder(spec, service)
            plan = member_plan(self.schema.event.schema, service)
            typed = None if decoder is None or plan is None or service not in stored.names \
                else (decoder, to_arrow_type(plan.spark_type), stored.field(service).type)
            self.plans[service] = (stored, typed)
        self.written = 0

    def run(self, paths: Sequence[str], stage: str) -> int:
        """One pass over ``paths``; returns the events read."""
        events = 0
        files: dict[str, list[Any]] = {}  # service -> [typed column, parts, bytes]
        for path in paths:
            segment = segment_number(path)
            reader = LogReader([], skip_corrupt=True, schema=self.schema, warn=False)
            for batch in reader.segment_batches(path):
                if type(batch) is not MessageBatch:
                    events += 1  # an event the scanner leaves to pycapnp: rare
                    continue
                events += len(batch)
                if stage == "read":
                    continue
                codes = batch.service
                for index in np.unique(codes).tolist():
                    service = batch.services[index]
                    typed = self.plans[service][1]
                    rows = np.flatnonzero(codes == index)
                    gathered = files.get(service)
                    if gathered is None:
                        column = None if typed is None else \
                            typed[0].decoded_column(self.schema, typed[1])
                        gathered = files[service] = [column, [], 0]
                    starts = batch.offset[rows]
                    lengths = batch.length[rows]
                    if gathered[0] is not None:
                        gathered[0].add(batch.data, starts, lengths)
                    if stage == "write":
                        gathered[1].append((path, segment, batch.mono_ns[rows],
                                            (batch.flags[rows] & VALID) != 0,
                                            starts + batch.stream_offset, lengths))
                    gathered[2] += int(lengths.sum())
                    if gathered[2] >= TARGET_FILE_BYTES:
                        self._end(service, files.pop(service), stage)
        for service, gathered in files.items():
            self._end(service, gathered, stage)
        return events

    def _end(self, service: str, gathered: list[Any], stage: str) -> None:
        """A table file's events gathered: written (pass write), or its column made."""
        if stage == "write":
            self._write(service, gathered)
        elif gathered[0] is not None:
            gathered[0].finish()

    def _write(self, service: str, gathered: list[Any]) -> None:
        pa = self.pa
        stored, typed = self.plans[service]
        column, parts, _ = gathered
        count = sum(len(p[2]) for p in parts)
        paths = [p[0] for p in parts]
        runs = [len(p[2]) for p in parts]
        names = sorted(set(paths))
        file_index = pa.array(np.repeat([names.index(p) for p in paths], runs).astype(np.int32))
        columns = {
            "logMonoTime": pa.array(np.concatenate([p[2] for p in parts]).astype(np.int64)),
            "valid": pa.array(np.concatenate([p[3] for p in parts])),
            "segment": pa.array(np.repeat([-1 if p[1] is None else p[1] for p in parts],
                                          runs).astype(np.int32)),
            "file": pa.array(names, pa.string()).take(file_index),
            "offset": pa.array(np.concatenate([p[4] for p in parts]).astype(np.int64)),
            "size": pa.array(np.concatenate([p[5] for p in parts]).astype(np.int32)),
            "problem": pa.nulls(count, pa.string()),
        }
        if column is not None:
            array, _failed = column.finish()
            columns[service] = _without_empty(array, typed[2])
        table = pa.Table.from_arrays([columns[f.name] for f in stored], schema=stored)
        pq.write_table(table, os.path.join(self.out, f"{service}-{self.written}.parquet"),
                       **_PARQUET_OPTIONS)
        self.written += 1


def _spread(paths: list[str], count: int) -> list[list[str]]:
    """``paths`` (in stream order) over ``count`` shares as a build deals its segments:
    :func:`msgq.spark.streaming.spread_ranges`'s contiguous runs of about equal bytes."""
    ranges = [StreamPartition(path, k, 0, os.path.getsize(path), 0)
              for k, path in enumerate(paths)]
    return [[r.path for r in part.ranges] for part in spread_ranges(ranges, count)]


def _worker(paths: list[str], warm: str, out: str, ready: Any, start: Any, done: Any) -> None:
    floor = _Floor(out)
    floor.run([warm], "decode")
    ready.put(os.getpid())
    start.wait()
    began_cpu = _cpu()
    events = floor.run(paths, "write")
    done.put((time.perf_counter(), _cpu() - began_cpu, events))


def _parallel_wall(paths: list[str], cores: int, out: str) -> tuple[float, float]:
    """(seconds from a common start to the last process's end, their CPU seconds) of the
    whole work over ``cores`` warm processes."""
    context = multiprocessing.get_context("spawn")
    ready, done, start = context.Queue(), context.Queue(), context.Event()
    shares = _spread(paths, cores)
    workers = [context.Process(target=_worker, args=(share, paths[0],
                                                     os.path.join(out, str(k)),
                                                     ready, start, done))
               for k, share in enumerate(shares)]
    for k, worker in enumerate(workers):
        os.makedirs(os.path.join(out, str(k)), exist_ok=True)
        worker.start()
    try:
        for _ in workers:
            _get(ready, workers)
        began = time.perf_counter()
        start.set()
        results = [_get(done, workers) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
    return max(r[0] for r in results) - began, sum(r[1] for r in results)


def _get(queue: Any, workers: list[Any]) -> Any:
    """The next item of ``queue``; RuntimeError when a worker ended without giving it
    (it failed: its traceback is on stderr)."""
    while True:
        try:
            return queue.get(timeout=0.5)
        except Empty:
            dead = [w for w in workers if not w.is_alive() and w.exitcode != 0]
            if dead:
                raise RuntimeError(f"a floor process failed (exit status {dead[0].exitcode})"
                                   "; see its error above") from None


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(folder) for f in files)


def measure(recording: str, cores: int | None = None) -> dict[str, Any]:
    """The floor of building the lake of ``recording`` (module docstring): ``events``,
    ``segments``, CPU seconds per 1 M events of each part (``read_cpu_per_m``,
    ``decode_cpu_per_m``, ``write_cpu_per_m``) and their sum (``floor_cpu_per_m``), the
    whole work's ``floor_wall_s`` on ``cores`` processes (default every core) and their
    CPU seconds, the Parquet bytes written and the load average before and after."""
    cores = cores or os.cpu_count() or 1
    load_before = os.getloadavg()
    paths = segment_paths(recording)
    if not paths:
        raise ValueError(f"{recording}: no segment files")
    out = tempfile.mkdtemp(prefix="msgq-build-floor-")
    try:
        floor = _Floor(out)
        floor.run(paths[:1], "decode")  # warm-up: imports, the typed reader's first call
        cpu: dict[str, float] = {}
        events = 0
        for stage in _PASSES:
            began = _cpu()
            events = floor.run(paths, stage)
            cpu[stage] = _cpu() - began
        lake_bytes = _folder_bytes(out)
        shutil.rmtree(out)
        os.makedirs(out)
        wall, wall_cpu = _parallel_wall(paths, cores, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    per_m = 1e6 / max(events, 1)
    parts = {"read": cpu["read"], "decode": cpu["decode"] - cpu["read"],
             "write": cpu["write"] - cpu["decode"]}
    return {
        "events": events, "segments": len(paths), "cores": cores,
        **{f"{name}_cpu_per_m": seconds * per_m for name, seconds in parts.items()},
        "floor_cpu_per_m": cpu["write"] * per_m,
        "floor_wall_s": wall, "floor_wall_cpu_s": wall_cpu, "parquet_bytes": lake_bytes,
        "load_before": load_before, "load_after": os.getloadavg(),
    }


def rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The floor's rows as a table shows them: (label, measured)."""
    return [
        ("read + decompress, CPU-s per 1 M events", f"{r['read_cpu_per_m']:.2f}"),
        ("  + typed decode into Arrow", f"{r['decode_cpu_per_m']:.2f}"),
        ("  + event columns, Parquet write (lake's options)", f"{r['write_cpu_per_m']:.2f}"),
        ("floor, CPU-s per 1 M events", f"{r['floor_cpu_per_m']:.2f}"),
        (f"floor's wall on {r['cores']} processes",
         f"{r['floor_wall_s']:.2f} s ({r['floor_wall_cpu_s']:.1f} CPU-s)"),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m msgq.bench.build_floor``."""
    parser = argparse.ArgumentParser(prog="python -m msgq.bench.build_floor",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", help="a msgq recording folder (segment files)")
    parser.add_argument("--cores", type=int, default=None,
                        help="processes for the floor's wall (default every core)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    try:
        result = measure(args.recording, args.cores)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"msgq bench build_floor: {e}", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(f"{result['events']:,} events in {result['segments']} segments; load "
          f"{result['load_before'][0]:.1f} before, {result['load_after'][0]:.1f} after")
    print(format_table([("row", "measured"), *rows(result)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
