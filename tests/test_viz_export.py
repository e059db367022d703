"""The Cap'n Proto → JSON mapping (against pycapnp's own to_dict) and ``msgq export`` to
MCAP, read back with the ``mcap`` library's reader: counts per channel, log times and
values equal LogReader's, on msgq's schema and on the robot profile."""

from __future__ import annotations

import base64
import json
import math
import os
import random
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from schema_profiles import ROBOT_SCHEMA, ROBOT_SERVICES, write_loggerd_log

from msgq.logs import LogReader, LogWriter
from msgq.schemas import Schema
from msgq.viz.json_schema import WHICH, encode_json, event_converter, json_value

try:  # the viz extra is part of the test set-up: missing, it is a broken set-up, not a skip
    import mcap.reader as mcap_reader
    from mcap.stream_reader import StreamReader
except ImportError as e:
    pytest.fail(f"{e}: install msgq-shm[viz] (the test extra includes it)", pytrace=False)

PYTHON = sys.executable

# --- events with every kind of value --------------------------------------------------------

_INT_LIMITS = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}
_SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 1e-300, 3.4e38)


def _value(kind: str, rng: random.Random, name: str) -> Any:
    if kind == "bool":
        return rng.random() < 0.5
    if kind in _INT_LIMITS:
        bits = _INT_LIMITS[kind]
        return rng.choice((-(2**bits), 2**bits - 1, rng.randrange(-(2**bits), 2**bits)))
    if kind.startswith("uint"):
        bits = int(kind[4:])
        return rng.choice((2**bits - 1, 0, rng.randrange(0, 2**bits)))
    if kind == "float64":
        return rng.choice((*_SPECIAL_FLOATS, rng.uniform(-1e6, 1e6)))
    if kind == "float32":
        return rng.choice((math.nan, math.inf, -math.inf, 0.1, rng.uniform(-9, 9)))
    if kind == "text":
        return rng.choice(("", f"{name} é ✓ \"quoted\" \\ \n", "plain"))
    if kind == "data":
        return rng.randbytes(rng.randrange(0, 9))
    return None


def fill(builder: Any, rng: random.Random, depth: int = 0) -> None:
    """Random values, extremes included (64-bit limits, NaN, infinities, UTF-8, empty and
    binary Data), in the fields of ``builder``; about a third of them left unset, so that
    defaults are read too; one member of each union set (sometimes none)."""
    fields = builder.schema.fields
    union = list(builder.schema.union_fields)
    if union and rng.random() < 0.9:
        chosen = rng.choice(union)
        _set(builder, chosen, fields[chosen], rng, depth)
    for name in builder.schema.non_union_fields:
        if rng.random() < 0.3:
            continue
        _set(builder, name, fields[name], rng, depth)


def _set(builder: Any, name: str, field: Any, rng: random.Random, depth: int) -> None:
    proto = field.proto
    if proto.which() == "group":
        fill(builder.init(name), rng, depth + 1)
        return
    kind = proto.slot.type.which()
    if kind == "void":
        setattr(builder, name, None)
    elif kind == "struct":
        if depth < 4:
            fill(builder.init(name), rng, depth + 1)
    elif kind == "enum":
        setattr(builder, name, rng.choice(list(field.schema.enumerants)))
    elif kind == "list":
        element = proto.slot.type.list.elementType
        element_kind = element.which()
        n = rng.randrange(0, 4)
        if element_kind == "struct":
            if depth < 4:
                for item in builder.init(name, n):
                    fill(item, rng, depth + 1)
        elif element_kind == "enum":
            names = list(field.schema.elementType.enumerants)
            setattr(builder, name, [rng.choice(names) for _ in range(n)])
        elif element_kind in ("list", "anyPointer", "interface"):
            return
        else:
            setattr(builder, name, [_value(element_kind, rng, name) for _ in range(n)])
    elif kind not in ("anyPointer", "interface"):
        setattr(builder, name, _value(kind, rng, name))


