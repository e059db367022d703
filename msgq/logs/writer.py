"""LogWriter: events to a recording folder of compressed, rotated segments.

A recording is a folder::

    DIR/segment-00000.log.zst   the first segment (.log.zst, .log.bz2 or .log)
    DIR/segment-00001.log.zst   ...
    DIR/index.json              per segment: first/last logMonoTime, counts per service

Where the schema has msgq's ``logStart`` member (a struct with the fields msgq writes),
every segment begins with a ``logStart`` event (msgq version, schema fingerprint, wall
and monotonic time, host, segment number, recording id, metadata). Any other schema
(openpilot's: its metadata event is the application's ``initData``) gets no event of
msgq's own: the same facts are in ``index.json`` only (the recording's ``msgq_version``,
``schema_fingerprint``, ``schema_members``, ``hostname``, ``recording_id``,
``metadata``; each segment's ``start`` wall and monotonic time). Segments rotate when the
events' logMonoTime has advanced ``rotate_seconds`` past the segment's first event,
and/or when ``rotate_bytes`` of (uncompressed) events are in it.

A closed segment rewrites the index only when that is due: once the segments closed
since the last write are a quarter of those it listed, or :data:`INDEX_SECONDS` after the
last write (while writing it costs under 1 % of that time); ``flush()`` and ``close()``
always rewrite it. Each rewrite is atomic (write +
rename), so a killed writer leaves an index that lists a prefix of the sealed segments;
readers read the segments it does not list (the index is a shortcut, never the truth).
The index bytes written per segment are thus bounded by a constant (about five entries),
where rewriting it at every segment cost the whole list per segment: a recording of many
small segments wrote the quadratic sum.

zstd output is a series of independent frames, each a whole number of messages with a
content checksum, ended every ``frame_bytes`` of input and at least every
``flush_seconds``: a crash loses at most the last unfinished frame, and a damaged frame
loses only itself (readers resume at the next one).
"""

from __future__ import annotations

import bz2
import functools
import hashlib
import os
import signal
import socket
import time
import uuid
from types import FrameType, TracebackType
from typing import Any, BinaryIO

import zstandard

from msgq.logs.index import SegmentIndex, write_index
from msgq.logs.schema_check import log_start_fields, schema_members
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.events import MessageDecodeError
from msgq.version import installed_version

__all__ = ["COMPRESSIONS", "INDEX_SECONDS", "LOG_START_FIELDS", "LogWriter",
           "close_on_termination", "writes_log_start"]

#: Compression name → segment file suffix.
COMPRESSIONS = {"zstd": ".log.zst", "bz2": ".log.bz2", "none": ".log"}

#: Seconds after which a closed segment rewrites the index even when fewer than a quarter
#: more segments were closed (so that a slow recording's index lags by about this much).
INDEX_SECONDS = 10.0

#: The fields of msgq's ``logStart`` the writer fills: a schema whose ``logStart`` member
#: lacks one of them gets no logStart events.
LOG_START_FIELDS = frozenset({"version", "schemaFingerprint", "wallTimeNs", "monoTimeNs",
                              "hostname", "segmentNum", "recordingId", "metadata"})


def writes_log_start(schema: Schema) -> bool:
    """Whether a log of ``schema`` begins each segment with msgq's ``logStart`` event (the
    schema has that member with the fields msgq fills)."""
    return LOG_START_FIELDS <= set(log_start_fields(schema))


@functools.cache
def _msgq_version() -> str:
    return installed_version()


class _SegmentFile:
    """One open segment: buffers messages and writes them as compressed frames."""

    def __init__(self, path: str, compression: str, level: int) -> None:
        self.path = path
        self.compression = compression
        self._file: BinaryIO = open(path, "xb")  # noqa: SIM115 - closed in close()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._zstd = zstandard.ZstdCompressor(level=level, write_checksum=True) \
            if compression == "zstd" else None
        # 100 kB blocks: a damaged or truncated block loses the least data
        self._bz2 = bz2.BZ2Compressor(1) if compression == "bz2" else None
        self.sha256 = hashlib.sha256()  # of the bytes written, for the index's seal
        self.file_bytes = 0

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self.sha256.update(data)
        self.file_bytes += len(data)

    def add(self, data: bytes) -> int:
        self._pending.append(data)
        self._pending_bytes += len(data)
        return self._pending_bytes

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        if self._zstd is not None:
            self._write(self._zstd.compress(data))
        elif self._bz2 is not None:
            self._write(self._bz2.compress(data))
        else:
            self._write(data)
        self._file.flush()

    def close(self) -> None:
        self.flush()
        if self._bz2 is not None:
            self._write(self._bz2.flush())
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


