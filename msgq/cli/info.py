"""``msgq info``: what a recording holds — its services with their event counts and mean
rates, its duration, its segments and the schema it was written with — from the
recording's index (``index.json``), without Spark or Java.

The index is a shortcut, never the truth (see :mod:`msgq.logs.index`): an entry is used
only when its seal matches the segment file; a segment without a trusted entry (a
recording still being written, cut short, edited, or a loggerd route with no index at
all) is read instead, with the schema in force.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from msgq.cli.output import EXIT_OK, CommandError, human_bytes, print_json, print_table
from msgq.logs import LogReader, segment_paths
from msgq.logs.index import INDEX_NAME, IndexCache
from msgq.logs.schema_check import SchemaMismatchError, check_paths
from msgq.schemas import SCHEMA_DIR, schema_fingerprint, schema_in_force, spec_in_force
from msgq.tables import plural

__all__ = ["BOOKKEEPING_SERVICES", "RecordingInfo", "SegmentInfo", "add_parser",
           "recording_info", "run"]

#: Events a recording holds for itself, not for a service (msgq's segment header).
BOOKKEEPING_SERVICES = frozenset({"logStart"})

DESCRIPTION = """\
Print what a recording holds: each service with its number of events and mean rate, the
duration, the segments (count, compression, size) and the schema it was written with —
read from the recording's index.json, so it takes no Spark, no Java and no time
proportional to the events. The segment header events (logStart) are bookkeeping and
are not listed.

