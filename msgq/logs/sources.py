"""Which log files a source names, in reading order: msgq recording folders
(``segment-NNNNN.log*``), openpilot loggerd logs (``rlog.zst``/``rlog.bz2``/``rlog``, else
``qlog*``), route folders ``<route>--<n>`` in segment order, globs and lists. One rule for
the log reader, replay, the schema check, the CLI, MCAP export and the Spark source
(whose Hadoop listing uses :data:`LOGGERD_NAME` and :func:`loggerd_log`).

Layer: the logs unit; imports the standard library and :mod:`msgq.logs.index`.
"""

from __future__ import annotations

import glob as globbing
import os
import re
from collections.abc import Iterable
from typing import Any

from msgq.logs.index import INDEX_NAME

__all__ = ["LOGGERD_NAME", "loggerd_log", "segment_paths"]

_SEGMENT_SUFFIXES = (".log.zst", ".log.bz2", ".log", ".zst", ".bz2")
#: openpilot loggerd's log files in a route segment folder: rlog (everything) or qlog (the
#: decimated copy), zstd, bz2 or raw.
LOGGERD_NAME = re.compile(r"^([rq]log)(\.zst|\.bz2)?$")
#: A route segment folder: ``<route>--<n>``.
_ROUTE_SEGMENT = re.compile(r"^(.+)--(\d+)$")
_DIGITS = re.compile(r"(\d+)")


def _natural(path: str) -> list[Any]:
    """Sort key: numbers compare as numbers (``route--10`` after ``route--9``)."""
    return [int(part) if part.isdigit() else part for part in _DIGITS.split(path)]


def loggerd_log(names: list[str]) -> list[str]:
    """The one log file of a loggerd segment folder: rlog over qlog, and of those zstd
    over bz2 over raw (never two copies of the same events)."""
    found: dict[tuple[str, str], str] = {}
    for name in names:
        match = LOGGERD_NAME.match(name)
        if match:
            found[(match.group(1), match.group(2) or "")] = name
    for kind in ("rlog", "qlog"):
        for suffix in (".zst", ".bz2", ""):
            if (kind, suffix) in found:
                return [found[(kind, suffix)]]
    return []


def _folder_logs(folder: str) -> list[str]:
    """The log files of a folder, in reading order: msgq segment files by name, or the
    loggerd log of a route segment folder; then those of its ``<route>--<n>`` subfolders
    in segment order."""
    names = [n for n in os.listdir(folder) if not n.startswith(".")]
    # (a name that is not a file is listed all the same: reading it says what it is)
    logs = loggerd_log(names)
    logs += sorted(n for n in names
                   if n.endswith(_SEGMENT_SUFFIXES) and not LOGGERD_NAME.match(n))
    paths = [os.path.join(folder, n) for n in logs]
    routes = sorted((n for n in names if _ROUTE_SEGMENT.match(n)
                     and os.path.isdir(os.path.join(folder, n))), key=_natural)
    for name in routes:
        paths += [os.path.join(folder, name, n)
                  for n in loggerd_log(os.listdir(os.path.join(folder, name)))]
    return paths


def segment_paths(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """The segment files a source names, in reading order: a file as is; a folder's
    segment files sorted by name (msgq's ``segment-NNNNN.log*``), its loggerd log
    (``rlog.zst``/``rlog.bz2``/``rlog``, else ``qlog*``), then the logs of its
    ``<route>--<n>`` subfolders in segment order (``--10`` after ``--9``); a glob's
    matches in natural order; lists concatenated. A folder with no log file (and no
    recording index), or a name that matches nothing, raises FileNotFoundError."""
    if isinstance(source, (str, os.PathLike)):
        sources = [os.fspath(source)]
    else:
        sources = [os.fspath(s) for s in source]
    paths: list[str] = []
    for item in sources:
        if os.path.isdir(item):
            found = _folder_logs(item)
            if not found and not os.path.exists(os.path.join(item, INDEX_NAME)):
                # (a recording that holds no segment yet is an empty log, not an error)
                raise FileNotFoundError(
                    f"no log files in {item} (msgq segment-*.log*, a loggerd rlog/qlog, "
                    "or <route>--<n> folders holding one)")
            paths += found
        elif os.path.exists(item):
            paths.append(item)
        else:
            matches = sorted(globbing.glob(item), key=_natural)
            if not matches:
                raise FileNotFoundError(f"no log file or folder matches {item!r}")
            paths += segment_paths(matches)
    return paths
