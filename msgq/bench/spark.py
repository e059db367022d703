"""Benchmark of msgq's Spark pipeline: ``python -m msgq.bench.spark`` (``msgq bench spark``).

Writes a recording of the 20 services of a controller-style process at their registry
rates (realistic list sizes, jittered times, outages making gaps; 1300 simulated s by
default: about 1 M events in 22 segments of 60 s), then, in one run:

* a plain single-process loop over the LogReader (pycapnp decode of every event) — the
  baseline — and the pycapnp loop an openpilot user writes (each segment decompressed,
  ``read_multiple_bytes``, ``which()`` and ``valid`` counted per service: issue 31's bar,
  CPU time);
* ``msgq logstats`` as a user runs it (its own process, JVM start-up included) on
  ``local[1]``, ``local[2]`` and a standalone cluster of two one-core workers started
  here with pyspark's ``spark-class`` (its start-up not counted); their results must be
  identical. Two commands on one segment come first: an untimed one that writes the
  driver JVM's class archive (msgq.spark.class_cache) that every later command maps,
  as a user's second command would, and a timed one: the fixed part of a command;
* reading the recording into a DataFrame (every row materialised by the ``noop``
  writer) with the raw columns and with every service decoded into typed columns, in
  ``local[1]`` and ``local[2]`` sessions.

Prints one table (wall time, events/s, events/s per core, ratio to the loop), the
targets of issue 17 with what was measured, and the load average before and after.
``--tiny`` is the smoke run the tests use (no cluster, and no command on one segment
first: the class archive and the fixed part are not measured); ``--no-cluster`` leaves
the cluster out;
``--seconds`` sets the size (1300: about 1 M events; the table says how many);
``--no-reads`` leaves the DataFrame reads out (the loop and logstats only).

``--pushdown`` runs the suite of issue 28 instead (:func:`run_pushdown`, about 2 minutes
at its default size): a rare service (gpsLocation, 1.3 % of the events) and a time
window of 5 % of the recording, each read with filter pushdown off, on, and by a plain
loop over the index reading only what the query needs; then the same events as many
small loggerd route segments (``<route>--<n>/rlog.zst``, 3 a route, written by a writer
per route: linear time) against the recording itself when it has at most 100 segments,
else 60 big ones, per event. ``--seconds 13000 --routes 2000`` is the issue's size
(10 M events).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from msgq.bench.fixtures import SERVICES, best_time, filled_message, pycapnp_loop
from msgq.cli.output import EXIT_FAILURE, print_error
from msgq.extras import MissingExtraError, require
from msgq.logs import LogReader, LogWriter, read_index
from msgq.schemas import SERVICE_LIST, use_schema

# pyspark-free at their top (pyspark, the spark extra, is imported when a session starts)
from msgq.spark import class_cache, read_logs
from msgq.spark.session import _java_runtime, spark_session
from msgq.spark.standalone import start_cluster
from msgq.tables import format_table

__all__ = ["main", "make_recording", "make_routes"]


def _events(seconds: float, jitter: float, drop: float, seed: int) -> Iterator[tuple[int, bytes]]:
    """(logMonoTime, bytes) of the benchmark's events, in time order (see
    :func:`make_recording`)."""
    rng = random.Random(seed)
    builders = {s: filled_message(s) for s in SERVICES}
    periods = {s: int(1e9 / SERVICE_LIST[s].frequency) for s in SERVICES}
    start = 1_000_000_000
    end = start + int(seconds * 1e9)
    # (time sent, nominal time, service): nominal times are exact multiples of the period
    due = [(start, start, s) for s in SERVICES]
    lost = dict.fromkeys(SERVICES, 0)
    heapq.heapify(due)
    written = 0
    while due:
        t, nominal, service = heapq.heappop(due)
        if t >= end:
            continue
        nominal += periods[service]
        heapq.heappush(due, (nominal + int(rng.uniform(-jitter, jitter) * periods[service]),
                             nominal, service))
        if lost[service]:
            lost[service] -= 1
            continue
        if rng.random() < drop:  # an outage of 1 to 4 messages (2 or more: a gap)
            lost[service] = rng.randint(0, 3)
            continue
        msg = builders[service]
        msg.logMonoTime = t
        msg.valid = written % 50 != 0
        yield t, msg.to_bytes()
        msg.clear_write_flag()
        written += 1


def make_recording(folder: str, seconds: float, rotate_seconds: float,
                   jitter: float = 0.05, drop: float = 0.001, seed: int = 17) -> int:
    """Writes ``seconds`` of simulated time of the benchmark's services at their
    registry rates to ``folder``; returns the number of events written. Each event is
    ``jitter`` periods early or late at most (uniform); with probability ``drop`` an
    outage of 1 to 4 messages starts (two or more lost: a gap); one in 50 is invalid:
    the analyses see realistic intervals, not one repeated value. Seeded: the same
    arguments write the same recording."""
    written = 0
    with LogWriter(folder, rotate_seconds=rotate_seconds) as writer:
        for _, data in _events(seconds, jitter, drop, seed):
            writer.write(data)
            written += 1
    return written


def make_routes(target: str, seconds: float, routes: int, per_route: int = 3,
                seed: int = 17) -> int:
    """The events of :func:`make_recording` (same ``seconds`` and ``seed``) in openpilot's
    layout under ``target``: ``routes`` routes of ``per_route`` segments, route ``r<i>``'s
    segment ``n`` as ``r<i>--<n>/rlog.zst``. Each route is written by a writer of its
    own (one recording index per route: thousands of segments in one recording rewrite
    its index per segment, quadratic time). Returns the number of events written."""
    span = int(seconds * 1e9 / routes)
    rotate = seconds / (routes * per_route)
    first_ns = 1_000_000_000
    written = 0
    route = -1
    writer: LogWriter | None = None
    staging = os.path.join(target, ".staging")

    def close(writer: LogWriter, route: int) -> None:
        writer.close()
        folder = os.path.join(staging, str(route))
        files = sorted(n for n in os.listdir(folder) if n.startswith("segment-"))
        for n, name in enumerate(files):
            segment = os.path.join(target, f"r{route:05d}--{n}")
            os.makedirs(segment)
            os.replace(os.path.join(folder, name), os.path.join(segment, "rlog.zst"))

    for t, data in _events(seconds, 0.05, 0.001, seed):
        at = min(routes - 1, (t - first_ns) // span)
        if at != route:
            if writer is not None:
                close(writer, route)
            route = at
            writer = LogWriter(os.path.join(staging, str(route)), rotate_seconds=rotate)
        assert writer is not None
        writer.write(data)
        written += 1
    if writer is not None:
        close(writer, route)
    shutil.rmtree(staging, ignore_errors=True)
    return written


def _pycapnp_loop(folder: str) -> int:
    """The loop an openpilot user writes (issue 31's bar): each segment decompressed,
    ``read_multiple_bytes``, ``which()`` and ``valid`` counted per service."""
    return pycapnp_loop(folder)


def _reader_decode(folder: str) -> int:
    count = 0
    for event in LogReader(folder):
        event.which()
        count += 1
    return count


def _spark_reads(folder: str, cores: int, services: Sequence[str],
                 repeat: int) -> dict[str, tuple[int, float]]:
    """(events, best seconds) of materialising the raw and the typed DataFrame, and the
    seconds the session took to start (JVM included)."""
    t0 = time.perf_counter()
    spark = spark_session(f"local[{cores}]", app_name="msgq spark bench")
    results = {"session": (0, time.perf_counter() - t0)}
    try:
        first = sorted(os.path.join(folder, n) for n in os.listdir(folder)
                       if n.startswith("segment-"))[0]
        for name, decode, data in (("raw", False, False), ("typed", True, False)):
            options = {"services": services if decode else None, "decode": decode,
                       "data": data}
            # warm-up on one segment: starts the Python workers, loads the schema
            read_logs(spark, first, **options).write.format("noop").mode("overwrite").save()
            df = read_logs(spark, folder, **options)

            def materialise(df: Any = df) -> int:
                df.write.format("noop").mode("overwrite").save()
                return 0

            _, seconds = best_time(materialise, repeat)
            results[name] = (df.count(), seconds)
            _note(f"read {name} local[{cores}]: {seconds:.1f} s")
        return results
    finally:
        spark.stop()


def _window_loop(folder: str, low: int, high: int) -> int:
    """Events with ``low <= logMonoTime < high`` by a plain loop: the recording index
    names the segments that overlap the window, and only those are read."""
    count = 0
    for entry in read_index(folder) or []:
        if entry.last_mono_ns < low or entry.first_mono_ns >= high:
            continue
        for event in LogReader(os.path.join(folder, entry.file), start_mono_ns=low).raw():
            count += event.mono_ns < high
    return count


def run_pushdown(seconds: float, rotate_seconds: float, repeat: int, routes: int,
                 cores: int = 2) -> dict[str, Any]:
    """The rows of issue 28, in one ``local[cores]`` session; each query's variants are
    timed alternately, best of ``repeat``."""
    load_before = os.getloadavg()
    rare = "gpsLocation"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="msgq-spark-bench-") as tmp:
        folder = os.path.join(tmp, "recording")
        written = make_recording(folder, seconds, rotate_seconds)
        entries = read_index(folder) or []
        first = min(e.first_mono_ns for e in entries)
        last = max(e.last_mono_ns for e in entries)
        low = first + int((last - first) * 0.475)
        high = first + int((last - first) * 0.525)
        _note(f"{written} events in {len(entries)} segments written")
        # the same events as small route segments and as few big ones
        layout = os.path.join(tmp, "routes")
        make_routes(layout, seconds, routes)
        big = folder
        if len(entries) > 100:  # few big segments: 60 of them
            big = os.path.join(tmp, "big")
            make_recording(big, seconds, seconds / 60)
        big_files = len([n for n in os.listdir(big) if n.startswith("segment-")])
        _note(f"{routes} routes x 3 segments, and {big_files} big segments written")
        spark = spark_session(f"local[{cores}]", app_name="msgq spark bench pushdown")
        try:
            def query(kind: str, pushdown: bool) -> int:
                if kind == "rare":
                    df = read_logs(spark, folder, data=False, pushdown=pushdown,
                                   services=[rare])
                else:
                    df = read_logs(spark, folder, data=False, pushdown=pushdown,
                                   start=low, end=high)
                return int(df.count())

            loops = {"rare": lambda: sum(1 for _ in LogReader(folder, services=[rare]).raw()),
                     "window": lambda: _window_loop(folder, low, high)}
            for kind, label in (("rare", f"rare service ({rare})"),
                                ("window", "time window (5 %)")):
                query(kind, True)  # warm-up: the Python workers, the schema
                best: dict[str, float] = {}
                counts: dict[str, int] = {}
                for _ in range(repeat):  # alternating: load affects each alike
                    for name, call in (("off", lambda k=kind: query(k, False)),
                                       ("on", lambda k=kind: query(k, True)),
                                       ("loop", loops[kind])):
                        t0 = time.perf_counter()
                        counts[name] = call()
                        best[name] = min(best.get(name, 1e99), time.perf_counter() - t0)
                if len(set(counts.values())) != 1:
                    raise RuntimeError(f"{label}: the variants disagree: {counts}")
                rows.append({"query": label, "events": counts["on"],
                             "pushdown_off_s": best["off"], "pushdown_on_s": best["on"],
                             "loop_s": best["loop"],
                             "speedup": best["off"] / best["on"],
                             "vs_loop": best["on"] / best["loop"]})
                _note(f"{label}: off {best['off']:.2f} s, on {best['on']:.2f} s, "
                      f"loop {best['loop']:.2f} s")

            def layout_read(path: str) -> int:
                df = read_logs(spark, path, data=False)
                df.write.format("noop").mode("overwrite").save()
                return 0

            sources = {"small": os.path.join(layout, "r*--*"), "big": big}
            counts_of = {k: read_logs(spark, p, data=False).count() for k, p in sources.items()}
            times: dict[str, float] = {}
            for _ in range(repeat):
                for name, path in sources.items():
                    t0 = time.perf_counter()
                    layout_read(path)
                    times[name] = min(times.get(name, 1e99), time.perf_counter() - t0)
            per_event = {k: times[k] / counts_of[k] for k in sources}
            layout_row = {"routes": routes, "small_files": routes * 3, "big_files": big_files,
                          "small_s": times["small"], "big_s": times["big"],
                          "small_events": counts_of["small"], "big_events": counts_of["big"],
                          "ratio_per_event": per_event["small"] / per_event["big"]}
            _note(f"layout: small {times['small']:.2f} s, big {times['big']:.2f} s")
        finally:
            spark.stop()
    return {"events_written": written, "segments": len(entries), "cores": cores,
            "rows": rows, "layout": layout_row, "load_before": load_before,
            "load_after": os.getloadavg()}


def _pushdown_table(result: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [("query", "events", "pushdown off s", "on s",
                                    "index loop s", "off/on", "on/loop")]
    for r in result["rows"]:
        rows.append((r["query"], str(r["events"]), f"{r['pushdown_off_s']:.2f}",
                     f"{r['pushdown_on_s']:.2f}", f"{r['loop_s']:.2f}",
                     f"{r['speedup']:.1f}x", f"{r['vs_loop']:.2f}x"))
    lay = result["layout"]
    load = " ".join(f"{v:.2f}" for v in result["load_before"])
    return "\n".join([
        f"{result['events_written']} events in {result['segments']} segments, "
        f"local[{result['cores']}]; load average {load} before",
        format_table(rows),
        "targets: off/on >= 10x, on/loop <= 2x",
        f"route layout: {lay['small_files']} small segments ({lay['routes']} routes x 3) "
        f"{lay['small_s']:.2f} s for {lay['small_events']} events, {lay['big_files']} big "
        f"segments {lay['big_s']:.2f} s for {lay['big_events']}: "
        f"{lay['ratio_per_event']:.2f}x per event (target <= 1.5x)",
    ])


def _logstats(folder: str, master: str) -> tuple[dict[str, Any], float]:
    """(the JSON of msgq logstats FOLDER --master MASTER, its wall seconds): the command
    as a user runs it, in its own process, JVM start-up included."""
    env = dict(os.environ)
    env.pop("PYSPARK_PYTHON", None)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "msgq", "logstats", folder, "--master",
                           master, "--json"], capture_output=True, text=True, env=env,
                          timeout=1800)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"msgq logstats --master {master} failed:\n{done.stderr}")
    _note(f"msgq logstats --master {master}: {seconds:.1f} s")
    return json.loads(done.stdout), seconds


def _fixed_part(folder: str) -> dict[str, Any]:
    """An untimed ``msgq logstats`` of one segment, so that the timed commands start as
    every command after a user's first does: with the driver JVM's class archive
    (:mod:`msgq.spark.class_cache`) written, and no JVM writing it in the background;
    then the same command timed: the part of every command that does not grow with the
    recording. Returns {"class_archive": in use, "events": that segment's events,
    "seconds": that command's}. With the archive off (MSGQ_SPARK_CLASS_CACHE=0) there is
    nothing to warm: one command."""
    first = os.path.join(folder, sorted(n for n in os.listdir(folder)
                                        if n.startswith("segment-"))[0])
    in_use = False
    if class_cache.enabled():
        _logstats(first, "local[1]")
        java, version, _ = _java_runtime()
        in_use = class_cache.wait_for_archive(java, version)
    doc, seconds = _logstats(first, "local[1]")
    return {"class_archive": in_use, "events": sum(r["count"] for r in doc["services"]),
            "seconds": seconds}


def _note(text: str) -> None:
    """Progress on stderr (the table comes at the end, on stdout)."""
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"  {text} (load {load})", file=sys.stderr, flush=True)


def _same_results(docs: list[dict[str, Any]]) -> bool:
    tables = ("services", "segments", "gaps", "problems")
    return all({t: d[t] for t in tables} == {t: docs[0][t] for t in tables} for d in docs)


def run(seconds: float, rotate_seconds: float, repeat: int, cluster: bool = True,
        folder: str | None = None, reads: bool = True,
        fixed_part: bool = True) -> dict[str, Any]:
    """Runs every measurement; returns the rows as dicts, the targets and the load
    (``fixed_part``: False leaves out the commands on one segment, and the class
    archive is then not written by an untimed command first)."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="msgq-spark-bench-") as tmp:
        folder = folder or os.path.join(tmp, "recording")
        written = make_recording(folder, seconds, rotate_seconds)
        files = sorted(n for n in os.listdir(folder) if n.startswith("segment-"))
        size = sum(os.path.getsize(os.path.join(folder, n)) for n in files)
        _note(f"{written} events written")
        loop = best_time(lambda: _reader_decode(folder), repeat)
        _note(f"LogReader loop: {loop[1]:.1f} s")
        pycapnp = best_time(lambda: _pycapnp_loop(folder), repeat)
        _note(f"pycapnp loop: {pycapnp[1]:.1f} s")
        fixed = _fixed_part(folder) if fixed_part else None
        stats: dict[str, tuple[dict[str, Any], float]] = {}
        for cores in (1, 2):
            stats[f"local[{cores}]"] = _logstats(folder, f"local[{cores}]")
        cluster_start = None
        if cluster:
            t0 = time.perf_counter()
            running = start_cluster(os.path.join(tmp, "cluster"), workers=2, cores=1)
            cluster_start = time.perf_counter() - t0
            try:
                stats["standalone"] = _logstats(folder, running.url)
            finally:
                running.stop()
        services = (*SERVICES, "logStart")  # every event, as the loop reads them
        measured = {cores: _spark_reads(folder, cores, services, repeat)
                    for cores in ((1, 2) if reads else ())}
    rows: list[dict[str, Any]] = []
    events, loop_seconds = loop

    def add(what: str, cores: int, count: int, secs: float) -> None:
        rate = count / secs
        rows.append({"what": what, "cores": cores, "events": count, "seconds": secs,
                     "events_per_s": rate, "events_per_s_per_core": rate / cores,
                     "vs_loop": secs / loop_seconds})

    add("LogReader loop (pycapnp decode), one process", 1, events, loop_seconds)
    add("pycapnp loop (read_multiple_bytes, which/valid counted)", 1, *pycapnp)
    for name, (doc, secs) in stats.items():
        label = "standalone, 2 workers x 1 core" if name == "standalone" else name
        add(f"msgq logstats, {label}", 2 if name != "local[1]" else 1,
            sum(r["count"] for r in doc["services"]), secs)
    for kind, label in (("raw", "raw columns (data=false)"), ("typed", "typed columns")):
        for cores in measured:
            add(f"read {label}, local[{cores}]", cores, *measured[cores][kind])
    l1, l2 = stats["local[1]"][1], stats["local[2]"][1]
    # one core: the per-core rate
    typed = measured[1]["typed"][0] / measured[1]["typed"][1] if measured else None
    raw = measured[1]["raw"][0] / measured[1]["raw"][1] if measured else None
    pycapnp_rate = pycapnp[0] / pycapnp[1]
    return {
        "events_written": written, "segments": len(files), "bytes": size,
        "cpu_count": os.cpu_count(), "rows": rows,
        # the first session of this process
        "jvm_start_s": measured[1]["session"][1] if measured else None,
        "cluster_start_s": cluster_start,
        "fixed_part": fixed,  # with whether the class archive was in use
        "identical_results": _same_results([doc for doc, _ in stats.values()]),
        "targets": {
            "logstats_local2_vs_loop": l2 / loop_seconds,  # <= 3
            "logstats_speedup_local1_to_local2": l1 / l2,  # >= 1.6
            "typed_events_per_s_per_core": typed,  # >= 50,000
            # issue 31: >= 1.5 and <= 0.5
            "raw_local1_vs_pycapnp_per_core": None if raw is None else raw / pycapnp_rate,
            "logstats_local2_time_vs_pycapnp": l2 / pycapnp[1],
        },
        "load_before": load_before, "load_after": os.getloadavg(),
    }


def _table(result: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [("what", "cores", "events", "wall s", "events/s",
                                    "events/s/core", "x loop time")]
    for r in result["rows"]:
        rows.append((r["what"], str(r["cores"]), str(r["events"]), f"{r['seconds']:.2f}",
                     f"{r['events_per_s']:,.0f}", f"{r['events_per_s_per_core']:,.0f}",
                     f"{r['vs_loop']:.2f}"))
    t = result["targets"]
    start = result["cluster_start_s"]

    def load(values: Sequence[float]) -> str:
        return " ".join(f"{v:.2f}" for v in values)

    starts = [] if result["jvm_start_s"] is None else \
        [f"JVM start-up (a session): {result['jvm_start_s']:.1f} s"]
    if start is not None:
        starts.append(f"cluster start-up (not counted): {start:.1f} s")
    fixed = result["fixed_part"]
    if fixed is not None:
        starts.append("driver JVM class archive: " + (
            "in use (written by an untimed first command)" if fixed["class_archive"]
            else "not in use"))
        starts.append(f"msgq logstats of one segment ({fixed['events']} events), local[1]: "
                      f"{fixed['seconds']:.1f} s (the part of a command that does not "
                      f"grow with the recording)")
    typed = t["typed_events_per_s_per_core"]
    return "\n".join([
        f"{result['events_written']} events written in {result['segments']} segments "
        f"(+ a logStart each), {result['bytes'] / 1e6:.1f} MB; {result['cpu_count']} CPUs; "
        f"load average {load(result['load_before'])} before, "
        f"{load(result['load_after'])} after",
        format_table(rows),
        *starts,
        f"logstats results identical on every master: "
        f"{'yes' if result['identical_results'] else 'NO'}",
        f"targets: logstats local[2] = {t['logstats_local2_vs_loop']:.2f}x the loop's time "
        f"(<= 3); local[1] -> local[2] speed-up {t['logstats_speedup_local1_to_local2']:.2f}x "
        f"(>= 1.6)" + ("" if typed is None else
                       f"; typed columns {typed:,.0f} events/s on one core (>= 50,000)"),
        "issue 31: " + ("" if t["raw_local1_vs_pycapnp_per_core"] is None else
                        f"raw columns local[1] = {t['raw_local1_vs_pycapnp_per_core']:.2f}x "
                        "the pycapnp loop's events/s (>= 1.5); ")
        + f"logstats local[2] = {t['logstats_local2_time_vs_pycapnp']:.2f}x the pycapnp "
          "loop's time (<= 0.5)",
    ])


def add_recording_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the recording :func:`make_recording` writes (``--seconds``,
    ``--rotate``), shared by the Spark and lake benchmarks."""
    parser.add_argument("--seconds", type=float, default=1300.0,
                        help="simulated seconds of recording (default 1300: ~1 M events)")
    parser.add_argument("--rotate", type=float, default=60.0,
                        help="segment length in simulated seconds (default 60)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: prints the table (or JSON)."""
    parser = argparse.ArgumentParser(prog="python -m msgq.bench.spark",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recording_arguments(parser)
    parser.add_argument("--repeat", type=int, default=1,
                        help="best of N runs of the loop and of the reads (default 1)")
    parser.add_argument("--no-cluster", action="store_true",
                        help="leave out the standalone cluster")
    parser.add_argument("--no-reads", action="store_true",
                        help="leave out the DataFrame reads (raw and typed columns): "
                             "the loop and msgq logstats only, e.g. on a larger --seconds")
    parser.add_argument("--tiny", action="store_true",
                        help="a smoke run: 4 simulated seconds in 2 segments, no cluster, "
                             "no command on one segment first")
    parser.add_argument("--pushdown", action="store_true",
                        help="the filter pushdown and route layout suite instead (issue 28; "
                             "default --seconds 300, --rotate 10)")
    parser.add_argument("--routes", type=int, default=200,
                        help="routes of 3 small segments in the layout row (default 200)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        require("spark", "pyspark")
    except MissingExtraError as e:
        print_error("bench spark", str(e))
        return EXIT_FAILURE
    seconds, rotate, repeat = (4.0, 2.0, 1) if args.tiny else \
        (args.seconds, args.rotate, args.repeat)
    if seconds <= 0 or rotate <= 0 or repeat < 1:
        parser.error("--seconds and --rotate must be positive, --repeat at least 1")
    # The recording is of msgq's own services: msgq's schema and registry are in force
    # here and in the commands run (whatever MSGQ_SCHEMA / --schema said).
    use_schema(None)
    if args.pushdown:
        given = argv if argv is not None else sys.argv[1:]
        pd_seconds = 20.0 if args.tiny else (
            args.seconds if "--seconds" in given else 300.0)
        pd_rotate = 5.0 if args.tiny else (args.rotate if "--rotate" in given else 10.0)
        routes = 4 if args.tiny else args.routes
        pushed = run_pushdown(pd_seconds, pd_rotate, max(repeat, 1 if args.tiny else 3),
                              routes)
        if args.json:
            json.dump(pushed, sys.stdout, indent=2)
            print()
        else:
            print(_pushdown_table(pushed))
        return 0
    result = run(seconds, rotate, repeat, cluster=not (args.tiny or args.no_cluster),
                 reads=not args.no_reads, fixed_part=not args.tiny)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(_table(result))
    return 0 if result["identical_results"] else 1


if __name__ == "__main__":
    sys.exit(main())
