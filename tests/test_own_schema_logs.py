"""Logs, recording, replay and lockstep with a schema of the application's own (the robot
profile, tests/schemas/robot: no logStart, non-zero defaults of logMonoTime and valid)
and with logs written the way openpilot's loggerd writes them; a log read with the wrong
schema is refused in one line, never read under wrong names."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli
from schema_profiles import (
    LOGGERD_NAMES,
    ROBOT_SCHEMA,
    ROBOT_SERVICES,
    robot_schema,
    write_loggerd_log,
)

import msgq
from msgq.lockstep import input_events, run_lockstep
from msgq.logs import (
    LogReader,
    LogWriter,
    SchemaMismatchError,
    check_schema,
    read_index,
    segment_paths,
)
from msgq.logs.index import read_recording
from msgq.logs.recorder import Recorder, default_services
from msgq.logs.replayer import Replayer
from msgq.logs.schema_check import schema_members
from msgq.schemas import Schema, msgq_schema, schema_in_force
from msgq.version import installed_version


@pytest.fixture(scope="module", autouse=True)
def _environment_as_found() -> Any:
    """The schema variables as they were before this module: the ``robot`` fixture's
    exports outlive its monkeypatch (it saves the value use_schema already set), and a
    later module's module-scoped fixtures would run under the robot schema."""
    from msgq.schemas import selection

    names = (selection.ENV_SCHEMA, selection.ENV_SERVICES, selection.ENV_ROOT)
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    selection.reset_to_environment()


# --- events of either schema -------------------------------------------------------------


def _fill(builder: Any, rng: random.Random, depth: int = 0) -> None:
    """Random values in the plain fields of ``builder`` (lists of 3; bools both ways, so
    that values equal to a default are stored as zero bits)."""
    for name, fld in builder.schema.fields.items():
        proto = fld.proto
        if proto.discriminantValue != 0xFFFF or proto.which() != "slot":
            continue
        kind = proto.slot.type.which()
        if kind == "struct" and depth < 3:
            _fill(builder.init(name), rng, depth + 1)
        elif kind == "list":
            element = proto.slot.type.list.elementType.which()
            if element == "struct" and depth < 3:
                for item in builder.init(name, 3):
                    _fill(item, rng, depth + 1)
            elif element in ("float32", "float64"):
                builder.init(name, 3)
                for i in range(3):
                    getattr(builder, name)[i] = rng.uniform(-9, 9)
            elif element == "data":
                items = builder.init(name, 2)
                for i in range(2):
                    items[i] = rng.randbytes(5)
        elif kind == "bool":
            setattr(builder, name, rng.random() < 0.5)
        elif kind in ("float32", "float64"):
            setattr(builder, name, rng.uniform(-9, 9))
        elif kind in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                      "uint64"):
            setattr(builder, name, rng.randrange(0, 100))
        elif kind == "text":
            setattr(builder, name, f"{name}-{rng.randrange(100)}")


def make_events(schema: Schema, n: int = 120, seed: int = 0, start_ns: int = 10**9,
                services: list[str] | None = None, default_times: bool = False
                ) -> list[bytes]:
    """``n`` filled events of ``schema``, 10 ms apart, cycling through its services
    (msgq's logStart left out); ``valid`` alternates (one of the two is the declared
    default, stored as a zero bit). ``default_times``: every fifth event keeps the
    declared default of logMonoTime (and of valid) instead."""
    rng = random.Random(seed)
    names = services or [s for s in schema.union_fields if s != "logStart"
                         and not s.startswith("custom")]
    out = []
    for i in range(n):
        name = names[i % len(names)]
        msg = schema.event.new_message()
        if i % 5 or not default_times:
            msg.logMonoTime = start_ns + i * 10_000_000
            msg.valid = i % 2 == 0
        if name in schema.sized_fields:
            kind = schema.event.schema.fields[name].proto.slot.type
            if kind.which() == "text":
                setattr(msg, name, f"text {i}")
            else:
                items = msg.init(name, 2)
                for j in range(2):
                    if kind.list.elementType.which() == "struct":
                        _fill(items[j], rng)
                    else:
                        items[j] = rng.randbytes(4)
        else:
            _fill(msg.init(name), rng)
        out.append(msg.to_bytes())
    return out