The index is trusted only where its seal matches the segment file; any other segment (a
recording still being written or cut short, an edited one, a loggerd route with no
index) is read with the schema in force (--schema / --registry, MSGQ_SCHEMA /
MSGQ_REGISTRY, else msgq's own). A recording written with another schema than the one
in force is said, with the option that fixes it.

REC is a recording folder, a segment file, a loggerd route (folder of <route>--<n>
segments) or a glob (quote it)."""

EPILOG = """\
examples:
  msgq info rec/                                  services, counts, duration, schema
  msgq info rec/ --segments                       and each segment file
  msgq info rec/ --json | jq '.services'          for scripts
  msgq info --schema cereal/log.capnp --registry cereal/services.py route/"""


@dataclass
class SegmentInfo:
    """One segment file: what it holds and where that was read from."""

    file: str
    events: int = 0
    first_mono_ns: int | None = None
    last_mono_ns: int | None = None
    file_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    #: "index" (a sealed entry that matches the file) or "read" (the file was read).
    source: str = "read"

    def add(self, mono_ns: int, service: str) -> None:
        """Counts one event read from the file."""
        self.events += 1
        self.counts[service] = self.counts.get(service, 0) + 1
        if self.first_mono_ns is None or mono_ns < self.first_mono_ns:
            self.first_mono_ns = mono_ns
        if self.last_mono_ns is None or mono_ns > self.last_mono_ns:
            self.last_mono_ns = mono_ns


@dataclass
class RecordingInfo:
    """What ``msgq info`` reports about one recording."""

    path: str
    segments: list[SegmentInfo]
    #: The index's metadata (recording_id, schema_fingerprint, compression, complete);
    #: empty without an index.
    index: dict[str, Any]
    #: The fingerprint of the schema in force (what unindexed segments were read with).
    schema_in_force: str
    problems: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """Events per service over every segment, bookkeeping events left out, by name."""
        total: dict[str, int] = {}
        for segment in self.segments:
            for service, n in segment.counts.items():
                if service not in BOOKKEEPING_SERVICES:
                    total[service] = total.get(service, 0) + n
        return dict(sorted(total.items()))

    @property
    def duration_s(self) -> float | None:
        """From the first to the last logMonoTime of the recording; None when empty."""
        firsts = [s.first_mono_ns for s in self.segments if s.first_mono_ns is not None]
        lasts = [s.last_mono_ns for s in self.segments if s.last_mono_ns is not None]
        if not firsts or not lasts:
            return None
        return (max(lasts) - min(firsts)) / 1e9

    @property
    def schema_fingerprint(self) -> str | None:
        """The fingerprint of the schema the recording was written with (its index's);
        None when it has no index."""
        value = self.index.get("schema_fingerprint")
        return value if isinstance(value, str) and value else None

    def to_json(self) -> dict[str, Any]:
        """The report as plain data (``--json``)."""
        duration = self.duration_s
        return {
            "path": self.path,
            "recording_id": self.index.get("recording_id"),
            "complete": self.index.get("complete"),
            "compression": self.index.get("compression"),
            "schema_fingerprint": self.schema_fingerprint,
            "schema_in_force": self.schema_in_force,
            "duration_s": duration,
            "events": sum(self.counts.values()),
            "file_bytes": sum(s.file_bytes for s in self.segments),
            "services": [
                {"service": name, "events": n,
                 "mean_hz": n / duration if duration else None}
                for name, n in self.counts.items()],
            "segments": [
                {"file": s.file, "events": s.events, "first_mono_ns": s.first_mono_ns,
                 "last_mono_ns": s.last_mono_ns, "file_bytes": s.file_bytes,
                 "from": s.source}
                for s in self.segments],
            "problems": self.problems,
        }


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq info``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "info",
        help="services, counts, duration, segments and schema of a recording (no Spark)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recording", metavar="REC",
                        help="recording folder, segment file, loggerd route or glob")
    parser.add_argument("--segments", action="store_true",
                        help="also list each segment file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return parser


def _read_index_metadata(folder: str) -> dict[str, Any]:
    """The metadata of ``folder/index.json`` (everything but its segment list); empty
    when there is none or it cannot be read."""
    try:
        with open(os.path.join(folder, INDEX_NAME)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: v for k, v in doc.items() if k != "segments"}


def _fingerprint_in_force() -> str:
    """The fingerprint of the schema in force, from its file (no Cap'n Proto load)."""
    spec = spec_in_force()
    return schema_fingerprint(spec.path or os.path.join(SCHEMA_DIR, "log.capnp"))


def recording_info(source: str) -> RecordingInfo:
    """What the recording (folder, segment file, route or glob) at ``source`` holds.
    Raises CommandError when it names no log, or when segments must be read and the
    recording was written with another schema than the one in force."""
    try:
        paths = segment_paths(source)
    except FileNotFoundError as e:
        raise CommandError(str(e)) from None
    folders = sorted({os.path.dirname(p) for p in paths})
    index: dict[str, Any] = {}
    for folder in folders:
        index = index or _read_index_metadata(folder)
    in_force = _fingerprint_in_force()
    info = RecordingInfo(os.path.normpath(source), [], index, in_force)
    cache = IndexCache()
    to_read: list[SegmentInfo] = []
    for path in paths:
        entry = cache.entry(path)
        if entry is not None:
            info.segments.append(SegmentInfo(
                path, entry.events, entry.first_mono_ns, entry.last_mono_ns,
                entry.file_bytes, dict(entry.counts), "index"))
        else:
            segment = SegmentInfo(path, file_bytes=_size(path))
            info.segments.append(segment)
            to_read.append(segment)
    if to_read:
        try:  # the one schema check of every reader (msgq.logs.schema_check)
            check_paths([s.file for s in to_read], schema_in_force())
        except SchemaMismatchError as e:
            raise CommandError(f"{plural(len(to_read), 'segment')} must be read: {e}"
                               ) from None
        _read_segments(to_read, info.problems)
    return info


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_segments(segments: list[SegmentInfo], problems: list[str]) -> None:
    """Counts the events of each segment file by reading it (damage is listed in
    ``problems``, never raised)."""
    by_path = {s.file: s for s in segments}
    try:
        reader = LogReader(list(by_path), skip_corrupt=True, warn=False, check_schema=False)
        for event in reader.raw():
            by_path[event.path].add(event.mono_ns, event.service)
    except ValueError as e:  # a log of another schema (SchemaMismatchError), said in one line
        raise CommandError(str(e)) from None
    problems.extend(str(p) for p in (*reader.truncated, *reader.corrupt))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _print(info: RecordingInfo, segments: bool) -> None:
    index = info.index
    state = ("no index.json: every segment was read" if not index else
             "complete" if index.get("complete") is True else
             "not closed: still being written, or its writer stopped")
    counts = info.counts
    duration = info.duration_s
    written_with = info.schema_fingerprint
    if written_with is None:
        schema = f"unknown (no index); read with the schema in force, {info.schema_in_force}"
    elif written_with == info.schema_in_force:
        schema = f"{written_with} (the schema in force)"
    else:
        schema = (f"{written_with}, not the schema in force ({info.schema_in_force}): "
                  "read it with --schema FILE.capnp --registry FILE")
    read = sum(1 for s in info.segments if s.source == "read")
    size = human_bytes(sum(s.file_bytes for s in info.segments))
    compression = index.get("compression")
    lines = [
        ("recording", f"{info.path} ({state})"),
        *([("id", str(index["recording_id"]))] if index.get("recording_id") else []),
        ("schema", schema),
        ("segments", f"{len(info.segments)}"
         f"{f' ({compression})' if compression else ''}, {size}"
         f"{f'; {read} read, not from the index' if read and index else ''}"),
        ("duration", _seconds(duration)),
        ("events", f"{sum(counts.values())} in {plural(len(counts), 'service')}"),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key.ljust(width)}  {value}")
    if counts:
        print()
        print_table(["service", "events", "mean Hz"],
                    [[name, n, f"{n / duration:.1f}" if duration else "-"]
                     for name, n in counts.items()])
    if segments:
        print()
        print_table(["segment", "events", "duration", "size", "from"],
                    [[os.path.relpath(s.file), s.events,
                      _seconds(None if s.first_mono_ns is None or s.last_mono_ns is None
                               else (s.last_mono_ns - s.first_mono_ns) / 1e9),
                      human_bytes(s.file_bytes), s.source]
                     for s in info.segments])
    for problem in info.problems:
        print(f"damaged: {problem}")


def run(args: argparse.Namespace) -> int:
    """Prints what the recording holds."""
    info = recording_info(args.recording)
    if args.json:
        print_json(info.to_json())
    else:
        _print(info, args.segments)
    return EXIT_OK
