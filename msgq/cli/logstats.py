"""``msgq logstats``: rates, jitter, gaps and validity of recorded logs, computed with
Spark (a local session by default, a cluster with ``--master``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from msgq.cli.output import (
    EXIT_OK,
    CommandError,
    UsageError,
    paint,
    print_json,
    print_table,
    spark_conf,
)
from msgq.cli.services import check_services
from msgq.extras import require

# msgq.cli imports this module only when the command runs, after checking that pyspark
# (the spark extra) is installed: the Spark pipeline is imported here, at the top.
from msgq.logs import SchemaMismatchError, check_schema, segment_paths
from msgq.schemas import default_schema
from msgq.spark import read_logs
from msgq.spark.analyses import GAP_FACTOR, expected_rates, log_stats
from msgq.spark.connect import ENV_REMOTE, RemoteError, remote_url
from msgq.spark.datasource import local_path
from msgq.spark.hadoop import split_paths
from msgq.spark.lake import LakeError, is_lake, open_lake
from msgq.spark.plot import plot_rates
from msgq.spark.session import (
    DEFAULT_MASTER,
    ExecutorPythonError,
    JavaMissingError,
    probed_executors,
    spark_session,
)
from msgq.spark.streaming import follow_stats
from msgq.tables import plural

DESCRIPTION = """\
Read msgq log segments with Spark (the msgqlog data source) and print, per service:
message count, expected rate (the service registry's) and measured rate, inter-arrival
times (p50, p99, max of dt), gaps, the fraction of invalid messages and the mean size;
then the gaps with their times and any damage found in the files (with file and offset).

The logs are read with the schema in force: --schema FILE.capnp and --registry FILE
(e.g. cereal's log.capnp and services.py), else MSGQ_SCHEMA / MSGQ_REGISTRY, else msgq's
own; the expected rates are that registry's, and each field is read with the schema's
declared defaults (openpilot's valid defaults to true). A local log written with another
schema is refused before Spark starts (exit 1, one line). Loggerd logs are read as they
are: rlog.zst, rlog.bz2 or a raw rlog, a route segment folder <route>--<n> or a folder
of them (a route's segments are one recording).

PATH is a segment file, a recording folder or a glob (quote it), as many as you like;
or one lake (msgq lake build), whose Parquet tables are read instead of the raw logs.
Local paths and file: URIs are read by the msgqlog source (Python I/O on the executors);
any other URI Spark accepts (hdfs://, s3a://, abfs://, gs://: the cluster needs that
Hadoop connector) through Spark's Hadoop file systems, whole segment files loaded by its
binaryFile source; --via hadoop sends every PATH that way. A gap is an interval longer
than --gap-factor expected periods. The measured rate is intervals / their total
duration (1 / mean dt).

Spark runs locally on every core (local[*]) unless --master names a cluster or --remote
(else MSGQ_SPARK_REMOTE, when no --master is given) a Spark Connect server: msgq spark
serve starts one, and a command attached to it skips Spark's start-up (a line on stderr
says it attached; a server that does not answer is an error, exit 1). On a
cluster the executors need msgq (installed, or shipped: msgq spark pack-env), and local
paths must be at the same paths on every executor (shared storage). Before the job a
probe task checks that the executors' Python imports msgq. --conf passes any Spark
setting. Spark needs Java 17+ (scripts/ensure_env.sh installs it). See docs/spark.md.
No readable event at all (a file that is no log) is an error (exit 1)."""

EPILOG = """\
examples:
  msgq logstats ~/logs/drive1                      every segment of a recording
  msgq logstats '/data/*/segment-*.log.zst' --segments
  msgq logstats rec --services vehicleState,can --plot rates.png
  msgq logstats rec --json > stats.json
  msgq logstats rec --start 120 --end 180          one minute of the recording
  msgq logstats rec --follow --every 2             live tables while msgq record runs
  msgq logstats --schema cereal/log.capnp --registry cereal/services.py route--0/rlog.zst
  msgq logstats rec --remote sc://127.0.0.1:15002  on a warm Spark (msgq spark serve)
  msgq logstats rec --master spark://head:7077     on a cluster (shared storage)
  msgq logstats rec --master spark://head:7077 --conf spark.archives=env.tar.gz#environment \
      --conf spark.pyspark.python=./environment/bin/python
                                                   executors without msgq: ship this venv
                                                   (msgq spark pack-env env.tar.gz)
  msgq logstats hdfs://nn/logs/drive1              from HDFS (s3a://, gs://... alike)"""


# The driver's JVM of one short command: the quick JIT only. Start-up compiles far less
# (measured: about 5 s less JVM CPU time, 0.5-1 s less wall time), and with the events
# packed in the Python workers the JVM runs no hot loop over them that the optimising
# compiler would pay back. --conf spark.driver.extraJavaOptions=... comes after (wins).
_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1",)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq logstats``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "logstats",
        help="rates, jitter, gaps and validity of recorded logs (Spark)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="segment file, recording folder or glob; path or URI")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master (default local[*]: this machine, every core)")
    parser.add_argument("--remote", metavar="sc://HOST:PORT",
                        help="run on this Spark Connect server (msgq spark serve); default "
                             "$MSGQ_SPARK_REMOTE unless --master is given")
    parser.add_argument("--services", metavar="A,B",
                        help="only these services (others are skipped without decoding)")
    parser.add_argument("--start", type=float, default=None, metavar="SECONDS",
                        help="only events from this logMonoTime on (seconds, as the "
                             "recording's clock; the first segments skipped unread)")
    parser.add_argument("--end", type=float, default=None, metavar="SECONDS",
                        help="only events before this logMonoTime (seconds)")
    parser.add_argument("--follow", action="store_true",
                        help="follow PATH, a recording folder being written (msgq record): "
                             "live tables, refreshed as events arrive (Structured "
                             "Streaming), until Ctrl-C")
    parser.add_argument("--every", type=float, default=5.0, metavar="SECONDS",
                        help="with --follow: a refresh every SECONDS (default 5)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="with --follow: stop after SECONDS (default: at Ctrl-C)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="write the rate of each service over time as a PNG")
    parser.add_argument("--segments", action="store_true",
                        help="also print the statistics of each segment file")
    parser.add_argument("--gap-factor", type=float, default=None, metavar="K",
                        help="a gap is an interval over K expected periods (default 2.5)")
    parser.add_argument("--max-gaps", type=int, default=20, metavar="N",
                        help="gaps listed in the text output (default 20; JSON lists all)")
    parser.add_argument("--bin", type=float, default=None, metavar="SECONDS",
                        help="time bin of the plot (default 1 s, coarser for long logs)")
    parser.add_argument("--approx", action="store_true",
                        help="approximate percentiles (bounded memory for huge logs)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable), e.g. --conf "
                             "spark.executor.memory=4g --conf spark.archives=env.tar.gz"
                             "#environment")
    parser.add_argument("--via", choices=("auto", "source", "hadoop"), default="auto",
                        help="auto (default): local paths and file: URIs with the msgqlog "
                             "source, other URIs through Spark's Hadoop file systems; "
                             "source or hadoop: every PATH that way")
    return parser



def _check_paths(paths: list[str], via: str) -> tuple[list[str], list[str]]:
    """(the local segment files the paths name, the paths read through Hadoop): local
    ones are listed and checked against the schema in force here, before Spark starts;
    Spark lists the others."""
    if len(paths) == 1 and is_lake(paths[0]):  # a lake (msgq lake build): its tables
        try:
            open_lake(None, paths[0])  # built under the schema in force, or refused
        except LakeError as e:
            raise CommandError(str(e)) from None
        return [paths[0]], []
    local, remote = split_paths(paths, via)
    try:
        files = segment_paths([local_path(p) for p in local])
    except (ValueError, FileNotFoundError) as e:
        raise CommandError(str(e)) from None
    if local and not files:
        raise CommandError(f"no log segment files in {' '.join(local)}")
    try:  # a log of another schema: said here in one line, not read under wrong names
        check_schema(files)
    except SchemaMismatchError as e:
        raise CommandError(str(e)) from None
    return files, remote


def _window(start: float | None, end: float | None) -> tuple[int | None, int | None]:
    """--start/--end in seconds as logMonoTime nanoseconds (start <= t < end)."""
    start_ns = None if start is None else round(start * 1e9)
    end_ns = None if end is None else round(end * 1e9)
    for name, value in (("--start", start_ns), ("--end", end_ns)):
        if value is not None and not 0 <= value < 1 << 63:
            raise UsageError(f"{name} must be between 0 and 9.2e9 seconds")
    if start_ns is not None and end_ns is not None and start_ns >= end_ns:
        raise UsageError("--start must be before --end")
    return start_ns, end_ns


def _check_services(text: str | None) -> list[str] | None:
    """The services of --services, members of the union of the schema in force; an
    unknown one is a usage error (said before Spark starts)."""
    return None if text is None else check_services([text], default_schema().union_fields)


def _auto_bin(services: list[dict[str, Any]]) -> float:
    """1 s, or coarser so that a long log has at most about 600 bins."""
    span = max((s["duration_s"] or 0.0 for s in services), default=0.0)
    if span <= 600:
        return 1.0
    return float(math.ceil(span / 600))


def start_session(master: str | None = None, conf: dict[str, str] | None = None,
                  remote: str | None = None) -> Any:
    """The Spark session of ``msgq logstats`` (``master``: its --master, ``conf``: its
    --conf settings, ``remote``: its --remote), started the way the command starts it.
    A later command in the same process runs on that session (what ./run.sh's demo does
    to start the JVM early). Without ``master`` and ``remote``, $MSGQ_SPARK_REMOTE names
    a Spark Connect server to attach to."""
    return spark_session(master, app_name="msgq logstats", config=conf,
                         java_options=_JAVA_OPTIONS, class_cache=True, remote=remote)


def _remote(args: argparse.Namespace) -> str | None:
    """The Spark Connect server the command attaches to (--remote, else
    $MSGQ_SPARK_REMOTE when no --master is given), or None; a malformed URL or --remote
    with --master is a usage error."""
    if args.remote is not None and args.master:
        raise UsageError("--remote and --master: give one or the other")
    try:
        return remote_url(args.remote) if args.remote is not None or not args.master \
            else None
    except RemoteError as e:
        raise UsageError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    """Computes the statistics and prints them (and writes the plot)."""
    if args.gap_factor is not None and not args.gap_factor > 0:
        raise UsageError("--gap-factor must be positive")
    if args.bin is not None and not args.bin > 0:
        raise UsageError("--bin must be positive")
    if args.max_gaps < 0:
        raise UsageError("--max-gaps must be 0 or more")
    start, end = _window(args.start, args.end)
    conf = spark_conf(args.conf)
    require("spark", "pyspark")
    if args.follow:
        return _follow(args, conf)
    server = _remote(args)
    where = server or args.master or "local[*]"
    files, remote = _check_paths(args.paths, args.via)
    services = _check_services(args.services)
    if sys.stderr.isatty() and not args.json:
        what = [plural(len(files), "segment file")] if files else []
        what += [f"{plural(len(remote), 'path')} through Hadoop"] if remote else []
        print(paint(f"reading {' and '.join(what)} with Spark "
                    f"({where}) ...", "dim", sys.stderr), file=sys.stderr)
    try:
        spark = start_session(args.master, conf, server)
    except (JavaMissingError, ExecutorPythonError, RemoteError) as e:
        raise CommandError(str(e)) from None
    except Exception as e:  # a bad master URL or setting: the JVM's reason, one line
        raise CommandError(f"cannot start Spark: {_first_line(e)}") from None
    try:
        # Without a plot only the statistics are wanted: the source packs the events per
        # segment file and service as it reads them (no Spark row per event).
        # the schema in force (--schema/--registry, MSGQ_SCHEMA/MSGQ_REGISTRY, else
        # msgq's own) travels with the read to the executors
        df = read_logs(spark, args.paths, services=services, data=False, via=args.via,
                       compact=not args.plot, start=start, end=end,
                       keep_problems=True)
        # the files Spark listed for the Hadoop paths (the source's are not listed here)
        count = len(files) + (len(df.inputFiles()) if remote else 0)
    except Exception as e:  # bad option values surface as Spark analysis errors
        raise CommandError(_first_line(e)) from None
    if not count:
        raise CommandError(f"no log segment files in {' '.join(args.paths)}")
    gap_factor = GAP_FACTOR if args.gap_factor is None else args.gap_factor
    stats = None
    try:
        # the statistics' Spark job runs here (log_stats returns them computed)
        stats = log_stats(df, expected_rates(), gap_factor=gap_factor,
                          approx_percentiles=args.approx, cache=bool(args.plot))
        result = stats.to_dict()
        _check_readable(result, args)
        plot = None
        if args.plot:
            plot = _write_plot(stats, result, args.plot, args.bin)
    except CommandError:
        raise
    except Exception as e:  # executors that fail (no msgq, out of memory ...): one line
        raise CommandError(f"the Spark job failed: {_first_line(e)}") from None
    finally:
        if stats is not None:
            stats.unpersist()
    result = {"paths": list(args.paths), "files": count, "master": where, **result}
    executors = probed_executors(spark)
    if executors is not None:  # what the probe found on a cluster's executors
        result["executors"] = [{"host": host, "python": python, "version": version}
                               for host, python, version in executors]
    if plot is not None:
        result["plot"] = plot
    if args.json:
        print_json(result)
        return EXIT_OK
    _print_report(result, args)
    return EXIT_OK


def _follow(args: argparse.Namespace, conf: dict[str, str]) -> int:
    """--follow: the statistics of a growing recording, printed after each refresh."""
    if len(args.paths) != 1 or not os.path.isdir(args.paths[0]):
        raise UsageError("--follow takes one recording folder (the one msgq record writes)")
    if args.every <= 0 or (args.duration is not None and args.duration <= 0):
        raise UsageError("--every and --duration must be positive")
    for flag, given in (("--plot", args.plot), ("--services", args.services),
                        ("--start", args.start), ("--end", args.end),
                        ("--master", args.master), ("--remote", args.remote)):
        if given:
            raise UsageError(f"--follow reads on local Spark with no {flag}")
    if os.environ.get(ENV_REMOTE, "").strip():
        # its micro-batches are collected into this process (foreachBatch), which a Spark
        # Connect server would run in its own Python instead
        print(f"msgq logstats: --follow runs on a local session ({ENV_REMOTE} is not used: "
              "a Connect server cannot hand each micro-batch back to this process)",
              file=sys.stderr)
    try:
        spark = spark_session(DEFAULT_MASTER, app_name="msgq logstats --follow",
                              config=conf, java_options=_JAVA_OPTIONS, class_cache=True)
    except JavaMissingError as e:
        raise CommandError(str(e)) from None
    folder = args.paths[0]

    def show(result: dict[str, Any]) -> None:
        result = {"paths": [folder], "files": len(segment_paths(folder)),
                  "master": "local[*]", **result}
        if args.json:
            print(json.dumps(result), flush=True)
            return
        if sys.stdout.isatty():
            print("\x1b[H\x1b[2J", end="")
        print(paint(f"following {folder} (every {args.every:g} s; Ctrl-C stops)", "dim"))
        _print_report(result, args)
        sys.stdout.flush()

    try:
        follow_stats(spark, folder, args.every, show, args.duration, args.gap_factor)
    except KeyboardInterrupt:
        pass
    except Exception as e:  # a failed streaming query: one line
        raise CommandError(f"the streaming query failed: {_first_line(e)}") from None
    return EXIT_OK


def _check_readable(result: dict[str, Any], args: argparse.Namespace) -> None:
    """No event at all is a failure, saying why: damage (a file that is no log), or a
    --services filter that matched nothing."""
    if result["services"]:
        return
    paths = " ".join(args.paths)
    problems = result["problems"]
    if problems:
        first = problems[0]
        where = "" if first["offset"] is None else f" at byte {first['offset']}"
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise CommandError(f"no readable events in {paths}: {first['file']}{where}: "
                           f"{first['problem']}{more}")
    if args.services:
        raise CommandError(f"no events of {args.services} in {paths}")
    raise CommandError(f"no events in {paths}")


def _first_line(error: Exception) -> str:
    """The line of a (Spark, Python or Java) error that says what went wrong."""
    text = str(error).strip()
    for marker in ("Error:", "Exception:"):  # Python's errors, then the JVM's
        for line in text.splitlines():
            if marker in line and "Traceback" not in line:
                return " ".join(line.split()).lstrip(": ")
    return " ".join(text.splitlines()[0].split()) if text else type(error).__name__


def _write_plot(stats: Any, result: dict[str, Any], path: str,
                bin_seconds: float | None) -> dict[str, Any]:
    bin_seconds = bin_seconds or _auto_bin(result["services"])
    timeline = [r.asDict() for r in stats.timeline(bin_seconds).collect()
                if r["service"] not in BOOKKEEPING]
    try:
        width, height = plot_rates(timeline, path, expected_rates(), result["gaps"],
                                   bin_seconds)
    except OSError as e:
        raise CommandError(f"cannot write the plot to {path}: {e}") from None
    return {"path": path, "width": width, "height": height, "bin_seconds": bin_seconds}


def _number(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def _service_rows(rows: list[dict[str, Any]], first: list[str]) -> list[list[str]]:
    out = []
    for r in rows:
        out.append([
            *[str(r[k]) for k in first],
            str(r["count"]),
            _number(r["expected_hz"], 2) if r["expected_hz"] else "event",
            _number(r["measured_hz"], 2),
            _number(r["dt_p50_ms"], 2),
            _number(r["dt_p99_ms"], 2),
            _number(r["dt_max_ms"], 2),
            "-" if r["gaps"] is None else str(r["gaps"]),
            f"{100 * r['invalid_fraction']:.1f}%",
            _number(r["mean_size"], 0),
        ])
    return out


#: msgq's own bookkeeping events, left out of the table and the plot (--json keeps them).
BOOKKEEPING = frozenset({"logStart"})

_HEADER = ["count", "expected Hz", "measured Hz", "dt p50 ms", "dt p99 ms", "dt max ms",
           "gaps", "invalid", "mean B"]


def _row_colour(r: dict[str, Any]) -> str | None:
    if r["gaps"]:
        return "yellow"
    ratio = r.get("rate_ratio")
    if ratio is not None and not 0.9 <= ratio <= 1.1:
        return "yellow"
    return None


def _print_report(result: dict[str, Any], args: argparse.Namespace) -> None:
    services = [r for r in result["services"] if r["service"] not in BOOKKEEPING]
    events = sum(r["count"] for r in services)
    span = max((r["duration_s"] or 0.0 for r in services), default=0.0)
    print(f"{plural(result['files'], 'segment file')}, {plural(events, 'event')} over "
          f"{span:.1f} s "
          f"(gap: dt > {result['gap_factor']:g} expected periods)")
    print()
    if services:
        print_table(["service", *_HEADER], _service_rows(services, ["service"]),
                    [_row_colour(r) for r in services])
    else:
        print("no events")
    segments = [r for r in result["segments"] if r["service"] not in BOOKKEEPING]
    if args.segments and segments:
        print()
        print(paint("per segment", "bold"))
        rows = _service_rows(segments, ["segment", "service"])
        print_table(["segment", "service", *_HEADER], rows,
                    [_row_colour(r) for r in segments])
    gaps = result["gaps"]
    if gaps:
        print()
        shown = gaps[:args.max_gaps]
        more = f" (first {len(shown)} of {len(gaps)}; --json lists all)" \
            if len(shown) < len(gaps) else ""
        print(paint(f"gaps{more}", "bold"))
        if shown:
            print_table(
                ["service", "start s", "duration ms", "missed", "segment"],
                [[g["service"], f"{g['start_s']:.3f}", f"{g['duration_ms']:.1f}",
                  str(g["missed"]), str(g["segment"])] for g in shown])
    problems = result["problems"]
    if problems:
        print()
        print(paint(f"problems ({len(problems)})", "bold"))
        for p in problems:
            where = "" if p["offset"] is None else f" at byte {p['offset']}"
            print(paint(f"  {p['file']}{where}: {p['problem']}", "yellow"))
    if "plot" in result:
        plot = result["plot"]
        print()
        print(f"plot: {plot['path']} ({plot['width']}x{plot['height']} px, bins of "
              f"{plot['bin_seconds']:g} s)")