def decoded(data: bytes, schema: Schema) -> tuple[int, bool, str]:
    """What pycapnp says of an event."""
    msg = schema.decode(data)
    return int(msg.logMonoTime), bool(msg.valid), str(msg.which())


# --- recording with any schema (defect 6) ------------------------------------------------


def test_log_writer_records_without_log_start(robot: Schema, tmp_path: Path) -> None:
    """A schema without msgq's logStart records: no event of msgq's own, and its facts in
    index.json; rotation, seeking and the seal work without it."""
    events = make_events(robot, 300)
    with LogWriter(str(tmp_path / "rec"), rotate_bytes=8000,
                   metadata={"vehicle": "arm-7"}) as writer:
        assert not writer.writes_log_start
        for data in events:
            writer.write(data)
    got = list(LogReader(tmp_path / "rec").raw())
    assert [e.data for e in got] == events  # nothing added, nothing lost
    for event in got:
        assert (event.mono_ns, event.valid, event.service) == decoded(event.data, robot)

    info = read_recording(str(tmp_path / "rec"))
    assert info is not None
    assert info["schema_fingerprint"] == robot.fingerprint and info["log_start"] is False
    assert [m[0] for m in info["schema_members"]] == list(robot.layout.services)
    assert info["metadata"] == {"vehicle": "arm-7"} and info["hostname"]
    assert info["msgq_version"] == installed_version() != "unknown"
    segments = read_index(str(tmp_path / "rec"))
    assert segments is not None and len(segments) >= 3
    assert sum(s.events for s in segments) == len(events)
    assert all(s.start and s.start["wall_time_ns"] > 0 and s.seal for s in segments)
    for segment in segments:  # the index's times and counts are pycapnp's
        mine = [decoded(d, robot) for d in events[:segment.events]]
        events_in = [e for e in got if e.path.endswith(segment.file)]
        assert segment.first_mono_ns == min(decoded(e.data, robot)[0] for e in events_in)
        assert segment.last_mono_ns == max(decoded(e.data, robot)[0] for e in events_in)
        assert sum(segment.counts.values()) == len(events_in)
        assert mine  # (the first events exist)

    # seeking skips whole segments through the sealed index
    start = segments[2].first_mono_ns
    reader = LogReader(tmp_path / "rec", start_mono_ns=start)
    assert reader.paths_to_read()[0].endswith(segments[2].file)
    assert [e.data for e in reader.raw()] == [d for d in events if decoded(d, robot)[0] >= start]


def test_record_command_records_a_schema_without_log_start(robot: Schema,
                                                           tmp_path: Path) -> None:
    """`msgq record` with the robot schema in force (it used to refuse: "the schema has no
    logStart member")."""
    out = tmp_path / "rec"
    run_cli("record", "armState", "-o", str(out), "--duration", "0.3", expect=1)  # nothing
    info = read_recording(str(out))
    assert info is not None and info["log_start"] is False and info["complete"] is True
    assert info["schema_fingerprint"] == robot.fingerprint


def test_recorder_logs_what_pycapnp_reads(schema_profile: Schema, tmp_path: Path) -> None:
    """Recorded live on each profile: the log holds the bytes sent, and the times,
    validity and counts the recorder and the index took from the bytes are pycapnp's
    (the robot schema's declared defaults applied)."""
    services = ["armState", "imu"] if schema_profile.path == ROBOT_SCHEMA \
        else ["gyroscope", "vehicleState"]
    events = make_events(schema_profile, 40, services=services, default_times=True)
    recorder = Recorder(tmp_path / "rec", services)
    recorder.start()
    pubs = {s: msgq.pub_sock(s) for s in services}
    for data in events:
        pubs[decoded(data, schema_profile)[2]].send(data)
    recorder.stop()
    stats = recorder.run(handle_signals=False)
    assert stats.messages == len(events) and stats.bad == 0
    logged = [e for e in LogReader(tmp_path / "rec").raw() if e.service in services]
    assert sorted(e.data for e in logged) == sorted(events)
    for event in logged:
        assert (event.mono_ns, event.valid, event.service) == decoded(event.data,
                                                                      schema_profile)
    (segment,) = read_index(str(tmp_path / "rec")) or []
    monos = [decoded(d, schema_profile)[0] for d in events]
    assert segment.last_mono_ns == max(monos)
    for service in services:
        assert segment.counts[service] == sum(decoded(d, schema_profile)[2] == service
                                              for d in events)
    for pub in pubs.values():
        pub.close()


