"""The Spark pipeline: the msgqlog data source, the analyses, ``msgq logstats`` and its
plot, on a generated multi-segment recording with known rates, injected gaps, invalid
messages and a truncated last segment — every statistic checked against values computed
here in plain Python, in a real local SparkSession (the shared ``spark`` fixture)."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import warnings
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers import run_logstats

from msgq.logs import LogReader, LogWriter, read_index
from msgq.messaging import new_message
from msgq.schemas import SERVICE_LIST, ServiceRegistry, load_schema

pytestmark = pytest.mark.spark

BASE_NS = 5_000_000_000
MS = 1_000_000
SECONDS = 8
GAP_FACTOR = 2.5
# service -> rate (Hz) of the generated recording
RATES = {"vehicleState": 100, "can": 100, "roadEncodeIdx": 20, "gpsLocation": 10,
         "deviceState": 2}
GEARS = ("park", "drive", "reverse")


@dataclass(frozen=True)
class Written:
    service: str
    mono: int
    valid: bool
    size: int
    segment: int


def _message(service: str, i: int, t: int, valid: bool) -> Any:
    if service == "can":
        msg = new_message("can", 3, logMonoTime=t, valid=valid)
        for j, frame in enumerate(msg.can):
            frame.address = (0x100 + i % 5, 2**32 - 1, 7)[j]
            frame.dat = bytes([i % 256, j, 0xFF])
            frame.bus = (i + j) % 3
            frame.busTimeNs = 2**63 + i  # UInt64 beyond a long
        return msg
    msg = new_message(service, logMonoTime=t, valid=valid)
    if service == "vehicleState":
        v = msg.vehicleState
        v.speed = i * 0.25
        v.gear = GEARS[i % 3]
        v.wheelSpeeds.frontLeft = i * 0.5
        v.cruiseState.setSpeed = 30.5
        v.faults = [f"fault{i % 3}"] * (i % 3)
    elif service == "gpsLocation":
        g = msg.gpsLocation
        g.latitudeDeg = 48.1 + i * 1e-6
        g.satelliteCount = 200 + i % 50  # UInt8 above 127
        g.fixType = "fix3d"
        g.source = "gnss ✓"
    elif service == "deviceState":
        d = msg.deviceState
        d.cpuUsagePercent = [10, -5, 100]
        d.thermalStatus = "yellow"
        d.networkType = "wifi"
    elif service == "roadEncodeIdx":
        e = msg.roadEncodeIdx
        e.frameId = 2**32 - 1 - i
        e.timestampSof = 2**64 - 1 - i
        e.segmentNum = -i
        e.type = "fullHevc"
    elif service == "logMessage":
        m = msg.logMessage
        m.level = "warning"
        m.text = f"message {i}"
        m.lineno = i
    return msg


def _schedule() -> list[tuple[int, str, int, bool]]:
    """(time, service, index, valid) of every generated event, in time order."""
    rng = random.Random(7)
    events = []
    for service, hz in RATES.items():
        period = 1_000_000_000 // hz
        for i in range(SECONDS * hz):
            t = i * period
            if service == "vehicleState":
                t += rng.randint(-MS, MS)  # jitter
                if 2300 * MS <= t < 2600 * MS or i == 150:  # a gap and one lost message
                    continue
            if service == "gpsLocation" and 4000 * MS <= t < 4550 * MS:
                continue  # a gap
            if service == "can" and 3950 * MS <= t <= 4050 * MS:
                continue  # a gap across the rotation at 4 s
            if service == "deviceState":
                valid = t >= 2000 * MS  # invalid while "starting"
            else:
                valid = i % 10 != 3
            events.append((BASE_NS + t, service, i, valid))
    for i, t in enumerate((500, 2100, 2900, 3100, 3500)):  # event-driven
        events.append((BASE_NS + t * MS + 7, "logMessage", i, True))
    events.sort()
    return events


@dataclass
class Recording:
    folder: str
    files: list[str]
    truncated: str
    expected: list[Written]  # the events a reader can get back, logStart included


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    folder = str(tmp_path_factory.mktemp("spark") / "recording")
    written: list[Written] = []
    with LogWriter(folder, rotate_seconds=2.0, frame_bytes=4096) as writer:
        for t, service, i, valid in _schedule():
            data = _message(service, i, t, valid).to_bytes()
            writer.write(data)
            written.append(Written(service, t, valid, len(data), len(writer.segments) - 1))
    files = sorted(os.path.join(folder, n) for n in os.listdir(folder)
                   if n.startswith("segment-"))
    assert len(files) == 4
    truncated = files[-1]
    with open(truncated, "r+b") as f:  # a crash: the last segment ends mid-frame
        f.truncate(os.path.getsize(truncated) * 40 // 100)

    # Which events survive: the LogStart events and a prefix of the last segment. The
    # reader tells how many; what they are is checked against what was written.
    expected: list[Written] = []
    for segment, path in enumerate(files):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            read = list(LogReader(path).raw())
        assert bool(caught) == (path == truncated)
        assert read[0].service == "logStart"
        ours = [w for w in written if w.segment == segment]
        body = read[1:]
        if path == truncated:
            assert 0 < len(body) < len(ours)
            ours = ours[:len(body)]
        assert [(e.service, e.mono_ns, e.valid, len(e.data)) for e in body] == \
            [(w.service, w.mono, w.valid, w.size) for w in ours]
        start = read[0]
        expected.append(Written("logStart", start.mono_ns, True, len(start.data), segment))
        expected += ours
    return Recording(folder, files, truncated, expected)


def _read(spark: Any, path: Any, **options: str) -> Any:
    import msgq.spark

    msgq.spark.register(spark)
    reader = spark.read.format("msgqlog")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path)


# -- the data source -----------------------------------------------------------------


def test_rows_are_the_events_of_the_log_reader(spark: Any, recording: Recording) -> None:
    df = _read(spark, recording.folder)
    assert df.columns[:10] == ["file", "segment", "offset", "logMonoTime", "service", "valid",
                              "size", "data", "problem", "route"]
    assert df.rdd.getNumPartitions() == 1  # four small files: packed into one task
    rows = df.where("service IS NOT NULL").orderBy("file", "offset").collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = list(LogReader(recording.folder).raw())
    assert len(rows) == len(reference) == len(recording.expected)
    numbers = {e.file: e.segment for e in read_index(recording.folder) or []}
    for row, event in zip(rows, reference, strict=True):
        assert (row.file, row.offset, row.logMonoTime, row.service, row.valid) == \
            (event.path, event.offset, event.mono_ns, event.service, event.valid)
        assert bytes(row.data) == event.data and row.size == len(event.data)
        assert row.segment == numbers[os.path.basename(event.path)]
        assert row.problem is None


def test_truncated_segment_is_reported_with_its_readable_rows(
        spark: Any, recording: Recording) -> None:
    df = _read(spark, recording.folder)
    problems = df.where("service IS NULL").collect()
    reader = LogReader(recording.truncated)
    with pytest.warns():
        survivors = list(reader.raw())
    (truncation,) = reader.truncated
    assert len(problems) == 1
    (row,) = problems
    assert row.file == recording.truncated and row.segment == 3
    assert row.offset == truncation.offset
    assert row.problem.startswith("truncated: ") and "zstd frame" in row.problem
    assert row.logMonoTime is None and row.data is None
    readable = df.where(df.file == recording.truncated).where("service IS NOT NULL")
    assert readable.count() == len(survivors) > 1

    with pytest.raises(Exception, match="truncated") as failure:
        _read(spark, recording.truncated, problems="fail").collect()
    assert recording.truncated in str(failure.value)


def test_services_option_reads_only_those_and_skips_segments_by_index(
        spark: Any, recording: Recording) -> None:
    df = _read(spark, recording.folder, services="logMessage, gpsLocation")
    got = {r.service: r["count"] for r in df.groupBy("service").count().collect()}
    want: dict[str | None, int] = defaultdict(int)
    want[None] = 1  # the truncation of the last segment, whatever the services
    for w in recording.expected:
        if w.service in ("logMessage", "gpsLocation"):
            want[w.service] += 1
    assert got == want
    # logMessage is in segments 0 and 1 only: 2 and 3 hold none, and the writer closed
    # the recording (its index is complete). Segment 2 is skipped unread; segment 3 was
    # truncated after the index was sealed, so its entry no longer matches the file and it
    # is read (an index is trusted only while its seal matches the segment).
    only = _read(spark, recording.folder, services="logMessage")
    from msgq.spark.datasource import ReadOptions, plan_segments

    planned = plan_segments(ReadOptions((recording.folder,), services=("logMessage",)))
    assert [p.segment for p in planned] == [0, 1, 3]
    assert only.where("service IS NOT NULL").count() == 5
    with pytest.raises(Exception, match="did you mean 'vehicleState'"):
        _read(spark, recording.folder, services="vehicleStat")


def test_paths_globs_lists_and_file_uris(spark: Any, recording: Recording) -> None:
    first_two = recording.files[:2]
    count = sum(1 for w in recording.expected if w.segment < 2)
    assert _read(spark, first_two).count() == count
    assert _read(spark, "file://" + recording.files[0]).count() + \
        _read(spark, "file:" + recording.files[1]).count() == count
    glob = os.path.join(recording.folder, "segment-0000[01].log.zst")
    assert _read(spark, glob).count() == count
    with pytest.raises(Exception, match="local paths and file: URIs only.*read_logs"):
        _read(spark, "s3a://bucket/logs")
    with pytest.raises(Exception, match="no log file or folder matches"):
        _read(spark, os.path.join(recording.folder, "nothing-*.zst")).collect()


# -- through Spark's Hadoop file systems (binaryFile + mapInArrow) ------------------------


def _uri(path: str) -> str:
    return "file://" + path


def _local_rows(df: Any) -> list[tuple[Any, ...]]:
    """The rows of a msgqlog DataFrame with ``file`` as a local path, in file order."""
    from msgq.spark.datasource import local_path

    rows = [(local_path(r.file), *r[1:]) for r in df.collect()]
    return sorted(rows, key=lambda r: (r[0], -1 if r[2] is None else r[2], r[4] or "",
                                       r[8] or ""))


def test_hadoop_path_gives_the_rows_of_the_source(spark: Any, recording: Recording) -> None:
    from msgq.spark import read_logs

    decode = ["vehicleState", "can", "roadEncodeIdx", "logStart"]
    source = read_logs(spark, recording.folder, decode=decode)
    hadoop = read_logs(spark, _uri(recording.folder), decode=decode, via="hadoop")
    assert hadoop.schema == source.schema
    rows = _local_rows(hadoop)
    assert rows == _local_rows(source)  # typed columns, problem rows and offsets included
    assert len(rows) == len(recording.expected) + 1
    assert {r.file for r in hadoop.select("file").distinct().collect()} == \
        {"file:" + f for f in recording.files}  # the URIs Spark reports
    reader = LogReader(recording.truncated)
    with pytest.warns():
        list(reader.raw())
    (truncation,) = reader.truncated
    (problem,) = [r for r in rows if r[4] is None]
    assert problem[:3] == (recording.truncated, 3, truncation.offset)
    assert problem[8].startswith("truncated: ") and "zstd frame" in problem[8]
    assert all((r[10] is not None) == (r[4] == "vehicleState") for r in rows)  # typed
    assert all((r[13] is not None) == (r[4] == "logStart") for r in rows)

    only = ["logMessage", "gpsLocation"]
    filtered = read_logs(spark, _uri(recording.folder), services=only, data=False,
                         via="hadoop")
    assert _local_rows(filtered) == \
        _local_rows(read_logs(spark, recording.folder, services=only, data=False))
    # a filter on service, as any on an event column, leaves out the problem rows
    assert {r.service for r in filtered.select("service").distinct().collect()} == set(only)
    with pytest.raises(Exception, match="truncated") as failure:
        read_logs(spark, _uri(recording.truncated), problems="fail", via="hadoop").collect()
    assert "file:" + recording.truncated in str(failure.value)


def test_hadoop_path_globs_and_routing(spark: Any, recording: Recording) -> None:
    from msgq.spark import read_logs
    from msgq.spark.hadoop import _missing_file_system, split_paths

    count = sum(1 for w in recording.expected if w.segment < 2)
    glob = _uri(os.path.join(recording.folder, "segment-0000[01].log.zst"))
    assert read_logs(spark, glob, via="hadoop").count() == count
    parent, name = os.path.split(recording.folder)
    folders = _uri(os.path.join(parent, name[:3] + "*"))  # a glob of recording folders
    assert read_logs(spark, folders, via="hadoop", data=False).count() == \
        len(recording.expected) + 1

    assert split_paths(["/a", "file:///b", "hdfs://nn/c", "s3a://d/e", "C:/f", "gs://g"]) == \
        (["/a", "file:///b", "C:/f"], ["hdfs://nn/c", "s3a://d/e", "gs://g"])
    assert split_paths(["/a", "hdfs://nn/c"], "source") == (["/a", "hdfs://nn/c"], [])
    assert split_paths(["/a", "hdfs://nn/c"], "hadoop") == ([], ["/a", "hdfs://nn/c"])
    with pytest.raises(ValueError, match="via must be one of"):
        split_paths(["/a"], "jvm")
    with pytest.raises(ValueError, match="no Hadoop file system for nosuchfs:"):
        read_logs(spark, [recording.folder, "nosuchfs://host/logs"])
    # a scheme Hadoop knows whose connector is not installed (s3a: without hadoop-aws)
    assert _missing_file_system(": java.lang.RuntimeException: java.lang.ClassNotFound"
                                "Exception: Class org.apache.hadoop.fs.s3a.S3AFileSystem "
                                "not found") == \
        "class org.apache.hadoop.fs.s3a.S3AFileSystem not found"
    assert _missing_file_system("java.net.UnknownHostException: nn") is None

    # A scheme other than file: through the default routing, mixed with a local path:
    # Hadoop's viewfs mounting the recording's folder (set at run time, then removed).
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    link = "fs.viewfs.mounttable.msgqtest.link./logs"
    conf.set(link, _uri(recording.folder))
    try:
        mixed = read_logs(spark, ["viewfs://msgqtest/logs/segment-00000.log.zst",
                                  recording.files[1]], data=False)
        got = {r.file: r["count"] for r in mixed.groupBy("file").count().collect()}
    finally:
        conf.unset(link)
    assert got == {
        "viewfs://msgqtest/logs/segment-00000.log.zst":
            sum(1 for w in recording.expected if w.segment == 0),
        recording.files[1]: sum(1 for w in recording.expected if w.segment == 1)}


# -- typed columns -----------------------------------------------------------------------


def _assert_same(value: Any, capnp_value: Any, where: str) -> None:
    """A typed column value equals the pycapnp value it was decoded from."""
    from pyspark.sql import Row

    if isinstance(value, Row):
        fields = value.asDict()
        schema = capnp_value.schema
        union = set(schema.union_fields)
        which = capnp_value.which() if union else None
        assert set(schema.non_union_fields) <= set(fields), where
        for key, item in fields.items():
            if key == "which":
                assert item == which, where
            elif key in union and key != which:
                assert item is None, f"{where}.{key}"
            else:
                _assert_same(item, getattr(capnp_value, key), f"{where}.{key}")
    elif isinstance(value, list):
        assert len(value) == len(capnp_value), where
        for i, item in enumerate(value):
            _assert_same(item, capnp_value[i], f"{where}[{i}]")
    elif isinstance(value, Decimal):
        assert value == Decimal(capnp_value), where
    elif isinstance(value, (bytes, bytearray)):
        assert bytes(value) == capnp_value, where
    elif type(capnp_value).__name__ == "_DynamicEnum":
        assert value == str(capnp_value), where
    else:
        assert value == capnp_value and type(value) is type(capnp_value), where


DECODED = ("vehicleState", "can", "gpsLocation", "deviceState", "roadEncodeIdx",
           "logMessage", "logStart")


def test_typed_columns_match_the_log_reader(spark: Any, recording: Recording) -> None:
    df = _read(spark, recording.files[:2], decode=",".join(DECODED))
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types["can"].startswith("array<struct<address:bigint,dat:binary,bus:smallint,")
    assert "gear:string" in types["vehicleState"]
    assert "timestampSof:decimal(20,0)" in types["roadEncodeIdx"]
    assert "cpuUsagePercent:array<tinyint>" in types["deviceState"]
    rows = df.where("service IS NOT NULL").orderBy("file", "offset").collect()
    events = list(LogReader(recording.files[:2]))
    assert len(rows) == len(events)
    seen = set()
    for row, event in zip(rows, events, strict=True):
        service = event.which()
        assert row.service == service and row.problem is None
        for other in DECODED:
            if other != service:
                assert row[other] is None
        _assert_same(row[service], getattr(event, service), service)
        seen.add(service)
    assert seen == set(DECODED)
    # the point of typed columns: plain SQL on message fields
    speeds = df.where("service = 'vehicleState'").select("vehicleState.speed").collect()
    assert speeds[:3] == [(0.0,), (0.25,), (0.5,)]
    big = df.selectExpr("max(roadEncodeIdx.timestampSof)", "max(can[1].address)",
                        "max(gpsLocation.satelliteCount)").first()
    assert big[0] == Decimal(2**64 - 1) and big[1] == 2**32 - 1
    assert big[2] == 200 + 39  # UInt8 200..239 in the first 4 s: widened, not wrapped


SHAPES = """\
@0xb5d3c2a1f0e4d6c7;
# msgq's LogStart, declared here (an import of msgq's log.capnp would parse that file a
# second time in a process that loaded it already, with other import folders)
struct LogStart {
  version @0 :Text;
  schemaFingerprint @1 :Text;
  wallTimeNs @2 :UInt64;
  monoTimeNs @3 :UInt64;
  hostname @4 :Text;
  segmentNum @5 :UInt32;
  recordingId @6 :Text;
  metadata @7 :List(KeyValue);
}
struct KeyValue {
  key @0 :Text;
  value @1 :Text;
}
struct Shape {
  name @0 :Text;
  union {
    circle @1 :Float64;
    square @2 :Float64;
    empty @3 :Void;
  }
  pos :group {
    x @4 :Int16;
    y @5 :UInt64;
  }
  style :union {
    solid @6 :UInt8;
    dashed @7 :List(UInt16);
  }
  grid @8 :List(List(Int32));
  tags @9 :List(Color);
  blob @10 :Data;
  child @11 :Shape;
  enum Color { red @0; green @1; }
}
struct Event {
  logMonoTime @0 :UInt64;
  valid @1 :Bool;
  union {
    logStart @2 :LogStart;
    shape @3 :Shape;
    note @4 :Text;
    ping @5 :Void;
  }
}
"""


def test_unions_groups_and_recursion_of_a_custom_schema(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "shapes.capnp"
    path.write_text(SHAPES)
    schema = load_schema(str(path), ServiceRegistry([]))
    folder = str(tmp_path / "rec")
    with LogWriter(folder, schema=schema) as writer:
        a = schema.event.new_message(logMonoTime=10, valid=True)
        shape = a.init("shape")
        shape.name = "a"
        shape.square = 2.5
        shape.pos.x = -3
        shape.pos.y = 2**64 - 1
        shape.style.dashed = [1, 65535]
        grid = shape.init("grid", 2)
        grid.init(0, 2)
        grid[0][0], grid[0][1] = 1, -2
        shape.tags = ["green", "red"]
        shape.blob = b"\x00\x01"
        shape.child.name = "kid"
        shape.child.circle = 1.0
        writer.write(a)
        b = schema.event.new_message(logMonoTime=20, valid=False)
        b.init("shape").empty = None
        writer.write(b)
        writer.write(schema.event.new_message(logMonoTime=30, valid=True, note="hello"))
        c = schema.event.new_message(logMonoTime=40, valid=True)
        c.ping = None
        writer.write(c)
    df = _read(spark, folder, schemaFile=str(path), decode="true")
    assert df.columns[10:] == ["logStart", "shape", "note"]  # ping is Void: no column
    assert df.schema["shape"].dataType.simpleString() == (
        "struct<name:string,pos:struct<x:smallint,y:decimal(20,0)>,"
        "style:struct<which:string,solid:smallint,dashed:array<int>>,"
        "grid:array<array<int>>,tags:array<string>,blob:binary,child:string,"
        "which:string,circle:double,square:double>")
    rows = df.orderBy("offset").collect()
    assert [r.service for r in rows] == ["logStart", "shape", "shape", "note", "ping"]
    first, second = rows[1].shape, rows[2].shape
    assert (first.which, first.circle, first.square) == ("square", None, 2.5)
    assert (first.pos.x, first.pos.y) == (-3, Decimal(2**64 - 1))
    assert (first.style.which, first.style.solid, first.style.dashed) == \
        ("dashed", None, [1, 65535])
    assert first.grid == [[1, -2], []] and first.tags == ["green", "red"]
    assert bytes(first.blob) == b"\x00\x01"
    assert 'name = "kid"' in first.child and "circle = 1" in first.child
    assert (second.which, second.circle, second.square) == ("empty", None, None)
    assert rows[3].note == "hello" and rows[4].shape is None and rows[4].note is None


def test_corrupt_frames_and_unreadable_files_become_problem_rows(
        spark: Any, tmp_path: Path) -> None:
    folder = tmp_path / "rec"
    with LogWriter(str(folder), frame_bytes=1024) as writer:
        for i in range(400):
            writer.write(_message("vehicleState", i, BASE_NS + i * 10 * MS, True))
    (segment,) = folder.glob("segment-*")
    data = bytearray(segment.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(16)  # damage one frame in the middle
    segment.write_bytes(bytes(data))
    reader = LogReader(str(segment), skip_corrupt=True)
    with pytest.warns():
        reference = list(reader.raw())
    assert reader.corrupt
    # a directory where a segment should be: the executor reports it, it does not crash
    (folder / "segment-00001.log.zst").mkdir()

    df = _read(spark, str(folder))
    problems = df.where("service IS NULL").orderBy("file", "offset").collect()
    assert [(p.file, p.offset) for p in problems] == \
        [(str(segment), c.offset) for c in reader.corrupt] + \
        [(str(folder / "segment-00001.log.zst"), None)]
    for row, corrupt in zip(problems, reader.corrupt, strict=False):
        assert row.problem.startswith("corrupt: ")
        assert f"file byte {corrupt.file_offset}" in row.problem
    assert problems[-1].problem == "unreadable: not a regular file"
    events = df.where("service IS NOT NULL").orderBy("offset").collect()
    assert [(r.offset, r.logMonoTime) for r in events] == \
        [(e.offset, e.mono_ns) for e in reference]
    assert 1 < len(reference) < 401
    # the same from the file's bytes in memory (the zstd resync seeks in them)
    from msgq.spark import read_logs

    assert _local_rows(read_logs(spark, _uri(str(segment)), via="hadoop")) == \
        _local_rows(df.where(df.file == str(segment)))


def test_an_event_that_does_not_decode_keeps_its_raw_columns(
        spark: Any, tmp_path: Path) -> None:
    good = _message("vehicleState", 1, BASE_NS, True).to_bytes()
    bad = bytearray(_message("vehicleState", 2, BASE_NS + 10 * MS, True).to_bytes())
    # Point the Event's payload pointer far outside the message: the three fields the
    # reader peeks still read, the payload does not.
    root = int.from_bytes(bad[8:16], "little")
    payload = 16 + 8 * (root >> 2 & 0x3FFFFFFF) + 8 * (root >> 32 & 0xFFFF)
    bad[payload:payload + 8] = (((2**29 - 1) << 2) | (1 << 32)).to_bytes(8, "little")
    folder = str(tmp_path / "rec")
    with LogWriter(folder) as writer:
        for data in (good, bytes(bad), good):
            writer.write(data)
    rows = _read(spark, folder, decode="vehicleState").orderBy("offset").collect()
    assert [r.service for r in rows] == ["logStart", "vehicleState", "vehicleState",
                                         "vehicleState"]
    broken = rows[2]
    assert broken.problem.startswith("undecodable: ") and broken.vehicleState is None
    assert bytes(broken.data) == bytes(bad) and broken.logMonoTime == BASE_NS + 10 * MS
    assert rows[1].vehicleState.speed == 0.25 and rows[3].problem is None


# -- analyses ----------------------------------------------------------------------------


def _percentile(ordered: list[int], p: float) -> float:
    """Linear interpolation between the two nearest ranks (Spark's ``percentile``)."""
    position = p * (len(ordered) - 1)
    lower, higher = math.floor(position), math.ceil(position)
    if lower == higher:
        return float(ordered[lower])
    return (higher - position) * ordered[lower] + (position - lower) * ordered[higher]


def _reference(events: list[Written]) -> dict[str, Any]:
    """The statistics of one service's events (in time order), computed here."""
    monos = [e.mono for e in events]
    dts = sorted(b - a for a, b in zip(monos, monos[1:], strict=False))
    hz = SERVICE_LIST[events[0].service].frequency or None
    out = {
        "count": len(events),
        "expected_hz": hz,
        "measured_hz": len(dts) * 1e9 / sum(dts) if dts else None,
        "dt_p50_ms": _percentile(dts, 0.5) / 1e6 if dts else None,
        "dt_p99_ms": _percentile(dts, 0.99) / 1e6 if dts else None,
        "dt_max_ms": max(dts) / 1e6 if dts else None,
        "gaps": None if hz is None else sum(dt > GAP_FACTOR * 1e9 / hz for dt in dts),
        "invalid": sum(not e.valid for e in events),
        "invalid_fraction": sum(not e.valid for e in events) / len(events),
        "mean_size": sum(e.size for e in events) / len(events),
        "intervals": len(dts),
    }
    return out


def _check(row: dict[str, Any], want: dict[str, Any], where: str) -> None:
    for key, value in want.items():
        if value is None or isinstance(value, int):
            assert row[key] == value, f"{where} {key}"
        else:
            assert row[key] == pytest.approx(value, rel=1e-12), f"{where} {key}"


@dataclass
class Stats:
    frames: Any  # LogStats
    collected: dict[str, Any]  # its to_dict()


@pytest.fixture(scope="module")
def stats(spark: Any, recording: Recording) -> Any:
    from msgq.spark import read_logs
    from msgq.spark.analyses import log_stats

    frames = log_stats(read_logs(spark, recording.folder, data=False))
    yield Stats(frames, frames.to_dict())
    frames.unpersist()


def test_statistics_per_service_and_segment(stats: Stats, recording: Recording) -> None:
    result = stats.collected
    by_service: dict[str, list[Written]] = defaultdict(list)
    for w in sorted(recording.expected, key=lambda w: w.mono):
        by_service[w.service].append(w)
    assert {r["service"] for r in result["services"]} == set(by_service)
    for row in result["services"]:
        _check(row, _reference(by_service[row["service"]]), row["service"])
    # the recording as generated: rates within a hair of the registry's, gaps found
    rows = {r["service"]: r for r in result["services"]}
    assert rows["vehicleState"]["gaps"] == 1 and rows["gpsLocation"]["gaps"] == 1
    assert rows["can"]["gaps"] == 1 and rows["roadEncodeIdx"]["gaps"] == 0
    assert rows["deviceState"]["invalid"] == 4 and rows["logMessage"]["gaps"] is None

    segments: dict[tuple[int, str], list[Written]] = defaultdict(list)
    for w in recording.expected:
        segments[(w.segment, w.service)].append(w)
    assert len(result["segments"]) == len(segments)
    for row in result["segments"]:
        want = _reference(segments[(row["segment"], row["service"])])
        _check(row, want, f"segment {row['segment']} {row['service']}")
    # the gap in can crosses the rotation: per segment there is none
    assert all(r["gaps"] in (0, None) for r in result["segments"] if r["service"] == "can")


def test_gaps_are_listed_with_their_times(stats: Stats, recording: Recording) -> None:
    start = min(w.mono for w in recording.expected)
    want = []
    by_service: dict[str, list[Written]] = defaultdict(list)
    for w in sorted(recording.expected, key=lambda w: w.mono):
        by_service[w.service].append(w)
    for service, events in by_service.items():
        hz = SERVICE_LIST[service].frequency
        for a, b in zip(events, events[1:], strict=False):
            dt = b.mono - a.mono
            if hz and dt > GAP_FACTOR * 1e9 / hz:
                want.append((service, a.mono, b.mono, b.segment,
                             math.floor(dt * hz / 1e9 + 0.5) - 1))
    gaps = stats.collected["gaps"]
    assert sorted((g["service"], g["start_mono_ns"], g["end_mono_ns"], g["segment"],
                   g["missed"]) for g in gaps) == sorted(want)
    for g in gaps:
        assert g["start_s"] == pytest.approx((g["start_mono_ns"] - start) / 1e9, rel=1e-12)
        assert g["duration_ms"] == pytest.approx(
            (g["end_mono_ns"] - g["start_mono_ns"]) / 1e6, rel=1e-12)
    assert {g["service"] for g in gaps} == {"vehicleState", "gpsLocation", "can"}


def test_problems_and_timeline(stats: Stats, recording: Recording) -> None:
    (problem,) = stats.collected["problems"]
    assert problem["file"] == recording.truncated
    assert problem["problem"].startswith("truncated")
    timeline = stats.frames.timeline(1.0).collect()
    counts: dict[tuple[str, int], int] = defaultdict(int)
    start = min(w.mono for w in recording.expected)
    span = (max(w.mono for w in recording.expected) - start) / 1e9
    for w in recording.expected:
        counts[(w.service, (w.mono - start) // 1_000_000_000)] += 1
    want = {}
    for (service, second), count in counts.items():
        covered = min(1.0, span - second)  # the last second is cut short by the truncation
        if covered >= 0.25:
            want[(service, second)] = pytest.approx(count / covered, rel=1e-12)
    assert span % 1 > 0.25 and any(k[1] == int(span) for k in want)
    assert {(r.service, r.bin): r.rate_hz for r in timeline} == want


# -- msgq logstats -----------------------------------------------------------------------


def test_logstats_table_json_and_plot(spark: Any, recording: Recording,
                                      tmp_path: Path) -> None:
    from matplotlib import image

    from msgq.spark.plot import default_size

    by_service: dict[str, list[Written]] = defaultdict(list)
    for w in sorted(recording.expected, key=lambda w: w.mono):
        if w.service != "logStart":  # msgq's bookkeeping: not in the table or the plot
            by_service[w.service].append(w)
    png = tmp_path / "rates.png"
    code, text = run_logstats(recording.folder, "--plot", str(png), "--segments")
    assert code == 0
    lines = text.splitlines()
    assert not any(line.split()[:1] == ["logStart"] for line in lines)
    assert f"{sum(len(e) for e in by_service.values())} events over" in text
    header = next(line for line in lines if line.startswith("service"))
    assert header.split()[:3] == ["service", "count", "expected"]
    for service, events in by_service.items():
        want = _reference(events)
        line = next(line for line in lines if line.split()[:1] == [service])
        cells = line.split()
        assert cells[1] == str(want["count"])
        if want["measured_hz"] is not None:
            assert cells[3] == f"{want['measured_hz']:.2f}"
    assert "gaps" in text and "problems (1)" in text and recording.truncated in text
    assert f"plot: {png}" in text

    width, height = default_size(len(by_service))
    pixels = image.imread(str(png))
    assert pixels.shape[:2] == (height, width)
    assert png.stat().st_size > 20_000
    assert pixels[..., :3].std() > 0.05  # drawn on, not a blank page

    code, text = run_logstats(recording.folder, "--json", "--services",
                            "vehicleState,gpsLocation")
    assert code == 0
    doc = json.loads(text)
    assert {r["service"] for r in doc["services"]} == {"vehicleState", "gpsLocation"}
    for row in doc["services"]:
        _check(row, _reference(by_service[row["service"]]), row["service"])
    assert len(doc["gaps"]) == 2 and doc["problems"][0]["file"] == recording.truncated


def test_logstats_reports_bad_paths_before_starting_spark(tmp_path: Path) -> None:
    from msgq.cli import logstats
    from msgq.cli.output import CommandError

    parser = argparse.ArgumentParser(prog="msgq")
    logstats.add_parser(parser.add_subparsers())
    for argv, message in (([str(tmp_path / "missing-*")], "no log file or folder matches"),
                          (["--via", "source", "hdfs://nn/logs"],
                           "local paths and file: URIs only"),
                          ([str(tmp_path)], "no log files in"),
                          ([__file__, "--services", "gpsLocaton"], "did you mean 'gpsLocation'")):
        with pytest.raises(CommandError, match=message):
            logstats.run(parser.parse_args(["logstats", *argv]))


def test_logstats_fails_when_nothing_is_readable(spark: Any, recording: Recording,
                                                tmp_path: Path) -> None:
    """A file that is no log, or a filter that matches nothing, is an error (exit 1 with
    one line), not an empty report."""
    from msgq.cli import logstats
    from msgq.cli.output import CommandError

    not_a_log = tmp_path / "notes.log"
    not_a_log.write_bytes(random.Random(3).randbytes(3000))
    parser = argparse.ArgumentParser(prog="msgq")
    logstats.add_parser(parser.add_subparsers())
    with pytest.raises(CommandError, match=f"no readable events in {not_a_log}: "
                                           f"{not_a_log} at byte 0: corrupt: "):
        logstats.run(parser.parse_args(["logstats", str(not_a_log)]))
    with pytest.raises(CommandError, match="no events of gyroscope in "):
        logstats.run(parser.parse_args(["logstats", recording.files[0], "--services",
                                        "gyroscope"]))


def test_logstats_conf_settings_reach_the_session(spark: Any, recording: Recording) -> None:
    from msgq.cli.output import UsageError

    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        code, _ = run_logstats(recording.files[0], "--json",
                             "--conf", "spark.sql.shuffle.partitions=3",
                             "--conf", "spark.sql.session.timeZone=UTC")
        assert code == 0
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    from msgq.cli import logstats

    parser = argparse.ArgumentParser(prog="msgq")
    logstats.add_parser(parser.add_subparsers())
    with pytest.raises(UsageError, match="--conf takes KEY=VALUE, not 'spark.x'"):
        logstats.run(parser.parse_args(["logstats", recording.files[0], "--conf", "spark.x"]))


def test_a_zip_of_msgq_in_py_files_is_refused(spark: Any, tmp_path: Path) -> None:
    """--py-files zips cannot carry msgq (compiled extensions, schema files) and would
    shadow a working installed msgq on the executors: refused before Spark is asked;
    a zip of other modules is accepted."""
    import zipfile

    from msgq.spark.session import spark_session

    ours = tmp_path / "deps.zip"
    with zipfile.ZipFile(ours, "w") as archive:
        archive.writestr("msgq/__init__.py", "")
        archive.writestr("helpers.py", "")
    with pytest.raises(ValueError, match="holds msgq: a zip cannot carry msgq's compiled"):
        spark_session("local[2]", config={"spark.submit.pyFiles": f"file:{ours}"})
    other = tmp_path / "helpers.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("helpers.py", "")
    assert spark_session("local[2]", config={"spark.submit.pyFiles": str(other)}) is spark


@pytest.mark.slow
def test_session_drops_only_the_incubator_notice(tmp_path: Path) -> None:
    """A quiet session (every msgq logstats) never shows the JVM's incubator notice, and
    whatever else the JVM writes to stderr still shows."""
    script = ("from msgq.spark.session import spark_session\n"
              "spark = spark_session('local[1]')\n"
              "err = spark.sparkContext._jvm.System.err\n"
              "err.println('a real message from the JVM'); err.flush()\n"
              "spark.stop()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "a real message from the JVM" in done.stderr, done.stderr
    assert "Using incubator modules" not in done.stderr, done.stderr


def test_logstats_through_the_hadoop_path(stats: Stats, recording: Recording) -> None:
    from msgq.cli import logstats
    from msgq.cli.output import CommandError
    from msgq.spark.datasource import local_path

    def local(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for row in rows:
            row = dict(row)
            for key in ("file", "recording"):
                if key in row:
                    row[key] = local_path(row[key])
            out.append(row)
        return out

    code, text = run_logstats(_uri(recording.folder), "--via", "hadoop", "--json")
    assert code == 0
    doc = json.loads(text)
    assert doc["files"] == len(recording.files)
    assert doc["problems"][0]["file"] == "file:" + recording.truncated
    want = json.loads(json.dumps(stats.collected))
    for table in ("services", "segments", "gaps", "problems"):
        assert len(doc[table]) == len(want[table]), table
        for got, expected in zip(local(doc[table]), local(want[table]), strict=True):
            assert got.keys() == expected.keys(), table
            for key, value in expected.items():  # sums may add up in another order
                same = pytest.approx(value, rel=1e-12) if isinstance(value, float) else value
                assert got[key] == same, f"{table} {key}"

    parser = argparse.ArgumentParser(prog="msgq")
    logstats.add_parser(parser.add_subparsers())
    with pytest.raises(CommandError, match="no Hadoop file system for nosuchfs:"):
        logstats.run(parser.parse_args(["logstats", "nosuchfs://host/logs"]))
    with pytest.raises(CommandError, match="no log segment files"):
        logstats.run(parser.parse_args(["logstats", "--via", "hadoop",  # not a segment name
                                        _uri(recording.folder) + "/index.json"]))


# -- benchmark -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)  # 80 s alone, up to 180 s beside the other workers' JVMs
def test_bench_smoke() -> None:
    """``python -m msgq.bench.spark --tiny`` runs end to end (its own Spark sessions and
    msgq logstats processes) and every reader sees every event. Its commands map the
    driver's class archive when another test's command wrote it, and never write it (on a
    fresh machine the first command would, a minute here; tests/test_spark_class_cache.py
    tests the archive)."""
    env = {**os.environ, "MSGQ_SPARK_CLASS_CACHE": "read"}
    out = subprocess.run([sys.executable, "-m", "msgq.bench.spark", "--tiny", "--json"],
                         capture_output=True, text=True, timeout=500, env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = result["rows"]
    assert len(rows) == 8 and all(r["events_per_s"] > 0 for r in rows)
    assert len({r["events"] for r in rows}) == 1  # every reader read the same events
    assert rows[1]["what"].startswith("pycapnp loop")  # issue 31's bar, same run
    assert result["identical_results"] is True
    assert set(result["targets"]) == {"logstats_local2_vs_loop",
                                      "logstats_speedup_local1_to_local2",
                                      "typed_events_per_s_per_core",
                                      "raw_local1_vs_pycapnp_per_core",
                                      "logstats_local2_time_vs_pycapnp"}


def test_the_worker_daemon_drops_only_the_zips_of_installed_versions(tmp_path: Path) -> None:
    """Local sessions' worker daemon imports the installed pyspark (cached bytecode)
    instead of Spark's zip only where the versions agree."""
    import zipfile
    from importlib import metadata

    from msgq.spark.worker_daemon import installed_first

    def spark_zip(folder: str, version: str) -> str:
        path = tmp_path / folder / "pyspark.zip"
        path.parent.mkdir()
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("pyspark/version.py", f"__version__: str = '{version}'\n")
        return str(path)

    same = spark_zip("same", metadata.version("pyspark"))
    other = spark_zip("other", "0.0.1")
    py4j = str(tmp_path / f"py4j-{metadata.version('py4j')}-src.zip")
    old_py4j = str(tmp_path / "py4j-0.0.1-src.zip")
    path = [same, py4j, "/usr/lib/python3", other, old_py4j]
    assert installed_first(path) == ["/usr/lib/python3", other, old_py4j]


def test_local_workers_import_the_installed_pyspark_ahead_of_sparks_zip(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter a local session gives its Python workers (the data source's
    driver-side planners included) imports the installed pyspark and py4j even with
    Spark's zips first on PYTHONPATH, as the JVM starts them; and nothing else moves
    ahead of the standard library. Where Spark's zip is another version, or the workers
    run another interpreter, the interpreter is left as it is."""
    import glob
    import zipfile

    import pyspark

    from msgq.spark import session
    from msgq.spark.session import _installed_pyspark_first

    monkeypatch.delenv("SPARK_HOME", raising=False)
    wrapper = _installed_pyspark_first(sys.executable)
    assert wrapper != sys.executable and os.access(wrapper, os.X_OK)
    zips = sorted(glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "python", "lib",
                                         "*.zip")))
    assert len(zips) == 2
    script = ("import json, py4j, pyspark; "
              "print(pyspark.__file__, py4j.__file__, json.__file__)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips)}
    spark_way = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                               text=True, check=True).stdout.split()
    assert all(".zip" in f for f in spark_way[:2])  # what the planners paid for
    ours = subprocess.run([wrapper, "-c", script], env=env, capture_output=True, text=True,
                          check=True).stdout.split()
    folder = os.path.dirname(wrapper)
    assert all(f.startswith(folder) and ".zip" not in f for f in ours[:2])
    assert ours[2] == spark_way[2]  # the standard library's json, not something installed
    assert sorted(os.listdir(folder)) == [".lock", "py4j", "pyspark", "python"]

    assert _installed_pyspark_first("/usr/bin/python3") == "/usr/bin/python3"

    # A process killed before its exit handlers ran left its folder, its lock free: the
    # next one removes it (links inside, not what they point to). A folder whose lock is
    # held (this process's) stays, and so does one without a lock.
    dead = tempfile.mkdtemp(prefix="msgq-spark-python-1-")
    Path(dead, ".lock").touch()
    os.symlink(os.path.dirname(pyspark.__file__), os.path.join(dead, "pyspark"))
    unlocked = tempfile.mkdtemp(prefix="msgq-spark-python-2-")
    again = _installed_pyspark_first(sys.executable)
    assert not os.path.exists(dead) and os.path.isdir(os.path.dirname(pyspark.__file__))
    assert os.path.isdir(folder) and os.path.isdir(os.path.dirname(again))
    assert os.path.isdir(unlocked)
    os.rmdir(unlocked)

    # A forked child that runs the exit handlers leaves its parent's folder alone.
    child = os.fork()
    if child == 0:
        try:
            session._release_wrapper_folder(folder, os.open(os.devnull, os.O_RDONLY),
                                            os.getppid())
        finally:
            os._exit(0)
    assert os.waitpid(child, 0)[1] == 0 and os.path.isdir(folder)

    home = tmp_path / "spark"
    (home / "python" / "lib").mkdir(parents=True)
    with zipfile.ZipFile(home / "python" / "lib" / "pyspark.zip", "w") as archive:
        archive.writestr("pyspark/version.py", "__version__: str = '0.0.1'\n")
    monkeypatch.setenv("SPARK_HOME", str(home))
    assert _installed_pyspark_first(sys.executable) == sys.executable
