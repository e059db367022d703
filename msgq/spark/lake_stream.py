"""The stream a lake build follows: ``spark.readStream.format("msgqlog_ranges")``, a
recording's micro-batches as the segment ranges they add (a row per range), not their
events.

A module of its own, apart from :mod:`msgq.spark.lake`, because Spark unpickles the
data source in a fresh Python process at the start of every streaming query (the
stream's source runner, which answers the offset calls for the whole query) and in its
planning processes: unpickling a class imports its module, and one that imports only
the msgqlog source and its stream readers is what those processes need. The lake's
module also imports the writing and the lake's reading (pyarrow's compute and Parquet
modules, :mod:`msgq.spark.lake_files`, :mod:`msgq.spark.lake_compact`), which the
runner would import for nothing before the batch's job could begin (measured in the
runner, 2 cores: 0.15 s to unpickle the source from msgq.spark.lake, cold bytecode).

Layer: part of the Spark tool, over the msgqlog source (pyspark: the spark extra).
"""

from __future__ import annotations

from typing import Any

from msgq.spark.datasource import (
    MsgqLogDataSource,
    check_local_logs,
    read_segment_range,
    segment_number,
)
from msgq.spark.streaming import RANGE_SCHEMA, SegmentRangeStreamReader

__all__ = ["RANGES_SOURCE", "SegmentRanges"]

#: The name of the stream of segment ranges a build follows (:class:`SegmentRanges`).
RANGES_SOURCE = "msgqlog_ranges"


class SegmentRanges(MsgqLogDataSource):
    """``spark.readStream.format("msgqlog_ranges").load(folder)``: the stream a build
    follows, the msgqlog stream's offsets and micro-batches with a row per segment
    range instead of a row per event (:class:`msgq.spark.streaming.
    SegmentRangeStreamReader`; option ``parallelism``: the tasks its ranges are spread
    over). Segments of another schema are refused at ``load()``, as the msgqlog
    stream refuses them."""

    @classmethod
    def name(cls) -> str:
        return RANGES_SOURCE

    def schema(self) -> str:
        options = self._options()
        assert options.spec is not None  # set by ReadOptions.__post_init__
        check_local_logs(list(options.paths), options.spec)
        return RANGE_SCHEMA

    def reader(self, schema: Any) -> Any:
        raise ValueError(f"{RANGES_SOURCE} is a stream: spark.readStream.format("
                         f"{RANGES_SOURCE!r}); read events with format('msgqlog')")

    def streamReader(self, schema: Any) -> Any:  # noqa: N802 - Spark's name
        return SegmentRangeStreamReader(self._options(), schema, read_segment_range,
                                        segment_number)
