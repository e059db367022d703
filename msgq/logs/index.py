"""The recording index: ``index.json`` in a recording folder, one entry per segment with
its first/last logMonoTime and event counts per service, so that summaries and seeking
never have to read the segments. Rewritten atomically (write + rename) whenever a segment
is closed; readers never require it. ``complete`` is true once the writer closed the
recording: until then the last entry may still grow.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["INDEX_NAME", "IndexCache", "SegmentIndex", "read_index", "write_index"]

INDEX_NAME = "index.json"
INDEX_VERSION = 1


@dataclass
class SegmentIndex:
    """What one segment holds."""

    file: str  # name within the recording folder
    segment: int
    first_mono_ns: int = 0
    last_mono_ns: int = 0
    events: int = 0
    uncompressed_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, mono_ns: int, service: str, size: int) -> None:
        if self.events == 0 or mono_ns < self.first_mono_ns:
            self.first_mono_ns = mono_ns
        self.last_mono_ns = max(self.last_mono_ns, mono_ns)
        self.events += 1
        self.uncompressed_bytes += size
        self.counts[service] = self.counts.get(service, 0) + 1


def write_index(folder: str, segments: list[SegmentIndex], metadata: dict[str, Any]) -> None:
    """Writes ``folder/index.json`` atomically."""
    doc = {"version": INDEX_VERSION, **metadata, "segments": [asdict(s) for s in segments]}
    tmp = os.path.join(folder, f".{INDEX_NAME}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, os.path.join(folder, INDEX_NAME))


def _load(folder: str) -> tuple[list[SegmentIndex], bool] | None:
    try:
        with open(os.path.join(folder, INDEX_NAME)) as f:
            doc = json.load(f)
        if doc.get("version") != INDEX_VERSION:
            return None
        return [SegmentIndex(**entry) for entry in doc["segments"]], doc.get("complete") is True
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def read_index(folder: str) -> list[SegmentIndex] | None:
    """The segments listed in ``folder/index.json``; None when there is no usable index
    (missing, unreadable or of another version: callers then read the segments)."""
    loaded = _load(folder)
    return None if loaded is None else loaded[0]


class IndexCache:
    """The index entries of segment files, reading each recording folder's index once."""

    def __init__(self) -> None:
        self._folders: dict[str, dict[str, SegmentIndex]] = {}

    def entry(self, path: str) -> SegmentIndex | None:
        """The final index entry of the segment file at ``path``; None when its folder has
        no usable index, the index does not list it, or the entry may still change: the
        last entry of a recording that was not closed describes a segment that was being
        written (or was cut short by a crash), so it is not trusted for skipping."""
        folder = os.path.dirname(path)
        entries = self._folders.get(folder)
        if entries is None:
            loaded = _load(folder)
            entries = {}
            if loaded is not None:
                segments, complete = loaded
                final = segments if complete else segments[:-1]
                entries = {s.file: s for s in final}
            self._folders[folder] = entries
        return entries.get(os.path.basename(path))
