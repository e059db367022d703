"""``msgq replay``: publish the events of logs again, in their original timing."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msgq.cli.output import (
    EXIT_OK,
    CommandError,
    UsageError,
    number,
    print_json,
    print_table,
)

DESCRIPTION = """\
Publish the events of LOG(s) on their services: each as the bytes in the log
(logMonoTime unchanged), at its original time relative to the first event, divided by
--speed; or as fast as possible with --fast. logStart events are never sent. LOG is a
recording folder, a segment file or a glob; several are merged in time order.

Timing is scheduled against the start of each pass, so errors do not add up; the summary
says how late sends were on average and at worst. A progress bar shows on a terminal.
Subscribers that read slower than a --fast replay sends lose messages, as with any fast
publisher. Replay takes over the endpoints it publishes: stop live publishers of the same
services first (or use another MSGQ_PREFIX)."""

EPILOG = """\
examples:
  msgq replay /data/rec1                       the whole recording, in real time
  msgq replay rec1 --speed 2                   twice as fast
  msgq replay rec1 --fast --services can,vehicleState
  msgq replay rec1 --exclude modelOutput --start 30   from 30 s in, without modelOutput
  msgq replay rec1 --loop                      over and over, until Ctrl-C
  msgq replay 'rec1/segment-0000[2-4].log.zst' --loops 3   three segments, three times
  MSGQ_PREFIX=sim msgq replay rec1             into the namespace 'sim'

exit codes: 0 replayed (also when stopped by Ctrl-C/SIGTERM), 1 could not replay (no such
log, ...), 2 bad command line (unknown service, ...)."""


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
                        help="recording folder, segment file or glob")
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
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON instead of a table")
    return parser


def _names(text: str | None) -> list[str] | None:
    """The services of a --services/--exclude list: members of the logs' schema."""
    if text is None:
        return None
    from msgq.cli.services import check_services
    from msgq.schemas import default_schema

    return check_services([text], default_schema().union_fields)


def run(args: argparse.Namespace) -> int:
    """Replays the logs; prints what was sent."""
    from msgq.logs.replayer import Replayer

    services, exclude = _names(args.services), _names(args.exclude)
    if services is not None and "logStart" in services:
        raise UsageError("logStart is never replayed: it describes the log")
    loop: bool | int = True if args.loop else (args.loops or False)
    try:
        replayer = Replayer(args.logs, speed=args.speed, fast=args.fast, loop=loop,
                            services=services, exclude=exclude, start_s=args.start)
    except (FileNotFoundError, ValueError) as e:
        raise CommandError(str(e)) from None
    end = replayer.end_mono_ns
    if end is not None and replayer.origin_ns > end:
        raise UsageError(f"--start {args.start:g} is past the end of the log "
                         f"({(end - replayer.first_mono_ns) / 1e9:.1f} s long)")
    stats = replayer.run()
    if args.json:
        print_json(stats.as_dict())
        return EXIT_OK
    _print_stats(stats, args)
    return EXIT_OK


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
