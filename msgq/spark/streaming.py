"""Structured Streaming over a growing recording: ``spark.readStream.format("msgqlog")
.load(folder)``.

Each micro-batch reads what the recorder wrote since the last offset: the rest of the
segments it closed, and the open segment up to the end of its last whole zstd frame
(msgq's writer flushes whole frames, each checksummed and starting on a message
boundary, so the bytes from one frame boundary to another are a zstd stream of their
own, read by :mod:`msgq.logs`' segment reader like any file). An uncompressed or bz2
segment is read once it is closed.

An offset names a position in the recording: ``{"file": name, "byte": b, "stream": u}``
— every segment file sorted before ``name`` is read, and ``name`` up to file byte ``b``
(``u`` uncompressed bytes: the ``offset`` column goes on counting from there, as in a
batch read). Segment files never change below a frame boundary once written, so the
rows between two offsets are always the same: a query restarted from its checkpoint
neither loses nor repeats an event (exactly once into a file sink). Damage found while
reading gives problem rows, as in batch: a corrupt frame where it is, a truncation when
a segment closed cut short (a crash).

Layer: part of the Spark tool, over :mod:`msgq.logs` (listing, index, segment reader).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

import msgq.spark
from msgq.logs import LogProblem, read_index, segment_paths
from msgq.logs.segment import read_messages

__all__ = ["MsgqLogStreamReader", "StreamPartition", "follow_stats", "frames_end"]

_ZSTD_SUFFIX = ".zst"


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

    def __init__(self, options: Any, schema: Any) -> None:
        if len(options.paths) != 1 or not os.path.isdir(options.paths[0]):
            raise ValueError("spark.readStream.format('msgqlog') follows one recording "
                             f"folder (that a recorder writes), not {list(options.paths)}")
        self.options = options
        self.schema = schema
        self.folder = options.paths[0]

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark's name
        """Nothing read yet."""
        return {"file": "", "byte": 0, "stream": 0}

    def _segments(self) -> list[str]:
        try:
            return [p for p in segment_paths(self.folder)
                    if os.path.dirname(p) == self.folder]
        except FileNotFoundError:
            return []

    def _closed(self, paths: list[str]) -> set[str]:
        """The segment files the writer finished: all but the last, and the last once
        its index entry is sealed."""
        closed = set(paths[:-1])
        if paths:
            name = os.path.basename(paths[-1])
            if any(e.file == name and e.seal for e in read_index(self.folder) or []):
                closed.add(paths[-1])
        return closed

    def latestOffset(self, start: dict[str, Any] | None = None,  # noqa: N802
                     limit: Any = None) -> dict[str, Any]:
        """The end of what is readable now: the last segment's last whole frame;
        ``start`` itself when no new byte is (a micro-batch of no partition would never
        finish in Spark 4.3)."""
        end = self._readable_end(start)
        if start is not None and not self.partitions(start, end):
            return start
        return end

    def _readable_end(self, start: dict[str, Any] | None) -> dict[str, Any]:
        paths = self._segments()
        if not paths:
            return start or self.initialOffset()
        last = paths[-1]
        name = os.path.basename(last)
        if last in self._closed(paths):
            return {"file": name, "byte": os.path.getsize(last), "stream": -1}
        if not name.endswith(_ZSTD_SUFFIX):
            return {"file": name, "byte": 0, "stream": 0}  # read when it is closed
        begin, stream0 = 0, 0
        if start and start.get("file") == name and start.get("stream", -1) >= 0:
            begin, stream0 = int(start["byte"]), int(start["stream"])
        with open(last, "rb") as f:
            f.seek(begin)
            data = f.read()
        end, stream = frames_end(data)
        return {"file": name, "byte": begin + end, "stream": stream0 + stream}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> list[InputPartition]:
        """The byte ranges between two offsets: the rest of ``start``'s segment, the
        segments after it, and ``end``'s segment up to its byte."""
        from msgq.spark.datasource import segment_number

        parts: list[InputPartition] = []
        for path in self._segments():
            name = os.path.basename(path)
            if name < start["file"] or name > end["file"]:
                continue
            first = int(start["byte"]) if name == start["file"] else 0
            stream = int(start["stream"]) if name == start["file"] else 0
            if stream < 0:  # a closed segment read to its end
                continue
            last = int(end["byte"]) if name == end["file"] else os.path.getsize(path)
            if last > first:
                parts.append(StreamPartition(path, segment_number(path), first, last,
                                             stream))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The rows of one byte range (Arrow batches, as the batch source's)."""
        from msgq.spark.datasource import _SegmentRead

        assert isinstance(partition, StreamPartition)
        with open(partition.path, "rb") as f:
            f.seek(partition.start)
            content = f.read(partition.end - partition.start)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield from _SegmentRead(self.options, self.schema, partition.path,
                                    partition.segment, content,
                                    stream_offset=partition.stream,
                                    file_offset=partition.start).batches()

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the files stay as they are."""


def follow_stats(spark: Any, folder: str, every_s: float, on_update: Any,
                 duration_s: float | None = None, gap_factor: float | None = None) -> int:
    """Follows the recording ``folder`` with a streaming query of compact rows
    (:mod:`msgq.spark.compact`, micro-batches every ``every_s``) and calls
    ``on_update(stats)`` (:meth:`msgq.spark.analyses.LogStats.to_dict` of everything
    read so far) after each micro-batch that brought rows; until ``duration_s`` passed
    (None: until interrupted). Returns the number of updates."""
    import threading
    import time

    from msgq.spark.analyses import GAP_FACTOR, expected_rates, log_stats
    from msgq.spark.compact import COMPACT_SCHEMA

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