def events_of(schema: Schema, per_service: int = 4, seed: int = 1,
              start_ns: int = 10**9) -> list[bytes]:
    """``per_service`` filled events of every union member of ``schema``, 1 ms apart,
    cycling through the services; valid alternates."""
    rng = random.Random(seed)
    out = []
    members = list(schema.union_fields)
    for i in range(per_service * len(members)):
        name = members[i % len(members)]
        msg = schema.event.new_message()
        msg.logMonoTime = start_ns + i * 1_000_000
        msg.valid = i % 2 == 0
        field = schema.event.schema.fields[name]
        _set(msg, name, field, rng, 0)
        if msg.which() != name:  # a member left unset by _set (a struct at depth)
            schema.init_payload(msg, name, 0 if name in schema.sized_fields else None)
        out.append(msg.to_bytes())
    return out


# --- the reference: pycapnp's to_dict -------------------------------------------------------


def reference(value: Any) -> Any:
    """pycapnp's ``to_dict(verbose=True)`` in the JSON mapping: Data as base64, non-finite
    floats as strings."""
    if isinstance(value, dict):
        return {k: reference(v) for k, v in value.items()}
    if isinstance(value, list):
        return [reference(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    return value


def without_which(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_which(v) for k, v in value.items() if k != WHICH}
    if isinstance(value, list):
        return [without_which(v) for v in value]
    return value


def validate(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$"
             ) -> None:
    """A JSON Schema check of the keywords the derived schemas use (type, properties,
    required, additionalProperties, items, enum, anyOf, pattern, minimum, maximum,
    $ref); raises AssertionError naming the path."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        validate(value, root["$defs"][name], root, path)
        return
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                validate(value, option, root, path)
                return
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(f"{path}: no option of anyOf matches {value!r}: {errors}")
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        checks = {"object": lambda v: isinstance(v, dict),
                  "array": lambda v: isinstance(v, list),
                  "string": lambda v: isinstance(v, str),
                  "boolean": lambda v: isinstance(v, bool),
                  "null": lambda v: v is None,
                  "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
                  "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}
        assert any(checks[t](value) for t in types), f"{path}: {value!r} is not {types}"
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    if isinstance(value, str) and "pattern" in schema:
        assert re.search(schema["pattern"], value), f"{path}: {value!r} !~ {schema['pattern']}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        assert value >= schema.get("minimum", value), f"{path}: {value} < minimum"
        assert value <= schema.get("maximum", value), f"{path}: {value} > maximum"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{path}: {key!r} missing"
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                validate(item, properties[key], root, f"{path}.{key}")
            else:
                assert schema.get("additionalProperties", True) is not False, \
                    f"{path}: {key!r} is not in the schema"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            validate(item, schema["items"], root, f"{path}[{i}]")


# --- the mapping ------------------------------------------------------------------------------


def test_every_service_converts_like_pycapnp_and_fits_its_schema(schema_profile: Schema
                                                                ) -> None:
    schema = schema_profile
    converter = event_converter(schema)
    events = events_of(schema)
    for data in events:
        event = schema.decode(data)
        service = event.which()
        value = converter.to_json(event)
        assert value[WHICH] == service
        assert without_which(json_value(value)) == reference(event.to_dict(verbose=True)), \
            service
        # through the JSON text and back: exact (64-bit integers, floats, strings)
        decoded = json.loads(encode_json(value))
        assert without_which(decoded) == reference(event.to_dict(verbose=True)), service
        # the fast encoder (orjson, when installed) writes the same values
        assert json.loads(converter.dumps(service, value)) == decoded, service
        assert decoded["logMonoTime"] == event.logMonoTime
        validate(decoded, converter.json_schema(service), converter.json_schema(service))
    assert converter is event_converter(schema)  # made once per schema
    assert converter.json_schema(service) is converter.json_schema(service)  # derived once


def test_robot_values_groups_unions_defaults_and_extremes(robot: Schema) -> None:
    """Hand-made values of the robot schema, each checked by name."""
    converter = event_converter(robot)
    msg = robot.event.new_message()
    msg.logMonoTime = 2**63 + 12345  # past 2**53: must stay exact
    arm = msg.init("armState")
    arm.speedLimit = math.nan
    arm.mode = "torque"
    joints = arm.init("joints", 2)
    joints[0].name = "elbow"
    joints[0].angle = -math.inf
    value = json.loads(converter.encode(robot.decode(msg.to_bytes())))
    assert value["logMonoTime"] == 2**63 + 12345
    assert value["valid"] is True and value["sequence"] == 42  # declared defaults
    assert value[WHICH] == "armState"
    arm_value = value["armState"]
    assert arm_value["speedLimit"] == "NaN" and arm_value["mode"] == "torque"
    assert arm_value["enabled"] is True  # declared default
    assert arm_value["gripper"] == {"closed": True, "force": 12.5, "temperature": -40}
    assert arm_value["joints"][0] == {"name": "elbow", "angle": "-Infinity", "limit": 3.14,
                                      "healthy": True}
    assert arm_value["joints"][1]["name"] == ""

    msg = robot.event.new_message()
    diagnostics = msg.init("diagnostics")
    diagnostics.source.component = "planner"
    diagnostics.blobs = [b"\x00\xff", b""]
    value = converter.to_json(robot.decode(msg.to_bytes()))["diagnostics"]
    assert value["source"] == {WHICH: "component", "component": "planner"}
    assert value["blobs"] == ["AP8=", ""]
    assert value["level"] == "warning"  # an enum's declared default, by name
    assert value["nested"]["level1"]["level2"] == {"value": 7,
                                                   "leaf": {"flag": True, "values": []}}
    msg = robot.event.new_message()
    msg.init("diagnostics").source.none = None
    value = converter.to_json(robot.decode(msg.to_bytes()))["diagnostics"]
    assert value["source"] == {WHICH: "none", "none": None}


def test_json_schema_of_a_service(robot: Schema) -> None:
    doc = event_converter(robot).json_schema("plannerPlan")
    assert doc["title"] == "Event.plannerPlan"
    props = doc["properties"]
    assert set(props) == {"logMonoTime", "valid", "sequence", "plannerPlan", WHICH}
    assert props[WHICH]["enum"] == ["plannerPlan"]
    assert props["logMonoTime"] == {"type": "integer", "minimum": 0, "maximum": 2**64 - 1,
                                    "description": props["logMonoTime"]["description"]}
    layers = props["plannerPlan"]["properties"]["layers"]
    assert layers == {"type": "array", "items": {"$ref": "#/$defs/PlannerPlan.Layer"}}
    layer = doc["$defs"]["PlannerPlan.Layer"]  # recursive: children are Layers
    assert layer["properties"]["children"]["items"] == {"$ref": "#/$defs/PlannerPlan.Layer"}
    json.dumps(doc)  # plain JSON
    with pytest.raises(KeyError, match="did you mean 'imu'"):
        event_converter(robot).json_schema("imuu")


# --- recordings of both profiles ------------------------------------------------------------


def write_recording(schema: Schema, folder: Path, events: list[bytes]) -> Path:
    """msgq's own schema: a LogWriter recording of two segments; the robot schema: an
    openpilot-style route of two segments (<route>--<n>/rlog.zst)."""
    half = len(events) // 2
    if schema.path.endswith("robot.capnp"):
        for n, part in enumerate((events[:half], events[half:])):
            write_loggerd_log(str(folder / f"2026-01-01--12-00-00--{n}" / "rlog.zst"), part)
        return folder
    with LogWriter(str(folder), rotate_bytes=sum(map(len, events[:half]))) as writer:
        for data in events:
            writer.write(data)
    return folder


def sources(schema: Schema, folder: Path) -> list[str]:
    if schema.path.endswith("robot.capnp"):
        return sorted(str(p) for p in folder.glob("*--*/rlog.zst"))
    return [str(folder)]


def read_mcap(path: Path) -> tuple[Any, list[tuple[str, int, dict[str, Any]]], dict[str, Any]]:
    """(summary, [(topic, log time, decoded JSON)], {metadata name: dict}) read back with
    the mcap library, every CRC checked."""
    with open(path, "rb") as f:
        for _record in StreamReader(f, validate_crcs=True).records:
            pass  # validation: every record parses and every CRC matches
    with open(path, "rb") as f:
        reader = mcap_reader.make_reader(f, validate_crcs=True)
        summary = reader.get_summary()
        messages = []
        for schema, channel, message in reader.iter_messages(log_time_order=False):
            assert schema.encoding == "jsonschema" and channel.message_encoding == "json"
            assert message.publish_time == message.log_time
            messages.append((channel.topic, message.log_time, json.loads(message.data)))
        metadata = {m.name: dict(m.metadata) for m in reader.iter_metadata()}
    return summary, messages, metadata


def test_export_reads_back_equal_to_log_reader(schema_profile: Schema, tmp_path: Path
                                               ) -> None:
    schema = schema_profile
    events = events_of(schema, per_service=3)
    folder = write_recording(schema, tmp_path / "rec", events)
    out = tmp_path / "out.mcap"
    from msgq.viz.mcap_export import export_mcap

    stats = export_mcap(sources(schema, folder), str(out))
    assert stats.problems == []
    summary, messages, metadata = read_mcap(out)

    converter = event_converter(schema)
    expected = [(f"/{e.service}", e.mono_ns, converter.to_json(schema.decode(e.data)))
                for e in LogReader(sources(schema, folder)).raw()]
    got = [(t, time, value) for t, time, value in messages]
    expected_json = [(t, time, json.loads(encode_json(v))) for t, time, v in expected]
    assert got == expected_json  # every message, in order, with its time and values
    counts: dict[str, int] = {}
    for topic, _, _ in expected:
        counts[topic] = counts.get(topic, 0) + 1
    channels = {c.id: c.topic for c in summary.channels.values()}
    assert {channels[i]: n for i, n in summary.statistics.channel_message_counts.items()} \
        == counts
    assert summary.statistics.message_count == len(expected) == stats.messages
    assert summary.statistics.message_start_time == min(t for _, t, _ in expected)
    assert summary.chunk_indexes and all(c.compression == "zstd"
                                         for c in summary.chunk_indexes)
    for channel in summary.channels.values():
        mcap_schema = summary.schemas[channel.schema_id]
        service = channel.topic[1:]
        assert json.loads(mcap_schema.data) == converter.json_schema(service)
        assert mcap_schema.name == f"Event.{service}"
    meta = metadata["msgq"]
    assert meta["schema_fingerprint"] == schema.fingerprint
    assert meta["schema_root"] == "Event"
    assert json.loads(meta["segments"]) == [
        str(p) for p in (sorted(folder.glob("*--*/rlog.zst")) if "robot" in schema.path
                         else sorted(folder.glob("segment-*")))]
    assert meta["msgq_version"]


def test_export_selects_services_and_times(tmp_path: Path) -> None:
    from msgq.schemas import msgq_schema
    from msgq.viz.mcap_export import export_mcap

    schema = msgq_schema()
    events = events_of(schema, per_service=2)
    folder = write_recording(schema, tmp_path / "rec", events)
    all_events = list(LogReader(str(folder)).raw())
    start, end = all_events[10].mono_ns, all_events[60].mono_ns
    stats = export_mcap(str(folder), str(tmp_path / "part.mcap"),
                        services=["vehicleState", "can"], start_ns=start, end_ns=end)
    _, messages, _ = read_mcap(tmp_path / "part.mcap")
    expected = [(f"/{e.service}", e.mono_ns) for e in all_events
                if e.service in ("vehicleState", "can") and start <= e.mono_ns <= end]
    assert [(t, time) for t, time, _ in messages] == expected and expected
    assert stats.messages == len(expected)


def test_damaged_segment_exports_what_is_intact(tmp_path: Path) -> None:
    from msgq.schemas import msgq_schema
    from msgq.viz.mcap_export import export_mcap

    schema = msgq_schema()
    events = events_of(schema, per_service=2)
    route = tmp_path / "route"
    half = len(events) // 2
    first = write_loggerd_log(str(route / "r--0" / "rlog"), events[:half], "none")
    write_loggerd_log(str(route / "r--1" / "rlog"), events[half:], "none")
    garbage = route / "r--2" / "rlog.zst"
    garbage.parent.mkdir()
    garbage.write_bytes(b"this is no zstd stream" * 10)
    # garbage in the middle of the first segment: the events around it are intact
    data = bytearray(Path(first).read_bytes())
    middle = sum(len(e) for e in events[:20])
    data[middle:middle + 16] = b"\xff" * 16
    Path(first).write_bytes(bytes(data))
    paths = [first, str(route / "r--1" / "rlog"), str(garbage)]
    stats = export_mcap(paths, str(tmp_path / "out.mcap"))
    _, messages, _ = read_mcap(tmp_path / "out.mcap")
    intact = list(LogReader(paths[:2], skip_corrupt=True, warn=False).raw())
    assert len(messages) == len(intact) == stats.messages
    assert len(events) - 2 <= len(intact) < len(events)
    assert any("r--0" in p and "corrupt" in p for p in stats.problems), stats.problems
    assert any("r--2" in p for p in stats.problems), stats.problems


def test_export_streams_in_bounded_memory(tmp_path: Path) -> None:
    """The peak memory of an export does not grow with the recording: four times the
    segments (of the same size, each several chunks) peak no higher."""
    from msgq.schemas import msgq_schema
    from msgq.viz.mcap_export import export_mcap

    schema = msgq_schema()
    events = events_of(schema, per_service=6)
    chunk = 16 * 1024
    peaks = []
    for copies in (3, 12):
        folder = tmp_path / f"rec{copies}"
        with LogWriter(str(folder), rotate_bytes=64 * 1024) as writer:
            for _ in range(copies):
                for data in events:
                    writer.write(data)
        export_mcap(str(folder), str(tmp_path / "warm.mcap"), chunk_size=chunk)  # caches
        tracemalloc.start()
        try:
            stats = export_mcap(str(folder), str(tmp_path / f"out{copies}.mcap"),
                                chunk_size=chunk)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert stats.bytes_out > 10 * chunk * copies / 12
    assert peaks[1] < 1.25 * peaks[0] + chunk, peaks


# --- the command ------------------------------------------------------------------------------


def run_msgq(*args: str, env: dict[str, str] | None = None, code: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    command = [PYTHON, "-c", code or "import sys; from msgq.cli import main; "
                                     "sys.exit(main(sys.argv[1:]))", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_cli_export_robot_route(robot: Schema, tmp_path: Path) -> None:
    events = events_of(robot, per_service=2)
    folder = write_recording(robot, tmp_path / "route", events)
    out = tmp_path / "route.mcap"
    result = run_msgq("export", "--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES,
                      str(folder / "*--*" / "rlog.zst"), str(out), "--services",
                      "armState,diagnostics")
    assert result.returncode == 0, result.stderr
    assert f"-> {out}" in result.stdout
    _, messages, _ = read_mcap(out)
    assert {t for t, _, _ in messages} == {"/armState", "/diagnostics"}
    assert len(messages) == 4
    again = run_msgq("export", str(folder / "*--*" / "rlog.zst"), str(out))
    assert again.returncode == 2 and "exists: remove it or pass --force" in again.stderr


def test_cli_export_of_nothing_readable_fails_in_one_line(tmp_path: Path) -> None:
    garbage = tmp_path / "rlog.zst"
    garbage.write_bytes(b"not a log at all" * 100)
    out = tmp_path / "out.mcap"
    result = run_msgq("export", str(garbage), str(out))
    assert result.returncode == 1, result.stderr
    assert "no event could be read" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_cli_export_without_the_extra_says_what_to_install(tmp_path: Path) -> None:
    """With mcap hidden (an import hook that refuses it), one line says what to install."""
    from msgq.schemas import msgq_schema

    folder = write_recording(msgq_schema(), tmp_path / "rec", events_of(msgq_schema(), 1))
    hide = ("import sys, importlib.abc\n"
            "class Hide(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('mcap', 'foxglove'):\n"
            "            raise ImportError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "from msgq.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    result = run_msgq("export", str(folder), str(tmp_path / "o.mcap"), code=hide)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'msgq-shm[viz]'" in lines[0], result.stderr
    result = run_msgq("foxglove", "--duration", "0.1", code=hide)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "pip install 'msgq-shm[viz]'" in lines[0]


@pytest.mark.slow
def test_export_benchmark_prints_its_table() -> None:
    """python -m msgq.bench.export on a short recording: its rows, the decode row at
    100 % and the export row a share of it."""
    result = subprocess.run([PYTHON, "-m", "msgq.bench.export", "--seconds", "2",
                             "--repeat", "1", "--jobs", "2"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = {line.split("  ")[0]: line for line in lines[2:-1]}
    assert set(rows) == {"decode (LogReader loop)", "convert", "convert + JSON",
                         "JSON writer (compiled)", "export to MCAP", "export through pycapnp",
                         "export, 2 processes"}, result.stdout
    assert rows["decode (LogReader loop)"].endswith("100.0 %")
    share = float(rows["export to MCAP"].split()[-2])
    assert 0 < share < 100
    summary = re.match(r"export / decode: ([\d.]+); .*pycapnp: ([\d.]+)x$", lines[-1])
    assert summary, lines[-1]
    assert 0 < float(summary[1]) < 1 and float(summary[2]) > 0


def test_logs_of_another_schema_are_refused_in_one_line(tmp_path: Path) -> None:
    """A recording of msgq's schema exported with the robot schema in force: refused
    before anything is written, never exported under the wrong names."""
    from msgq.schemas import msgq_schema

    folder = write_recording(msgq_schema(), tmp_path / "rec", events_of(msgq_schema(), 2))
    out = tmp_path / "out.mcap"
    result = run_msgq("export", "--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES,
                      str(folder), str(out))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--schema" in lines[0], result.stderr
    assert not out.exists() and not list(tmp_path.glob("*.part"))


def test_an_interrupted_export_leaves_no_file(tmp_path: Path) -> None:
    from msgq.schemas import msgq_schema
    from msgq.viz.mcap_export import export_mcap

    folder = write_recording(msgq_schema(), tmp_path / "rec", events_of(msgq_schema(), 2))
    seen = []

    def interrupt(size: int) -> None:
        seen.append(size)
        if len(seen) == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_mcap(str(folder), str(tmp_path / "out.mcap"), progress=interrupt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec"]


GENERIC_SCHEMA = """
@0xe1f2a3b4c5d6e7f9;
struct Map(Key, Value) {
  entries @0 :List(Entry);
  struct Entry {
    key @0 :Key;
    value @1 :Value;
  }
}
struct Point {
  x @0 :Float32;
  y @1 :Float32 = 2.5;
}
struct Config {
  params @0 :Map(Text, Data);
  labels @1 :Map(Text, Text);
  tracks @2 :Map(Text, List(Float32));
  points @3 :Map(Text, Point);
}
struct Event {
  logMonoTime @0 :UInt64;
  valid @1 :Bool;
  union {
    config @2 :Config;
    note @3 :Text;
  }
}
"""


def test_generics_are_read_as_bound(tmp_path: Path) -> None:
    """openpilot's initData.params is a Map(Text, Data): the fields of a generic's
    parameter type are read as the brand binds them (Text, Data as base64, lists,
    structs), and the JSON Schema says string / base64 where the binding is known."""
    from msgq.schemas import load_schema

    path = tmp_path / "generic.capnp"
    path.write_text(GENERIC_SCHEMA)
    schema = load_schema(str(path))
    converter = event_converter(schema)
    msg = schema.event.new_message()
    config = msg.init("config")
    entries = config.params.init("entries", 2)
    entries[0].key, entries[0].value = "gain", b"\x00\x01"
    entries[1].key = "empty"
    config.labels.init("entries", 1)[0].key = "a"
    config.labels.entries[0].value = "b"
    track = config.tracks.init("entries", 1)[0]
    track.key = "t"
    track.init("value", 2)
    track.value[0], track.value[1] = 1.5, math.inf
    point = config.points.init("entries", 1)[0]
    point.key = "p"
    point.init("value").x = 4.0
    event = schema.decode(msg.to_bytes())
    value = json.loads(converter.encode(event))
    assert value["config"]["params"]["entries"] == [{"key": "gain", "value": "AAE="},
                                                    {"key": "empty", "value": ""}]
    assert value["config"]["labels"]["entries"] == [{"key": "a", "value": "b"}]
    assert value["config"]["tracks"]["entries"] == [{"key": "t",
                                                     "value": [1.5, "Infinity"]}]
    assert value["config"]["points"]["entries"] == [{"key": "p",
                                                     "value": {"x": 4.0, "y": 2.5}}]
    assert without_which(value) == reference(event.to_dict(verbose=True))
    doc = converter.json_schema("config")
    validate(value, doc, doc)
    entry = doc["properties"]["config"]["properties"]["params"]["properties"]["entries"]
    assert entry["items"]["properties"]["key"] == {"type": "string"}
    assert entry["items"]["properties"]["value"] == {"type": "string",
                                                     "contentEncoding": "base64"}


def test_parallel_export_writes_the_same_file(tmp_path: Path) -> None:
    """Segments converted by two worker processes: the same messages in the same order,
    the same metadata and the same damage report as the export in one process."""
    from msgq.schemas import msgq_schema
    from msgq.viz.mcap_export import export_mcap

    schema = msgq_schema()
    events = events_of(schema, per_service=4)
    folder = tmp_path / "rec"
    with LogWriter(str(folder), rotate_bytes=sum(map(len, events)) // 5) as writer:
        for data in events:
            writer.write(data)
    segments = sorted(folder.glob("segment-*"))
    assert len(segments) >= 5
    damaged = bytearray(segments[2].read_bytes())  # a damaged segment in the middle
    damaged[len(damaged) // 2:len(damaged) // 2 + 64] = b"\x00" * 64
    segments[2].write_bytes(bytes(damaged))
    one = export_mcap(str(folder), str(tmp_path / "one.mcap"), jobs=1)
    two = export_mcap(str(folder), str(tmp_path / "two.mcap"), jobs=2)
    _, messages_one, meta_one = read_mcap(tmp_path / "one.mcap")
    _, messages_two, meta_two = read_mcap(tmp_path / "two.mcap")
    assert messages_one == messages_two and len(messages_one) == one.messages
    assert meta_one == meta_two
    assert one.problems == two.problems and one.problems
    assert (one.counts, one.first_mono_ns, one.last_mono_ns, one.bytes_in) == \
        (two.counts, two.first_mono_ns, two.last_mono_ns, two.bytes_in)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_the_batched_mcap_path_is_pinned_to_the_mcap_it_was_checked_against(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export batches messages into mcap's Writer through its private chunk builder
    (mcap's public API adds one message at a time, 5x slower). That is pinned: the
    installed mcap must be a version the batcher was checked against; with it the batcher
    is used (no message through add_message) and its file equals add_message's byte for
    byte. An mcap upgrade fails here, loudly, until the batcher is checked again and
    MCAP_BATCHED_VERSIONS widened (the export meanwhile uses add_message only)."""
    from importlib.metadata import version

    import mcap.writer

    from msgq.schemas import msgq_schema
    from msgq.viz import mcap_export
    from msgq.viz.mcap_export import MCAP_BATCHED_VERSIONS, export_mcap, mcap_batches

    installed = version("mcap")
    assert mcap_batches(), (
        f"mcap {installed} is outside {MCAP_BATCHED_VERSIONS}, the versions the export's "
        "batched path (mcap_export._MessageBatcher, on mcap's private Writer attributes) "
        "was checked against: check it with this test and widen the range")
    import io

    # every private attribute it uses is there (AttributeError otherwise)
    mcap_export._MessageBatcher(mcap.writer.Writer(io.BytesIO()), 4096)

    schema = msgq_schema()
    folder = write_recording(schema, tmp_path / "rec", events_of(schema, per_service=3,
                                                                 seed=7))
    added: list[int] = []
    original = mcap.writer.Writer.add_message

    def add_message(self: Any, *args: Any, **kwargs: Any) -> None:
        added.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(mcap.writer.Writer, "add_message", add_message)
    batched = export_mcap(str(folder), str(tmp_path / "batched.mcap"), chunk_size=2000)
    assert batched.messages > 0 and added == []  # all batched
    monkeypatch.setattr(mcap_export, "mcap_batches", lambda: False)  # another version
    single = export_mcap(str(folder), str(tmp_path / "single.mcap"), chunk_size=2000)
    assert len(added) == single.messages == batched.messages
    assert (tmp_path / "single.mcap").read_bytes() == (tmp_path / "batched.mcap").read_bytes()
