"""The recording index: ``index.json`` in a recording folder, one entry per segment with
its first/last logMonoTime and event counts per service, so that summaries and seeking
never have to read the segments. Rewritten atomically (write + rename) by the writer when
that is due (every quarter more segments closed, and at close: see
:mod:`msgq.logs.writer`), so until the recording is complete it may list only the first
segments; readers never require it, and read the segments it does not list. ``complete``
is true once the writer closed the recording: until then the last entry may still grow.

The index is a shortcut, never the truth: an entry is used (to skip a segment, or for a
segment's first time) only when it is *sealed* — ``seal`` is a SHA-256 over the entry's
other fields and the segment file's bytes, written when the segment was closed — and the
seal still matches the entry and the file. An entry edited by hand, left stale by a
damaged, truncated or appended segment file, or written by an older version is not
trusted: readers then read the segment itself.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["INDEX_NAME", "IndexCache", "SegmentIndex", "file_sha256",
           "parse_index_document", "read_index", "read_index_document", "read_recording",
           "write_index"]

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
    file_bytes: int = 0  # size of the segment file when it was closed
    seal: str = ""  # see seal_for(); empty until the segment is closed
    # When the segment started: {"wall_time_ns": ..., "mono_time_ns": ...} (what a
    # logStart event says, kept here for schemas without one); None in older indexes.
    start: dict[str, int] | None = None

    def seal_for(self, file_sha256: str) -> str:
        """The seal of this entry for a segment file with this SHA-256 (hex)."""
        fields = asdict(self)
        fields.pop("seal")
        if fields["start"] is None:  # older entries: sealed without it
            fields.pop("start")
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(f"{text}\n{file_sha256}".encode()).hexdigest()

    def add(self, mono_ns: int, service: str, size: int) -> None:
        if self.events == 0 or mono_ns < self.first_mono_ns:
            self.first_mono_ns = mono_ns
        self.last_mono_ns = max(self.last_mono_ns, mono_ns)
        self.events += 1
        self.uncompressed_bytes += size
        self.counts[service] = self.counts.get(service, 0) + 1


def file_sha256(path: str) -> str | None:
    """The SHA-256 (hex) of a file's bytes; None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def write_index(folder: str, segments: list[SegmentIndex], metadata: dict[str, Any]) -> None:
    """Writes ``folder/index.json`` atomically."""
    doc = {"version": INDEX_VERSION, **metadata, "segments": [asdict(s) for s in segments]}
    tmp = os.path.join(folder, f".{INDEX_NAME}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, os.path.join(folder, INDEX_NAME))


def parse_index_document(data: bytes | str) -> dict[str, Any] | None:
    """The index document in ``data`` (an ``index.json``'s bytes: what the recording
    says of itself, ``segments`` included, as written); None when it is not one of this
    version."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION:
        return None
    return doc


def read_index_document(folder: str) -> dict[str, Any] | None:
    """:func:`parse_index_document` of ``folder/index.json``; None when there is none."""
    try:
        with open(os.path.join(folder, INDEX_NAME), "rb") as f:
            return parse_index_document(f.read())
    except OSError:
        return None


def read_recording(folder: str) -> dict[str, Any] | None:
    """What ``folder/index.json`` says of the whole recording (``recording_id``,
    ``schema_fingerprint``, ``schema_members``, ``hostname``, ``metadata``, ``complete``,
    ...; its ``segments`` left out); None when there is no usable index."""
    try:
        with open(os.path.join(folder, INDEX_NAME)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION:
        return None
    doc.pop("segments", None)
    return doc


def _load(folder: str) -> tuple[list[SegmentIndex], bool] | None:
    try:
        with open(os.path.join(folder, INDEX_NAME)) as f:
            doc = json.load(f)
        if doc.get("version") != INDEX_VERSION:
            return None
        return [SegmentIndex(**entry) for entry in doc["segments"]], doc.get("complete") is True
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _trusted(entry: SegmentIndex, path: str) -> bool:
    """Whether ``entry`` describes the file at ``path`` as it is: sealed, and the seal
    matches the entry and the file's bytes."""
    if not isinstance(entry.seal, str) or not entry.seal:
        return False
    try:
        if os.path.getsize(path) != entry.file_bytes:
            return False
    except (OSError, TypeError):
        return False
    digest = file_sha256(path)
    try:
        return digest is not None and entry.seal_for(digest) == entry.seal
    except (TypeError, ValueError):  # fields of the wrong types
        return False


def read_index(folder: str) -> list[SegmentIndex] | None:
    """The segments listed in ``folder/index.json``; None when there is no usable index
    (missing, unreadable or of another version: callers then read the segments)."""
    loaded = _load(folder)
    return None if loaded is None else loaded[0]


class IndexCache:
    """The index entries of segment files, reading each recording folder's index once."""

    def __init__(self) -> None:
        self._folders: dict[str, dict[str, SegmentIndex]] = {}
        self._verified: dict[str, bool] = {}

    def entry(self, path: str) -> SegmentIndex | None:
        """The final index entry of the segment file at ``path``; None when its folder has
        no usable index, the index does not list it, the entry may still change (the last
        entry of a recording that was not closed describes a segment that was being
        written, or was cut short by a crash), or the entry is not sealed or its seal does
        not match the entry and the file (see the module docstring)."""
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
        entry = entries.get(os.path.basename(path))
        if entry is None:
            return None
        key = os.path.abspath(path)
        verdict = self._verified.get(key)
        if verdict is None:
            verdict = self._verified[key] = _trusted(entry, path)
        return entry if verdict else None
