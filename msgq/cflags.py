"""Compiler and linker flags for C programs that use msgq's C API (``msgq.h``).

The wheel installs the public headers in ``msgq/include`` and the library in
``msgq/lib`` (``libmsgq.so`` and ``libmsgq.a``). Print the flags with::

    python -m msgq.cflags --cflags --libs          # or: msgq config --cflags --libs
    gcc app.c $(python -m msgq.cflags --cflags --libs) -o app

``--libs`` links the shared library with an rpath to it (the program finds it without
LD_LIBRARY_PATH); ``--static`` links ``libmsgq.a`` instead; ``--visionipc`` adds the
VisionIPC server library (``visionipc.h``, ``libvisionipc``).

Layer: a program of its own; it reads only the installed files, never the extension.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["include_dir", "lib_dir", "cflags", "libs", "main"]

PACKAGE_DIR = Path(__file__).resolve().parent


def include_dir() -> Path:
    """The folder holding ``msgq.h``, ``visionipc.h`` and the headers they include."""
    return PACKAGE_DIR / "include"


def lib_dir() -> Path:
    """The folder holding ``libmsgq.so``/``.a`` and ``libvisionipc.so``/``.a``."""
    return PACKAGE_DIR / "lib"


def cflags() -> list[str]:
    """Compiler flags: the include folder."""
    return [f"-I{include_dir()}"]


def libs(static: bool = False, visionipc: bool = False) -> list[str]:
    """Linker flags: the shared library with an rpath, or with ``static`` the archive;
    with ``visionipc`` the VisionIPC server library before it."""
    names = ["visionipc", "msgq"] if visionipc else ["msgq"]
    if static:
        return [str(lib_dir() / f"lib{n}.a") for n in names] + ["-lpthread"]
    return [f"-L{lib_dir()}", f"-Wl,-rpath,{lib_dir()}", *(f"-l{n}" for n in names),
            "-lpthread"]


def missing() -> list[Path]:
    """Installed files a C build needs that are not there (an install without the C
    library: rebuild with ``pip install .``)."""
    needed = [include_dir() / "msgq.h", include_dir() / "visionipc.h"]
    needed += [lib_dir() / f"lib{n}.{ext}" for n in ("msgq", "visionipc") for ext in ("so", "a")]
    return [p for p in needed if not p.exists()]


def flags(want_cflags: bool, want_libs: bool, static: bool = False,
          visionipc: bool = False) -> list[str]:
    """The flags asked for (both when neither is asked for)."""
    if not want_cflags and not want_libs:
        want_cflags = want_libs = True
    return (cflags() if want_cflags else []) + (libs(static, visionipc) if want_libs else [])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m msgq.cflags`` and ``msgq config``."""
    parser.add_argument("--cflags", action="store_true", help="print the compiler flags")
    parser.add_argument("--libs", action="store_true", help="print the linker flags")
    parser.add_argument("--static", action="store_true",
                        help="with --libs: link libmsgq.a instead of libmsgq.so")
    parser.add_argument("--visionipc", action="store_true",
                        help="with --libs: also link the VisionIPC server (visionipc.h)")
    parser.add_argument("--include-dir", action="store_true",
                        help="print only the folder of msgq.h")
    parser.add_argument("--lib-dir", action="store_true",
                        help="print only the folder of libmsgq.so / libmsgq.a")


def output(args: argparse.Namespace) -> tuple[str, list[Path]]:
    """The line to print for parsed ``args`` and the installed files that are missing."""
    if args.include_dir:
        return str(include_dir()), missing()
    if args.lib_dir:
        return str(lib_dir()), missing()
    return shlex.join(flags(args.cflags, args.libs, args.static, args.visionipc)), missing()


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the flags; exit code 1 (and a note on stderr) when the files are missing."""
    parser = argparse.ArgumentParser(
        prog="python -m msgq.cflags",
        description="Flags for building C programs against msgq's C API (msgq.h).")
    add_arguments(parser)
    args = parser.parse_args(argv)
    line, absent = output(args)
    print(line)
    if absent:
        print("msgq.cflags: not installed: " + ", ".join(map(str, absent))
              + " (rebuild msgq with pip install .)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
