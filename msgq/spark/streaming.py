"""Structured Streaming over a growing recording: ``spark.readStream.format("msgqlog")
.load(folder)``, where ``folder`` is a msgq recording (``segment-NNNNN.log.zst`` and its
index) or a folder of openpilot loggerd route segments (``<route>--<n>/rlog.zst``, as
loggerd writes them: the stream takes each segment once it is closed).

Each micro-batch reads what the recorder wrote since the last offset: the rest of the
segments it closed, and the open segment up to the end of its last whole zstd frame
(msgq's writer flushes whole frames, each checksummed and starting on a message
boundary, so the bytes from one frame boundary to another are a zstd stream of their
own, read by :mod:`msgq.logs`' segment reader like any file). An uncompressed or bz2
segment is read once it is closed.

An offset names a position in the recording: ``{"file": name, "byte": b, "stream": u}``
— every segment file sorted before ``name`` (its path relative to the folder; numbers
compare as numbers: ``route--10`` after ``route--9``) is read, and ``name`` up to file
byte ``b``
(``u`` uncompressed bytes: the ``offset`` column goes on counting from there, as in a
batch read). Segment files never change below a frame boundary once written, so the
rows between two offsets are always the same: a query restarted from its checkpoint
neither loses nor repeats an event (exactly once into a file sink). Damage found while
reading gives problem rows, as in batch: a corrupt frame where it is, a truncation when
a segment closed cut short (a crash).

A loggerd segment is one zstd stream written whole (not frame by frame), so it is read
once closed: when its folder holds no ``*.lock`` file (loggerd keeps ``rlog.lock`` there
while it writes the segment) or a later segment of its route exists. The offset stops at
the first segment not closed yet, whatever comes after it in the order.

Layer: part of the Spark tool, over :mod:`msgq.logs` (listing, index, segment reader).
"""

from __future__ import annotations

import io
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

import msgq.spark
from msgq.logs import LogProblem, read_index, segment_paths
from msgq.logs.segment import read_messages
from msgq.logs.sources import LOGGERD_NAME
from msgq.spark.analyses import GAP_FACTOR, expected_rates, log_stats
from msgq.spark.compact import COMPACT_SCHEMA

__all__ = ["RANGE_SCHEMA", "MsgqLogStreamReader", "RangesPartition", "SegmentRangeStreamReader",
           "StreamPartition", "follow_stats", "frames_end", "spread_ranges"]

_ZSTD_SUFFIX = ".zst"
_ROUTE_SEGMENT = re.compile(r"^(.+)--(\d+)$")
_DIGITS = re.compile(r"(\d+)")


