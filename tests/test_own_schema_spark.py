"""The Spark source and ``msgq logstats`` with an application's own schema (the robot
profile, tests/schemas/robot: cereal-shaped, with non-zero defaults everywhere) on
loggerd-style logs (``<route>--<n>/rlog.zst``, ``rlog.bz2``).

Every column the source produces — ``logMonoTime``, ``valid``, ``service``, ``size``,
``data`` and the typed column of every service — is compared with pycapnp's own decoding
of the same bytes with the same schema (attribute by attribute, no code of the source),
on events whose fields are unset (their declared defaults: ``valid`` true, logMonoTime
1000, bools true, floats, ints and enums non-zero, in groups, nested structs and list
elements), set to zero or false (the opposite of the default), set to other values, and
written by an older version of the schema (fields past the end of a struct's data or
pointer section read as their defaults). A few values are also asserted literally, so
that pycapnp and the source cannot agree on a wrong answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    DataType,
    DecimalType,
    StringType,
    StructType,
)
from schema_profiles import ROBOT_SCHEMA, ROBOT_SERVICES, write_loggerd_log  # noqa: E402

from msgq.schemas import Schema, SchemaSpec, msgq_schema  # noqa: E402
from msgq.schemas.schema import load_module  # noqa: E402
from msgq.spark import datasource  # noqa: E402

# An older version of robot.capnp, as a writer built before fields were added: ArmState,
# Heartbeat, InitData and CanFrame with their first fields only (smaller data and pointer
# sections), ImuReading and Diagnostics with none (no data section: even Diagnostics'
# union discriminant lies beyond it); the union's members keep their numbers (the others
# are Void here).
OLD_ROBOT = """\
@0xe1d2c3b4a5968778;

struct Event {
  logMonoTime @0 :UInt64 = 1000;
  union {
    initData @1 :InitData;
    armState @2 :ArmState;
    imu @3 :Empty;
    cameraFrame @4 :Void;
    canFrames @5 :List(CanFrame);
    rawChunks @6 :Void;
    missionLog @7 :Void;
    plannerPlan @8 :Void;
    heartbeat @9 :Heartbeat;
    diagnostics @10 :Empty;
  }
}

struct Empty {}

struct InitData {
  robotName @0 :Text;
}

struct ArmState {
  enabled @0 :Bool = true;
}

struct CanFrame {
  address @0 :UInt32;
}

