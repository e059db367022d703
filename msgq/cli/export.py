"""``msgq export``: a recording to an MCAP file for Foxglove, PlotJuggler and every other
viewer that reads MCAP."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from msgq.cli.output import EXIT_FAILURE, EXIT_OK, CommandError, UsageError, number, print_json
from msgq.cli.services import check_services
from msgq.logs import segment_paths
from msgq.logs.index import IndexCache
from msgq.schemas import schema_in_force
from msgq.viz import MissingExtraError, require
from msgq.viz.mcap_export import default_jobs, export_mcap, first_mono_ns

DESCRIPTION = """\
Export a recording to MCAP: each event becomes a message on the channel /<service>,
log time = publish time = its logMonoTime, JSON-encoded with a JSON Schema derived from
the Cap'n Proto schema (enums as names, Data as base64, 64-bit integers exact, NaN and
infinities as the strings "NaN", "Infinity", "-Infinity", unions as the set member plus
"_which"), so that Foxglove and PlotJuggler plot any numeric field without a plug-in.
Messages are in zstd-compressed chunks with the summary and indexes (viewers seek at
once); metadata records hold the msgq version, the schema's fingerprint, the segments and
the recording's index.json (see docs/tools.md).

LOG is a segment file, a recording folder, a route folder (<route>--<n>/rlog.zst) or a
glob, as many as you like; the events are read with the schema in force (--schema,
--registry, or MSGQ_SCHEMA / MSGQ_REGISTRY; msgq's own by default).

The export streams (memory stays bounded) and shows progress on a terminal. Logs of
several segments are converted by worker processes (--jobs; the file is the same), the
messages written in order by this one. Damaged
segments export what is intact; what could not be read is listed on stderr. The exit
code is 1 only when nothing could be exported. Needs the viz extra: pip install
'msgq-shm[viz]'."""

EPILOG = """\
examples:
  msgq export rec/ rec.mcap                          every event of a recording
  msgq export rec/ arm.mcap --services armState,imu --start 10 --end 70
  msgq export --schema cereal/log.capnp --registry cereal/services.py \\
      'route--*/rlog.zst' route.mcap                 an openpilot route
then open the file in Foxglove (File > Open local file) or PlotJuggler (Load Data)"""

_seconds = number(float, 0.0, "a number of seconds >= 0")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq export``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "export",
        help="export a recording to MCAP (Foxglove, PlotJuggler)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="segment file, recording folder or glob (several allowed)")
    parser.add_argument("output", metavar="OUT.mcap", help="the MCAP file to write")
    parser.add_argument("--services", metavar="A,B", help="only these services")
    parser.add_argument("--start", type=_seconds, default=None, metavar="SECONDS",
                        help="from this many seconds after the first event")
    parser.add_argument("--end", type=_seconds, default=None, metavar="SECONDS",
                        help="up to this many seconds after the first event")
    parser.add_argument("--jobs", type=number(int, 1, "a number of processes >= 1"),
                        default=None, metavar="N",
                        help="processes converting segments (default: one per core, at "
                             "most 8, for logs over 16 MB in several segments; else 1)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite OUT.mcap when it exists")
    parser.add_argument("--json", action="store_true",
                        help="print what was exported as JSON instead of a summary")
    return parser


def run(args: argparse.Namespace) -> int:
    """Exports; prints the counts and any damage found."""
    try:
        require("mcap")
    except MissingExtraError as e:
        raise CommandError(str(e)) from None
    if not args.output.endswith(".mcap"):
        raise UsageError(f"the output file should end in .mcap, not {args.output!r} "
                         "(did you forget it after the logs?)")
    if os.path.exists(args.output) and not args.force:
        raise UsageError(f"{args.output} exists: remove it or pass --force")
    if args.start is not None and args.end is not None and args.end < args.start:
        raise UsageError(f"--end {args.end:g} is before --start {args.start:g}")
    schema = schema_in_force()
    services = check_services([args.services], schema.union_fields) if args.services else None
    try:
        paths = segment_paths(args.logs)
    except FileNotFoundError as e:
        raise CommandError(str(e).strip('"')) from None
    if not paths:
        raise CommandError(f"no log segment in {' '.join(args.logs)}")
    start_ns = end_ns = None
    if args.start is not None or args.end is not None:
        origin = first_mono_ns(paths, schema)
        if origin is None:
            raise CommandError("no readable event in the logs: nothing to export")
        if args.start is not None:
            start_ns = origin + int(args.start * 1e9)
        if args.end is not None:
            end_ns = origin + int(args.end * 1e9)
    bar = _progress(paths)
    try:
        stats = export_mcap(paths, args.output, services=services, start_ns=start_ns,
                            end_ns=end_ns, schema=schema,
                            progress=None if bar is None else bar.update,
                            jobs=args.jobs or default_jobs(paths))
    except ValueError as e:  # logs of another schema (msgq.logs.SchemaMismatchError)
        raise CommandError(str(e)) from None
    finally:
        if bar is not None:
            bar.close()
    for problem in stats.problems[:20]:
        print(f"msgq export: {problem}", file=sys.stderr)
    if len(stats.problems) > 20:
        print(f"msgq export: ... and {len(stats.problems) - 20} more problems",
              file=sys.stderr)
    if args.json:
        print_json(stats.as_dict())
    else:
        span = 0.0 if stats.first_mono_ns is None else \
            (stats.last_mono_ns - stats.first_mono_ns) / 1e9
        print(f"{stats.messages} messages on {len(stats.counts)} channels, {span:.1f} s, "
              f"{stats.bytes_out / 1e6:.1f} MB -> {args.output}")
    if stats.messages == 0:
        os.remove(args.output)
        what = "no event could be read" if stats.problems or not stats.segments \
            else "no event matches the services and times asked for"
        print(f"msgq export: {what}; {args.output} not written", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _progress(paths: list[str]) -> Any:
    """A tqdm bar of event bytes read, on a terminal only; its total is the recording's
    when its index knows it (sealed entries for every segment)."""
    if not sys.stderr.isatty():
        return None
    # start-up cost: tqdm, only for a bar on a terminal
    from tqdm import tqdm

    indexes = IndexCache()
    entries = [indexes.entry(p) for p in paths]
    total = sum(e.uncompressed_bytes for e in entries if e is not None) \
        if all(e is not None for e in entries) else None
    return tqdm(total=total, unit="B", unit_scale=True, desc="export", leave=False)
