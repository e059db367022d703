"""The ``msgq`` command: one entry point, one module per subcommand.

Each subcommand is a module ``msgq.cli.<name>`` with two functions:

* ``add_parser(subparsers) -> argparse.ArgumentParser`` registers the subcommand (help,
  description, an epilog of examples, ``RawDescriptionHelpFormatter``) and returns its
  parser.
* ``run(args) -> int`` does the work and returns the exit code (see ``msgq.cli.output``);
  it raises ``CommandError`` for a failure the user can act on.

Adding a subcommand is adding its name and one-line help to COMMANDS, the command table.
:func:`main` imports the module of the one command that runs (``msgq --help`` imports
none), so a command module imports what it needs at its top: nothing it imports slows
another command's start-up. A library of an optional extra (pyspark, mcap, foxglove-sdk)
is loaded with :func:`msgq.extras.require`, whose one-line error :func:`main` prints.

Layer: the command line, the top — it may import every layer. ``msgq.cli.output``
(messages, exit codes, argument types, tables) sits lower, under the benchmark and demo
programs that share it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple, NoReturn

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
from msgq.extras import MissingExtraError, require
from msgq.schemas import selection
from msgq.sockets import backend_name
from msgq.version import installed_version

__all__ = ["COMMANDS", "CommandParser", "add_schema_options", "apply_schema_options",
           "build_parser", "main"]


class Command(NamedTuple):
    """A line of the command table."""

    #: its line in ``msgq --help`` (tests/test_cli.py checks that it is its module's)
    help: str
    #: (extra, library) when the command's module imports a library of an optional
    #: extra at its top: checked first, so that a missing one is said in one line
    needs: tuple[str, str] | None = None


#: The command table: each subcommand (a module of msgq.cli), in the order ``msgq --help``
#: lists them. A module is imported only when its command runs or shows its --help.
COMMANDS: dict[str, Command] = {
    "dump": Command("print messages of services as they arrive"),
    "top": Command("live table of services: rates, bytes/s, readers, alive"),
    "queues": Command("list the queue files of this namespace; --clean removes dead ones"),
    "record": Command("record services to a log folder"),
    "replay": Command("publish logged events again, in their original timing"),
    "info": Command("services, counts, duration, segments and schema of a recording (no Spark)"),
    "logstats": Command("rates, jitter, gaps and validity of recorded logs (Spark)",
                        needs=("spark", "pyspark")),
    "lake": Command("recordings as Parquet tables per service: build, follow, sql (Spark)",
                    needs=("spark", "pyspark")),
    "export": Command("export a recording to MCAP (Foxglove, PlotJuggler)"),
    "foxglove": Command("serve the live services to Foxglove (WebSocket)"),
    "spark": Command("a warm Spark server, cluster helpers (serve, pack-env)"),
    "bridge": Command("carry services and VisionIPC frames between machines"),
    "keys": Command("make and list CurveZMQ keys for the ZMQ backend and the bridge"),
    "bench": Command("run the benchmarks and print their tables"),
    "config": Command("compiler and linker flags for C programs using msgq.h"),
}

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

your own schema: every command takes --schema FILE.capnp and --registry FILE (a
services.py like cereal's, or .toml/.json), or reads MSGQ_SCHEMA and MSGQ_REGISTRY:
  msgq --schema cereal/log.capnp --registry cereal/services.py dump carState
  MSGQ_SCHEMA=cereal/log.capnp MSGQ_REGISTRY=cereal/services.py msgq replay route/

exit codes: 0 done, 1 failed (one line on stderr says why), 2 bad command line,
130 interrupted (Ctrl-C).
environment: MSGQ_PREFIX / OPENPILOT_PREFIX (namespace), MSGQ_SHM_DIR (shm folder,
default /dev/shm), MSGQ_SCHEMA / MSGQ_REGISTRY / MSGQ_SCHEMA_ROOT (the schema in force),
NO_COLOR (no colour even on a terminal)."""


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


def load_command(name: str) -> ModuleType | ImportError:
    """The module of command ``name`` (imported now), or the ImportError that stopped it:
    a missing extra's one-line :class:`MissingExtraError`, else any other."""
    try:
        if COMMANDS[name].needs is not None:
            require(*COMMANDS[name].needs)
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError as e:  # said when the command runs, not when another one does
        return e


def _unavailable(error: ImportError) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if isinstance(error, MissingExtraError):
            raise CommandError(str(error))
        raise CommandError(f"this command cannot be loaded: {error}")

    return run


