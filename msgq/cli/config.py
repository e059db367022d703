"""``msgq config``: the compiler and linker flags of msgq's C API (``msgq.h``,
``libmsgq``), for building C programs that talk to Python services."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msgq import cflags
from msgq.cli.output import EXIT_FAILURE, EXIT_OK

DESCRIPTION = """\
Print the flags a C build needs to use msgq's C API: the folder of msgq.h (--cflags)
and the library (--libs: libmsgq.so with an rpath; --static: libmsgq.a). With neither,
both. docs/c_api.md describes the API."""

EPILOG = """\
examples:
  msgq config --cflags --libs               flags for the shared library
  msgq config --libs --static               link libmsgq.a instead
  msgq config --include-dir                 the folder of msgq.h
  gcc app.c $(msgq config --cflags --libs) -o app"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq config``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "config",
        help="compiler and linker flags for C programs using msgq.h",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cflags.add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Prints the flags; fails when the C library is not installed."""
    line, absent = cflags.output(args)
    print(line)
    if absent:
        print("msgq config: not installed: " + ", ".join(map(str, absent))
              + " (rebuild msgq with pip install .)", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK
