"""``msgq lake``: recordings as one Parquet table per service (the route lake), built,
followed and queried with Spark (:mod:`msgq.spark.lake`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
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
from msgq.extras import require

# pyspark-free at their top (the spark extra is imported when Spark is used)
from msgq.spark import lake
from msgq.spark.connect import RemoteError, remote_url
from msgq.spark.session import (
    DEFAULT_MASTER,
    ExecutorPythonError,
    JavaMissingError,
    spark_session,
)

DESCRIPTION = """\
The route lake: Spark's columnar copy of recordings, one Parquet table per service, for
queries that read only what they ask for. The raw logs stay the record of truth (replay
reads them); the lake can always be built again from them.

  build SRC... --to LAKE   land recordings in LAKE: msgq recording folders, folders of
                           openpilot loggerd route segments (<route>--<n>/rlog.zst), or
                           folders of those. Run it again to add what is new: only
                           segments (and bytes of a segment being written) not yet in
                           the lake are read. Killed at any moment, the lake stays
                           readable, and the next run finishes the work, no row lost or
                           doubled (Spark's streaming checkpoint, trigger availableNow,
                           files written apart and moved in whole).
  follow SRC --to LAKE     the same, every --every seconds, for a recording being written
                           (Ctrl-C stops; a later build or follow goes on from there);
                           prints each batch and the age of its newest event when it
                           became queryable.
  sql "SELECT ..." LAKE    a SQL query over the lake: each service is a table of its own
                           name (SELECT vehicleState.speed FROM vehicleState ...), the
                           damage found is the table problems. Columns: logMonoTime,
                           valid, segment, file, offset, size, problem, the service's
                           typed column, date and route (partitions).

build and follow run on a local Spark session (--master may name a cluster), also when
--remote or $MSGQ_SPARK_REMOTE names a Spark Connect server (said on stderr): each
micro-batch is written by a function of this process (foreachBatch), which a Connect
server would run in its own Python, away from this machine's lake and output. sql
attaches to the server. msgq logstats LAKE and msgq.spark.read_logs(spark, LAKE) read a
lake too. The lake is
built under the schema in force (--schema/--registry, else MSGQ_SCHEMA/MSGQ_REGISTRY,
else msgq's own) and records it: read with another, it is refused in one line; a later
version of the schema that only adds fields adds columns (null in older rows). Damaged
segments: their good events land, the damage is listed (file, offset, reason).
See docs/spark.md ("The lake")."""

EPILOG = """\
examples:
  msgq lake build ~/logs/drive1 ~/logs/drive2 --to ~/lake
  msgq lake build /data/routes --to /data/lake      every route under /data/routes
  msgq lake follow ~/logs/live --to ~/lake --every 2
  msgq lake sql "SELECT route, count(*) FROM can GROUP BY route" ~/lake
  msgq lake sql "SELECT logMonoTime, gpsLocation.latitude FROM gpsLocation
                 WHERE logMonoTime BETWEEN 60e9 AND 120e9" ~/lake --json
  msgq logstats ~/lake --services can"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq lake``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "lake", help="recordings as Parquet tables per service: build, follow, sql (Spark)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="lake_command", metavar="<action>", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = actions.add_parser(
            name, help=help_text, description=f"{help_text}; see msgq lake --help.",
            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("--master", metavar="URL",
                         help="Spark master (default local[*]: this machine, every core)")
        sub.add_argument("--remote", metavar="sc://HOST:PORT",
                         help="a Spark Connect server (msgq spark serve; default "
                              "$MSGQ_SPARK_REMOTE unless --master is given): sql runs on "
                              "it; build and follow run locally and say so")
        sub.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                         help="a Spark setting (repeatable)")
        sub.add_argument("--json", action="store_true", help="print JSON instead of tables")
        return sub

    build = action("build", "land recordings in the lake (what is new since the last run)")
    build.add_argument("sources", nargs="+", metavar="SRC",
                       help="recording folder, folder of route segments, or of those")
    build.add_argument("--to", required=True, metavar="LAKE", help="the lake folder")
    follow = action("follow", "land a recording in the lake as it is written")
    follow.add_argument("source", metavar="SRC", help="the recording folder being written")
    follow.add_argument("--to", required=True, metavar="LAKE", help="the lake folder")
    follow.add_argument("--every", type=float, default=5.0, metavar="SECONDS",
                        help="a micro-batch every SECONDS (default 5)")
    follow.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="stop after SECONDS (default: at Ctrl-C)")
    query = action("sql", "a SQL query over the lake's tables")
    query.add_argument("query", metavar="SQL", help="the query (tables: service names, "
                                                    "problems)")
    query.add_argument("lake", metavar="LAKE", help="the lake folder (or a Hadoop URI)")
    query.add_argument("--limit", type=int, default=100, metavar="N",
                       help="rows printed at most in the table output (default 100; JSON "
                            "prints all)")
    return parser



def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    for marker in ("Error:", "Exception:"):
        for line in text.splitlines():
            if marker in line and "Traceback" not in line:
                return " ".join(line.split()).lstrip(": ")
    return " ".join(text.splitlines()[0].split()) if text else type(error).__name__


