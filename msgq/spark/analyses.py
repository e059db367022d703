"""Ready analyses of msgq logs in Spark: rates, inter-arrival jitter, gaps, validity and
size, per service and per segment — DataFrame operations and window functions only, so
they run wherever the DataFrame does (one machine or a cluster).

Definitions (docs/spark.md has them with examples):

* an **interval** (``dt``) is the logMonoTime difference between consecutive events of one
  service, in time order. Per service, intervals are taken within a recording (the folder
  of the segment files; segment boundaries included, different recordings never mixed);
  per segment, within the segment file.
* **measured rate** = intervals / their total duration (= 1 / mean dt), in Hz; the
  **expected rate** is the registry's frequency (none for event-driven services);
  ``rate_ratio`` = measured / expected.
* **jitter**: p50, p99 and max of dt in ms. Percentiles are exact, interpolated linearly
  between the two nearest intervals (Spark's ``percentile``, as numpy's default), or
  approximate with ``approx_percentiles`` (``percentile_approx``, bounded memory).
* a **gap** is an interval longer than ``gap_factor`` expected periods (default
  :data:`GAP_FACTOR` = 2.5: two or more messages lost in a row, while a single lost
  message, two periods, with up to half a period of jitter is not a gap).
* ``invalid_fraction`` = events with ``valid`` false / events; ``mean_size`` = mean of the
  event size in bytes.

Event rows are the rows with a service and a logMonoTime; problem rows (damage) are
listed apart in ``problems``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GAP_FACTOR", "LogStats", "expected_rates", "log_stats", "rate_timeline"]

#: Default gap threshold, in expected periods.
GAP_FACTOR = 2.5

_NS = 1_000_000_000


def expected_rates(registry: Mapping[str, Any] | None = None) -> dict[str, float | None]:
    """service -> expected Hz from a service registry (default ``SERVICE_LIST``); None for
    event-driven services."""
    if registry is None:
        from msgq.schemas import SERVICE_LIST

        registry = SERVICE_LIST
    return {name: (s.frequency if s.frequency > 0 else None) for name, s in registry.items()}


def _recording(sf: Any) -> Any:
    """The recording of a row: the folder of its segment file."""
    return sf.regexp_extract(sf.col("file"), r"^(.*)/[^/]*$", 1)


def _rates_frame(spark: Any, rates: Mapping[str, float | None]) -> Any:
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    schema = StructType([StructField("service", StringType(), False),
                         StructField("expected_hz", DoubleType(), True)])
    rows = [(name, None if hz is None else float(hz)) for name, hz in rates.items()]
    return spark.createDataFrame(rows, schema)


def _with_dt(frame: Any, keys: list[str]) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    order = Window.partitionBy(*keys).orderBy("logMonoTime", "file", "offset")
    return frame.withColumn("dt", sf.col("logMonoTime") - sf.lag("logMonoTime").over(order))


def _is_gap(gap_factor: float) -> Any:
    from pyspark.sql import functions as sf

    return sf.col("dt") > sf.lit(gap_factor * _NS) / sf.col("expected_hz")


def _summarise(frame: Any, keys: list[str], gap_factor: float, approx: bool) -> Any:
    from pyspark.sql import functions as sf

    if approx:
        quantiles = sf.percentile_approx("dt", [0.5, 0.99], 10000)
    else:
        quantiles = sf.percentile("dt", [0.5, 0.99])
    gap_count = sf.sum(sf.when(_is_gap(gap_factor), 1).otherwise(0))
    stats = frame.groupBy(*keys, "expected_hz").agg(
        sf.count(sf.lit(1)).alias("count"),
        sf.countDistinct("file").alias("segments"),
        sf.min("logMonoTime").alias("first_mono_ns"),
        sf.max("logMonoTime").alias("last_mono_ns"),
        sf.count("dt").alias("intervals"),
        sf.sum("dt").alias("dt_sum_ns"),
        quantiles.alias("dt_quantiles_ns"),
        sf.max("dt").alias("dt_max_ns"),
        gap_count.alias("gap_count"),
        sf.sum(sf.when(sf.col("valid"), 0).otherwise(1)).alias("invalid"),
        sf.avg("size").alias("mean_size"),
    )
    measured = sf.when(sf.col("dt_sum_ns") > 0,
                      sf.col("intervals") * sf.lit(float(_NS)) / sf.col("dt_sum_ns"))
    return stats.select(
        *keys,
        "count",
        "segments",
        "expected_hz",
        measured.alias("measured_hz"),
        (measured / sf.col("expected_hz")).alias("rate_ratio"),
        (sf.col("dt_quantiles_ns")[0] / 1e6).alias("dt_p50_ms"),
        (sf.col("dt_quantiles_ns")[1] / 1e6).alias("dt_p99_ms"),
        (sf.col("dt_max_ns") / 1e6).alias("dt_max_ms"),
        sf.when(sf.col("expected_hz").isNotNull(), sf.col("gap_count")).alias("gaps"),
        "invalid",
        (sf.col("invalid") / sf.col("count")).alias("invalid_fraction"),
        "mean_size",
        "first_mono_ns",
        "last_mono_ns",
        ((sf.col("last_mono_ns") - sf.col("first_mono_ns")) / 1e9).alias("duration_s"),
        "intervals",
    )


@dataclass
class LogStats:
    """The analyses of one set of logs (Spark DataFrames; :meth:`to_dict` collects).

    ``services``: one row per service; ``segments``: one row per segment file and
    service; ``gaps``: one row per gap; ``problems``: damage found while reading.
    """

    services: Any
    segments: Any
    gaps: Any
    problems: Any
    events: Any  # the event rows (narrow, cached): recording, file, segment, service, ...
    gap_factor: float

    def timeline(self, bin_seconds: float = 1.0) -> Any:
        """Rate over time: see :func:`rate_timeline`."""
        return rate_timeline(self.events, bin_seconds)

    def to_dict(self) -> dict[str, Any]:
        """Everything collected as plain lists of dicts (JSON-ready), sorted."""

        def rows(frame: Any, order: list[str]) -> list[dict[str, Any]]:
            return [r.asDict() for r in frame.orderBy(*order).collect()]

        return {
            "gap_factor": self.gap_factor,
            "services": rows(self.services, ["service"]),
            "segments": rows(self.segments, ["recording", "segment", "file", "service"]),
            "gaps": rows(self.gaps, ["recording", "start_mono_ns", "service"]),
            "problems": rows(self.problems, ["file", "offset"]),
        }

    def unpersist(self) -> None:
        """Drops the cached event rows."""
        self.events.unpersist()


def log_stats(
    df: Any,
    rates: Mapping[str, float | None] | None = None,
    gap_factor: float = GAP_FACTOR,
    approx_percentiles: bool = False,
    cache: bool = True,
) -> LogStats:
    """The analyses of a msgqlog DataFrame (see the module docstring).

    ``rates``: service -> expected Hz (None: event-driven); default the registry's.
    ``cache``: keep the narrow event rows in memory (and disk) so that the logs are read
    once for every analysis; :meth:`LogStats.unpersist` drops them.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as sf

    if not gap_factor > 0:
        raise ValueError(f"gap_factor must be positive, not {gap_factor}")
    spark = df.sparkSession
    rates = expected_rates() if rates is None else rates
    narrow = df.select("file", "segment", "offset", "logMonoTime", "service", "valid", "size",
                       "problem")
    if cache:
        narrow = narrow.persist(StorageLevel.MEMORY_AND_DISK)
    problems = narrow.where(sf.col("service").isNull() | sf.col("logMonoTime").isNull()
                            | sf.col("problem").isNotNull()) \
        .select("file", "segment", "offset", "service", "problem")
    events = narrow.where(sf.col("service").isNotNull() & sf.col("logMonoTime").isNotNull()) \
        .drop("problem").withColumn("recording", _recording(sf)) \
        .join(sf.broadcast(_rates_frame(spark, rates)), "service", "left")

    per_recording = _with_dt(events, ["recording", "service"])
    services = _summarise(per_recording, ["service"], gap_factor, approx_percentiles)
    segments = _summarise(_with_dt(events, ["file", "service"]),
                          ["recording", "file", "segment", "service"], gap_factor,
                          approx_percentiles)

    starts = events.groupBy("recording").agg(sf.min("logMonoTime").alias("recording_start"))
    gaps = per_recording.where(_is_gap(gap_factor)).join(starts, "recording").select(
        "recording",
        "file",
        "segment",
        "service",
        (sf.col("logMonoTime") - sf.col("dt")).alias("start_mono_ns"),
        sf.col("logMonoTime").alias("end_mono_ns"),
        ((sf.col("logMonoTime") - sf.col("dt") - sf.col("recording_start")) / 1e9)
        .alias("start_s"),
        (sf.col("dt") / 1e6).alias("duration_ms"),
        (sf.round(sf.col("dt") * sf.col("expected_hz") / 1e9) - 1).cast("long").alias("missed"),
    )
    return LogStats(services, segments, gaps, problems, events, gap_factor)