class LogWriter:
    """Writes events to a recording folder (see the module docstring).

    ``write`` takes an Event builder, an Event reader or the bytes of one. Use it as a
    context manager, or call ``close()``: that finishes the open segment and the index.
    ``schema``: default the schema in force. ``writes_log_start``: whether segments
    begin with a ``logStart`` event (the schema has msgq's).
    """

    def __init__(
        self,
        folder: str,
        rotate_seconds: float | None = 60.0,
        rotate_bytes: int | None = None,
        compression: str = "zstd",
        level: int = 3,
        schema: Schema | None = None,
        metadata: dict[str, str] | None = None,
        frame_bytes: int = 1 << 20,
        flush_seconds: float = 1.0,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}, "
                             f"not {compression!r}")
        if rotate_seconds is not None and rotate_seconds <= 0:
            raise ValueError("rotate_seconds must be positive (or None: no time rotation)")
        if rotate_bytes is not None and rotate_bytes <= 0:
            raise ValueError("rotate_bytes must be positive (or None: no size rotation)")
        self.folder = os.path.abspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        existing = [n for n in os.listdir(self.folder) if n.startswith("segment-")]
        if existing:
            raise FileExistsError(f"{self.folder} already holds a recording; "
                                  "write to a new folder")
        self.schema = schema_in_force(schema)
        self.writes_log_start = writes_log_start(self.schema)
        self._members = schema_members(self.schema)
        self.hostname = socket.gethostname()
        self.compression = compression
        self.level = level
        self.rotate_ns = None if rotate_seconds is None else int(rotate_seconds * 1e9)
        self.rotate_bytes = rotate_bytes
        self.frame_bytes = frame_bytes
        self.flush_seconds = flush_seconds
        self.metadata = dict(metadata or {})
        self.recording_id = uuid.uuid4().hex
        self.segments: list[SegmentIndex] = []
        self._segment: _SegmentFile | None = None
        self._index: SegmentIndex | None = None
        self._last_flush = time.monotonic()
        self._listed = 0  # sealed segments the index on disk lists
        self._index_written = time.monotonic()  # when it was last written
        self._index_cost = 0.0  # seconds the last write took
        #: index.json writes so far (each a whole rewrite, atomic)
        self.index_writes = 0
        self.closed = False

    # -- writing -------------------------------------------------------------------

    def write(self, event: Any) -> None:
        """Appends one event (builder, reader or bytes)."""
        if self.closed:
            raise ValueError("write to a closed LogWriter")
        if isinstance(event, (bytes, bytearray, memoryview)):
            data = bytes(event)
        elif hasattr(event, "which") and hasattr(event, "to_bytes"):  # a builder
            data = event.to_bytes()
        elif hasattr(event, "which") and hasattr(event, "as_builder"):  # a reader
            data = event.as_builder().to_bytes()
        else:
            raise TypeError(f"write takes an Event builder, reader or bytes, not "
                            f"{type(event).__name__}")
        identity = self.schema.layout.identify(data)
        if identity is None:
            raise MessageDecodeError(f"{len(data)} bytes are not exactly one valid Event")
        self.write_checked(data, identity[0], identity[2])

    def write_checked(self, data: bytes, mono_ns: int, service: str) -> None:
        """Appends the bytes of an Event the caller has already checked, with its
        logMonoTime and service (the recorder's path: no second look at the bytes)."""
        if self.closed:
            raise ValueError("write to a closed LogWriter")
        if self._needs_rotation(mono_ns, len(data)):
            self._start_segment(mono_ns)
        segment, index = self._segment, self._index
        if segment is None or index is None:
            raise RuntimeError("no open segment after rotation")
        index.add(mono_ns, service, len(data))
        pending = segment.add(data)
        now = time.monotonic()
        if pending >= self.frame_bytes or now - self._last_flush >= self.flush_seconds:
            segment.flush()
            self._last_flush = now

    def _needs_rotation(self, mono: int, size: int) -> bool:
        index = self._index
        if index is None:
            return True
        if index.events <= self.writes_log_start:  # nothing (but a logStart) never rotates
            return False
        if self.rotate_ns is not None and mono - index.first_mono_ns >= self.rotate_ns:
            return True
        return (self.rotate_bytes is not None
                and index.uncompressed_bytes + size > self.rotate_bytes)

    def _start_segment(self, mono: int) -> None:
        self._finish_segment()
        number = len(self.segments)
        name = f"segment-{number:05d}{COMPRESSIONS[self.compression]}"
        self._segment = _SegmentFile(os.path.join(self.folder, name), self.compression,
                                     self.level)
        wall_ns, mono_ns = time.time_ns(), time.monotonic_ns()
        self._index = SegmentIndex(file=name, segment=number,
                                   start={"wall_time_ns": wall_ns, "mono_time_ns": mono_ns})
        self.segments.append(self._index)
        if self.writes_log_start:
            start = self._log_start(number, mono, wall_ns, mono_ns)
            self._index.add(mono, "logStart", len(start))
            self._segment.add(start)

    def _log_start(self, number: int, mono: int, wall_ns: int, mono_ns: int) -> bytes:
        """The bytes of the logStart event that opens segment ``number``."""
        msg = self.schema.event.new_message(logMonoTime=mono, valid=True)
        start = msg.init("logStart")
        start.version = _msgq_version()
        start.schemaFingerprint = self.schema.fingerprint
        start.wallTimeNs = wall_ns
        start.monoTimeNs = mono_ns
        start.hostname = self.hostname
        start.segmentNum = number
        start.recordingId = self.recording_id
        entries = start.init("metadata", len(self.metadata))
        for entry, (key, value) in zip(entries, sorted(self.metadata.items()), strict=True):
            entry.key = str(key)
            entry.value = str(value)
        return msg.to_bytes()

    def _finish_segment(self) -> None:
        if self._segment is not None:
            self._segment.close()
            if self._index is not None:
                self._index.file_bytes = self._segment.file_bytes
                self._index.seal = self._index.seal_for(self._segment.sha256.hexdigest())
            self._segment = None
            if self.closed or self._index_due():
                self._write_index()

    def _index_due(self) -> bool:
        """Whether closing a segment rewrites the index: the segments closed since the
        last write are at least a quarter of those it listed (so every rewrite is paid
        for by that many segments: amortised, a constant per segment), or
        :data:`INDEX_SECONDS` have passed and the last write took under 1 % of that."""
        unlisted = len(self.segments) - self._listed  # closed since (all sealed)
        if unlisted >= max(1, self._listed // 4):
            return True
        since = time.monotonic() - self._index_written
        return since >= max(INDEX_SECONDS, 100 * self._index_cost)

    def _write_index(self) -> None:
        began = time.monotonic()
        self._write_index_file()
        # the sealed segments it lists (flush lists the open one too, unsealed)
        self._listed = len(self.segments) - (self._segment is not None)
        self._index_written = now = time.monotonic()
        self._index_cost = now - began
        self.index_writes += 1

    def _write_index_file(self) -> None:
        write_index(self.folder, self.segments, {
            "recording_id": self.recording_id,
            "schema_fingerprint": self.schema.fingerprint,
            "schema_root": self.schema.root_name,
            "schema_members": self._members,
            "log_start": self.writes_log_start,
            "msgq_version": _msgq_version(),
            "hostname": self.hostname,
            "metadata": dict(sorted(self.metadata.items())),
            "compression": self.compression,
            "complete": self.closed,
        })

    def flush(self) -> None:
        """Writes buffered events out (as a complete frame) and updates the index."""
        if self._segment is not None:
            self._segment.flush()
            self._last_flush = time.monotonic()
            self._write_index()

    def close(self) -> None:
        """Finishes the open segment and the index. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        self._finish_segment()  # writes the index, now marked complete
        if not self.segments:
            self._write_index()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def close_on_termination() -> None:
    """Makes SIGTERM (and SIGHUP) raise SystemExit in the main thread, so ``with
    LogWriter(...)`` blocks and ``finally`` clauses close logs cleanly when a process is
    stopped; SIGINT already raises KeyboardInterrupt."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
