"""``msgq record``: record services to a log folder until stopped, then print the counts."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from typing import Any

from msgq.cli.output import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CommandError,
    UsageError,
    human_bytes,
    number,
    paint,
    print_error,
    print_json,
    print_table,
)
from msgq.cli.services import check_services
from msgq.logs.recorder import Recorder
from msgq.logs.writer import writes_log_start
from msgq.queues import QUEUE_FILE_PREFIX, inspect_queue, namespace_prefix
from msgq.schemas import schema_in_force

DESCRIPTION = """\
Subscribe to SERVICE(s) (default: every service the registry marks should_log) through
one poller and write every message, as received, to segment files in DIR. Stop with
Ctrl-C, SIGTERM or --duration: the log is closed cleanly (finished frame, fsync, index)
and the messages, bytes, bad messages and drops of each service are printed.

Any schema records (--schema/--registry): where it has msgq's logStart, each segment
starts with one; otherwise (openpilot's schema, say) msgq adds no event of its own and
keeps its facts (schema, host, times, recording id) in DIR/index.json.

bad: messages not written because they are not an Event of the service (garbage, another
service's message). drops: times the recorder fell a whole queue behind and skipped
ahead, losing messages (shared-memory backend; each drop loses one or more messages).
The ZMQ backend cannot see its losses: drops show as '?' there."""

EPILOG = """\
examples:
  msgq record -o /data/rec1                       every should_log service, until Ctrl-C
  msgq record vehicleState can -o rec2            two services only
  msgq record -o rec3 --duration 60 --json        one minute, then the counts as JSON
  msgq record -o rec4 --rotate-seconds 30 --rotate-bytes 100M --compression none
  msgq replay rec1                                play a recording back

exit codes: 0 recorded and stopped (--duration, SIGTERM, SIGHUP), 130 recorded and
stopped by Ctrl-C (the log is just as complete; 130 tells a calling script that the user
interrupted), 1 could not record (DIR already holds a recording, ...) or recorded nothing
(an error line names the namespaces that do have live publishers: MSGQ_PREFIX=NAME
records one of them; after Ctrl-C the line is printed and the code stays 130), 2 bad
command line (unknown service, ...)."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)i?[bB]?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _size(text: str) -> int:
    """'100M' -> 104857600 (K, M, G are powers of 1024)."""
    match = _SIZE.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 50000000 or 100M)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


_seconds = number(float, 0.0, "a positive number of seconds", exclusive=True)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq record``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "record",
        help="record services to a log folder",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("services", nargs="*", metavar="SERVICE",
                        help="services to record (default: every should_log service); "
                             "commas work too: a,b")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="recording folder (created; must not hold a recording yet)")
    parser.add_argument("--rotate-seconds", type=_seconds, default=60.0, metavar="S",
                        help="start a new segment every S seconds of log time (default 60)")
    parser.add_argument("--rotate-bytes", type=_size, default=None, metavar="N",
                        help="... or when a segment holds N bytes of events (e.g. 100M)")
    parser.add_argument("--compression", choices=("zstd", "bz2", "none"), default="zstd",
                        help="segment compression (default zstd)")
    parser.add_argument("--duration", type=_seconds, default=None, metavar="S",
                        help="stop after S seconds (default: at Ctrl-C or SIGTERM)")
    parser.add_argument("--json", action="store_true",
                        help="print the counts as JSON instead of a table")
    return parser


def _services(args: argparse.Namespace) -> list[str] | None:
    schema = schema_in_force()
    services = check_services(args.services, schema.union_fields)
    if not services:
        return None
    if "logStart" in services and writes_log_start(schema):
        raise UsageError("logStart is not recorded: the log writes its own at the start of "
                         "every segment")
    return services