struct Heartbeat {
  alive @0 :Bool = true;
}
"""

MS = 1_000_000


def _old_writer(folder: Path) -> Any:
    path = folder / "old_robot.capnp"
    path.write_text(OLD_ROBOT)
    return load_module(str(path)).Event


def _robot_events(schema: Schema, old_event: Any) -> list[bytes]:
    """Events of every service: unset, set to the opposite of their defaults, set to
    other values, and old writers' — with logMonoTime and valid unset or set."""
    event = schema.event
    out: list[bytes] = []

    def add(msg: Any) -> None:
        out.append(msg.to_bytes())

    # logMonoTime and valid unset: 1000 and true
    msg = event.new_message()
    msg.init("initData")
    add(msg)
    msg = event.new_message(logMonoTime=1 * MS, valid=False)
    init = msg.init("initData")
    init.robotName, init.softwareVersion, init.dirty = "r2", "1.0", False
    init.wallTimeNanos = 2**64 - 1
    params = init.init("params", 2)
    params[0].key, params[0].value = "a", b"\x00\x01"
    add(msg)
    for i in range(40):  # armState at 100 Hz, every kind of value in turn
        msg = event.new_message(logMonoTime=(10 + 10 * i) * MS)
        if i % 5 == 1:
            msg.valid = False
        elif i % 5 == 2:
            msg.valid = True
        arm = msg.init("armState")
        if i % 4 == 1:  # the opposite of every default
            arm.enabled, arm.speedLimit, arm.mode = False, 0.0, "idle"
            arm.gripper.closed, arm.gripper.force, arm.gripper.temperature = False, 0.0, 0
            joints = arm.init("joints", 2)
            joints[0].limit, joints[0].healthy = 0.0, False
        elif i % 4 == 2:
            arm.speedLimit, arm.mode, arm.gripper.temperature = -2.25, "torque", 300
            joints = arm.init("joints", 1)
            joints[0].name, joints[0].angle = "elbow", 0.5
        add(msg)
    for i in range(4):  # heartbeat
        msg = event.new_message(logMonoTime=(15 + 500 * i) * MS, valid=i != 2)
        beat = msg.init("heartbeat")
        if i % 2:
            beat.alive, beat.counter = False, 0
        add(msg)
    msg = event.new_message(logMonoTime=20 * MS)
    msg.init("imu")
    add(msg)
    msg = event.new_message(logMonoTime=21 * MS)
    imu = msg.init("imu")
    imu.acceleration, imu.gyro = [0.5, -1.0, 9.75], []
    imu.temperature, imu.calibrated = 0.0, False
    imu.sensor.rateHz, imu.sensor.level = 0.0, "error"
    add(msg)
    msg = event.new_message(logMonoTime=22 * MS)
    camera = msg.init("cameraFrame")
    camera.frameId, camera.image = 7, b"\xff" * 5
    camera.sensor.name = ""
    add(msg)
    msg = event.new_message(logMonoTime=23 * MS)
    frames = msg.init("canFrames", 3)
    frames[0].address, frames[0].dat, frames[0].src = 0x123, b"\x01\x02", 0
    frames[2].src = 7
    add(msg)
    add(event.new_message(logMonoTime=24 * MS, rawChunks=[b"", b"\x00\x01"]))
    add(event.new_message(logMonoTime=25 * MS, missionLog="go ✓"))
    msg = event.new_message(logMonoTime=26 * MS)
    plan = msg.init("plannerPlan")
    points = plan.horizon.init("points", 2)
    points[0].x, points[1].v = 1.5, 0.0
    layers = plan.init("layers", 1)
    layers[0].name, layers[0].weights = "l0", [0.25]
    child = layers[0].init("children", 1)
    child[0].name = "l1"
    add(msg)
    msg = event.new_message(logMonoTime=27 * MS)
    msg.init("plannerPlan")
    add(msg)
    for i, source in enumerate(("none", "sensor", "component")):
        msg = event.new_message(logMonoTime=(28 + i) * MS)
        diag = msg.init("diagnostics")
        if source == "sensor":
            diag.source.init("sensor").level = "warning"
            diag.level = "ok"
        elif source == "component":
            diag.source.component = "arm"
            diag.blobs = [b"x"]
            diag.nested.level1.level2.value = 0
            leaf = diag.nested.level1.level2.leaf
            leaf.flag, leaf.values = False, [1, 65535]
        add(msg)
    # an older writer's events: what it did not know reads as the defaults
    old = old_event.new_message(logMonoTime=31 * MS)
    old.init("armState").enabled = False
    add(old)
    old = old_event.new_message(logMonoTime=32 * MS)
    old.init("heartbeat")
    add(old)
    old = old_event.new_message(logMonoTime=33 * MS)
    old.init("initData").robotName = "old"
    add(old)
    old = old_event.new_message(logMonoTime=34 * MS)
    old.init("canFrames", 2)[1].address = 9
    add(old)
    for service in ("imu", "diagnostics"):
        old = old_event.new_message(logMonoTime=35 * MS)
        old.init(service)
        add(old)
    return out


def _thirds(events: list[bytes]) -> list[list[bytes]]:
    third = len(events) // 3
    return [events[:third], events[third:2 * third], events[2 * third:]]


def _loggerd_route(folder: Path, events: list[bytes]) -> list[str]:
    """The events as a loggerd route of three segments, a third each:
    ``route--0/rlog.zst``, ``route--1/rlog.bz2`` and ``route--2/rlog`` (raw)."""
    return [write_loggerd_log(str(folder / f"route--{n}" / name), part, compression)
            for n, (name, compression, part) in enumerate(zip(
                ("rlog.zst", "rlog.bz2", "rlog"), ("zstd", "bz2", "none"), _thirds(events),
                strict=True))]


