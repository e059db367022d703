"""Logs: record events to compressed, rotated segment files and read them back.

* :class:`LogWriter` — a recording folder of segments (zstd by default; bz2 or none),
  each starting with a ``logStart`` event where the schema has msgq's, plus
  ``index.json`` (which keeps the same facts for schemas without one).
* :class:`LogReader` — events from a file, folder, glob or list (msgq recordings and
  openpilot loggerd logs: ``rlog.zst``, ``rlog.bz2``, ``rlog``, route folders), streamed,
  filtered by service, optionally merged in time order; truncation and corruption
  reported with file and byte offset.
* :func:`check_schema` / :class:`SchemaMismatchError` — whether logs were written with the
  schema used to read them (index, else a sample of the first events); LogReader
  iteration checks first and raises SchemaMismatchError rather than mislabel events.
* :class:`Recorder` / :class:`Replayer` — record live services, replay logs in real time.

The file format is described in docs/logs.md.

Layer: a service — over the package's sockets (recorder, replayer), the Event layer
(framing, ``EventLayout``, decoding) and zstandard; it does not import ``msgq.messaging``,
its peer.
"""

from msgq.logs.index import SegmentIndex, read_index
from msgq.logs.reader import (
    CorruptLogWarning,
    LogCorruptionError,
    LogEvent,
    LogReader,
    TruncatedLogWarning,
    segment_paths,
)
from msgq.logs.recorder import Recorder, RecordStats
from msgq.logs.replayer import Replayer, ReplayStats
from msgq.logs.schema_check import SchemaMismatchError, check_schema
from msgq.logs.segment import LogProblem, MessageBatch
from msgq.logs.writer import COMPRESSIONS, LogWriter, close_on_termination

__all__ = [
    "COMPRESSIONS",
    "CorruptLogWarning",
    "LogCorruptionError",
    "LogEvent",
    "LogProblem",
    "LogReader",
    "LogWriter",
    "MessageBatch",
    "RecordStats",
    "Recorder",
    "ReplayStats",
    "Replayer",
    "SchemaMismatchError",
    "SegmentIndex",
    "TruncatedLogWarning",
    "check_schema",
    "close_on_termination",
    "read_index",
    "segment_paths",
]
