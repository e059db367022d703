"""msgq's Event builder (what new_message returns; schemas/_event_builder.pxi): the same
messages as pycapnp's builder for the same calls, on msgq's schema and on the robot
schema (non-zero defaults, groups, a union inside a struct); pycapnp's behaviour, values
and errors, for everything it hands over; PubMaster and LogWriter take it."""

from __future__ import annotations

import math
import random
import struct
from typing import Any

import capnp
import pytest

from msgq.schemas import Schema, default_schema, log_from_bytes, new_message
from msgq.schemas._typed_reader import StructBuilder
from tests.schema_profiles import robot_schema

_INT_RANGES = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_UINT_RANGES = {"uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}


def _pycapnp_message(schema: Schema, service: str, mono: int) -> Any:
    msg = schema.event.new_message()
    msg.logMonoTime = mono
    msg.valid = False
    msg.init(service)
    return msg


def _value(rng: random.Random, kind: str, field: Any) -> Any:
    if kind == "bool":
        return rng.random() < 0.5
    if kind in _INT_RANGES:
        bits = _INT_RANGES[kind]
        return rng.choice([0, -1, 1, -(1 << (bits - 1)), (1 << (bits - 1)) - 1,
                           rng.randrange(-(1 << (bits - 1)), 1 << (bits - 1))])
    if kind in _UINT_RANGES:
        bits = _UINT_RANGES[kind]
        return rng.choice([0, 1, (1 << bits) - 1, rng.randrange(1 << bits)])
    if kind in ("float32", "float64"):
        return rng.choice([0.0, -0.0, 1.5, -2.25, 1e-30, 3.4e38, math.inf, -math.inf,
                           rng.uniform(-1e6, 1e6), 7])
    if kind == "enum":
        return rng.choice(sorted(field.schema.enumerants))
    raise AssertionError(kind)


def _program(rng: random.Random, schema: Any, depth: int) -> list[tuple[Any, ...]]:
    """Calls on a struct builder of ``schema`` that the builder makes itself: sets of
    numbers, bools and enums (by name), nested structs by attribute or init, groups, one
    member of each union. ``("set", name, value)``, ``("get", name, program)`` or
    ``("init", name, program)``."""
    ops: list[tuple[Any, ...]] = []
    union = set(schema.union_fields)
    member = rng.choice(sorted(union)) if union else None
    for field in schema.fields_list:
        proto = field.proto
        name = proto.name
        if name in union and name != member:
            continue
        if name not in union and rng.random() < 0.4:
            continue
        if proto.which() == "group":
            ops.append(("get", name, _program(rng, field.schema, depth)))
            continue
        slot = proto.slot
        kind = slot.type.which()
        if kind == "struct" and not slot.hadExplicitDefault:
            if depth > 0:
                call = "init" if name in union or rng.random() < 0.5 else "get"
                ops.append((call, name, _program(rng, field.schema, depth - 1)))
        elif kind in ("bool", "enum", "float32", "float64", *_INT_RANGES, *_UINT_RANGES):
            ops.append(("set", name, _value(rng, kind, field)))
    rng.shuffle(ops)
    return ops


def _run(builder: Any, ops: list[tuple[Any, ...]]) -> None:
    for call, name, arg in ops:
        if call == "set":
            setattr(builder, name, arg)
        elif call == "get":
            _run(getattr(builder, name), arg)
        else:
            _run(builder.init(name), arg)


def _read_back(builder: Any, other: Any, ops: list[tuple[Any, ...]]) -> None:
    """Every value set reads back the same from both builders."""
    for call, name, arg in ops:
        if call == "set":
            ours, theirs = getattr(builder, name), getattr(other, name)
            if isinstance(theirs, float) and math.isnan(theirs):
                assert math.isnan(ours)
            else:
                assert ours == theirs, name
        else:
            _read_back(getattr(builder, name), getattr(other, name), arg)


@pytest.mark.parametrize("profile", ["msgq", "robot"])
def test_the_builder_writes_what_pycapnp_writes_for_the_same_calls(profile: str) -> None:
    schema = default_schema() if profile == "msgq" else robot_schema()
    rng = random.Random(20261127)
    event = schema.event.schema
    services = sorted(name for name in schema.union_fields
                      if event.fields[name].proto.slot.type.which() == "struct")
    for round_ in range(300):
        service = services[round_ % len(services)]
        ops = _program(rng, event.fields[service].schema, depth=3)
        ours = new_message(service, schema=schema)
        assert type(ours) is StructBuilder
        # pycapnp's builder class, as cereal code may check, without handing over
        assert isinstance(ours, capnp.lib.capnp._DynamicStructBuilder)
        assert not isinstance(ours, (bytes, bytearray, memoryview))
        ours.logMonoTime = 12345 + round_
        theirs = _pycapnp_message(schema, service, 12345 + round_)
        _run(getattr(ours, service), ops)
        _run(getattr(theirs, service), ops)
        assert ours.which() == theirs.which() == service
        data = ours.to_bytes()
        assert not ours.handed_over, (service, ops)  # all made without pycapnp
        got = log_from_bytes(data, schema.event)
        assert got.to_dict() == log_from_bytes(theirs.to_bytes(), schema.event).to_dict()
        _read_back(getattr(ours, service), getattr(theirs, service), ops)  # (enums: pycapnp)


def test_declared_defaults_are_kept_and_written_as_cap_n_proto_does() -> None:
    schema = robot_schema()  # valid defaults to true, logMonoTime to 1000
    ours = new_message("armState", schema=schema)
    assert ours.valid is False  # new_message's rule, written against the default
    ours.valid = True
    ours.logMonoTime = 1000
    data = ours.to_bytes()
    # both equal their defaults: stored as zero bits, as pycapnp stores them
    theirs = _pycapnp_message(schema, "armState", 1000)
    theirs.valid = True
    assert log_from_bytes(data, schema.event).to_dict() == \
        log_from_bytes(theirs.to_bytes(), schema.event).to_dict()
    root_words = data[8 + 8: 8 + 8 + 16]  # the Event's data section after its pointer
    assert struct.unpack("<Q", root_words[:8])[0] == 0


def test_anything_else_hands_over_to_pycapnp_and_earlier_structs_follow() -> None:
    schema = robot_schema()
    ours = new_message("armState", schema=schema)
    theirs = _pycapnp_message(schema, "armState", ours.logMonoTime)
    arm_ours, arm_theirs = ours.armState, theirs.armState
    fields = {f.proto.name: f for f in arm_ours_fields(schema)}
    number = next(n for n, f in fields.items() if f.proto.which() == "slot"
                  and f.proto.slot.type.which() in ("float32", "float64"))
    setattr(arm_ours, number, 2.5)
    setattr(arm_theirs, number, 2.5)
    assert not ours.handed_over
    # a list: pycapnp from here on; the struct given out before still writes into it
    listed = next((n for n, f in fields.items() if f.proto.which() == "slot"
                   and f.proto.slot.type.which() == "list"), None)
    assert listed is not None
    arm_ours.init(listed, 2)
    arm_theirs.init(listed, 2)
    assert ours.handed_over
    setattr(arm_ours, number, 3.5)
    setattr(arm_theirs, number, 3.5)
    assert getattr(arm_ours, number) == 3.5
    assert log_from_bytes(ours.to_bytes(), schema.event).to_dict() == \
        log_from_bytes(theirs.to_bytes(), schema.event).to_dict()
    # pycapnp's own methods and results
    assert ours.to_dict() == theirs.to_dict()
    assert ours.as_reader().which() == "armState"


def arm_ours_fields(schema: Schema) -> list[Any]:
    return list(schema.event.schema.fields["armState"].schema.fields_list)


def _error_of(call: Any, msg: Any) -> type[BaseException] | None:
    try:
        call(msg)
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        return type(e)
    return None


@pytest.mark.parametrize("call", [
    lambda m: setattr(m.gyroscope, "dieTemperatureCelsius", "1.5"),  # type mismatch
    lambda m: setattr(m.gyroscope, "dieTemperatureCelsius", True),
    lambda m: setattr(m.gyroscope, "status", -1),  # out of range
    lambda m: setattr(m.gyroscope, "status", 1 << 32),
    lambda m: setattr(m.gyroscope, "timestampNs", 1.5),
    lambda m: setattr(m.gyroscope, "source", "imu9"),  # no such enumerant
    lambda m: setattr(m.gyroscope, "source", 7),
    lambda m: m.accelerometer,  # a union member that is not set
    lambda m: m.init("gyroscope", 3),
])
def test_values_it_does_not_take_get_pycapnps_conversion_or_error(call: Any) -> None:
    schema = default_schema()
    ours = new_message("gyroscope")
    theirs = _pycapnp_message(schema, "gyroscope", ours.logMonoTime)
    assert _error_of(call, ours) is _error_of(call, theirs)
    # the same message after it (or the same error reading it: an enum number unknown)
    dicts = [log_from_bytes(m.to_bytes(), schema.event) for m in (ours, theirs)]
    errors = [_error_of(lambda r: r.to_dict(), r) for r in dicts]
    assert errors[0] is errors[1]
    if errors[0] is None:
        assert dicts[0].to_dict() == dicts[1].to_dict()


def test_misspelled_fields_and_services_say_so_as_before() -> None:
    msg = new_message("gyroscope")
    with pytest.raises(AttributeError, match="vEgoo"):
        msg.gyroscope.vEgoo = 1.0
    with pytest.raises(ValueError):
        new_message("gyroscope", 3)  # a struct takes no size
    with pytest.raises(KeyError):
        new_message("gyroscop")
    msg = new_message("gyroscope")
    msg.gyroscope.source = "imu1"
    assert msg.gyroscope.source == "imu1"  # enums read as pycapnp reads them
    assert msg.handed_over


def test_pub_master_and_log_writer_take_it(tmp_path: Any) -> None:
    from msgq.logs import LogReader, LogWriter

    msgs = []
    for i in range(3):
        msg = new_message("gyroscope")
        msg.gyroscope.timestampNs = i
        msg.gyroscope.value.x = 0.5
        if i == 2:
            assert msg.gyroscope.source == "unknown"  # handed over
        msgs.append(msg)
    with LogWriter(str(tmp_path / "rec")) as writer:
        for msg in msgs:
            writer.write(msg)
    read = [(e.gyroscope.timestampNs, e.gyroscope.value.x)
            for e in LogReader(str(tmp_path / "rec")) if e.which() == "gyroscope"]
    assert read == [(0, 0.5), (1, 0.5), (2, 0.5)]
    assert msgs[2].handed_over and not msgs[1].handed_over


def test_built_bytes_is_which_and_to_bytes_in_one_call() -> None:
    from msgq.schemas._typed_reader import built_bytes

    msg = new_message("vehicleState")
    msg.vehicleState.speed = 3.0
    assert built_bytes(msg, "vehicleState") == msg.to_bytes()
    assert built_bytes(msg, "gyroscope") is None  # another member
    assert built_bytes(msg.vehicleState, "vehicleState") is None  # not the root
    # handed over to pycapnp: its which() and to_bytes()
    robot = robot_schema()
    arm = new_message("armState", schema=robot)
    listed = next(f.proto.name for f in arm_ours_fields(robot) if f.proto.which() == "slot"
                  and f.proto.slot.type.which() == "list")
    arm.armState.init(listed, 2)
    assert arm.handed_over
    assert built_bytes(arm, "vehicleState") is None
    data = built_bytes(arm, "armState")
    assert data is not None and log_from_bytes(data, robot.event).which() == "armState"