def test_recorder_defaults_to_the_schemas_own_registry(schema_profile: Schema) -> None:
    expected = [name for name, s in schema_profile.services.items()
                if s.should_log and name != "logStart"]
    assert default_services() == expected
    assert Recorder("unused", schema=schema_profile).services == expected
    if schema_profile.path == ROBOT_SCHEMA:
        assert "cameraFrame" not in expected and "initData" in expected  # its registry's


# --- the wrong schema is noticed (defect 7) -------------------------------------------------


def _recording(folder: Path, schema: Schema, events: list[bytes]) -> Path:
    with LogWriter(str(folder), schema=schema) as writer:
        for data in events:
            writer.write(data)
    return folder


@pytest.mark.parametrize("writer_profile", ["msgq", "robot"])
@pytest.mark.parametrize("layout", ["recording", "recording-no-index", "rlog.zst", "rlog.bz2",
                                    "rlog"])
def test_a_log_of_another_schema_is_refused(writer_profile: str, layout: str,
                                            tmp_path: Path) -> None:
    writer_schema = robot_schema() if writer_profile == "robot" else msgq_schema()
    reader_schema = msgq_schema() if writer_profile == "robot" else robot_schema()
    events = make_events(writer_schema, 150, default_times=True)
    if layout.startswith("recording"):
        log = _recording(tmp_path / "rec", writer_schema, events)
        if layout == "recording-no-index":
            os.remove(log / "index.json")
    else:
        compression = {v: k for k, v in LOGGERD_NAMES.items()}[layout]
        log = Path(write_loggerd_log(str(tmp_path / "r--0" / layout), events, compression))
    check_schema(log, writer_schema)  # its own schema: no complaint
    assert len(list(LogReader(log, schema=writer_schema).raw())) >= len(events)

    with pytest.raises(SchemaMismatchError, match="--schema") as raised:
        check_schema(log, reader_schema)
    assert "\n" not in str(raised.value) and isinstance(raised.value, ValueError)
    reader = LogReader(log, schema=reader_schema, skip_corrupt=True, warn=False)
    with pytest.raises(SchemaMismatchError):
        next(reader.raw())
    with pytest.raises(SchemaMismatchError):
        next(iter(reader))
    with pytest.raises(SchemaMismatchError):
        Replayer(log, schema=reader_schema, fast=True)


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["none", "zstd", "bz2"])
def test_damage_is_never_taken_for_another_schema(compression: str, tmp_path: Path) -> None:
    """Seeded damage to logs without an index (so the sample decides): flipped bits,
    zeroed ranges, cut ends, garbage at the start. Read with their own schema, no copy
    is called a log of another schema; read with the other one, the copies whose sample
    still holds events are refused."""
    rng = random.Random(f"damage-{compression}")
    profiles = [(msgq_schema(), robot_schema()), (robot_schema(), msgq_schema())]
    refused = readable = 0
    for round_ in range(60):
        own, other = profiles[round_ % 2]
        data = bytearray(b"".join(make_events(own, 80, seed=round_, default_times=True)))
        kind = round_ % 4
        if kind == 0:
            for _ in range(rng.randrange(1, 40)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            at = rng.randrange(len(data))
            data[at:at + rng.randrange(8, 600)] = bytes(min(len(data) - at, 600))
        elif kind == 2:
            del data[rng.randrange(len(data) // 3, len(data)):]
        else:
            data[0:0] = rng.randbytes(rng.randrange(1, 300))
        log = write_loggerd_log(str(tmp_path / f"r{round_}" / LOGGERD_NAMES[compression]),
                                [bytes(data)], compression)
        check_schema(log, own)  # damage is never another schema
        try:
            check_schema(log, other)
        except SchemaMismatchError:
            refused += 1
        else:
            readable += 1
    # not all: garbage of a length off the 8-byte grid before a raw log hides every event
    assert refused >= 40, (refused, readable)


def test_replay_refuses_a_log_of_another_schema(tmp_path: Path) -> None:
    """`msgq replay` with msgq's schema of a robot log: one line naming --schema, exit 1,
    nothing sent (it used to publish every event as msgq's logStart and exit 0)."""
    log = write_loggerd_log(str(tmp_path / "r--0" / "rlog.zst"),
                            make_events(robot_schema(), default_times=True))
    proc = run_cli("replay", "--fast", log, expect=1)
    assert proc.stderr.count("\n") == 1 and "--schema" in proc.stderr
    assert "not a log of" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    ok = run_cli("--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES, "replay", "--fast",
                 "--json", log)
    assert json.loads(ok.stdout)["events"] == 120


def test_a_grown_schema_still_reads_its_older_recordings(tmp_path: Path) -> None:
    """A recording whose index lists the same members by ordinal, fewer of them (an older
    version of the schema: members added since), is read; one member different is not."""
    schema = msgq_schema()
    log = _recording(tmp_path / "rec", schema, make_events(schema, 30))
    doc = json.loads((log / "index.json").read_text())
    doc["schema_fingerprint"] = "0123456789abcdef"  # another text: the schema was edited
    doc["schema_members"] = doc["schema_members"][:-3]
    (log / "index.json").write_text(json.dumps(doc))
    check_schema(log, schema)
    assert len(list(LogReader(log).raw())) == 31  # with its logStart

    # a log of a newer version: members added at the end, events of one of them
    doc["schema_members"] = [*schema_members(schema), ["gyroscope3", "struct:123"],
                             ["gyroscope4", "struct:124"]]
    (log / "index.json").write_text(json.dumps(doc))
    check_schema(log, schema)  # none of its events is of the new members
    doc["segments"][0]["counts"]["gyroscope4"] = 2
    (log / "index.json").write_text(json.dumps(doc))
    with pytest.raises(SchemaMismatchError, match="it holds events of gyroscope4, union "
                                                  "members this schema lacks"):
        check_schema(log, schema)

    doc["schema_members"] = doc["schema_members"][:-5]
    doc["schema_members"][2] = ["accelerometerV2", doc["schema_members"][2][1]]
    (log / "index.json").write_text(json.dumps(doc))
    with pytest.raises(SchemaMismatchError, match="union member #2 is 'accelerometerV2'"):
        check_schema(log, schema)


def in_union_events(writer: Schema, reader: Schema, n: int = 120) -> list[bytes]:
    """Events of ``writer`` whose bytes ``reader`` takes for its own: their discriminant
    as ``reader`` reads it is one of its members, and no bit of its root struct is one it
    leaves unused (the robot schema's initData and armState read with msgq's: robot's
    ``valid`` sits where msgq's discriminant is, so they read as logStart or gyroscope;
    msgq's logStart and gyroscope read with the robot schema, likewise). Only decoding
    them tells them apart."""
    from msgq.logs.schema_check import _classify, _root_shape

    services = {"robot.capnp": ["initData", "armState"],
                "log.capnp": ["logStart", "gyroscope"]}[os.path.basename(writer.path)]
    events = make_events(writer, n, services=services)
    shape = _root_shape(reader)
    for data in events:  # the case this is: the old signals all say "fine"
        assert reader.layout.peek(data)[2] in reader.union_set  # type: ignore[index]
        assert _classify(data, shape) == "ok"
    return events


# The evidence a log of another schema shows, by how it was written: (writer profile,
# layout, the signal that decides when read with the other profile).
MISMATCHES = [
    ("robot", "recording", "index schema members"),
    ("robot", "route", "root struct shape"),
    ("robot", "route-in-union", "decode failures"),
    ("msgq", "route", "root struct shape"),
    ("msgq", "route-in-union", "decode failures"),
]


def write_mismatch(folder: Path, writer_profile: str, layout: str) -> tuple[Path, Schema,
                                                                            Schema]:
    """A log of ``writer_profile``'s schema in ``folder`` (a LogWriter recording, or a
    loggerd route of two segments); (its path, its schema, the other profile's)."""
    writer = robot_schema() if writer_profile == "robot" else msgq_schema()
    reader = msgq_schema() if writer_profile == "robot" else robot_schema()
    if layout == "recording":
        return _recording(folder / "rec", writer, make_events(writer, 150)), writer, reader
    events = in_union_events(writer, reader) if layout == "route-in-union" \
        else make_events(writer, 120, default_times=True)
    for n, part in enumerate((events[:60], events[60:])):
        write_loggerd_log(str(folder / "route" / f"2026-01-01--12-00-00--{n}" / "rlog.zst"),
                          part)
    return folder / "route", writer, reader


@pytest.mark.parametrize(("writer_profile", "layout", "signal"), MISMATCHES)
def test_each_signal_decides_and_says_so(writer_profile: str, layout: str, signal: str,
                                         tmp_path: Path) -> None:
    """Each kind of log of another schema is refused by the signal it carries, named in
    the one line (and in ``SchemaMismatchError.signal``); read with its own schema,
    nothing is refused. The in-union cases passed as fine before decoding was a signal:
    msgq read robot's initData and armState as logStart and gyroscope."""
    log, writer, reader = write_mismatch(tmp_path, writer_profile, layout)
    check_schema(log, writer)
    assert len(list(LogReader(log, schema=writer).raw())) >= 120
    with pytest.raises(SchemaMismatchError, match="--schema") as raised:
        check_schema(log, reader)
    assert raised.value.signal == signal
    assert f"(decided by {signal})" in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(SchemaMismatchError, match=f"decided by {signal}"):
        next(LogReader(log, schema=reader).raw())
    with pytest.raises(SchemaMismatchError, match=f"decided by {signal}"):
        Replayer(log, schema=reader, fast=True)


@pytest.mark.slow
@pytest.mark.parametrize(("writer_profile", "layout", "signal"), MISMATCHES)
def test_every_command_refuses_a_log_of_another_schema(writer_profile: str, layout: str,
                                                       signal: str, tmp_path: Path) -> None:
    """``msgq replay``, ``info``, ``export`` and ``logstats`` of a log of one profile with
    the other in force: exit 1, one line naming --schema and the signal, nothing written
    or sent (``info`` of a recording whose sealed index holds it all reads no event: it
    shows the index's counts and says the schema differs); with the log's own schema each
    command runs."""
    log, writer, _ = write_mismatch(tmp_path, writer_profile, layout)
    robot = ["--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES]
    wrong, right = (robot, []) if writer_profile == "msgq" else ([], robot)
    out = tmp_path / "out.mcap"
    commands = [("replay", "--fast", str(log)), ("info", str(log)),
                ("export", str(log), str(out)), ("logstats", str(log))]
    for command in commands:
        if command[0] == "info" and layout == "recording":
            # everything from its sealed index, under the names its writer gave: shown,
            # with the schema it was written with and the option to read it with
            shown = run_cli(*wrong, *command).stdout
            assert "not the schema in force" in shown and "--schema" in shown
            continue
        proc = run_cli(*wrong, *command, expect=1)
        (line,) = proc.stderr.splitlines()
        assert "not a log of" in line and "--schema" in line, (command, line)
        assert f"decided by {signal}" in line, (command, line)
        assert proc.stdout == "" and not out.exists()
    for command in commands[:3]:  # (logstats with its schema: the Spark tests)
        run_cli(*right, *command)
    assert out.exists()


# --- loggerd logs and route folders --------------------------------------------------------


def test_route_folders_are_read_in_segment_order(robot: Schema, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    route = tmp_path / "route"
    expected = []
    for n in range(12):  # --10 and --11 come after --9, not after --1
        events = make_events(robot, 6, seed=n, start_ns=10**9 + n * 10**9,
                             default_times=True)
        expected += events
        compression = ("zstd", "bz2", "none")[n % 3]
        write_loggerd_log(str(route / f"2024-01-01--12-00-00--{n}" /
                              LOGGERD_NAMES[compression]), events, compression)
        # the decimated copy beside it is not read twice
        write_loggerd_log(str(route / f"2024-01-01--12-00-00--{n}" / "qlog.zst"),
                          events[:2], "zstd")
    (route / "2024-01-01--12-00-00--3" / "fcamera.hevc").write_bytes(b"not a log")
    paths = segment_paths(route)
    assert [Path(p).parent.name.rsplit("--", 1)[1] for p in paths] == [str(n) for n in
                                                                       range(12)]
    from msgq.logs import schema_check

    sampled: list[Any] = []
    sample = schema_check._sample
    monkeypatch.setattr(schema_check, "_sample",
                        lambda path, schema: sampled.append(path) or sample(path, schema))
    check_schema(route)
    assert sampled == [paths[0]]  # one sample speaks for the route's segments
    assert all(Path(p).name.startswith("rlog") for p in paths)
    got = list(LogReader(route).raw())
    assert [e.data for e in got] == expected
    for event in got:
        assert (event.mono_ns, event.valid, event.service) == decoded(event.data, robot)
    # one segment folder; a glob; a qlog alone
    assert [e.data for e in LogReader(route / "2024-01-01--12-00-00--10").raw()] == \
        expected[60:66]
    assert [p.split("--")[-1] for p in segment_paths(str(route / "*-00--1*"))] == \
        ["1/rlog.bz2", "10/rlog.bz2", "11/rlog"]
    os.remove(segment_paths(route / "2024-01-01--12-00-00--4")[0])
    assert [e.data for e in LogReader(route / "2024-01-01--12-00-00--4").raw()] == \
        expected[24:26]


def test_a_folder_without_logs_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no log here")
    with pytest.raises(FileNotFoundError, match="no log files in"):
        LogReader(tmp_path / "empty")
    proc = run_cli("replay", str(tmp_path / "empty"), expect=1)
    assert proc.stderr.count("\n") == 1 and "no log files" in proc.stderr


def test_a_segment_name_that_is_no_file_is_listed_for_the_reader_to_report(
        tmp_path: Path) -> None:
    """(The Spark source reports such a path as unreadable; the schema check leaves it
    to the reader.)"""
    log = _recording(tmp_path / "rec", msgq_schema(), make_events(msgq_schema(), 5))
    (log / "segment-00000.log.zst").rename(log / "segment-00002.log.zst")
    (log / "segment-00000.log.zst").mkdir()
    assert [Path(p).name for p in segment_paths(log)] == ["segment-00000.log.zst",
                                                         "segment-00002.log.zst"]
    os.remove(log / "index.json")
    check_schema(log)
    with pytest.raises(IsADirectoryError):
        list(LogReader(log).raw())


def test_replay_of_a_route_sends_what_pycapnp_reads(robot: Schema, tmp_path: Path) -> None:
    """Every event of a loggerd route, on its service, with the logMonoTime and valid
    pycapnp decodes (declared defaults applied)."""
    events = make_events(robot, 40, services=["armState", "imu", "heartbeat"])
    write_loggerd_log(str(tmp_path / "r--0" / "rlog.bz2"), events[:20], "bz2")
    write_loggerd_log(str(tmp_path / "r--1" / "rlog"), events[20:], "none")
    subs = {s: msgq.sub_sock(s, timeout=0, conflate=False) for s in ("armState", "imu",
                                                                       "heartbeat")}
    stats = Replayer(str(tmp_path), fast=True).run(handle_signals=False)
    assert stats.events == 40
    received = {s: list(msgq.drain_sock_raw(sock)) for s, sock in subs.items()}
    for service, datas in received.items():
        assert datas == [d for d in events if decoded(d, robot)[2] == service]
    # lockstep's inputs read the same
    inputs = list(input_events(str(tmp_path)))
    assert [(e.mono_ns, e.service) for e in inputs] == \
        [decoded(d, robot)[::2] for d in events]
    for sock in subs.values():
        sock.close()


# --- damaged input never shows a traceback (defect 8) ---------------------------------------


def test_replay_skips_an_event_larger_than_its_queue(tmp_path: Path) -> None:
    """A decodable event larger than its service's queue takes is not sent, and counted;
    the events around it are sent (it used to stop the replay with a ValueError)."""
    schema = msgq_schema()
    small = make_events(schema, 4, services=["gyroscope"])
    pub = msgq.pub_sock("gyroscope")
    limit = pub.max_message_size
    pub.close()
    msg = schema.event.new_message(logMonoTime=10**9 + 15_000_000, valid=True)
    msg.init("logMessage").text = "x" * (limit + 100)  # a gyroscope queue cannot take it
    big_bytes = bytearray(msg.to_bytes())
    # ...relabelled as gyroscope, as a damaged discriminant would do
    layout = schema.layout
    segments = int.from_bytes(big_bytes[:4], "little") + 1
    base = (4 + 4 * segments + 7) & ~7  # the root pointer, its struct right after it
    assert int.from_bytes(big_bytes[base:base + 4], "little") == 0
    root = base + 8
    big_bytes[root + layout.discriminant_byte:root + layout.discriminant_byte + 2] = \
        layout.services.index("gyroscope").to_bytes(2, "little")
    assert layout.identify(bytes(big_bytes))[2] == "gyroscope"
    events = [*small[:2], bytes(big_bytes), *small[2:]]
    log = write_loggerd_log(str(tmp_path / "rlog"), events, "none")
    stats = Replayer(log, fast=True).run(handle_signals=False)
    assert stats.counts == {"gyroscope": 4} and stats.too_large == {"gyroscope": 1}
    proc = run_cli("replay", "--fast", log)
    assert "not sent: 1 event(s) larger than their service's queue takes: gyroscope (1)" \
        in proc.stderr and "Traceback" not in proc.stderr


def test_replay_does_not_wait_for_a_damaged_time(tmp_path: Path) -> None:
    """An event whose logMonoTime is years past the rest (a flipped high bit) is counted,
    not waited for (it used to sleep until then, or overflow the wait)."""
    schema = msgq_schema()
    events = make_events(schema, 6, services=["gyroscope"])
    damaged = bytearray(events[3])
    damaged[16 + 7] ^= 0x40  # the top byte of logMonoTime: 2**62 ns later
    events[3] = bytes(damaged)
    log = write_loggerd_log(str(tmp_path / "rlog"), events, "none")
    stats = Replayer(log, speed=1.0).run(handle_signals=False)
    assert stats.counts == {"gyroscope": 5} and stats.bad_time == {"gyroscope": 1}
    assert stats.seconds < 5


# --- lockstep with any schema ---------------------------------------------------------------


def echo_imu_times() -> None:
    """The process under test: for every imu event, a heartbeat whose counter is the imu
    event's logMonoTime as pycapnp decodes it with the schema in force in this process."""
    schema = schema_in_force()
    sub = msgq.sub_sock("imu", conflate=False)
    pub = msgq.pub_sock("heartbeat")
    print("schema in force:", schema.path, flush=True)
    while True:
        data = sub.receive()
        if data is None:
            continue
        imu = schema.decode(data)
        out = schema.event.new_message(logMonoTime=imu.logMonoTime, valid=imu.valid)
        out.init("heartbeat").counter = int(imu.logMonoTime)
        pub.send(out.to_bytes())


@pytest.mark.parametrize("in_force", [True, False], ids=["in-force", "explicit"])
def test_lockstep_child_rebuilds_the_schema_from_its_spec(in_force: bool, tmp_path: Path,
                                                          request: pytest.FixtureRequest
                                                          ) -> None:
    """The process under test gets the harness's schema (its spec, pickled), whether it
    is in force or only passed as ``schema=`` (then the child's environment names msgq's
    own)."""
    schema = request.getfixturevalue("robot") if in_force else robot_schema()
    events = make_events(schema, 30, services=["imu", "armState"])
    log = _recording(tmp_path / "rec", schema, events)
    result = run_lockstep(echo_imu_times, str(log), "imu", ["heartbeat"], schema=schema,
                          step_timeout=20, startup_timeout=60)
    imus = [decoded(d, schema) for d in events if decoded(d, schema)[2] == "imu"]
    assert [e.event.heartbeat.counter for e in result.by_service("heartbeat")] == \
        [mono for mono, _, _ in imus]
    assert [step.mono_ns for step in result.steps] == [mono for mono, _, _ in imus]
    assert f"schema in force: {ROBOT_SCHEMA}" in result.output


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