def rate_timeline(events: Any, bin_seconds: float = 1.0) -> Any:
    """Rate of each service over time, in bins of ``bin_seconds`` from the start of its
    recording (its first event): rows (recording, service, bin, start_s, seconds,
    rate_hz), where ``seconds`` is the part of the bin the recording covers (less than
    ``bin_seconds`` for the last bin, which ends with the recording's last event) and
    rate_hz = messages / seconds. Bins without a message of the service are left out; a
    last bin covering less than a quarter of ``bin_seconds`` is left out too (too short
    for a rate). ``events`` is :attr:`LogStats.events` (or any frame with recording,
    service, logMonoTime)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    if not (bin_seconds > 0 and math.isfinite(bin_seconds)):
        raise ValueError(f"bin_seconds must be a positive number, not {bin_seconds}")
    bin_ns = int(bin_seconds * _NS)
    recording = Window.partitionBy("recording")
    start = sf.min("logMonoTime").over(recording)
    end = sf.max("logMonoTime").over(recording)
    binned = events.select(
        "recording", "service",
        sf.floor((sf.col("logMonoTime") - start) / bin_ns).cast("long").alias("bin"),
        ((end - start) / 1e9).alias("span_s"),
    )
    counts = binned.groupBy("recording", "service", "bin").agg(
        sf.count(sf.lit(1)).alias("messages"), sf.first("span_s").alias("span_s"))
    start_s = sf.col("bin") * bin_seconds
    seconds = sf.least(sf.lit(float(bin_seconds)), sf.col("span_s") - start_s)
    return counts.select(
        "recording", "service", "bin", start_s.alias("start_s"), seconds.alias("seconds"),
        (sf.col("messages") / seconds).alias("rate_hz"),
    ).where(sf.col("seconds") >= bin_seconds / 4)
