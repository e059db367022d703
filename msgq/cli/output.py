"""How every ``msgq`` subcommand talks to people and scripts: exit codes, one-line errors,
colour (only on a terminal, never with NO_COLOR), aligned tables, JSON and the short
human forms of sizes (msgq.tables.human_bytes, re-exported) and ages."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from msgq.tables import format_table, human_bytes

__all__ = [
    "EXIT_OK",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "EXIT_BROKEN_PIPE",
    "CommandError",
    "UsageError",
    "use_colour",
    "paint",
    "print_table",
    "print_json",
    "print_error",
    "human_bytes",
    "human_age",
    "number",
    "spark_conf",
]

#: The command did what was asked.
EXIT_OK = 0
#: It could not: the reason is on stderr, one line.
EXIT_FAILURE = 1
#: The command line was wrong (unknown command, bad option).
EXIT_USAGE = 2
#: Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: The reader of our output went away, e.g. ``msgq queues | head -1`` (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141

_COLOURS = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
}


class CommandError(Exception):
    """A failure the user can act on. The command prints it as one line,
    ``msgq <command>: error: <message>``, and exits with EXIT_FAILURE."""


class UsageError(CommandError):
    """A command line argparse could not reject by itself (a bad combination of options,
    an unknown name): printed like CommandError, exit code EXIT_USAGE."""


def use_colour(stream: TextIO | None = None) -> bool:
    """Colour only for a person: ``stream`` (default stdout) is a terminal and NO_COLOR
    (https://no-color.org) is unset or empty."""
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


def paint(text: str, colour: str | None, stream: TextIO | None = None) -> str:
    """``text`` in ``colour`` (bold, dim, red, green, yellow) when ``stream`` gets colour
    (see :func:`use_colour`), else unchanged."""
    if not colour or not use_colour(stream):
        return text
    return f"\x1b[{_COLOURS[colour]}m{text}\x1b[0m"


def print_table(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    row_colours: Sequence[str | None] | None = None,
    stream: TextIO | None = None,
) -> None:
    """Aligned columns (the first left-aligned, the rest right-aligned, as
    :func:`msgq.tables.format_table` lays them out), header in bold; ``row_colours[i]``
    colours row i as a whole, so colour codes never disturb the alignment."""
    stream = sys.stdout if stream is None else stream
    lines = format_table([list(header), *rows]).split("\n")
    colours = [None] * len(rows) if row_colours is None else list(row_colours)
    print(paint(lines[0], "bold", stream), file=stream)
    for line, colour in zip(lines[1:], colours, strict=True):
        print(paint(line, colour, stream), file=stream)


def print_json(data: Any, stream: TextIO | None = None) -> None:
    """``data`` as one indented JSON document, for scripts (``--json``)."""
    stream = sys.stdout if stream is None else stream
    json.dump(data, stream, indent=2)
    stream.write("\n")


def print_error(command: str, message: str) -> None:
    """One line on stderr: ``msgq <command>: error: <message>``."""
    prog = f"msgq {command}" if command else "msgq"
    text = " ".join(str(message).split())  # one line, whatever the message held
    print(f"{prog}: {paint('error', 'red', sys.stderr)}: {text}", file=sys.stderr)


def human_age(seconds: float | None) -> str:
    """How long ago, in the largest whole unit: '42 s ago', '5 min ago', '3 h ago',
    '2 d ago'; None -> '-'."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    for limit, unit, size in ((60, "s", 1), (3600, "min", 60), (86400, "h", 3600)):
        if s < limit:
            return f"{s // size} {unit} ago"
    return f"{s // 86400} d ago"


def number(kind: type[float] | type[int], minimum: float, what: str,
           exclusive: bool = False) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses a finite ``kind`` (int or float) >= ``minimum``
    (> with ``exclusive``); anything else is a usage error saying ``not <what>: '<text>'``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < minimum or \
                (exclusive and value == minimum):
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}")
        return value

    return parse


def spark_conf(items: list[str]) -> dict[str, str]:
    """The ``--conf KEY=VALUE`` options of the Spark commands as a dict (a malformed one
    is a usage error)."""
    conf = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise UsageError(f"--conf takes KEY=VALUE, not {item!r}")
        conf[key.strip()] = value
    return conf
