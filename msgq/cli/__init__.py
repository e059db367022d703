"""The ``msgq`` command: one entry point, one module per subcommand.

Each subcommand is a module ``msgq.cli.<name>`` with two functions:

* ``add_parser(subparsers) -> argparse.ArgumentParser`` registers the subcommand (help,
  description, an epilog of examples, ``RawDescriptionHelpFormatter``) and returns its
  parser. Keep it cheap: import heavy things inside ``run``.
* ``run(args) -> int`` does the work and returns the exit code (see ``msgq.cli.output``);
  it raises ``CommandError`` for a failure the user can act on.

Adding a subcommand is adding its module name to COMMANDS.

Layer: the command line, the top — it may import every layer. Subcommands import what
would slow every other command's start-up (the bridge, pycapnp) inside ``run``, with a
comment saying so. ``msgq.cli.output`` (messages, exit codes, argument types, tables) sits
lower, under the benchmark and demo programs that share it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import version
from types import ModuleType
from typing import Any, NoReturn

from msgq.cli.output import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CommandError,
    UsageError,
    print_error,
)
from msgq.errors import IpcError
from msgq.sockets import backend_name

__all__ = ["COMMANDS", "CommandParser", "build_parser", "main"]

#: The subcommands, in the order ``msgq --help`` lists them: modules of msgq.cli.
COMMANDS: tuple[str, ...] = (
    "dump",
    "top",
    "queues",
    "record",
    "replay",
    "logstats",
    "spark",
    "bridge",
    "bench",
    "config",
)

DESCRIPTION = """\
Tools for msgq: watch services, record and replay them, analyse logs, carry services
between machines, look after the queues, measure.

Every command works in the current namespace (MSGQ_PREFIX, else OPENPILOT_PREFIX)."""

EPILOG = """\
examples:
  msgq dump vehicleState --values speed       one field of each message as it arrives
  msgq top                                    live rates, bytes/s, readers, alive
  msgq record -o rec/ && msgq replay rec/     record every logged service, play it back
  msgq logstats rec/ --plot rates.png         rates, jitter, gaps on local Spark
  msgq bridge connect 192.168.1.10            a robot's services and frames, locally
  msgq queues --clean --dry-run               what --clean would remove
  MSGQ_PREFIX=sim1 msgq queues                the queues of another namespace
  msgq bench core -- --quick                  a short run of the pub/sub benchmark
  msgq <command> --help                       options and examples of one command

exit codes: 0 done, 1 failed (one line on stderr says why), 2 bad command line,
130 interrupted (Ctrl-C).
environment: MSGQ_PREFIX / OPENPILOT_PREFIX (namespace), MSGQ_SHM_DIR (shm folder,
default /dev/shm), NO_COLOR (no colour even on a terminal)."""


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``<prog>: error: <what> (see
    '<prog> --help')``, exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The parser of each subcommand (filled by build_parser).
        self.command_parsers: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("msgq").strip()
        print_error(command, f"{message} (see '{self.prog} --help')")
        raise SystemExit(EXIT_USAGE)


def _version() -> str:
    try:
        return version("msgq")
    except Exception:  # not installed as a distribution (e.g. run from a source tree)
        return "unknown"


def _load(name: str) -> ModuleType | ImportError:
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError as e:  # a missing optional dependency must not take down the others
        return e


def _unavailable(error: ImportError) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise CommandError(f"this command cannot be loaded: {error}")

    return run


def build_parser() -> CommandParser:
    """The ``msgq`` parser with every subcommand of COMMANDS registered."""
    parser = CommandParser(
        prog="msgq",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"msgq {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    for name in COMMANDS:
        module = _load(name)
        if isinstance(module, ImportError):
            sub = subparsers.add_parser(name, help=f"(unavailable: {module})")
            sub.set_defaults(_run=_unavailable(module))
        else:
            sub = module.add_parser(subparsers)
            sub.set_defaults(_run=module.run)
        parser.command_parsers[name] = sub
    return parser


def _first_command(argv: Sequence[str]) -> str | None:
    """The subcommand word of argv (the main parser has only flag options)."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``msgq`` command (and ``python -m msgq``); returns the exit
    code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    command = _first_command(argv)
    if command is not None and command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        print_error(
            "",
            f"unknown command '{command}'{hint} (commands: {', '.join(COMMANDS)}; "
            "see 'msgq --help')",
        )
        return EXIT_USAGE
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the subcommand's parser, so the error names the subcommand
            owner = parser.command_parsers.get(args.command, parser)
            owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as e:  # --help, --version (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        backend_name()  # a bad MSGQ_BACKEND is a usage error, said once, before any work
    except ValueError as e:
        print_error(args.command, str(e))
        return EXIT_USAGE
    try:
        code = int(args._run(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except CommandError as e:
        print_error(args.command, str(e))
        return EXIT_USAGE if isinstance(e, UsageError) else EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Whoever read our output left (``msgq queues | head -1``): what is still
        # buffered goes nowhere, and the interpreter does not complain at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (OSError, IpcError) as e:
        print_error(args.command, str(e))
        return EXIT_FAILURE
