"""``log_stats`` gives the results of its first implementation (window functions and
Spark's exact ``percentile``, kept below as the reference) on a fixed generated set of
recordings built to reach every corner: jitter, equal timestamps within a service and
across segment files, events out of time order in a file, gaps inside segments and
across rotations, two recordings (different clocks: never mixed), a service with a
single event, one whose intervals sum to zero, services missing from the rates, invalid
events, and a truncated segment (a problem row). Every number of ``to_dict()`` and of
the rate timeline must be equal."""

from __future__ import annotations

import math
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from msgq.logs import LogWriter  # noqa: E402
from msgq.messaging import new_message  # noqa: E402

pytestmark = pytest.mark.spark

MS = 1_000_000
# service -> (rate Hz, jitter in periods); event-driven services have rate 0
SERVICES = {"vehicleState": (100, 0.3), "can": (100, 0.05), "gpsLocation": (10, 0.1),
            "roadEncodeIdx": (20, 0.0), "deviceState": (2, 0.02), "logMessage": (0, 0.0)}
# rates given to log_stats: gpsLocation left out (no expected rate), one made up
RATES = {"vehicleState": 100.0, "can": 100.0, "roadEncodeIdx": 20.0, "deviceState": 2.0,
         "logMessage": None, "clocks": 50.0}


def _events(rng: random.Random, base: int, seconds: float) -> list[tuple[int, str, bool]]:
    out = []
    for service, (hz, jitter) in SERVICES.items():
        if hz == 0:
            times = sorted(base + rng.randrange(int(seconds * 1e9)) for _ in range(7))
            times.append(times[-1])  # two at the same time
            out += [(t, service, True) for t in times]
            continue
        period = 1_000_000_000 // hz
        for i in range(int(seconds * hz)):
            t = base + i * period + int(rng.uniform(-jitter, jitter) * period)
            if rng.random() < 0.01:
                continue  # a lost message
            if service == "can" and 1900 * MS <= i * period <= 2100 * MS:
                continue  # a gap across the rotation at 2 s
            if service == "vehicleState" and 700 * MS <= i * period <= 760 * MS:
                continue  # a gap inside a segment
            out.append((t, service, rng.random() > 0.05))
            if rng.random() < 0.02:
                out.append((t, service, True))  # an equal timestamp
    return out


def _write(folder: Path, events: list[tuple[int, str, bool]], shuffle: random.Random) -> None:
    events.sort()
    for _ in range(40):  # a few events written out of time order
        i = shuffle.randrange(len(events) - 1)
        events[i], events[i + 1] = events[i + 1], events[i]
    with LogWriter(str(folder), rotate_seconds=1.0, frame_bytes=4096) as writer:
        for i, (t, service, valid) in enumerate(events):
            msg = new_message(service, logMonoTime=t, valid=valid)
            if service == "logMessage":
                msg.logMessage.text = "x" * (i % 17)
            writer.write(msg.to_bytes())