def run(args: argparse.Namespace) -> int:
    """Runs ``msgq lake ACTION``."""
    conf = spark_conf(args.conf)
    if args.lake_command == "follow" and not args.every > 0:
        raise UsageError("--every must be positive")
    if args.lake_command == "follow" and args.duration is not None and not args.duration > 0:
        raise UsageError("--duration must be positive")
    if args.lake_command == "sql" and args.limit < 0:
        raise UsageError("--limit must be 0 or more")
    if args.remote is not None and args.master:
        raise UsageError("--remote and --master: give one or the other")
    try:
        server = remote_url(args.remote) if args.remote is not None or not args.master \
            else None
    except RemoteError as e:
        raise UsageError(str(e)) from None
    master = args.master
    if server is not None and args.lake_command != "sql":
        # foreachBatch's function would run in the server's Python, not here
        print(f"msgq lake {args.lake_command}: runs on a local Spark session ({DEFAULT_MASTER}), "
              f"not on {server}: each micro-batch is written by this process (foreachBatch)",
              file=sys.stderr)
        server, master = None, DEFAULT_MASTER
    require("spark", "pyspark")
    try:  # the paths first: a bad one is said before Spark starts
        if args.lake_command == "build":
            lake.lake_sources(args.sources)
        elif args.lake_command == "follow":
            lake.lake_sources([args.source])
        elif not lake.is_lake(args.lake) and "://" not in args.lake:
            lake.open_lake(None, args.lake)  # says why it is no lake
    except (lake.LakeError, ValueError) as e:
        raise CommandError(str(e)) from None
    try:
        spark = spark_session(master, app_name=f"msgq lake {args.lake_command}",
                              config=conf, remote=server)
    except (JavaMissingError, ExecutorPythonError, RemoteError) as e:
        raise CommandError(str(e)) from None
    except Exception as e:  # a bad master URL or setting: the JVM's reason, one line
        raise CommandError(f"cannot start Spark: {_first_line(e)}") from None
    try:
        if args.lake_command == "sql":
            return _sql(spark, lake, args)
        return _build(spark, lake, args)
    except KeyboardInterrupt:
        return EXIT_OK
    except CommandError:
        raise
    except (lake.LakeError, ValueError) as e:
        raise CommandError(_first_line(e)) from None
    except Exception as e:  # Spark's analysis errors, failed jobs: one line
        raise CommandError(_first_line(e)) from None


def _build(spark: Any, lake: Any, args: argparse.Namespace) -> int:
    began = time.monotonic()
    live = args.lake_command == "follow"

    def report(batch: Any) -> None:
        doc = batch.to_dict()
        if args.json:
            if live:
                print(json.dumps(doc), flush=True)
            return
        rows = sum(doc["rows"].values())
        age = "" if not live or doc["newest_age_s"] is None else \
            f", newest event queryable {doc['newest_age_s']:.2f} s after it was logged"
        print(f"{doc['source']}: batch {doc['batch']}: {rows} events in "
              f"{len(doc['rows'])} tables, {doc['problem_count']} problems, "
              f"{doc['seconds']:.1f} s{age}", flush=True)
        for p in doc["problems"]:
            where = "" if p["offset"] is None else f" at byte {p['offset']}"
            print(paint(f"  {p['file']}{where}: {p['problem']}", "yellow"), flush=True)

    if live:
        if sys.stderr.isatty():
            print(paint(f"following {args.source} into {args.to} (every {args.every:g} s; "
                        "Ctrl-C stops)", "dim", sys.stderr), file=sys.stderr)
        reports = lake.follow(spark, args.source, args.to, args.every, args.duration,
                              on_batch=report)
    else:
        reports = lake.build(spark, args.sources, args.to, on_batch=report)
    if live:
        return EXIT_OK
    tables: dict[str, int] = {}
    for r in reports:
        for table, n in r.rows.items():
            tables[table] = tables.get(table, 0) + n
    result = {"lake": args.to, "sources": sorted({r.source for r in reports}),
              "batches": len(reports), "events": sum(tables.values()), "tables": tables,
              "problems": [p for r in reports for p in r.problems],
              "problem_count": sum(r.problem_count for r in reports),
              "seconds": time.monotonic() - began}
    if args.json:
        print_json(result)
    elif not reports:
        print(f"{args.to}: up to date (nothing new in {' '.join(args.sources)})")
    else:
        print(f"{args.to}: {result['events']} events added in {len(reports)} batches, "
              f"{result['problem_count']} problems, {result['seconds']:.1f} s")
    return EXIT_OK


def _sql(spark: Any, lake: Any, args: argparse.Namespace) -> int:
    df = lake.sql(spark, args.lake, args.query)
    if args.json:
        rows = [r.asDict(recursive=True) for r in df.collect()]
        print(json.dumps(rows, indent=2, default=_plain))
        return EXIT_OK
    rows = df.limit(args.limit + 1).collect()
    shown = rows[:args.limit]
    print_table(df.columns, [[_cell(v) for v in r] for r in shown])
    if len(rows) > args.limit:
        print(paint(f"(first {args.limit} rows; --limit N or --json for more)", "dim"))
    return EXIT_OK


def _plain(value: Any) -> Any:
    """JSON for what json cannot write: bytes as hex, decimals and others as text."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return str(value)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