def run(args: argparse.Namespace) -> int:
    """Records until --duration, Ctrl-C or SIGTERM; prints the counts."""
    services = _services(args)
    try:
        recorder = Recorder(args.output, services, rotate_seconds=args.rotate_seconds,
                            rotate_bytes=args.rotate_bytes, compression=args.compression)
    except ValueError as e:
        raise CommandError(str(e)) from None
    until = f"for {args.duration:g} s" if args.duration else "until Ctrl-C"

    def announce() -> None:
        print(f"msgq record: recording {len(recorder.services)} service(s) to "
              f"{recorder.folder} {until}", file=sys.stderr, flush=True)

    try:
        stats = recorder.run(duration=args.duration, on_ready=announce)
    except FileExistsError as e:
        raise CommandError(str(e)) from None
    if args.json:
        print_json(stats.as_dict())
    else:
        _print_stats(stats)
    interrupted = stats.stop_signal == signal.SIGINT
    if stats.messages == 0:
        print_error("record", _nothing_recorded(stats))
        return EXIT_INTERRUPTED if interrupted else EXIT_FAILURE
    return EXIT_INTERRUPTED if interrupted else EXIT_OK


def _nothing_recorded(stats: Any) -> str:
    """Why a recording holds nothing, and where the live publishers are instead."""
    prefix = namespace_prefix()
    here = f"namespace {prefix}" if prefix else "the default namespace"
    text = (f"recorded nothing: none of the {len(stats.services)} service(s) was published "
            f"in {here} while it ran")
    if stats.backend != "msgq":
        return text + " (on ZMQ: is the publisher's address right?)"
    live = live_publisher_namespaces()
    live.pop(prefix, None)
    if not live:
        return text + "; no other namespace has a live publisher either"
    found = ", ".join(f"{name or '(default)'} ({count})"
                      for name, count in sorted(live.items(), key=lambda kv: -kv[1])[:5])
    return (text + f"; namespaces with live publishers (queues): {found} — "
            "record one with MSGQ_PREFIX=NAME (unset for the default)")


def live_publisher_namespaces(root: str | None = None) -> dict[str, int]:
    """Namespace prefix ("" for the default) -> how many queues there have a live
    publisher, read from the queue files under ``root`` (``MSGQ_SHM_DIR``, else
    /dev/shm) without connecting."""
    root = root or os.environ.get("MSGQ_SHM_DIR") or "/dev/shm"
    found: dict[str, int] = {}

    def count(folder: str, name: str) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith(QUEUE_FILE_PREFIX) and entry.is_file(follow_symlinks=False):
                try:
                    alive = inspect_queue(entry.path)["publisher_alive"]
                except (OSError, ValueError):
                    continue
                if alive:
                    found[name] = found.get(name, 0) + 1
            elif name == "" and entry.is_dir(follow_symlinks=False):
                count(entry.path, entry.name)

    count(root, "")
    return found


def _print_stats(stats: Any) -> None:
    counts = list(stats.services.values())
    shown = [c for c in counts if c.messages or c.bad or c.drops]
    rows = [[c.service, f"{c.messages:,}", human_bytes(c.bytes), f"{c.bad:,}",
             "?" if c.drops is None else f"{c.drops:,}"] for c in shown]
    colours = ["yellow" if c.bad or c.drops else None for c in shown]
    if len(shown) != 1:
        drops = stats.drops
        rows.append(["total", f"{stats.messages:,}",
                     human_bytes(sum(c.bytes for c in counts)), f"{stats.bad:,}",
                     "?" if drops is None else f"{drops:,}"])
        colours.append("bold")
    print_table(["SERVICE", "MESSAGES", "BYTES", "BAD", "DROPS"], rows, colours)
    silent = len(counts) - len(shown)
    print()
    print(f"{stats.messages:,} messages in {stats.seconds:.1f} s to {stats.folder}: "
          f"{stats.segments} segment(s), {human_bytes(stats.file_bytes)} on disk"
          + (f"; {silent} service(s) sent nothing" if silent else ""))
    if stats.drops:
        print(paint(f"the recorder fell behind {stats.drops} time(s): messages were lost "
                    "(see DROPS)", "yellow"))
    elif stats.drops is None:
        print(paint(f"drops cannot be seen on the {stats.backend} backend", "dim"))
