"""``msgq bench``: runs the benchmark programs of the package and prints their tables.

Each suite is a module with ``main(argv) -> int`` that prints its own table; this command
only picks the suites, passes the arguments after ``--`` through and keeps their exit
codes. Suites are imported when run, so a missing one is an error of that suite only."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from msgq.cli.output import EXIT_FAILURE, EXIT_OK, CommandError, UsageError, paint

#: suite -> (module with main(argv), what it measures). "all" runs them in this order.
SUITES: dict[str, tuple[str, str]] = {
    "core": ("msgq.bench.core", "msgq pub/sub: throughput and round trips against its peers"),
    "visionipc": ("msgq.bench.visionipc", "VisionIPC: frames through shared buffers"),
    "messaging": ("msgq.bench.messaging", "SubMaster.update and PubMaster.send per call"),
    "logs": ("msgq.bench.logs", "log read throughput and the zero-drop record rate"),
    "spark": ("msgq.bench.spark", "the msgqlog Spark source vs a LogReader loop, 1 and 2 cores"),
    "export": ("msgq.bench.export", "MCAP export vs a decode-only LogReader loop; --live: the "
               "Foxglove server on the demo robot"),
}

DESCRIPTION = """\
Run the benchmark programs and print their tables.

  core       python -m msgq.bench: msgq's throughput and round-trip latency against
             pyzmq, kickmsg and iceoryx2, each end in its own process
  visionipc  python -m msgq.bench.visionipc: VisionIPC frame rates and latency
  messaging  python -m msgq.bench.messaging: SubMaster.update / PubMaster.send cost,
             with the Cap'n Proto share
  logs       python -m msgq.bench.logs: LogReader events/s and MB/s, and the rate the
             recorder keeps up with, without drops
  spark      python -m msgq.bench.spark: events/s decoded per core by the Spark data
             source against a plain LogReader loop, and the 1 -> 2 core speed-up
  export     python -m msgq.bench.export: MCAP export events/s against a decode-only
             LogReader loop (--live: the Foxglove server's cost on the demo robot)
  all        every suite, one after the other (the default)

Arguments after '--' go to the suite's own program; 'msgq bench core -- --help' lists
them. A full run takes minutes; --quick (core) is a short one. Not while other heavy
work runs, if the numbers are to mean anything."""

EPILOG = """\
examples:
  msgq bench                                   every suite with its default settings
  msgq bench core -- --quick                   a short run of the pub/sub benchmark
  msgq bench core -- --backends msgq --sizes 8,64K --json out.json
  msgq bench visionipc                         the VisionIPC benchmark only
  msgq bench core -- --help                    the options of the core benchmark"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq bench``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="run the benchmarks and print their tables",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "suite",
        nargs="?",
        default="all",
        metavar="{" + ",".join([*SUITES, "all"]) + "}",
        help="which benchmark to run (default: all)",
    )
    parser.add_argument(
        "suite_args",
        nargs="*",
        metavar="-- ARGS",
        help="arguments for the suite's program (after '--')",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Runs the chosen suite(s); the exit code is the worst of theirs."""
    suite, extra = args.suite, list(args.suite_args)
    if suite.startswith("-"):  # `msgq bench -- --quick`: no suite named, arguments given
        suite, extra = "all", [suite, *extra]
    if suite not in SUITES and suite != "all":
        raise UsageError(f"unknown suite '{suite}'; choose from {', '.join([*SUITES, 'all'])}")
    names = list(SUITES) if suite == "all" else [suite]
    if extra and len(names) > 1:
        raise UsageError(
            "arguments after '--' go to one suite: name it, e.g. "
            f"'msgq bench core -- {' '.join(extra)}'"
        )
    worst = EXIT_OK
    missing: list[str] = []
    for i, name in enumerate(names):
        module_name, title = SUITES[name]
        try:
            main = _load_main(name, module_name)
        except CommandError as e:
            if len(names) == 1:
                raise
            missing.append(str(e))
            continue
        if len(names) > 1:
            if i:
                print()
            print(paint(f"== {name}: {title} ==", "bold"), flush=True)
        worst = max(worst, _run_suite(main, extra))
    for why in missing:  # after the tables, where it is seen
        print(f"msgq bench: error: {why}", file=sys.stderr)
    return EXIT_FAILURE if missing and worst == EXIT_OK else worst


def _load_main(name: str, module_name: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name + ".").startswith(e.name + "."):
            raise CommandError(
                f"the {name} benchmark ({module_name}) is not in this installation of msgq"
            ) from None
        raise CommandError(
            f"the {name} benchmark ({module_name}) cannot be loaded: {e}; install what it needs"
        ) from None
    except ImportError as e:
        raise CommandError(f"the {name} benchmark ({module_name}) cannot be loaded: {e}") from None
    main = getattr(module, "main", None)
    if not callable(main):
        raise CommandError(f"the {name} benchmark ({module_name}) has no main(argv)")
    return main


def _run_suite(main: Any, argv: Sequence[str]) -> int:
    """main(argv) with the environment it may change (the core suite sets its own
    MSGQ_PREFIX) put back afterwards, and SystemExit (--help, bad options) as a code."""
    saved = dict(os.environ)
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_FAILURE)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return int(code or 0)