def _order(name: str) -> list[Any]:
    """The order of segment files in a stream (``name`` relative to the folder): numbers
    compare as numbers, as :func:`msgq.logs.segment_paths` lists them."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in _DIGITS.split(name)]


class StreamPartition(InputPartition):
    """File bytes ``[start, end)`` of one segment (frame boundaries; ``end`` None: to the
    end of a closed file), whose uncompressed stream begins at ``stream``."""

    def __init__(self, path: str, segment: int | None, start: int, end: int,
                 stream: int) -> None:
        super().__init__((path, start, end))
        self.path = path
        self.segment = segment
        self.start = start
        self.end = end
        self.stream = stream

    def __repr__(self) -> str:
        return f"StreamPartition({self.path!r}, bytes {self.start}-{self.end})"


def frames_end(data: bytes) -> tuple[int, int]:
    """(file bytes, uncompressed bytes) of the whole, checksummed zstd frames at the
    start of ``data`` (the bytes of a segment from a frame boundary on, maybe ending in
    a frame still being written): what a micro-batch may read of an open segment."""
    problems: list[LogProblem] = []
    source = io.BytesIO(data)
    source.name = "<open segment>"
    ends: list[tuple[int, int]] = []  # (frame start, end of the message in the stream)
    for message in read_messages(source, problems.append, True, lambda _: True):
        ends.append((message.file_offset, message.offset + len(message.data)))
    cut = [p.file_offset for p in problems if p.kind == "truncated"]
    end = min(cut) if cut else len(data)  # the frame being written waits
    return end, max((stream for start, stream in ends if start < end), default=0)


class MsgqLogStreamReader(DataSourceStreamReader):
    """The stream of one recording folder (module docstring); rows as the batch
    source's (same options, same columns)."""

    def __init__(self, options: Any, schema: Any, read_range: Any,
                 segment_number: Any) -> None:
        if len(options.paths) != 1 or not os.path.isdir(options.paths[0]):
            raise ValueError("spark.readStream.format('msgqlog') follows one recording "
                             f"folder (that a recorder writes), not {list(options.paths)}")
        self.options = options
        self.schema = schema
        self.folder = options.paths[0]
        # msgq.spark.datasource's read_segment_range and segment_number (passed in:
        # that module imports this one)
        self._read_range = read_range
        self._segment_number = segment_number

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark's name
        """Nothing read yet."""
        return {"file": "", "byte": 0, "stream": 0}

    def _segments(self) -> list[str]:
        """The segment files of the folder in stream order: msgq segment files in it,
        and the log of each ``<route>--<n>`` folder in it."""
        try:
            paths = segment_paths(self.folder)
        except FileNotFoundError:
            return []
        return [p for p in paths if os.path.dirname(p) == self.folder
                or os.path.dirname(os.path.dirname(p)) == self.folder]

    def _name(self, path: str) -> str:
        """A segment file's name in offsets: its path relative to the folder."""
        return os.path.relpath(path, self.folder)

    def _closed(self, paths: list[str]) -> list[bool]:
        """Whether the writer finished each segment file: a msgq segment when a later one
        of the folder exists or its index entry is sealed; a loggerd segment when its
        folder has no lock file or a later segment of its route exists."""
        closed = []
        sealed: set[str] | None = None
        later_segment: dict[str, int] = {}
        for path in paths:
            match = _ROUTE_SEGMENT.match(os.path.basename(os.path.dirname(path)))
            if match and LOGGERD_NAME.match(os.path.basename(path)):
                route, n = match.group(1), int(match.group(2))
                later_segment[route] = max(later_segment.get(route, -1), n)
        msgq_files = [p for p in paths if os.path.dirname(p) == self.folder]
        for path in paths:
            folder = os.path.dirname(path)
            match = _ROUTE_SEGMENT.match(os.path.basename(folder))
            if folder != self.folder and match:
                try:
                    locked = any(n.endswith(".lock") for n in os.listdir(folder))
                except OSError:
                    locked = False
                closed.append(not locked or int(match.group(2)) < later_segment.get(
                    match.group(1), -1))
            elif msgq_files and path != msgq_files[-1]:
                closed.append(True)
            else:
                if sealed is None:
                    sealed = {e.file for e in read_index(self.folder) or [] if e.seal}
                closed.append(os.path.basename(path) in sealed)
        return closed

    def latestOffset(self, start: dict[str, Any] | None = None,  # noqa: N802
                     limit: Any = None) -> dict[str, Any]:
        """The end of what is readable now: up to the first segment not closed yet (its
        last whole frame, for a msgq zstd segment); ``start`` itself when no new byte is
        (a micro-batch of no partition would never finish in Spark 4.3)."""
        end = self._readable_end(start)
        if start is not None and not self.partitions(start, end):
            return start
        return end

    def _readable_end(self, start: dict[str, Any] | None) -> dict[str, Any]:
        paths = self._segments()
        if not paths:
            return start or self.initialOffset()
        closed = self._closed(paths)
        if all(closed):
            return {"file": self._name(paths[-1]), "byte": os.path.getsize(paths[-1]),
                    "stream": -1}
        first_open = paths[closed.index(False)]
        name = self._name(first_open)
        if os.path.dirname(first_open) != self.folder or not name.endswith(_ZSTD_SUFFIX):
            return {"file": name, "byte": 0, "stream": 0}  # read when it is closed
        begin, stream0 = 0, 0
        if start and start.get("file") == name and start.get("stream", -1) >= 0:
            begin, stream0 = int(start["byte"]), int(start["stream"])
        with open(first_open, "rb") as f:
            f.seek(begin)
            data = f.read()
        end, stream = frames_end(data)
        return {"file": name, "byte": begin + end, "stream": stream0 + stream}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> list[InputPartition]:
        """The byte ranges between two offsets: the rest of ``start``'s segment, the
        segments after it, and ``end``'s segment up to its byte."""
        parts: list[InputPartition] = []
        first_key, last_key = _order(start["file"]), _order(end["file"])
        for path in self._segments():
            name = self._name(path)
            key = _order(name)
            if key < first_key or key > last_key:
                continue
            first = int(start["byte"]) if name == start["file"] else 0
            stream = int(start["stream"]) if name == start["file"] else 0
            if stream < 0:  # a closed segment read to its end
                continue
            last = int(end["byte"]) if name == end["file"] else os.path.getsize(path)
            if last > first:
                parts.append(StreamPartition(path, self._segment_number(path), first, last,
                                             stream))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The rows of one byte range (Arrow batches, as the batch source's)."""
        assert isinstance(partition, StreamPartition)
        return self._read_range(self.options, self.schema, partition.path,
                                partition.segment, partition.start, partition.end,
                                partition.stream)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the files stay as they are."""


#: The rows of a stream of segment ranges (:class:`SegmentRangeStreamReader`): a segment
#: file, its number, its file bytes ``[start, end)`` and where its uncompressed stream
#: is at ``start``.
RANGE_SCHEMA = "path string, segment int, start bigint, end bigint, stream bigint"


class RangesPartition(InputPartition):
    """The segment ranges one task of a micro-batch reads (StreamPartitions)."""

    def __init__(self, ranges: list[StreamPartition]) -> None:
        super().__init__([(r.path, r.start, r.end) for r in ranges])
        self.ranges = ranges

    def __repr__(self) -> str:
        return f"RangesPartition({len(self.ranges)} ranges, first {self.ranges[0]!r})"


def spread_ranges(ranges: list[StreamPartition], tasks: int) -> list[RangesPartition]:
    """``ranges`` cut, in stream order, into at most ``tasks`` contiguous runs of about
    equal bytes: run k ends at the range whose middle is nearest past k/tasks of the
    whole (a segment is never split: it is one task's). Contiguous runs make each of a
    lake table's files cover one time span, so that a time window's query skips the
    other files by their ``logMonoTime`` statistics (dealt largest-first, every file
    spanned the whole recording). No empty partition (a micro-batch of an empty
    partition never finishes in Spark 4.3)."""
    if not ranges:
        return []
    ordered = sorted(ranges, key=lambda r: (_order(r.path), r.start))
    count = max(1, min(tasks, len(ordered)))
    total = sum(r.end - r.start for r in ordered)
    runs: list[list[StreamPartition]] = [[]]
    done = 0
    for i, r in enumerate(ordered):
        size = r.end - r.start
        still_to_open = count - len(runs)
        if runs[-1] and still_to_open > 0 and (
                len(ordered) - i <= still_to_open
                or (done + size / 2) * count >= len(runs) * total):
            runs.append([])
        runs[-1].append(r)
        done += size
    return [RangesPartition(run) for run in runs]


class SegmentRangeStreamReader(MsgqLogStreamReader):
    """The stream of a recording folder as the segment ranges each micro-batch adds,
    not their events: a row per range (:data:`RANGE_SCHEMA`), the ranges spread by size
    over ``options.parallelism`` partitions (:func:`spread_ranges`). Offsets, closed
    segments and exactly-once are :class:`MsgqLogStreamReader`'s; whoever takes the
    rows reads the ranges (a lake build's tasks: :mod:`msgq.spark.lake_files`, with the
    source's own :func:`msgq.spark.datasource.read_segment_range`), so that the events
    never become Spark rows."""

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> list[InputPartition]:
        """The byte ranges between two offsets (:meth:`MsgqLogStreamReader.partitions`),
        spread over the tasks."""
        ranges = [r for r in super().partitions(start, end)
                  if isinstance(r, StreamPartition)]
        return list(spread_ranges(ranges, self.options.parallelism or 1))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """A row per range of the partition."""
        assert isinstance(partition, RangesPartition)
        for r in partition.ranges:
            yield (r.path, r.segment, r.start, r.end, r.stream)


def follow_stats(spark: Any, folder: str, every_s: float, on_update: Any,
                 duration_s: float | None = None, gap_factor: float | None = None) -> int:
    """Follows the recording ``folder`` with a streaming query of compact rows
    (:mod:`msgq.spark.compact`, micro-batches every ``every_s``) and calls
    ``on_update(stats)`` (:meth:`msgq.spark.analyses.LogStats.to_dict` of everything
    read so far) after each micro-batch that brought rows; until ``duration_s`` passed
    (None: until interrupted). Returns the number of updates."""
    rows: list[Any] = []
    fresh = threading.Event()
    lock = threading.Lock()

    def collect(batch: Any, _batch_id: int) -> None:
        got = batch.collect()
        if got:
            with lock:
                rows.extend(got)
            fresh.set()

    msgq.spark.register(spark)
    stream = (spark.readStream.format("msgqlog").option("compact", "true")
              .option("cwd", os.getcwd()).load(folder))
    query = (stream.writeStream.foreachBatch(collect)
             .trigger(processingTime=f"{every_s:g} seconds").start())
    rates = expected_rates()
    factor = GAP_FACTOR if gap_factor is None else gap_factor
    updates = 0
    deadline = None if duration_s is None else time.monotonic() + duration_s
    try:
        while deadline is None or time.monotonic() < deadline:
            wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            if query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {query.exception()}")
            if not fresh.wait(wait):
                continue
            fresh.clear()
            with lock:
                df = spark.createDataFrame(list(rows), COMPACT_SCHEMA)
            stats = log_stats(df, rates, gap_factor=factor)
            try:
                on_update(stats.to_dict())
            finally:
                stats.unpersist()
            updates += 1
    finally:
        query.stop()
    return updates