# -- what pycapnp says --------------------------------------------------------------


def _pycapnp_value(value: Any, kind: DataType) -> Any:
    """The column value of a pycapnp reader's ``value`` for the Spark type ``kind``, by
    pycapnp's attribute access only (its defaults, its enum names, its text form)."""
    if isinstance(kind, StructType):
        union = tuple(value.schema.union_fields)
        which_name = "_which" if "which" in value.schema.fieldnames else "which"
        out = {}
        for field in kind.fields:
            if union and field.name == which_name:
                out[field.name] = value.which()
            elif field.name in union:
                out[field.name] = _pycapnp_value(getattr(value, field.name), field.dataType) \
                    if value.which() == field.name else None
            else:
                out[field.name] = _pycapnp_value(getattr(value, field.name), field.dataType)
        return out
    if isinstance(kind, ArrayType):
        return [_pycapnp_value(v, kind.elementType) for v in value]
    if isinstance(kind, StringType):
        return value if isinstance(value, str) else \
            value._as_str() if hasattr(value, "_as_str") else str(value)
    if isinstance(kind, DecimalType):
        return int(value)
    if isinstance(kind, BinaryType):
        return bytes(value)
    return value


def _expected_rows(schema: Schema, files: list[str], events: list[list[bytes]],
                   columns: StructType) -> list[dict[str, Any]]:
    rows = []
    typed = [f for f in columns.fields[len(datasource.BASE_COLUMNS):]]
    for path, data_list in zip(files, events, strict=True):
        offset = 0
        # a loggerd segment's route: its folder's name less --<n>
        route = os.path.basename(os.path.dirname(path)).rpartition("--")[0] \
            if os.path.basename(path).startswith(("rlog", "qlog")) else None
        for data in data_list:
            msg = schema.decode(data)
            service = msg.which()
            row = {"file": path, "offset": offset, "logMonoTime": msg.logMonoTime,
                   "service": service, "valid": msg.valid, "size": len(data), "data": data,
                   "problem": None, "route": route}
            for field in typed:
                row[field.name] = _pycapnp_value(getattr(msg, service), field.dataType) \
                    if field.name == service else None
            rows.append(row)
            offset += len(data)
    return rows


def _plain(value: Any) -> Any:
    """A collected value as plain Python (Row -> dict, bytearray -> bytes, Decimal ->
    int)."""
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, Decimal):
        return int(value)
    return value


