"""Logs: record events to compressed, rotated segment files and read them back.

* :class:`LogWriter` — a recording folder of segments (zstd by default; bz2 or none),
  each starting with a ``logStart`` event, plus ``index.json``.
* :class:`LogReader` — events from a file, folder, glob or list, streamed, filtered by
  service, optionally merged in time order; truncation and corruption reported with
  file and byte offset.
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
from msgq.logs.segment import LogProblem
from msgq.logs.writer import COMPRESSIONS, LogWriter, close_on_termination

__all__ = [
    "COMPRESSIONS",
    "CorruptLogWarning",
    "LogCorruptionError",
    "LogEvent",
    "LogProblem",
    "LogReader",
    "LogWriter",
    "RecordStats",
    "Recorder",
    "ReplayStats",
    "Replayer",
    "SegmentIndex",
    "TruncatedLogWarning",
    "close_on_termination",
    "read_index",
    "segment_paths",
]
