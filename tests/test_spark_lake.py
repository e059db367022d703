"""The route lake (``msgq lake``, :mod:`msgq.spark.lake`): every field of every service
read back from the lake equals the LogReader's, on msgq's schema and the robot schema,
over generated recordings of random messages; ``read_logs``, ``log_stats``, ``msgq lake
sql`` and ``msgq logstats`` on a lake give the raw logs' answers (damage included); a
second build adds only what is new; a lake is refused in one line when it is no lake or
was built under another schema, and read with a later schema that only adds fields."""

from __future__ import annotations

import datetime
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from msgq.logs import LogReader, LogWriter, SchemaMismatchError, read_index  # noqa: E402
from msgq.schemas import Schema  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

BASE = 5_000_000_000


def _msgq(*argv: str, cwd: Path | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYSPARK_PYTHON", None)  # as a user's shell has it
    return subprocess.run([sys.executable, "-m", "msgq", *argv], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=cwd)


# -- generated recordings ---------------------------------------------------------------


def _random_event(rng: random.Random, schema: Schema, service: str, mono: int) -> bytes:
    """A random event of ``service``: its member filled with random values of every
    kind the schema has (test_fast_reader's generator), Void, Text and lists too."""
    from test_fast_reader import _fill, _fill_list, _value

    msg = schema.event.new_message(logMonoTime=mono, valid=rng.random() < 0.7)
    field = schema.event.schema.fields[service]
    proto = field.proto
    if proto.which() == "group":
        _fill(rng, getattr(msg, service), field.schema)
        return bytes(msg.to_bytes())
    kind = proto.slot.type.which()
    if kind == "struct":
        _fill(rng, msg.init(service), field.schema)
    elif kind == "list":
        _fill_list(rng, msg, service, proto.slot.type, field.schema, 1)
    elif kind == "void":
        setattr(msg, service, None)
    elif kind not in ("anyPointer", "interface"):
        setattr(msg, service, _value(rng, proto.slot.type,
                                     field.schema if kind == "enum" else None))
    return bytes(msg.to_bytes())


def _write_random(folder: Path, schema: Schema, seed: int, per_service: int = 6) -> int:
    """A recording of ``per_service`` random events of every service of ``schema``, in
    time order, over three segments; returns the events in it (the writer's own
    included)."""
    rng = random.Random(seed)
    services = list(schema.union_fields)
    events = [s for s in services for _ in range(per_service)]
    rng.shuffle(events)
    step = 1_000_000
    with LogWriter(str(folder), rotate_seconds=len(events) * step / 3e9 + 1e-6,
                   schema=schema) as writer:
        for i, service in enumerate(events):
            writer.write(_random_event(rng, schema, service, BASE + i * step + seed))
    return sum(1 for _ in LogReader(str(folder), schema=schema).raw())


def _same(value: Any, capnp_value: Any, where: str) -> None:
    """A lake value equals the pycapnp value of the event (enums by name, an unknown
    enumerant by its number as text, floats bit for bit, UInt64 as a decimal, a struct
    inside itself as its capnp text)."""
    import math
    import struct
    from decimal import Decimal

    from pyspark.sql import Row

    kind = type(capnp_value).__name__
    if kind == "_DynamicStructReader" and isinstance(value, str):
        assert value == str(capnp_value), where  # a struct inside itself: its text
    elif isinstance(value, Row):
        fields = value.asDict()
        schema = capnp_value.schema
        union = set(schema.union_fields)
        which = capnp_value.which() if union else None
        for key, item in fields.items():
            if key in ("which", "_which") and key not in schema.fieldnames:
                assert item == which, where
            elif key in union and key != which:
                assert item is None, f"{where}.{key}"
            else:
                _same(item, getattr(capnp_value, key), f"{where}.{key}")
        assert set(schema.non_union_fields) <= set(fields) | _omitted(schema), where
    elif isinstance(value, list):
        assert len(value) == len(capnp_value), where
        for i, item in enumerate(value):
            _same(item, capnp_value[i], f"{where}[{i}]")
    elif kind == "_DynamicEnum":
        try:
            name = str(capnp_value)
        except RuntimeError:  # an enumerant this schema does not know: its number
            name = str(capnp_value.raw)
        assert value == name, where
    elif isinstance(value, Decimal):
        assert value == Decimal(capnp_value), where
    elif isinstance(value, (bytes, bytearray)):
        assert bytes(value) == bytes(capnp_value), where
    elif isinstance(value, float):
        assert isinstance(capnp_value, float), where
        assert struct.pack("<d", value) == struct.pack("<d", capnp_value) or \
            (math.isnan(value) and math.isnan(capnp_value)), (where, value, capnp_value)
    else:
        assert value == capnp_value and type(value) is type(capnp_value), \
            (where, value, capnp_value)


def _omitted(schema: Any) -> set[str]:
    """Fields with no column: Void, AnyPointer, interfaces, structs with no fields."""
    out = set()
    for f in schema.fields_list:
        proto = f.proto
        if proto.which() == "slot" and proto.slot.type.which() in (
                "void", "anyPointer", "interface"):
            out.add(proto.name)
        elif proto.which() == "slot" and proto.slot.type.which() == "struct" \
                and not f.schema.fields_list:
            out.add(proto.name)
    return out


def test_every_field_of_every_service_equals_the_log_readers(
        spark: Any, schema_profile: Schema, tmp_path: Path) -> None:
    from msgq.spark import lake

    fleet = tmp_path / "fleet"
    written = sum(_write_random(fleet / f"rec{seed}", schema_profile, seed)
                  for seed in (1, 2))
    reports = lake.build(spark, [fleet], tmp_path / "lake")
    assert sum(sum(r.rows.values()) for r in reports) == written
    assert not any(r.problem_count for r in reports)
    opened = lake.open_lake(spark, tmp_path / "lake")
    rows = {}
    for service in schema_profile.union_fields:
        table = lake.read_table(spark, tmp_path / "lake", service)
        assert service in opened.tables
        for row in table.collect():
            rows[(row.file, row.offset)] = (service, row)
    assert len(rows) == written
    seen = set()
    for seed in (1, 2):
        files = sorted(str(p) for p in (fleet / f"rec{seed}").glob("segment-*"))
        # a msgq recording's date: the UTC day it began (its first segment's start)
        start = (read_index(str(fleet / f"rec{seed}")) or [])[0].start
        assert start is not None
        began = datetime.datetime.fromtimestamp(start["wall_time_ns"] / 1e9,
                                                datetime.timezone.utc).strftime("%Y-%m-%d")
        # the offsets are the msgqlog source's (raw reading): events in file order
        by_file: dict[str, list[Any]] = {}
        for key, value in rows.items():
            if key[0] in files:
                by_file.setdefault(key[0], []).append((key[1], value))
        for path in files:
            got = [v for _, v in sorted(by_file.get(path, []), key=lambda kv: kv[0])]
            events = list(LogReader(path, schema=schema_profile))
            assert len(got) == len(events), path
            for (service, row), event in zip(got, events, strict=True):
                assert service == event.which()
                assert row.logMonoTime == event.logMonoTime and row.valid == event.valid
                assert row.problem is None and row.segment is not None
                assert row.route == f"rec{seed}" and row.date == began
                if service in row.asDict():
                    _same(row[service], getattr(event, service), service)
                seen.add(service)
    assert seen == set(schema_profile.union_fields)


# -- one recording, read every way --------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, dict[str, Any]]:
    """A recording with a damaged last segment, and its lake built by ``msgq lake
    build`` (a process of its own, as a user runs it): (recording, lake, build JSON)."""
    from msgq.bench.spark import make_recording

    root = tmp_path_factory.mktemp("lake")
    folder = str(root / "drive")
    make_recording(folder, 20.0, 5.0, drop=0.01)
    last = sorted(n for n in os.listdir(folder) if n.startswith("segment-"))[-1]
    with open(os.path.join(folder, last), "r+b") as f:  # damage: a problem row
        f.truncate(os.path.getsize(os.path.join(folder, last)) * 2 // 3)
    done = _msgq("lake", "build", folder, "--to", str(root / "lake"), "--json")
    assert done.returncode == 0, done.stderr
    return folder, str(root / "lake"), json.loads(done.stdout)


def _stats(df: Any) -> dict[str, Any]:
    from msgq.spark.analyses import log_stats

    stats = log_stats(df)
    try:
        return dict(json.loads(json.dumps(stats.to_dict())))
    finally:
        stats.unpersist()


def test_log_stats_on_the_lake_equal_the_raw_logs(
        spark: Any, built: tuple[str, str, dict[str, Any]]) -> None:
    from msgq.spark import read_logs

    folder, lake, report = built
    raw = _stats(read_logs(spark, folder, data=False))
    assert raw["problems"] and raw["gaps"]
    assert report["problem_count"] == len(raw["problems"])
    assert report["problems"][0]["file"] == raw["problems"][0]["file"]
    assert report["events"] == sum(s["count"] for s in raw["services"])
    assert _stats(read_logs(spark, lake)) == raw
    # a window and a service: the same rows as on the raw logs
    window = dict(services=["can", "gpsLocation"], start=8 * 10**9, end=12 * 10**9)
    got = read_logs(spark, lake, **window).select("file", "offset", "service").collect()
    want = read_logs(spark, folder, data=False, **window) \
        .select("file", "offset", "service").collect()
    assert sorted(got) == sorted(want) and want


def test_msgq_logstats_and_sql_on_the_lake(spark: Any, built: tuple[str, str, dict[str, Any]],
                                           tmp_path: Path) -> None:
    from helpers import run_msgq_here

    folder, lake, _ = built
    # the commands themselves, in this process on the run's session (a JVM each
    # otherwise: the build fixture runs the command as a user does)
    code, out, err = run_msgq_here("lake", "sql", "SELECT route, count(*) AS n, "
                                   "max(vehicleState.speed) AS top FROM vehicleState "
                                   "GROUP BY route", lake, "--json")
    assert code == 0, err
    rows = json.loads(out)
    events = [e for e in LogReader(folder).raw() if e.service == "vehicleState"]
    assert rows == [{"route": "drive", "n": len(events), "top": 0.0}]
    raw = run_msgq_here("logstats", folder, "--json")
    on_lake = run_msgq_here("logstats", lake, "--json")
    assert raw[0] == 0 and on_lake[0] == 0, on_lake[2]
    want, got = json.loads(raw[1]), json.loads(on_lake[1])
    for table in ("services", "segments", "gaps", "problems"):
        assert got[table] == want[table], table
    # not a lake, and a missing path: one line each, exit 1
    for path in (folder, str(tmp_path / "nothing")):
        done = _msgq("lake", "sql", "SELECT 1", path)
        assert done.returncode == 1 and "is not a lake" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_the_compact_table_holds_the_raw_compact_reads_rows(
        spark: Any, built: tuple[str, str, dict[str, Any]]) -> None:
    """The build's compact table: for each segment file and service, the row the raw
    logs' compact read makes of its events (one per file and service: each segment is
    read whole by one task), the problem rows left to the problems table."""
    import pyarrow.parquet as pq

    from msgq.spark import lake, read_logs
    from msgq.spark.compact import COMPACT_COLUMNS

    folder, path, _ = built
    assert lake.COMPACT_TABLE in lake.open_lake(spark, path).tables
    files = [os.path.join(d, n) for d, _, names in os.walk(os.path.join(path, "_compact"))
             for n in names]
    assert files and all(n.endswith(".parquet") for n in files)
    got = [row for f in files for row in pq.read_table(f).to_pylist()]
    assert all(tuple(k for k in row if k not in ("date", "route")) == COMPACT_COLUMNS
               for row in got)
    keys = [(r["file"], r["service"]) for r in got]
    assert len(set(keys)) == len(keys)

    def packed(rows: list[Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
        out: dict[tuple[str, str], list[Any]] = {}
        for r in rows:
            o = out.setdefault((r["file"], r["service"]), [0, 0, 0, b""])
            o[0] += r["count"]
            o[1] += r["invalid"]
            o[2] += r["size_sum"]
            o[3] += r["monos"]
        return {k: (c, i, s, sorted(memoryview(m).cast("q").tolist()))
                for k, (c, i, s, m) in out.items()}

    raw = [r.asDict() for r in read_logs(spark, folder, compact=True).collect()]
    assert all(r["kind"] == "events" for r in got)
    assert packed(got) == packed([r for r in raw if r["kind"] == "events"])
    assert sum(r["count"] for r in got) == sum(1 for _ in LogReader(folder).raw())


def test_table_files_are_sorted_by_log_mono_time(spark: Any, tmp_path: Path) -> None:
    """Events recorded out of time order (and at the same time) land sorted by
    logMonoTime, then file and offset, in the table's file; in order, as they came; the
    file holds logMonoTime's statistics."""
    import pyarrow.parquet as pq

    from msgq.messaging import new_message
    from msgq.spark import lake

    times = [BASE + t for t in (5, 3, 3, 9, 1, 7, 7, 2)]
    with LogWriter(str(tmp_path / "rec")) as writer:
        for i, mono in enumerate(times):
            writer.write(new_message("can", logMonoTime=mono).to_bytes())
            writer.write(new_message("vehicleState", logMonoTime=BASE + 10 * i).to_bytes())
    lake.build(spark, [tmp_path / "rec"], tmp_path / "lake")
    for service, want in (("can", sorted(times)),
                          ("vehicleState", [BASE + 10 * i for i in range(len(times))])):
        files = list((tmp_path / "lake" / service).rglob("*.parquet"))
        assert len(files) == 1
        rows = pq.read_table(files[0], columns=["logMonoTime", "offset"]).to_pylist()
        assert [r["logMonoTime"] for r in rows] == want
        keys = [(r["logMonoTime"], r["offset"]) for r in rows]
        assert keys == sorted(keys)
        # the statistics a time window skips files and row groups by
        stats = pq.ParquetFile(files[0]).metadata.row_group(0).column(0).statistics
        assert (stats.min, stats.max) == (min(want), max(want))


def test_a_second_build_adds_only_what_is_new(spark: Any, tmp_path: Path) -> None:
    from msgq.bench.spark import make_recording
    from msgq.spark import lake, read_logs

    fleet = tmp_path / "fleet"
    make_recording(str(fleet / "a"), 4.0, 2.0)
    first = lake.build(spark, [fleet], tmp_path / "lake")
    assert len(first) == 1 and lake.build(spark, [fleet], tmp_path / "lake") == []
    make_recording(str(fleet / "b"), 3.0, 1.0, seed=3)
    second = lake.build(spark, [fleet], tmp_path / "lake")
    assert [r.source for r in second] == [str(fleet / "b")]
    got = read_logs(spark, str(tmp_path / "lake")).select("file", "offset").collect()
    want = read_logs(spark, [str(fleet / "a"), str(fleet / "b")], data=False) \
        .select("file", "offset").collect()
    assert sorted(got) == sorted(want) and len(set(got)) == len(got)


def test_a_lake_of_another_schema_is_refused(spark: Any, robot: Schema,
                                            tmp_path: Path) -> None:
    from msgq.schemas import msgq_schema
    from msgq.spark import lake

    _write_random(tmp_path / "rec", msgq_schema(), 5, per_service=2)
    lake.build(spark, [tmp_path / "rec"], tmp_path / "lake", schema=msgq_schema())
    with pytest.raises(lake.LakeError, match="built under another schema") as raised:
        lake.read_lake(spark, tmp_path / "lake")  # the robot schema in force
    assert "\n" not in str(raised.value) and "--schema" in str(raised.value)
    with pytest.raises(lake.LakeError, match="is not a lake"):
        lake.read_lake(spark, tmp_path / "rec")
    with pytest.raises(lake.LakeError, match="not empty"):
        lake.build(spark, [tmp_path / "rec"], tmp_path / "rec")
    # segments of another schema: refused in one line before anything is written
    _write_random(tmp_path / "robot", robot, 6, per_service=1)
    with pytest.raises(SchemaMismatchError) as refused:
        lake.build(spark, [tmp_path / "robot"], tmp_path / "lake", schema=msgq_schema())
    assert "\n" not in str(refused.value) and "robot" in str(refused.value)
    assert not (tmp_path / "lake" / "_checkpoints" / lake.source_key(
        str(tmp_path / "robot"))).exists()


SCHEMA_V1 = """\
@0xc5d3c2a1f0e4d6c9;
struct Point {
  x @0 :Float64;
  label @1 :Text;
}
struct Event {
  logMonoTime @0 :UInt64;
  valid @1 :Bool;
  union {
    point @2 :Point;
    note @3 :Text;
  }
}
"""
# (a later version of a file keeps its id; one process cannot load both, so here v2
# has an id of its own: the lake compares the columns, not the ids)
SCHEMA_V2 = SCHEMA_V1.replace("  label @1 :Text;\n", "  label @1 :Text;\n  y @2 :Int32;\n") \
    .replace("@0xc5d3c2a1f0e4d6c9", "@0xc5d3c2a1f0e4d6ca")


def test_a_later_schema_that_adds_fields_adds_columns(spark: Any, tmp_path: Path) -> None:
    from msgq.schemas import load_schema
    from msgq.spark import lake

    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v1" / "app.capnp").write_text(SCHEMA_V1)
    (tmp_path / "v2" / "app.capnp").write_text(SCHEMA_V2)
    v1 = load_schema(str(tmp_path / "v1" / "app.capnp"))
    v2 = load_schema(str(tmp_path / "v2" / "app.capnp"))

    def record(folder: Path, schema: Schema, first: int) -> None:
        with LogWriter(str(folder), schema=schema) as writer:
            for i in range(first, first + 5):
                msg = schema.event.new_message(logMonoTime=BASE + i, valid=True)
                point = msg.init("point")
                point.x = i / 2
                if schema is v2:
                    point.y = -i
                writer.write(msg.to_bytes())

    fleet = tmp_path / "fleet"
    record(fleet / "old", v1, 0)
    lake.build(spark, [fleet], tmp_path / "lake", schema=v1)
    record(fleet / "new", v2, 5)
    lake.build(spark, [fleet / "new"], tmp_path / "lake", schema=v2)
    rows = sorted(lake.read_table(spark, tmp_path / "lake", "point", schema=v2)
                  .select("logMonoTime", "point.x", "point.y").collect())
    assert [tuple(r) for r in rows] == [(BASE + i, i / 2, None if i < 5 else -i)
                                       for i in range(10)]
    with pytest.raises(lake.LakeError, match="point.y is gone"):  # the older schema
        lake.read_table(spark, tmp_path / "lake", "point", schema=v1)
    shutil.rmtree(tmp_path / "lake")


def test_a_lake_reads_through_a_hadoop_path(spark: Any,
                                            built: tuple[str, str, dict[str, Any]]) -> None:
    """The tables are Spark's Parquet source: a Hadoop URI reads them (viewfs mounting
    the lake folder, set at run time), with the same rows as the local path."""
    from msgq.spark import lake

    _, folder, _ = built
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    link = "fs.viewfs.mounttable.msgqlake.link./lake"
    conf.set(link, "file://" + folder)
    try:
        uri = "viewfs://msgqlake/lake"
        query = "SELECT count(*) AS n, sum(offset) AS s FROM can WHERE logMonoTime > 5e9"
        assert lake.sql(spark, uri, query).first() == lake.sql(spark, folder, query).first()
        assert lake.read_lake(spark, uri).count() == lake.read_lake(spark, folder).count()
        with pytest.raises(lake.LakeError, match="is not a lake"):
            lake.read_lake(spark, "viewfs://msgqlake/lake/can")
    finally:
        conf.unset(link)


def test_partition_folders_are_named_as_sparks_writer_names_them(
        spark: Any, tmp_path: Path) -> None:
    """The build's tasks write the partition folders themselves (lake_files): their names
    must be the ones Spark's writer gives and its reader parses back."""
    from msgq.spark.lake_files import partition_folder

    values = ["drive", "a:b=c%d [x]^{y}'z*?", "tab\there", "2024-01-02--03-04-05", None]
    df = spark.createDataFrame([(v, i) for i, v in enumerate(values)], "route string, i int")
    df.write.partitionBy("route").parquet(str(tmp_path / "t"))
    written = {n for n in os.listdir(tmp_path / "t") if n.startswith("route=")}
    assert written == {partition_folder("route", v) for v in values}
    back = spark.read.schema("i int, route string").parquet(str(tmp_path / "t")).collect()
    assert sorted((r.i, r.route) for r in back) == list(enumerate(values))


def test_build_under_a_connect_server_runs_locally_and_says_so(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """msgq lake build with $MSGQ_SPARK_REMOTE set (here a server that is not there) runs
    on a local session and says so in one line; sql attaches to the server (and says in
    one line that it does not answer)."""
    import socket

    from helpers import run_msgq_here

    from msgq.bench.spark import make_recording

    make_recording(str(tmp_path / "rec"), 3.0, 2.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"sc://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there
    # the build in this process: the local session it runs on is the run's (no JVM to
    # start); attached to the server, the command would fail
    monkeypatch.setenv("MSGQ_SPARK_REMOTE", url)
    code, out, err = run_msgq_here("lake", "build", str(tmp_path / "rec"), "--to",
                                   str(tmp_path / "lake"), "--json")
    monkeypatch.delenv("MSGQ_SPARK_REMOTE")
    assert code == 0, err
    said = [line for line in err.splitlines() if url in line]
    assert len(said) == 1 and "runs on a local Spark session" in said[0], err
    assert json.loads(out)["events"] == sum(
        1 for _ in LogReader(str(tmp_path / "rec")).raw())
    done = _msgq("lake", "sql", "SELECT count(*) FROM can", str(tmp_path / "lake"),
                 "--remote", url)
    assert done.returncode == 1 and url in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_segment_ranges_are_dealt_in_contiguous_runs_of_about_equal_bytes() -> None:
    """A build's tasks take the segments in stream order, cut where the bytes pass k/tasks
    (so each table file covers one time span), never an empty task, never a split."""
    from msgq.spark.streaming import StreamPartition, spread_ranges

    rng = random.Random(7)
    for _ in range(300):
        sizes = [rng.choice([0, 1, rng.randint(1, 1000)]) for _ in range(rng.randint(1, 30))]
        # stream order is the numbers' order, not the names' ("10" after "9")
        ranges = [StreamPartition(f"rlog.{n}.zst", n, 0, size, 0)
                  for n, size in enumerate(sizes)]
        tasks = rng.randint(1, 8)
        parts = spread_ranges(list(reversed(ranges)), tasks)
        assert len(parts) == min(tasks, len(ranges))
        assert all(p.ranges for p in parts)
        assert [r for p in parts for r in p.ranges] == ranges
        if all(s > 0 for s in sizes):
            loads = [sum(r.end - r.start for r in p.ranges) for p in parts]
            assert max(loads) <= sum(sizes) / len(parts) + max(sizes)