def _assert_rows(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g = {k: v for k, v in _plain(g).items() if k != "segment"}
        where = f"{w['service']} at {w['file']}:{w['offset']}"
        assert g.keys() == w.keys(), where
        for key in w:
            assert g[key] == w[key], f"{where}: column {key}: {g[key]!r} != {w[key]!r}"


def _literal_checks(rows: list[dict[str, Any]]) -> None:
    """Values written down here, not taken from pycapnp: the declared defaults."""
    first = _plain(rows[0])
    assert (first["logMonoTime"], first["valid"]) == (1000, True)  # both unset
    assert first["initData"]["dirty"] is True
    arms = [_plain(r) for r in rows if r["service"] == "armState"]
    unset, zeroed = arms[0]["armState"], arms[1]["armState"]
    assert (unset["enabled"], unset["speedLimit"], unset["mode"]) == (True, 1.5, "position")
    assert unset["gripper"] == {"closed": True, "force": 12.5, "temperature": -40}
    assert (zeroed["enabled"], zeroed["speedLimit"], zeroed["mode"]) == (False, 0.0, "idle")
    assert zeroed["joints"][1] == {"name": "", "angle": 0.0, "limit": 3.14, "healthy": True}
    assert [a["valid"] for a in arms[:5]] == [True, False, True, True, True]
    old_arm = arms[-1]["armState"]  # written without speedLimit, joints, mode, gripper
    assert old_arm == {"enabled": False, "speedLimit": 1.5, "joints": [], "mode": "position",
                       "gripper": {"closed": True, "force": 12.5, "temperature": -40}}
    beats = [_plain(r)["heartbeat"] for r in rows if r["service"] == "heartbeat"]
    assert beats[0] == {"alive": True, "counter": -1}
    assert beats[1] == {"alive": False, "counter": 0}
    assert beats[-1] == {"alive": True, "counter": -1}  # the old writer's
    cans = [_plain(r)["canFrames"] for r in rows if r["service"] == "canFrames"]
    assert [f["src"] for f in cans[0]] == [0, 128, 7]
    assert cans[-1] == [{"address": 0, "dat": b"", "src": 128},
                        {"address": 9, "dat": b"", "src": 128}]
    diags = [_plain(r)["diagnostics"] for r in rows if r["service"] == "diagnostics"]
    assert diags[0]["level"] == "warning" and diags[0]["source"]["which"] == "none"
    assert diags[0]["nested"] == {"level1": {"level2": {"value": 7, "leaf": {
        "flag": True, "values": []}}}}
    assert diags[1]["source"]["sensor"] == {"name": "unnamed", "rateHz": 100.0,
                                            "level": "warning"}
    assert diags[-1] == diags[0]  # the old writer's: every default, as the unset one
    imus = [_plain(r)["imu"] for r in rows if r["service"] == "imu"]
    assert imus[-1] == {"acceleration": [], "gyro": [], "temperature": 25.0, "calibrated": True,
                        "sensor": {"name": "unnamed", "rateHz": 100.0, "level": "ok"}}


# -- tests ---------------------------------------------------------------------------


def _read_directly(options: datasource.ReadOptions) -> list[dict[str, Any]]:
    """The rows of a read as the executors make them (no Spark session)."""
    columns = datasource.output_schema(options)
    rows = []
    for partition in datasource.plan_segments(options):
        read = datasource._SegmentRead(options, columns, partition.path, partition.segment)
        for batch in read.batches():
            rows += batch.to_pylist()
    return rows


def test_every_column_is_pycapnps_with_the_schemas_defaults(robot: Schema,
                                                             tmp_path: Path) -> None:
    events = _robot_events(robot, _old_writer(tmp_path))
    files = _loggerd_route(tmp_path, events)
    options = datasource.ReadOptions(paths=tuple(files), decode=robot.union_fields)
    assert options.spec == robot.spec
    columns = datasource.output_schema(options)
    rows = _read_directly(options)
    _assert_rows(rows, _expected_rows(robot, files, _thirds(events), columns))
    _literal_checks(rows)
    # the segment number of a loggerd segment is its folder's
    assert [r["segment"] for r in (rows[0], rows[-1])] == [0, 2]


def test_the_schema_travels_with_the_read_as_a_spec(robot: Schema, tmp_path: Path) -> None:
    """The source's options carry the schema in force (registry included) as a spec;
    a schemaFile option alone takes the registry in force for that file, none for
    another; the expected rates are the registry in force's."""
    from msgq.spark.analyses import expected_rates

    text = datasource.spec_option(robot.spec)
    assert datasource.spec_from_option(text) == robot.spec
    assert datasource.spec_from_option(text).registry()["armState"].frequency == 100.0
    assert datasource.spec_from_option(datasource.spec_option(SchemaSpec())) == SchemaSpec()
    parse = datasource.ReadOptions.parse
    assert parse({"path": str(tmp_path), "schemaSpec": text}).spec == robot.spec
    assert parse({"path": str(tmp_path)}).spec == robot.spec  # the schema in force
    assert parse({"path": str(tmp_path), "schemaFile": ROBOT_SCHEMA}).spec == robot.spec
    spec = parse({"path": str(tmp_path), "schemaFile": ROBOT_SCHEMA,
                  "registry": ROBOT_SERVICES}).spec
    assert spec.services == robot.services
    mine = parse({"path": str(tmp_path), "schemaFile": msgq_schema().path}).spec
    assert mine == SchemaSpec()  # msgq's own file: msgq's own registry
    with_imports = parse({"path": str(tmp_path), "schemaFile": ROBOT_SCHEMA,
                          "imports": os.pathsep.join(["/a", str(tmp_path)])}).spec
    assert (with_imports.path, with_imports.imports) == (ROBOT_SCHEMA, ("/a", str(tmp_path)))
    with pytest.raises(ValueError, match="leave out schemaFile"):
        parse({"path": str(tmp_path), "schemaSpec": text, "schemaFile": ROBOT_SCHEMA})
    with pytest.raises(ValueError, match="option schemaSpec is not one"):
        parse({"path": str(tmp_path), "schemaSpec": "{}"})
    rates = expected_rates()
    assert (rates["armState"], rates["heartbeat"], rates["initData"]) == (100.0, 0.5, None)
    assert "carState" not in rates and "vehicleState" not in rates


@pytest.mark.spark
def test_a_spark_read_uses_the_schema_in_force_not_the_workers_environment(
        spark: Any, robot: Schema, tmp_path: Path) -> None:
    """The session's JVM and Python workers were started with some environment (the
    robot schema's, or none); reads use the schema in force in this process — the robot
    schema, then msgq's own — because its spec travels with the read (read_logs) or
    with the registered source (spark.read.format)."""
    import msgq.spark
    from msgq.schemas import use_schema

    events = _robot_events(robot, _old_writer(tmp_path))
    files = _loggerd_route(tmp_path, events)
    df = msgq.spark.read_logs(spark, files, decode=True)
    columns = df.schema
    rows = [r.asDict() for r in df.orderBy("file", "offset").collect()]
    _assert_rows(rows, _expected_rows(robot, files, _thirds(events), columns))
    _literal_checks(rows)
    # through Spark's Hadoop file systems, the route's folders: one copy of each segment
    # (a qlog, and a raw rlog beside the rlog.zst, are the same events again)
    write_loggerd_log(str(tmp_path / "route--0" / "qlog.zst"), events[:3])
    write_loggerd_log(str(tmp_path / "route--0" / "rlog"), events[:3], "none")
    folders = [(tmp_path / f"route--{n}").as_uri() for n in range(3)]
    hadoop = msgq.spark.read_logs(spark, folders, via="hadoop").orderBy("file", "offset")
    assert [(r.file.rpartition("/")[2], r.offset, r.service, r.logMonoTime, r.valid)
            for r in hadoop.collect()] == \
        [(r["file"].rpartition("/")[2], r["offset"], r["service"], r["logMonoTime"],
          r["valid"]) for r in rows]
    # the route's two segment folders are one recording (one clock), for the timeline too
    from msgq.spark.analyses import log_stats

    recordings = log_stats(df).events.select("recording").distinct().collect()
    assert [r.recording for r in recordings] == [str(tmp_path / "route")]

    folder = _msgq_recording(tmp_path)
    # a log of msgq's schema under the robot schema: refused at load(), never mislabeled
    with pytest.raises(Exception, match="not a log of .*robot.capnp.*--schema"):
        msgq.spark.read_logs(spark, folder)
    use_schema(None)  # msgq's own, in this process only: the workers are not told
    msgq.spark.register(spark)
    df = spark.read.format("msgqlog").load(folder)
    assert [(r.service, r.valid) for r in df.orderBy("offset").collect()] == \
        [("logStart", True), ("userBookmark", False)]  # new_message: valid=False, as cereal
    assert "userBookmark" in msgq.spark.read_logs(spark, folder, decode=True).columns


def _msgq_recording(tmp_path: Path) -> str:
    """A recording of msgq's own schema (written as msgq's own schema, whatever is in
    force): a logStart, then a userBookmark."""
    from msgq.logs import LogWriter
    from msgq.schemas import new_message

    folder = str(tmp_path / "msgq-recording")
    with LogWriter(folder, schema=msgq_schema()) as writer:
        writer.write(new_message("userBookmark", schema=msgq_schema()))
    return folder


def _logstats(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "msgq", "logstats", *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.spark
def test_logstats_with_the_robot_schema(tmp_path: Path) -> None:
    """``msgq logstats`` as a user runs it, with --schema/--registry and with
    MSGQ_SCHEMA/MSGQ_REGISTRY: the registry's expected rates, invalid counts with
    valid's default of true (an unset valid is valid)."""
    from schema_profiles import robot_schema

    robot = robot_schema()
    events = _robot_events(robot, _old_writer(tmp_path))
    files = _loggerd_route(tmp_path, events)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MSGQ_SCHEMA", "MSGQ_REGISTRY", "MSGQ_SCHEMA_ROOT")}
    by_flags = _logstats(["--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES, "--json",
                          "--master", "local[1]", *files], env)
    assert by_flags.returncode == 0, by_flags.stderr
    by_env = _logstats(["--json", "--master", "local[1]", *files],
                       {**env, "MSGQ_SCHEMA": ROBOT_SCHEMA, "MSGQ_REGISTRY": ROBOT_SERVICES})
    assert by_env.returncode == 0, by_env.stderr
    for result in (by_flags, by_env):
        services = {r["service"]: r for r in json.loads(result.stdout)["services"]}
        arm = services["armState"]
        assert (arm["count"], arm["expected_hz"]) == (41, 100.0)
        # the route's folders are one recording: intervals across their boundaries
        assert arm["intervals"] == 40
        assert arm["segments"] == sum(any(robot.decode(e).which() == "armState" for e in part)
                                      for part in _thirds(events))
        # 8 of the 40 new ones written valid=False; the old writer's has no valid: true
        assert arm["invalid_fraction"] == pytest.approx(8 / 41)
        assert services["heartbeat"]["expected_hz"] == 0.5
        assert services["heartbeat"]["invalid_fraction"] == pytest.approx(1 / 5)
        assert services["initData"]["expected_hz"] is None
        assert services["initData"]["invalid_fraction"] == pytest.approx(1 / 3)
        assert services["imu"]["invalid_fraction"] == 0.0
    # a log of msgq's schema with the robot schema: refused before Spark starts, in one
    # line naming --schema
    folder = _msgq_recording(tmp_path)
    refused = _logstats(["--master", "local[1]", folder],
                        {**env, "MSGQ_SCHEMA": ROBOT_SCHEMA, "MSGQ_REGISTRY": ROBOT_SERVICES})
    assert refused.returncode == 1 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert f"{folder}: not a log of {ROBOT_SCHEMA}" in line and "--schema FILE.capnp" in line


@pytest.mark.spark
def test_the_spark_source_refuses_a_log_of_another_schema_on_local_and_hadoop_paths(
        spark: Any, tmp_path: Path) -> None:
    """Logs of the robot schema read with msgq's in force, through the msgqlog source
    (local paths) and through Spark's Hadoop file systems (``file:`` URIs, via="hadoop":
    the indexes and segment starts read by Spark): refused at load(), in one line naming
    --schema and the signal that decided — a recording by its index, a loggerd route by
    its root struct's bits, and a route whose ordinals fall inside msgq's union by its
    decode failures. Logs of msgq's own schema still read on both paths."""
    from test_own_schema_logs import write_mismatch

    import msgq.spark
    from msgq.logs import SchemaMismatchError

    for layout, signal in (("recording", "index schema members"),
                           ("route", "root struct shape"),
                           ("route-in-union", "decode failures")):
        log, _, reader = write_mismatch(tmp_path / layout, "robot", layout)
        assert reader.path == msgq_schema().path
        folders = [str(log)] if layout == "recording" else \
            [str(p) for p in sorted(log.iterdir())]
        for via, paths in (("source", folders),
                           ("hadoop", [Path(p).as_uri() for p in folders])):
            with pytest.raises(SchemaMismatchError) as raised:
                msgq.spark.read_logs(spark, paths, via=via).count()
            line = str(raised.value)
            assert raised.value.signal == signal, (via, layout, line)
            assert "\n" not in line and "--schema FILE.capnp" in line, line
    folder = _msgq_recording(tmp_path)
    for via, path in (("source", folder), ("hadoop", Path(folder).as_uri())):
        assert [r.service for r in msgq.spark.read_logs(spark, path, via=via)
                .orderBy("offset").collect()] == ["logStart", "userBookmark"]