def write_corner_recordings(a: Path, b: Path) -> list[str]:
    """The two recordings the log_stats tests read (also test_spark_lake_query's)."""
    rng = random.Random(2024)
    _write(a, _events(rng, 10_000_000_000, 4.5), rng)
    # drive b: another clock (overlapping times), one deviceState event only, and a
    # service whose two events share a timestamp (intervals summing to zero)
    events = [e for e in _events(rng, 10_500_000_000, 2.5) if e[1] != "deviceState"]
    events += [(11_000_000_000, "deviceState", False), (11_100_000_000, "clocks", True),
               (11_100_000_000, "clocks", True)]
    _write(b, events, rng)
    last = sorted(n for n in os.listdir(b) if n.startswith("segment-"))[-1]
    with open(b / last, "r+b") as f:  # a crash: the last segment ends mid-frame
        f.truncate(os.path.getsize(b / last) // 2)
    return [str(a), str(b)]


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("stats")
    return write_corner_recordings(root / "drive-a", root / "drive-b")


# -- the reference: log_stats as first written (window functions, Spark's percentile) ------


def _reference_stats(df: Any, rates: Mapping[str, float | None], gap_factor: float,
                     approx: bool = False) -> tuple[dict[str, Any], Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as sf
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    ns = 1_000_000_000
    spark = df.sparkSession
    narrow = df.select("file", "segment", "offset", "logMonoTime", "service", "valid", "size",
                       "problem")
    problems = narrow.where(sf.col("service").isNull() | sf.col("logMonoTime").isNull()
                            | sf.col("problem").isNotNull()) \
        .select("file", "segment", "offset", "service", "problem")
    schema = StructType([StructField("service", StringType(), False),
                         StructField("expected_hz", DoubleType(), True)])
    rates_frame = spark.createDataFrame(
        [(name, None if hz is None else float(hz)) for name, hz in rates.items()], schema)
    events = narrow.where(sf.col("service").isNotNull() & sf.col("logMonoTime").isNotNull()) \
        .drop("problem") \
        .withColumn("recording", sf.regexp_extract(sf.col("file"), r"^(.*)/[^/]*$", 1)) \
        .join(sf.broadcast(rates_frame), "service", "left")

    def with_dt(frame: Any, keys: list[str]) -> Any:
        order = Window.partitionBy(*keys).orderBy("logMonoTime", "file", "offset")
        return frame.withColumn("dt", sf.col("logMonoTime") - sf.lag("logMonoTime").over(order))

    is_gap = sf.col("dt") > sf.lit(gap_factor * ns) / sf.col("expected_hz")

    def summarise(frame: Any, keys: list[str]) -> Any:
        quantiles = sf.percentile_approx("dt", [0.5, 0.99], 10000) if approx else \
            sf.percentile("dt", [0.5, 0.99])
        stats = frame.groupBy(*keys, "expected_hz").agg(
            sf.count(sf.lit(1)).alias("count"),
            sf.countDistinct("file").alias("segments"),
            sf.min("logMonoTime").alias("first_mono_ns"),
            sf.max("logMonoTime").alias("last_mono_ns"),
            sf.count("dt").alias("intervals"),
            sf.sum("dt").alias("dt_sum_ns"),
            quantiles.alias("dt_quantiles_ns"),
            sf.max("dt").alias("dt_max_ns"),
            sf.sum(sf.when(is_gap, 1).otherwise(0)).alias("gap_count"),
            sf.sum(sf.when(sf.col("valid"), 0).otherwise(1)).alias("invalid"),
            sf.avg("size").alias("mean_size"),
        )
        measured = sf.when(sf.col("dt_sum_ns") > 0,
                          sf.col("intervals") * sf.lit(float(ns)) / sf.col("dt_sum_ns"))
        return stats.select(
            *keys, "count", "segments", "expected_hz", measured.alias("measured_hz"),
            (measured / sf.col("expected_hz")).alias("rate_ratio"),
            (sf.col("dt_quantiles_ns")[0] / 1e6).alias("dt_p50_ms"),
            (sf.col("dt_quantiles_ns")[1] / 1e6).alias("dt_p99_ms"),
            (sf.col("dt_max_ns") / 1e6).alias("dt_max_ms"),
            sf.when(sf.col("expected_hz").isNotNull(), sf.col("gap_count")).alias("gaps"),
            "invalid", (sf.col("invalid") / sf.col("count")).alias("invalid_fraction"),
            "mean_size", "first_mono_ns", "last_mono_ns",
            ((sf.col("last_mono_ns") - sf.col("first_mono_ns")) / 1e9).alias("duration_s"),
            "intervals",
        )

    per_recording = with_dt(events, ["recording", "service"])
    services = summarise(per_recording, ["service"])
    segments = summarise(with_dt(events, ["file", "service"]),
                         ["recording", "file", "segment", "service"])
    starts = events.groupBy("recording").agg(sf.min("logMonoTime").alias("recording_start"))
    gaps = per_recording.where(is_gap).join(starts, "recording").select(
        "recording", "file", "segment", "service",
        (sf.col("logMonoTime") - sf.col("dt")).alias("start_mono_ns"),
        sf.col("logMonoTime").alias("end_mono_ns"),
        ((sf.col("logMonoTime") - sf.col("dt") - sf.col("recording_start")) / 1e9)
        .alias("start_s"),
        (sf.col("dt") / 1e6).alias("duration_ms"),
        (sf.round(sf.col("dt") * sf.col("expected_hz") / 1e9) - 1).cast("long").alias("missed"),
    )

    def rows(frame: Any, order: list[str]) -> list[dict[str, Any]]:
        return [r.asDict() for r in frame.orderBy(*order).collect()]

    result = {
        "gap_factor": gap_factor,
        "services": rows(services, ["service"]),
        "segments": rows(segments, ["recording", "segment", "file", "service"]),
        "gaps": rows(gaps, ["recording", "start_mono_ns", "service"]),
        "problems": rows(problems, ["file", "offset"]),
    }
    return result, events


def _reference_timeline(events: Any, bin_seconds: float) -> list[tuple[Any, ...]]:
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    bin_ns = int(bin_seconds * 1_000_000_000)
    recording = Window.partitionBy("recording")
    start = sf.min("logMonoTime").over(recording)
    end = sf.max("logMonoTime").over(recording)
    binned = events.select(
        "recording", "service",
        sf.floor((sf.col("logMonoTime") - start) / bin_ns).cast("long").alias("bin"),
        ((end - start) / 1e9).alias("span_s"))
    counts = binned.groupBy("recording", "service", "bin").agg(
        sf.count(sf.lit(1)).alias("messages"), sf.first("span_s").alias("span_s"))
    start_s = sf.col("bin") * bin_seconds
    seconds = sf.least(sf.lit(float(bin_seconds)), sf.col("span_s") - start_s)
    frame = counts.select(
        "recording", "service", "bin", start_s.alias("start_s"), seconds.alias("seconds"),
        (sf.col("messages") / seconds).alias("rate_hz"),
    ).where(sf.col("seconds") >= bin_seconds / 4)
    return sorted(tuple(r) for r in frame.collect())


# -- the comparison ----------------------------------------------------------------------


def _assert_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() >= want.keys()
    for table in ("services", "segments", "gaps", "problems"):
        assert len(got[table]) == len(want[table]), table
        for g, w in zip(got[table], want[table], strict=True):
            assert g == w, f"{table}: {g} != {w}"
    assert got["gap_factor"] == want["gap_factor"]


@pytest.fixture(scope="module")
def reference(spark: Any, recordings: list[str]) -> tuple[Any, dict[str, Any], Any]:
    """(the msgqlog frame of the recordings, the reference's results, its event rows)."""
    from msgq.spark import read_logs

    df = read_logs(spark, recordings, data=False)
    want, events = _reference_stats(df, RATES, 2.5)
    return df, want, events


def test_log_stats_equal_the_reference(reference: tuple[Any, dict[str, Any], Any],
                                       recordings: list[str]) -> None:
    from msgq.spark.analyses import log_stats

    df, want, events = reference
    # the recordings reach what they were made for
    services = {r["service"]: r for r in want["services"]}
    assert services["deviceState"]["count"] > 1 and services["clocks"]["measured_hz"] is None
    assert services["gpsLocation"]["expected_hz"] is None and len(want["problems"]) == 1
    assert {g["service"] for g in want["gaps"]} >= {"can", "vehicleState"}
    assert {s["recording"] for s in want["segments"]} == set(recordings)
    assert any(s["count"] == 1 for s in want["segments"])

    stats = log_stats(df, RATES, cache=True)
    try:
        _assert_equal(stats.to_dict(), want)
        for bin_seconds in (1.0, 0.3):
            got = sorted(tuple(r) for r in stats.timeline(bin_seconds).collect())
            assert got == _reference_timeline(events, bin_seconds)
        # the frames hold what to_dict() collected
        got = stats.to_dict()
        assert sorted((r.asDict() for r in stats.gaps.collect()), key=repr) == \
            sorted(got["gaps"], key=repr)
        assert sorted((r.asDict() for r in stats.segments.collect()), key=repr) == \
            sorted(got["segments"], key=repr)
    finally:
        stats.unpersist()


def test_log_stats_of_a_service_subset_and_the_default_rates(
        spark: Any, recordings: list[str]) -> None:
    from msgq.spark import read_logs
    from msgq.spark.analyses import expected_rates, log_stats

    df = read_logs(spark, recordings[0], services=["can", "vehicleState", "gpsLocation"],
                   data=False)
    want, _ = _reference_stats(df, expected_rates(), 1.5)
    stats = log_stats(df, gap_factor=1.5)
    try:
        _assert_equal(stats.to_dict(), want)
    finally:
        stats.unpersist()


def test_approximate_percentiles_are_close(
        reference: tuple[Any, dict[str, Any], Any]) -> None:
    """``approx_percentiles=True``: every other number equal, p50 and p99 within the
    stated error of the exact ones."""
    import copy

    from msgq.spark.analyses import APPROX_RELATIVE_ERROR, log_stats

    df, want, _ = reference
    want = copy.deepcopy(want)
    stats = log_stats(df, RATES, approx_percentiles=True)
    try:
        got = stats.to_dict()
    finally:
        stats.unpersist()
    for table in ("services", "segments"):
        for g, w in zip(got[table], want[table], strict=True):
            for key in ("dt_p50_ms", "dt_p99_ms"):
                exact, approx = w.pop(key), g.pop(key)
                if exact is None:
                    assert approx is None
                else:
                    assert math.isclose(approx, exact, rel_tol=APPROX_RELATIVE_ERROR * 1.0001)
            assert g == w


def test_log_stats_of_a_compact_read_equal_the_reference(
        spark: Any, reference: tuple[Any, dict[str, Any], Any], recordings: list[str]) -> None:
    """``read_logs(..., compact=True)`` (what ``msgq logstats`` reads: the events packed
    by the source's workers) gives the same statistics, on the source and through
    Hadoop; it has no event rows for a timeline."""
    from msgq.spark import read_logs
    from msgq.spark.analyses import log_stats

    _, want, _ = reference
    compact = read_logs(spark, recordings, compact=True)
    stats = log_stats(compact, RATES)
    try:
        _assert_equal(stats.to_dict(), want)
        with pytest.raises(ValueError, match="compact"):
            stats.timeline(1.0)
    finally:
        stats.unpersist()
    with pytest.raises(ValueError, match="compact"):
        log_stats(compact, RATES, cache=True)

    uris = [Path(r).as_uri() for r in recordings]
    events = log_stats(read_logs(spark, uris, data=False, via="hadoop"), RATES)
    packed = log_stats(read_logs(spark, uris, via="hadoop", compact=True), RATES)
    try:
        _assert_equal(packed.to_dict(), events.to_dict())
    finally:
        events.unpersist()
        packed.unpersist()


def test_a_compact_read_has_no_typed_columns(spark: Any, recordings: list[str]) -> None:
    from msgq.spark import read_logs

    with pytest.raises(Exception, match="compact"):
        read_logs(spark, recordings[0], compact=True, decode=True)
