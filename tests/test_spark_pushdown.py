"""Filter pushdown of the msgqlog source: every filter form, on every kind of recording
this file writes (closed and sealed, a damaged one, a loggerd route layout, bz2 and
uncompressed), gives the rows Spark's own evaluation gives (pushdown off); and what the
planner skips unread."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from msgq.logs import LogWriter
from msgq.messaging import new_message

pytestmark = pytest.mark.spark

BASE = 10_000_000_000
MS = 1_000_000
# service -> period in ms; gpsLocation is the rare one
PERIODS = {"vehicleState": 10, "can": 10, "deviceState": 100, "gpsLocation": 250}


def _write(folder: Path, seconds: float, compression: str = "zstd",
           offset_ns: int = 0) -> list[tuple[int, str, bool]]:
    """A recording rotated every second; (time, service, valid) of its events."""
    events = []
    for service, period in PERIODS.items():
        for i in range(int(seconds * 1000) // period):
            events.append((BASE + offset_ns + i * period * MS + 3, service, i % 7 != 2))
    events.sort()
    with LogWriter(str(folder), rotate_seconds=1.0, compression=compression,
                   frame_bytes=2048) as writer:
        for t, service, valid in events:
            writer.write(new_message(service, logMonoTime=t, valid=valid).to_bytes())
    return events


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pushdown")
    _write(root / "sealed", 4.0)
    _write(root / "damaged", 3.0, offset_ns=500 * MS)
    files = sorted((root / "damaged").glob("segment-*"))
    data = bytearray(files[1].read_bytes())  # a corrupt frame in the middle
    data[len(data) // 2: len(data) // 2 + 16] = b"\xee" * 16
    files[1].write_bytes(bytes(data))
    with open(files[-1], "r+b") as f:  # and a crash: the last segment cut short
        f.truncate(os.path.getsize(files[-1]) * 60 // 100)
    _write(root / "plain", 2.0, compression="none", offset_ns=7 * MS)
    _write(root / "bz2", 2.0, compression="bz2", offset_ns=9 * MS)
    # openpilot's layout: <route>--<n>/rlog.zst (+ qlog.zst), no index
    _write(root / "tmp_route", 3.0, offset_ns=11 * MS)
    route = root / "routes"
    route.mkdir()
    for n, segment in enumerate(sorted((root / "tmp_route").glob("segment-*"))):
        folder = route / f"dongle|2026-11-26--12-00-00--{n}"
        folder.mkdir()
        shutil.copy(segment, folder / "rlog.zst")
        shutil.copy(segment, folder / "qlog.zst")
    shutil.rmtree(root / "tmp_route")
    return {name: str(root / name) for name in ("sealed", "damaged", "plain", "bz2",
                                                  "routes")}


@pytest.fixture(scope="module")
def both(spark: Any, recordings: dict[str, str]) -> tuple[Any, Any]:
    from msgq.spark import read_logs

    paths = list(recordings.values())
    on = read_logs(spark, paths, data=False, pushdown=True)
    off = read_logs(spark, paths, data=False, pushdown=False)
    return on, off


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


# Every form the source takes, mixed with forms it returns to Spark.
FILTERS = [
    "service = 'gpsLocation'",
    "service IN ('gpsLocation', 'deviceState')",
    "service = 'gpsLocation' AND valid",
    "service = 'noSuchService'",
    "service IS NOT NULL",
    "service IS NULL",
    "logMonoTime < {t1}",
    "logMonoTime <= {t1}",
    "logMonoTime > {t2}",
    "logMonoTime >= {t2}",
    "logMonoTime BETWEEN {t1} AND {t2}",
    "logMonoTime >= {t1} AND logMonoTime < {t2} AND service = 'can'",
    "logMonoTime = {exact}",
    "logMonoTime IN ({exact}, {t1})",
    "logMonoTime > {t2} AND logMonoTime < {t1}",
    "valid",
    "NOT valid",
    "valid = false AND service IN ('can', 'vehicleState')",
    "file = '{file}'",
    "file IN ('{file}', '{rlog}')",
    "segment = 1",
    "segment >= 2 AND service = 'deviceState'",
    "segment IN (0, 2)",
    "route = 'dongle|2026-11-26--12-00-00'",
    "route IS NULL",
    "service <> 'can'",
    "service LIKE 'gps%'",
    "logMonoTime < {t1} OR valid = false",
    "problem IS NOT NULL",
    "size > 60 AND service = 'can'",
    "offset IS NOT NULL AND segment < 1",
]


def test_every_filter_form_gives_the_rows_of_spark_alone(
        both: tuple[Any, Any], recordings: dict[str, str]) -> None:
    on, off = both
    values = {
        "t1": BASE + 1_500 * MS, "t2": BASE + 700 * MS, "exact": BASE + 1_000 * MS + 3,
        "file": os.path.join(recordings["damaged"], "segment-00001.log.zst"),
        "rlog": os.path.join(recordings["routes"], "dongle|2026-11-26--12-00-00--1",
                             "rlog.zst"),
    }
    assert {r.service for r in off.where("service IS NULL").collect()} == {None}
    problems = off.where("problem IS NOT NULL").count()
    assert problems >= 2  # the corrupt frame and the truncation: both forms meet them
    for text in FILTERS:
        condition = text.format(**values)
        want = _rows(off.where(condition))
        got = _rows(on.where(condition))
        assert got == want, condition
    assert _rows(off.where("service = 'gpsLocation'")) != []


def test_a_time_window_and_a_service_skip_sealed_segments_unread(
        recordings: dict[str, str]) -> None:
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan

    from msgq.spark.datasource import ReadOptions, plan_segments
    from msgq.spark.pushdown import push

    options = ReadOptions((recordings["sealed"],))
    assert len(plan_segments(options)) == 4
    window = [GreaterThanOrEqual(("logMonoTime",), BASE + 1_200 * MS),
              LessThan(("logMonoTime",), BASE + 1_900 * MS)]
    where, rest = push(window)
    assert rest == [] and (where.min_mono, where.max_mono) == \
        (BASE + 1_200 * MS, BASE + 1_900 * MS - 1)
    assert [p.segment for p in plan_segments(replace(options, where=where))] == [1]
    where, rest = push([In(("service",), ("logStart",))])
    assert len(plan_segments(replace(options, where=where))) == 4
    where, _ = push([EqualTo(("service",), "logMessage")])
    assert plan_segments(replace(options, where=where)) == []
    like = object()
    where, rest = push([like, EqualTo(("segment",), 3)])
    assert rest == [like] and [p.segment for p in
                               plan_segments(replace(options, where=where))] == [3]


def test_a_query_after_a_pushed_one_reads_everything_again(
        spark: Any, recordings: dict[str, str]) -> None:
    """Spark keeps the reader of a DataFrame's last pushed query for a later query that
    pushes nothing: read_logs' DataFrames push on every query, so each plans afresh."""
    from msgq.spark import read_logs

    df = read_logs(spark, recordings["sealed"], data=False)
    total = df.count()
    assert df.where("service = 'gpsLocation'").count() == 16
    assert df.count() == total == sum(1000 // p for p in PERIODS.values()) * 4 + 4
    assert df.selectExpr("max(logMonoTime)").first()[0] > BASE + 3_900 * MS


def test_problem_rows_stay_without_an_event_filter_and_go_with_one(
        both: tuple[Any, Any], recordings: dict[str, str]) -> None:
    on, _ = both
    damaged = recordings["damaged"]
    problems = on.where(on.file.startswith(damaged)).where("service IS NULL").collect()
    assert sorted(r.problem.split(":")[0] for r in problems) == ["corrupt", "truncated"]
    assert on.where("file LIKE '%damaged%' AND valid").where("problem IS NOT NULL") \
        .count() == 0


def test_pushdown_off_by_conf_reads_with_spark_filtering(
        spark: Any, recordings: dict[str, str]) -> None:
    import msgq.spark
    from msgq.spark import PUSHDOWN_CONF, read_logs

    spark.conf.set(PUSHDOWN_CONF, "false")
    try:
        df = read_logs(spark, recordings["sealed"], services=["gpsLocation"])
        assert df.count() == 4 * 4
        msgq.spark.register(spark)  # the plain source takes no filters then
        plain = spark.read.format("msgqlog").load(recordings["sealed"])
        assert plain.where("service = 'gpsLocation'").count() == 16
        with pytest.raises(ValueError, match=PUSHDOWN_CONF):
            read_logs(spark, recordings["sealed"], pushdown=True)
    finally:
        spark.conf.set(PUSHDOWN_CONF, "true")
        msgq.spark.register(spark)


def test_read_logs_services_start_end_are_pushed_filters(
        spark: Any, recordings: dict[str, str]) -> None:
    from msgq.spark import read_logs

    start, end = BASE + 1_000 * MS, BASE + 2_000 * MS
    df = read_logs(spark, recordings["sealed"], services=["can", "gpsLocation"],
                   start=start, end=end, data=False)
    rows = df.collect()
    assert {r.service for r in rows} == {"can", "gpsLocation"}
    assert all(start <= r.logMonoTime < end for r in rows)
    assert len(rows) == 100 + 4
    # the source took every condition: Spark's plan filters nothing itself
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "BatchScan msgqlog" in plan and "Filter (" not in plan, plan
    unpushed = read_logs(spark, recordings["sealed"], services=["can"], pushdown=False)
    assert "Filter (" in unpushed._jdf.queryExecution().executedPlan().toString()
    compact = read_logs(spark, recordings["damaged"], services=["can"], start=start,
                        end=end, compact=True).collect()
    assert sum(r["count"] for r in compact if r.kind != "problem") == \
        read_logs(spark, recordings["damaged"], services=["can"], start=start,
                  end=end).count()
    assert sorted(r.problem.split(":")[0] for r in compact if r.kind == "problem") == \
        ["corrupt", "truncated"]  # a compact read keeps them: logstats reports damage
