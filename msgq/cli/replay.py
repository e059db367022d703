"""``msgq replay``: publish the events of logs again, in their original timing."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from msgq.cli.output import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    CommandError,
    UsageError,
    number,
    print_json,
    print_table,
)
from msgq.cli.services import check_services
from msgq.logs.reader import LogCorruptionError
from msgq.logs.replayer import Replayer
from msgq.logs.schema_check import SchemaMismatchError
from msgq.logs.writer import writes_log_start
from msgq.schemas import schema_in_force

DESCRIPTION = """\
Publish the events of LOG(s) on their services: each as the bytes in the log
(logMonoTime unchanged), at its original time relative to the first event, divided by
--speed; or as fast as possible with --fast. msgq's logStart events are never sent. LOG
is a recording folder, a segment file, a glob, or an openpilot log (rlog.zst, rlog.bz2,
rlog, a route segment folder <route>--<n>, or a folder of them, read in segment order);
several are merged in time order.

The log is read with the schema in force (--schema FILE.capnp --registry FILE for
another one, e.g. openpilot's). A log written with another schema is refused before
anything is sent (one line, exit 1) rather than published under wrong names.

Timing is scheduled against the start of each pass, so errors do not add up; the summary
says how late sends were on average and at worst. A progress bar shows on a terminal.
Subscribers that read slower than a --fast replay sends lose messages, as with any fast
publisher. Replay takes over the endpoints it publishes: stop live publishers of the same
services first (or use another MSGQ_PREFIX).

Damaged logs: a file cut short is replayed up to its last complete event (a note on
stderr says where it ends). Corrupt data stops the replay after every event before it was
sent: one line on stderr names the file and byte offset, exit 1. With --skip-corrupt the
replay goes on at the next readable event and the damage skipped (count, files, offsets)
is listed on stderr at the end. Events larger than their service's queue takes, or with
a logMonoTime absurdly far ahead (damaged), are not sent and are counted on stderr."""

EPILOG = """\
examples:
  msgq replay /data/rec1                       the whole recording, in real time
  msgq replay rec1 --speed 2                   twice as fast
  msgq replay rec1 --fast --services can,vehicleState
  msgq replay rec1 --exclude modelOutput --start 30   from 30 s in, without modelOutput
  msgq replay rec1 --loop                      over and over, until Ctrl-C
  msgq replay 'rec1/segment-0000[2-4].log.zst' --loops 3   three segments, three times
  msgq replay damaged/ --skip-corrupt          past corrupt data, listed at the end
  msgq replay --schema cereal/log.capnp --registry cereal/services.py route/
                                               an openpilot route, segment by segment
  MSGQ_PREFIX=sim msgq replay rec1             into the namespace 'sim'

exit codes: 0 replayed (also when stopped by SIGTERM), 1 could not replay (no such log,
nothing readable in it, a log of another schema, corrupt data without --skip-corrupt,
...), 2 bad command line
(unknown service, ...), 130 stopped by Ctrl-C (after printing what was sent)."""


_speed = number(float, 0.0, "a positive speed factor", exclusive=True)
_seconds = number(float, 0.0, "a number of seconds >= 0")
_count = number(int, 1, "a number of passes >= 1")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq replay``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="publish logged events again, in their original timing",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="recording folder, segment file, glob, loggerd rlog or "
                             "route folder")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=_speed, default=1.0, metavar="X",
                      help="play X times as fast (default 1; 0.5 is half speed)")
    pace.add_argument("--fast", action="store_true", help="as fast as possible")
    passes = parser.add_mutually_exclusive_group()
    passes.add_argument("--loop", action="store_true", help="repeat until Ctrl-C")
    passes.add_argument("--loops", type=_count, metavar="N", help="play N times")
    parser.add_argument("--services", metavar="A,B", help="only these services")
    parser.add_argument("--exclude", metavar="A,B", help="all services but these")
    parser.add_argument("--start", type=_seconds, default=0.0, metavar="SECONDS",
                        help="start this many seconds after the first event")
    parser.add_argument("--skip-corrupt", action="store_true",
                        help="go on past corrupt data (listed at the end) instead of "
                             "stopping there")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON instead of a table")
    return parser


def _names(text: str | None) -> list[str] | None:
    """The services of a --services/--exclude list: members of the logs' schema."""
    if text is None:
        return None

    return check_services([text], schema_in_force().union_fields)


def _damage(problem: Any) -> str:
    return f"{problem} (--skip-corrupt goes on past it)"


def run(args: argparse.Namespace) -> int:
    """Replays the logs; prints what was sent."""

    services, exclude = _names(args.services), _names(args.exclude)
    if services is not None and "logStart" in services and \
            writes_log_start(schema_in_force()):
        raise UsageError("logStart is never replayed: it describes the log")
    loop: bool | int = True if args.loop else (args.loops or False)
    try:
        replayer = Replayer(args.logs, speed=args.speed, fast=args.fast, loop=loop,
                            services=services, exclude=exclude, start_s=args.start,
                            skip_corrupt=args.skip_corrupt)
    except LogCorruptionError as e:  # while looking for the first event
        raise CommandError(f"nothing replayed: {_damage(e.problem)}") from None
    except SchemaMismatchError as e:
        raise CommandError(f"nothing replayed: {e}") from None
    except (FileNotFoundError, ValueError) as e:
        raise CommandError(str(e)) from None
    end = replayer.end_mono_ns
    if end is not None and replayer.origin_ns > end:
        raise UsageError(f"--start {args.start:g} is past the end of the log "
                         f"({(end - replayer.first_mono_ns) / 1e9:.1f} s long)")
    try:
        stats = replayer.run()
    except LogCorruptionError as e:
        sent = replayer.stats.events
        raise CommandError(f"{_damage(e.problem)}; {sent:,} event(s) were sent before "
                           "it") from None
    if args.json:
        print_json(stats.as_dict())
    else:
        _print_stats(stats, args)
    _print_damage(stats)
    return EXIT_INTERRUPTED if stats.stop_signal == signal.SIGINT else EXIT_OK


def _print_damage(stats: Any) -> None:
    """What the replay read past, on stderr: where files ended early, events not sent
    (too large for their queue, damaged times), and (with --skip-corrupt) the corrupt
    spots skipped."""
    for problem in stats.truncated:
        print(f"msgq replay: note: {problem}", file=sys.stderr)
    for counts, why in ((stats.too_large, "larger than their service's queue takes"),
                        (stats.bad_time, "with a logMonoTime far past the log's end "
                                         "(damaged)")):
        if counts:
            listed = ", ".join(f"{s} ({n:,})" for s, n in sorted(counts.items()))
            print(f"msgq replay: not sent: {sum(counts.values()):,} event(s) {why}: "
                  f"{listed}", file=sys.stderr)
    if stats.corrupt:
        files = sorted({p.path for p in stats.corrupt})
        print(f"msgq replay: skipped {len(stats.corrupt)} corrupt spot(s) in "
              f"{len(files)} file(s):", file=sys.stderr)
        for problem in stats.corrupt:
            print(f"  {problem}", file=sys.stderr)


def _print_stats(stats: Any, args: argparse.Namespace) -> None:
    rows = [[service, f"{n:,}"] for service, n in sorted(stats.counts.items())]
    colours: list[str | None] = [None] * len(rows)
    if len(rows) > 1:
        rows.append(["total", f"{stats.events:,}"])
        colours.append("bold")
    if rows:
        print_table(["SERVICE", "EVENTS"], rows, colours)
        print()
    pace = "as fast as possible" if args.fast else f"at speed {args.speed:g}"
    end = "stopped" if stats.interrupted else "done"
    timing = "" if args.fast else (f"; sends late by {stats.late_mean_ms:.2f} ms on "
                                   f"average, {stats.late_max_ms:.2f} ms at most")
    print(f"{end}: {stats.events:,} events, {stats.passes} pass(es) {pace} in "
          f"{stats.seconds:.1f} s{timing}", file=sys.stdout)
