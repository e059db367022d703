"""Reading the route lake (:mod:`msgq.spark.lake`'s read side) and the analyses on it:
``log_stats`` on a lake gives the raw logs' answers with either engine (the Python
stages and the SQL aggregates), on recordings built to reach the corners (test_spark_stats':
jitter, equal timestamps, events out of time order across segment files, two
recordings with overlapping clocks, a truncated segment); the SQL engine equals the
first implementation's reference on the raw rows too, and so does a compact read of a
lake (its compact table, or without one its files packed by pyarrow in the workers);
``read_logs`` of a lake (one Parquet scan of every table) gives each row the service
and route of its table and partition, an escaped route name included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from test_spark_stats import (  # noqa: E402
    RATES,
    _assert_equal,
    _reference_stats,
    write_corner_recordings,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def recordings_and_lake(spark: Any, tmp_path_factory: pytest.TempPathFactory
                        ) -> tuple[list[str], str]:
    """test_spark_stats' two recordings (the second one's folder named with characters
    Spark escapes in a partition folder) and a lake built from them."""
    from msgq.spark import lake

    root = tmp_path_factory.mktemp("lake-query")
    a, b = root / "drive-a", root / "drive b:1+2%"
    write_corner_recordings(a, b)
    lake.build(spark, [str(a), str(b)], str(root / "lake"))
    return [str(a), str(b)], str(root / "lake")


def _stats(df: Any, **options: Any) -> dict[str, Any]:
    from msgq.spark.analyses import log_stats

    stats = log_stats(df, RATES, **options)
    try:
        return dict(json.loads(json.dumps(stats.to_dict())))
    finally:
        stats.unpersist()


def test_the_sql_engine_equals_the_reference(
        spark: Any, recordings_and_lake: tuple[list[str], str]) -> None:
    from msgq.spark import read_logs
    from msgq.spark.analyses import log_stats

    recordings, _ = recordings_and_lake
    df = read_logs(spark, recordings, data=False)
    want, events = _reference_stats(df, RATES, 2.5)
    assert {g["service"] for g in want["gaps"]} >= {"can", "vehicleState"}
    stats = log_stats(df, RATES, cache=True, engine="sql")
    try:
        got = stats.to_dict()
        _assert_equal(got, want)
        # the frames hold what to_dict() collected
        for table, frame in (("gaps", stats.gaps), ("segments", stats.segments),
                             ("problems", stats.problems)):
            assert sorted((r.asDict() for r in frame.collect()), key=repr) == \
                sorted(got[table], key=repr), table
        assert sorted((r.asDict() for r in stats.services.collect()), key=repr) == \
            sorted(got["services"], key=repr)
        assert stats.events.count() == events.count()
    finally:
        stats.unpersist()


def test_log_stats_on_the_lake_equal_the_raw_logs_with_both_engines(
        spark: Any, recordings_and_lake: tuple[list[str], str]) -> None:
    from msgq.spark import read_logs

    recordings, lake = recordings_and_lake
    raw = _stats(read_logs(spark, recordings, data=False))
    assert raw["problems"] and raw["gaps"]
    assert _stats(read_logs(spark, lake)) == raw
    assert _stats(read_logs(spark, lake), engine="sql") == raw
    # what msgq logstats reads (compact=True): the lake's compact table
    assert _stats(read_logs(spark, lake, compact=True)) == raw
    # a service subset and a window, the damage kept
    window = dict(services=["can", "gpsLocation"], start=11_500_000_000, end=14_000_000_000)
    want = _stats(read_logs(spark, recordings, data=False, keep_problems=True, **window))
    got = read_logs(spark, lake, keep_problems=True, **window)
    assert _stats(got) == want and _stats(got, engine="sql") == want
    assert _stats(read_logs(spark, lake, compact=True, **window)) == want
    assert want["problems"] and {s["service"] for s in want["services"]} == \
        {"can", "gpsLocation"}


def test_a_compact_read_of_a_lake_reads_its_compact_table(
        spark: Any, recordings_and_lake: tuple[list[str], str], tmp_path: Path) -> None:
    """read_logs(LAKE, compact=True) scans the compact table the build wrote (and the
    problems table), no service table, and log_stats groups its rows in the tasks that
    read them (every answer equal); a service subset is filtered there; a lake
    without that table (made before it came) packs its service tables instead, with
    the same answers."""
    import shutil

    from msgq.spark import lake as lakes
    from msgq.spark import read_logs
    from msgq.spark.compact import GroupableRead

    recordings, lake = recordings_and_lake
    raw = _stats(read_logs(spark, recordings, data=False))
    compact = read_logs(spark, lake, compact=True)
    folders = {Path(f.split(":", 1)[1]).relative_to(lake).parts[0]
               for f in compact.inputFiles()}
    assert folders == {lakes.COMPACT_TABLE, lakes.PROBLEMS_TABLE}
    # log_stats groups its rows in the tasks that read them (no shuffle)
    assert isinstance(compact, GroupableRead)
    assert not isinstance(compact.select("*"), GroupableRead)
    assert _stats(compact.select("*")) == raw  # derived frames: groupBy, same answers
    subset = dict(services=["can", "gpsLocation"], keep_problems=True)
    want = _stats(read_logs(spark, recordings, data=False, **subset))
    assert _stats(read_logs(spark, lake, compact=True, **subset)) == want
    assert {s["service"] for s in want["services"]} == {"can", "gpsLocation"}

    older = tmp_path / "older-lake"
    shutil.copytree(lake, older)
    shutil.rmtree(older / lakes.COMPACT_TABLE)
    meta = json.loads((older / lakes.LAKE_FILE).read_text())
    del meta["tables"][lakes.COMPACT_TABLE]
    (older / lakes.LAKE_FILE).write_text(json.dumps(meta))
    packed = read_logs(spark, str(older), compact=True)
    assert packed.inputFiles() == []  # (table, file) rows packed by the tasks
    assert not isinstance(packed, GroupableRead)
    assert _stats(packed) == raw
    assert _stats(read_logs(spark, str(older), compact=True, **subset)) == want


def test_rows_of_a_lake_carry_their_table_and_partition(
        spark: Any, recordings_and_lake: tuple[list[str], str]) -> None:
    from msgq.spark import lake as lakes
    from msgq.spark import read_logs

    recordings, lake = recordings_and_lake
    got = {(r.service, r.route, r.file, r.offset) for r in
           read_logs(spark, lake).select("service", "route", "file", "offset").collect()}
    want = set()
    for service in lakes.open_lake(spark, lake).table_names():
        want |= {(service, r.route, r.file, r.offset) for r in
                 lakes.read_table(spark, lake, service)
                 .select("route", "file", "offset").collect()}
    problems = {(None, r.route, r.file, r.offset) for r in
                lakes.read_table(spark, lake, lakes.PROBLEMS_TABLE).collect()}
    assert problems and got == want | problems
    assert {route for _, route, _, _ in got} == {Path(r).name for r in recordings}
    raw = {(r.service, r.file, r.offset) for r in
           read_logs(spark, recordings, data=False).select("service", "file", "offset")
           .collect()}
    assert {(s, f, o) for s, _, f, o in got} == raw


def test_the_engine_is_checked(spark: Any, recordings_and_lake: tuple[list[str], str]
                               ) -> None:
    from msgq.spark import read_logs
    from msgq.spark.analyses import log_stats

    recordings, _ = recordings_and_lake
    with pytest.raises(ValueError, match="engine is 'python' or 'sql'"):
        log_stats(read_logs(spark, recordings, data=False), engine="java")
    with pytest.raises(ValueError, match="compact read"):
        log_stats(read_logs(spark, recordings, compact=True), engine="sql")
    with pytest.raises(ValueError, match="exact percentiles"):
        log_stats(read_logs(spark, recordings, data=False), engine="sql",
                  approx_percentiles=True)


def test_a_small_table_is_read_by_one_task(
        spark: Any, recordings_and_lake: tuple[list[str], str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A table of a few small files (one per route here) is one task: an aggregate over
    it plans no shuffle (one stage), with the raw logs' answer; above
    ONE_TASK_BYTES each file is Spark's to split as it does."""
    from msgq.spark import lake as lakes
    from msgq.spark import read_logs

    recordings, lake = recordings_and_lake
    assert len(list(Path(lake, "can").rglob("*.parquet"))) >= 2
    assert lakes.read_table(spark, lake, "can").rdd.getNumPartitions() == 1
    query = lakes.sql(spark, lake, "SELECT count(*), max(logMonoTime) FROM can")
    got = tuple(query.collect()[0])
    assert "Exchange" not in query._jdf.queryExecution().executedPlan().toString()
    raw = read_logs(spark, recordings, services=["can"], data=False) \
        .where("service IS NOT NULL").selectExpr("count(*)", "max(logMonoTime)")
    assert got == tuple(raw.collect()[0]) and got[0] > 0
    monkeypatch.setattr(lakes, "ONE_TASK_BYTES", 0)
    assert lakes.read_table(spark, lake, "can").rdd.getNumPartitions() >= 2
