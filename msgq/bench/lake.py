"""Benchmark of the route lake (issue 42): ``python -m msgq.bench.lake``.

Writes the Spark benchmark's recording (:func:`msgq.bench.spark.make_recording`: 1300
simulated s by default, about 1 M events; ``--seconds 13000``: about 10 M), then, in one
local Spark session (``--cores``, default every core):

* one raw ``log_stats`` pass as ``msgq logstats`` computes it (the source's compact read)
  and building the lake from the recording (``msgq.spark.lake.build``, a new lake each
  time), the best of ``--repeat`` each, measured in turn with the log_stats rows below
  after a first run of each (the first build's time the JSON keeps as
  ``build_cold_s``), and their ratio: the JVM's compiler goes on warming the raw pass's
  JVM work for several passes (10 M events: 3.3 s on its second run, 2.4-2.5 s from its
  fourth) while the build's work, in Python, takes the same from its second, so one
  early pass of each flatters the build; the lake's size (its tables, checkpoints left
  out) against the zstd segment files';
* a rare service's column over a 5 % time window (``gpsLocation``: avg of its speed),
  on the lake and on the raw logs with filter pushdown (services, start, end given to
  the source): the best of ``--query-repeat`` runs each (default 9: each run is well
  under a second, where one slow run in three is common on a shared machine),
  alternating, the bytes each read
  (Spark's input metrics of the query's stages for the lake's Parquet scan; for the raw
  source, which reads its files in Python and reports none, the bytes of the segment
  files the pushed filters leave it to read), and apart two costs no layout removes: a
  Spark job's own (``spark.range(1).count()``) and Spark's floor for any Parquet query
  (one tiny Parquet file, read with its schema given, its one column collected; a new
  DataFrame each time, as each query is);
* full ``log_stats`` on the lake (both engines) against the raw pass (the results must
  be equal): each as ``msgq logstats`` reads, the Python engine on compact reads (the
  raw source's packing in its workers; the lake's compact table, which the build
  packed once, grouped where it is read), the SQL engine on the lake's event rows; and
  apart the least a job over every event's row costs: one aggregate (count, first
  logMonoTime, bytes per service) over the lake's narrow columns;
* the build's floor (:func:`msgq.bench.build_floor.measure`: the read, decode and write
  work of a build with no Spark, measured before the session starts), beside the raw
  pass and the build.

Prints one table with the issue's targets and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from msgq.bench.lake_rows import ROWS, headline, measured
from msgq.bench.spark import add_recording_arguments, make_recording
from msgq.cli.output import EXIT_FAILURE, CommandError, print_error
from msgq.extras import MissingExtraError, require
from msgq.logs import read_index
from msgq.spark import read_logs
from msgq.spark.analyses import log_stats
from msgq.spark.session import spark_session
from msgq.tables import format_table

__all__ = ["ROWS", "headline", "main", "measured", "run"]

RARE = "gpsLocation"


def _folder_bytes(folder: str, skip: tuple[str, ...] = ()) -> int:
    total = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in skip]
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def _input_bytes(spark: Any, run: Callable[[], Any]) -> tuple[Any, int]:
    """(what ``run`` returns, the input bytes of the Spark stages it ran: the status
    store's stage data, which local sessions keep with no web UI)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    defaults = [getattr(store, f"stageList$default${i}")() for i in range(2, 6)]

    def stages() -> dict[int, int]:
        out = {}
        it = store.stageList(None, *defaults).iterator()
        while it.hasNext():
            stage = it.next()
            out[int(stage.stageId())] = int(stage.inputBytes())
        return out

    before = stages()
    result = run()
    after = stages()
    return result, sum(b for s, b in after.items() if s not in before)


def _best(calls: dict[str, Callable[[], Any]], repeat: int) -> tuple[dict[str, float],
                                                                     dict[str, Any]]:
    """Best seconds of each call over ``repeat`` rounds, alternating (load hits all
    alike), and each call's last result."""
    best: dict[str, float] = {}
    results: dict[str, Any] = {}
    for _ in range(repeat):
        for name, call in calls.items():
            began = time.perf_counter()
            results[name] = call()
            best[name] = min(best.get(name, 1e99), time.perf_counter() - began)
    return best, results


def run(seconds: float, rotate_seconds: float, repeat: int, cores: int | None,
        keep: str | None = None, query_repeat: int = 9) -> dict[str, Any]:
    """The rows (see the module docstring): ``log_stats`` and the build the best of
    ``repeat`` runs, the narrow query, the job and the Parquet floor the best of
    ``query_repeat``; ``keep``: a folder to write the recording and the lake to and
    leave there (default: a temporary one)."""
    # optional extra: these modules import pyspark (the spark extra) at their tops
    import pyarrow as pa
    import pyarrow.parquet as pq

    from msgq.bench import build_floor  # optional extra: pyspark and pyarrow at its top
    from msgq.spark import datasource, lake  # optional extra: pyspark at their tops

    load_before = os.getloadavg()
    root = keep or tempfile.mkdtemp(prefix="msgq-lake-bench-")
    os.makedirs(root, exist_ok=True)
    recording = os.path.join(root, "recording")
    lake_path = os.path.join(root, "lake")
    try:
        if not os.path.isdir(recording):
            written = make_recording(recording, seconds, rotate_seconds)
        else:
            written = sum(e.events for e in read_index(recording) or [])
        shutil.rmtree(lake_path, ignore_errors=True)
        entries = read_index(recording) or []
        first = min(e.first_mono_ns for e in entries)
        last = max(e.last_mono_ns for e in entries)
        low = first + int((last - first) * 0.475)
        high = first + int((last - first) * 0.525)
        master = "local[*]" if cores is None else f"local[{cores}]"
        # its own processes, no Spark: before the session, so nothing else runs
        floor = build_floor.measure(recording, cores)
        tiny = os.path.join(root, "parquet-floor.parquet")
        pq.write_table(pa.table({"x": pa.array([1, 2, 3], pa.int64())}), tiny)
        spark = spark_session(master, app_name="msgq lake bench")
        try:
            def raw_stats() -> dict[str, Any]:
                stats = log_stats(read_logs(spark, recording, data=False, compact=True,
                                            keep_problems=True))
                try:
                    return stats.to_dict()
                finally:
                    stats.unpersist()

            def lake_stats(engine: str = "python") -> dict[str, Any]:
                # as msgq logstats reads: compact (the Python engine's input)
                stats = log_stats(read_logs(spark, lake_path, compact=engine == "python"),
                                  engine=engine)
                try:
                    return stats.to_dict()
                finally:
                    stats.unpersist()

            def lake_floor() -> Any:  # the least a job over every event's row does
                return read_logs(spark, lake_path).groupBy("service").agg(
                    {"*": "count", "logMonoTime": "min", "size": "sum"}).collect()

            raw_stats()  # warm-up: the Python workers, the JIT
            # The first build in this JVM (a streaming query's first start loads and
            # compiles what later ones reuse), into the lake the queries read; the
            # measured builds run with the log_stats rows, in turn with the raw pass.
            began = time.perf_counter()
            lake.build(spark, [recording], lake_path)
            build_cold_s = time.perf_counter() - began

            def build_again() -> None:  # the same lake again, from nothing
                shutil.rmtree(lake_path, ignore_errors=True)
                lake.build(spark, [recording], lake_path)

            zstd_bytes = _folder_bytes(recording)
            lake_bytes = _folder_bytes(lake_path, ("_checkpoints", "_staging"))

            def lake_query() -> Any:
                return lake.sql(spark, lake_path, f"SELECT count(*), avg({RARE}.speed) FROM "
                                f"{RARE} WHERE logMonoTime >= {low} AND logMonoTime < {high}"
                                ).collect()[0]

            def raw_query() -> Any:
                df = read_logs(spark, recording, services=[RARE], decode=[RARE],
                               data=False, start=low, end=high, pushdown=True)
                return df.selectExpr("count(*)", f"avg({RARE}.speed)").collect()[0]

            def job() -> int:
                return int(spark.range(1).count())

            def parquet_floor() -> Any:  # what no lake layout can remove
                return spark.read.schema("x bigint").parquet(tiny).select("x").collect()

            lake_query()
            raw_query()
            parquet_floor()
            times, answers = _best({"lake": lake_query, "raw": raw_query, "job": job,
                                    "floor": parquet_floor}, query_repeat)
            if tuple(answers["lake"]) != tuple(answers["raw"]):
                raise RuntimeError(f"the lake and the raw logs disagree: {answers}")
            _, lake_read = _input_bytes(spark, lake_query)
            _, raw_metric = _input_bytes(spark, raw_query)
            options = datasource.ReadOptions.parse(_Options({
                "path": recording, "services": RARE,
                "where": datasource.where_option([RARE], low, high)}))
            raw_read = raw_metric or sum(os.path.getsize(p.path) for p in
                                         datasource.plan_segments(options))
            stats_times, stats_docs = _best({
                "lake": lake_stats, "raw": raw_stats,
                "sql": lambda: lake_stats("sql"), "floor": lake_floor,
                "build": build_again}, repeat)
            same = json.loads(json.dumps(stats_docs["lake"])) == \
                json.loads(json.dumps(stats_docs["raw"])) == \
                json.loads(json.dumps(stats_docs["sql"]))
            if not same:
                raise RuntimeError("log_stats on the lake differs from the raw logs'")
        finally:
            spark.stop()
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return {
        "events": written, "segments": len(entries), "master": master,
        "raw_stats_s": stats_times["raw"], "build_s": stats_times["build"],
        "build_cold_s": build_cold_s,
        "zstd_bytes": zstd_bytes, "lake_bytes": lake_bytes,
        "window_events": int(answers["lake"][0]),
        "lake_query_s": times["lake"], "raw_query_s": times["raw"], "job_s": times["job"],
        "parquet_floor_s": times["floor"], "build_floor": floor,
        "lake_read_bytes": lake_read, "raw_read_bytes": raw_read,
        "raw_read_from": "metrics" if raw_metric else "files",
        "lake_stats_s": stats_times["lake"], "raw_stats_best_s": stats_times["raw"],
        "lake_stats_sql_s": stats_times["sql"], "lake_floor_s": stats_times["floor"],
        "stats_equal": same, "load_before": load_before, "load_after": os.getloadavg(),
        "repeat": repeat, "query_repeat": query_repeat,
    }


class _Options:
    """Data source options as the source sees them (case-insensitive get)."""

    def __init__(self, options: dict[str, str]) -> None:
        self._options = {k.lower(): v for k, v in options.items()}

    def get(self, key: str) -> str | None:
        return self._options.get(key.lower())


def _table(r: dict[str, Any]) -> str:
    cells = measured(r)
    rows = [("row", "measured", "target")]
    rows += [(label, cells[name], target) for name, (label, target) in ROWS.items()]
    return headline(r) + "\n" + format_table(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m msgq.bench.lake``."""
    parser = argparse.ArgumentParser(prog="python -m msgq.bench.lake",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recording_arguments(parser)
    parser.add_argument("--repeat", type=int, default=3,
                        help="log_stats and the build: best of N (default 3)")
    parser.add_argument("--query-repeat", type=int, default=9,
                        help="the narrow query, the job and the Parquet floor: best of N "
                             "(default 9)")
    parser.add_argument("--cores", type=int, default=None,
                        help="local Spark cores (default every core)")
    parser.add_argument("--keep", metavar="DIR",
                        help="write the recording and the lake here and keep them (a "
                             "recording already there is reused)")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the results as JSON (what msgq.bench.figures reads)")
    args = parser.parse_args(argv)
    try:
        require("spark", "pyspark")
        result = run(args.seconds, args.rotate, max(1, args.repeat), args.cores, args.keep,
                     max(1, args.query_repeat))
    except (CommandError, MissingExtraError) as e:
        print_error("bench lake", str(e))
        return EXIT_FAILURE
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