def add_schema_options(parser: argparse.ArgumentParser) -> None:
    """The options that set the schema in force, on the main parser and every
    subcommand's (``msgq --schema F dump ...`` and ``msgq dump --schema F ...`` both
    work); applied once by :func:`main`, before the command runs."""
    group = parser.add_argument_group(
        "schema", "the schema in force (default: MSGQ_SCHEMA / MSGQ_REGISTRY, else msgq's own)")
    group.add_argument("--schema", metavar="FILE.capnp", default=argparse.SUPPRESS,
                       help="the application's Cap'n Proto schema (e.g. cereal's log.capnp)")
    group.add_argument("--registry", metavar="FILE", default=argparse.SUPPRESS,
                       help="its service registry: a services.py like cereal's, or .toml/.json")
    group.add_argument("--schema-root", metavar="STRUCT", default=argparse.SUPPRESS,
                       help="the schema's root struct (default Event)")


def apply_schema_options(args: argparse.Namespace) -> None:
    """Makes the schema of ``--schema``/``--registry``/``--schema-root`` the one in force
    (exported to child processes too); raises CommandError naming the file when it cannot
    be loaded. Without the options the environment's (else msgq's own) stays in force."""
    schema = getattr(args, "schema", None)
    registry = getattr(args, "registry", None)
    root = getattr(args, "schema_root", None)
    try:
        if schema is None and registry is None and root is None:
            spec = selection.spec_in_force()  # a bad MSGQ_SCHEMA / MSGQ_REGISTRY: said here
            if not spec.is_msgq_own:
                try:
                    spec.load()  # an application's schema is checked before the command runs
                except (OSError, ValueError, TypeError) as e:
                    raise CommandError(f"{e} (the schema in force, from "
                                       f"{selection.ENV_SCHEMA}/{selection.ENV_SERVICES})"
                                       ) from None
            return
        env = os.environ
        selection.use_schema(
            schema if schema is not None else env.get(selection.ENV_SCHEMA) or None,
            registry if registry is not None else env.get(selection.ENV_SERVICES) or None,
            root=root or env.get(selection.ENV_ROOT) or "Event")
    except (OSError, ValueError, TypeError) as e:
        raise CommandError(str(e)) from None
    except Exception as e:  # pycapnp's parse errors: their first line
        raise CommandError(f"cannot load the schema {schema}: "
                           f"{str(e).strip().splitlines()[0]}") from None


def build_parser(only: str | None = None) -> CommandParser:
    """The ``msgq`` parser with every subcommand of COMMANDS registered: with ``only``,
    that command's module is imported and registers its options, the others are their
    line of the table (``only=""``: no module imported, for ``msgq --help``); without,
    every command's module is imported."""
    parser = CommandParser(
        prog="msgq",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"msgq {installed_version()}")
    add_schema_options(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    for name, command in COMMANDS.items():
        if only is not None and name != only:
            parser.command_parsers[name] = subparsers.add_parser(name, help=command.help)
            continue
        module = load_command(name)
        if isinstance(module, ImportError):
            sub = subparsers.add_parser(name, help=f"(unavailable: {module})")
            sub.set_defaults(_run=_unavailable(module))
        else:
            sub = module.add_parser(subparsers)
            add_schema_options(sub)
            sub.set_defaults(_run=module.run)
        parser.command_parsers[name] = sub
    return parser


_MAIN_OPTIONS_WITH_VALUE = ("--schema", "--registry", "--schema-root")


def _first_command(argv: Sequence[str]) -> str | None:
    """The subcommand word of argv (skipping the main parser's options and their
    values)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--":
            return None
        if arg in _MAIN_OPTIONS_WITH_VALUE:
            skip = True
            continue
        if not arg.startswith("-"):
            return arg
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``msgq`` command (and ``python -m msgq``); returns the exit
    code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _first_command(argv)
    if command is not None and command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        print_error(
            "",
            f"unknown command '{command}'{hint} (commands: {', '.join(COMMANDS)}; "
            "see 'msgq --help')",
        )
        return EXIT_USAGE
    if command is not None:
        module = load_command(command)
        if isinstance(module, ImportError):  # before its options, which it would register
            print_error(command, str(module) if isinstance(module, MissingExtraError)
                        else f"this command cannot be loaded: {module}")
            return EXIT_FAILURE
    parser = build_parser(only=command or "")
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
        apply_schema_options(args)
        code = int(args._run(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except CommandError as e:
        print_error(args.command, str(e))
        return EXIT_USAGE if isinstance(e, UsageError) else EXIT_FAILURE
    except MissingExtraError as e:  # msgq.extras.require: one line naming the extra
        print_error(args.command, str(e))
        return EXIT_FAILURE
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
