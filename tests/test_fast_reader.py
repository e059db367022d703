"""Payload views (``schemas/_typed_reader.pyx`` StructView, ``schemas/payload_views.py``):
every field read through the fast path equals pycapnp's, on randomly built messages of
every struct service of msgq's schema and of the robot schema (non-zero defaults, bools
defaulting to true, groups, unions inside structs, enums, Text/Data lists, lists of
structs, deep nesting, unknown enum values, NaN and signed zeros); on damaged copies of
them the fast path reads pycapnp's value, raises pycapnp's exception type, or hands the
message to pycapnp — never anything else; and SubMaster hands out views over real
sockets."""

from __future__ import annotations

import math
import random
import struct
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from helpers import damage_message
from schema_profiles import robot_schema

from msgq.messaging import PubMaster, SubMaster, new_message
from msgq.schemas import Schema, msgq_schema
from msgq.schemas._typed_reader import EnumValue, StructListView, StructView
from msgq.schemas.payload_views import FALLBACK
from msgq.schemas.reader_layouts import NO_DISCRIMINANT

MAX_DEPTH = 5

_INT_RANGES = {"int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1),
               "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1),
               "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1),
               "uint64": (0, 2**64 - 1)}
_SPECIAL_FLOATS = (0.0, -0.0, 1.5, -1e300, math.inf, -math.inf, math.nan)


def _schemas() -> list[tuple[str, Schema]]:
    return [("msgq", msgq_schema()), ("robot", robot_schema())]


def _float(rng: random.Random, kind: str) -> float:
    value = rng.choice(_SPECIAL_FLOATS) if rng.random() < 0.3 else rng.uniform(-1e6, 1e6)
    if kind == "float32" and math.isfinite(value) and abs(value) > 3e38:
        value = 1.0
    return value


def _value(rng: random.Random, type_proto: Any, schema: Any) -> Any:
    """A random value of a primitive, text, data or enum type."""
    kind = type_proto.which()
    if kind == "bool":
        return rng.random() < 0.5
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        return rng.choice((low, high, 0, 1, rng.randint(low, high)))
    if kind in ("float32", "float64"):
        return _float(rng, kind)
    if kind == "text":
        return rng.choice(("", "a", "héllo ✓", "x" * rng.randrange(40)))
    if kind == "data":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(12)))
    if kind == "enum":
        raws = sorted(schema.enumerants.values())
        return rng.choice(raws) if rng.random() < 0.9 else max(raws) + 1 + rng.randrange(5)
    raise AssertionError(kind)


def _fill_list(rng: random.Random, builder: Any, name: str, type_proto: Any, schema: Any,
               depth: int) -> None:
    element = type_proto.list.elementType
    kind = element.which()
    n = rng.randrange(5)
    if kind in ("void", "anyPointer", "interface"):
        return
    lst = builder.init(name, n)
    for i in range(n):
        if kind == "struct":
            if depth < MAX_DEPTH:
                _fill(rng, lst[i], schema.elementType, depth + 1)
        elif kind == "list":
            _fill_list(rng, lst, i, element, schema.elementType, depth + 1)
        else:
            lst[i] = _value(rng, element, schema.elementType if kind == "enum" else None)


def _fill(rng: random.Random, builder: Any, schema: Any, depth: int = 0) -> None:
    """Sets a random subset of the fields of ``builder`` (a struct of ``schema``) to
    random values, one member of its union, recursively."""
    union = list(schema.union_fields)
    chosen = rng.choice(union) if union else None
    for field in schema.fields_list:
        proto = field.proto
        name = proto.name
        if proto.discriminantValue != NO_DISCRIMINANT and name != chosen:
            continue
        if name != chosen and rng.random() < 0.25:
            continue  # unset: its default
        if proto.which() == "group":
            if depth < MAX_DEPTH:
                _fill(rng, getattr(builder, name), field.schema, depth + 1)
            continue
        type_proto = proto.slot.type
        kind = type_proto.which()
        if kind == "void":
            setattr(builder, name, None)
        elif kind == "struct":
            if depth < MAX_DEPTH:
                _fill(rng, builder.init(name), field.schema, depth + 1)
        elif kind == "list":
            if depth < MAX_DEPTH:
                _fill_list(rng, builder, name, type_proto, field.schema, depth + 1)
        elif kind not in ("anyPointer", "interface"):
            setattr(builder, name, _value(rng, type_proto,
                                          field.schema if kind == "enum" else None))


def random_message(rng: random.Random, schema: Schema, service: str) -> bytes:
    """A random Event of ``service`` (a struct or list-of-structs payload)."""
    msg = schema.event.new_message(logMonoTime=rng.randrange(2**64), valid=rng.random() < .5)
    field = schema.event.schema.fields[service]
    if field.proto.slot.type.which() == "list":
        elements = msg.init(service, rng.randrange(5))
        for element in elements:
            _fill(rng, element, field.schema.elementType)
    else:
        _fill(rng, msg.init(service), field.schema)
    return msg.to_bytes()


def _struct_services(schema: Schema) -> list[str]:
    """The services whose payload is a struct or a list of structs (those have views)."""
    fields = schema.event.schema.fields
    out = []
    for s in schema.union_fields:
        proto = fields[s].proto
        kind = proto.slot.type.which() if proto.which() == "slot" else None
        if kind == "struct" or (kind == "list"
                                and proto.slot.type.list.elementType.which() == "struct"):
            out.append(s)
    return out


def _same_scalar(fast: Any, slow: Any, where: str) -> None:
    if isinstance(slow, float):
        assert type(fast) is float, where
        assert struct.pack("<d", fast) == struct.pack("<d", slow), (where, fast, slow)
    elif type(slow).__name__ == "_DynamicEnum":
        if type(fast) is type(slow):  # inside a list of structs: pycapnp's own reader
            assert fast.raw == slow.raw, where
            return
        assert isinstance(fast, EnumValue), where
        assert fast.raw == slow.raw and fast == slow.raw, (where, fast.raw, slow.raw)
        try:
            name = str(slow)
        except RuntimeError:  # a number the schema does not know
            with pytest.raises(RuntimeError):
                str(fast)
        else:
            assert str(fast) == name and fast == name and repr(fast) == repr(slow), where
            assert hash(fast) == hash(slow), where
    elif type(slow).__name__ == "_DynamicStructReader":
        raise AssertionError(f"{where}: a struct where a scalar was expected")
    else:
        assert type(fast) is type(slow) and fast == slow, (where, fast, slow)


def _same_list(fast: Any, slow: Any, where: str, stats: dict[str, int]) -> None:
    assert len(fast) == len(slow), where
    for i in range(len(slow)):
        kind, slow_value = _outcome(lambda: slow[i])  # noqa: B023
        fast_kind, fast_value = _outcome(lambda: fast[i])  # noqa: B023
        assert fast_kind == kind, (f"{where}[{i}]", fast_value, slow_value)
        if kind == "error":
            assert fast_value is slow_value, f"{where}[{i}]"
        else:
            _same(fast_value, slow_value, f"{where}[{i}]", stats)


def _same(fast: Any, slow: Any, where: str, stats: dict[str, int]) -> None:
    kind = type(slow).__name__
    if kind == "_DynamicStructReader":
        _same_struct(fast, slow, where, stats)
    elif kind == "_DynamicListReader":
        if isinstance(fast, list):
            stats["fast lists"] += 1
        if isinstance(fast, StructListView):
            stats["struct lists"] += 1
        _same_list(fast, slow, where, stats)
    else:
        _same_scalar(fast, slow, where)
        stats["fields"] += 1


def _outcome(read: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "value", read()
    except Exception as e:  # pycapnp's errors on damaged bytes
        return "error", type(e)


def _same_struct(fast: Any, slow: Any, where: str, stats: dict[str, int]) -> None:
    """Every field of ``slow`` (a pycapnp struct reader) read through ``fast`` gives the
    same value, or the same exception type."""
    if isinstance(fast, StructView):
        stats["views"] += 1
    schema = slow.schema
    union = list(schema.union_fields)
    active = None
    if union:
        kind, active = _outcome(lambda: slow.which())
        assert _outcome(lambda: fast.which()) == (kind, active), where
        if kind == "error":
            return
    for field in schema.fields_list:
        name = field.proto.name
        if name in union and name != active:
            continue
        kind, slow_value = _outcome(lambda: getattr(slow, name))  # noqa: B023
        fast_kind, fast_value = _outcome(lambda: getattr(fast, name))  # noqa: B023
        assert fast_kind == kind, (f"{where}.{name}", fast_value, slow_value)
        if kind == "error":
            assert fast_value is slow_value, f"{where}.{name}"
            stats["errors"] += 1
        else:
            _same(fast_value, slow_value, f"{where}.{name}", stats)


def _view(schema: Schema, service: str, data: bytes) -> Any:
    return schema.views.view(service, data, lambda: getattr(schema.decode(data), service))


def test_views_read_what_pycapnp_reads_on_random_messages() -> None:
    """Random messages of every struct service of both schemas: every field, read through
    the view (nested views, enums, lists, text, data, groups, union members through
    pycapnp), equals pycapnp's, type included; which(), to_dict() and str() are
    pycapnp's."""
    rng = random.Random(31)
    for profile, schema in _schemas():
        stats = {"views": 0, "fields": 0, "fast lists": 0, "struct lists": 0, "errors": 0}
        for service in _struct_services(schema):
            for _ in range(25):
                data = random_message(rng, schema, service)
                view = _view(schema, service, data)
                assert isinstance(view, (StructView, StructListView)), (profile, service)
                slow = getattr(schema.decode(data), service)
                _same(view, slow, f"{profile}:{service}", stats)
        view, slow = _view(schema, service, data), getattr(schema.decode(data), service)
        assert str(view) == str(slow) and repr(view) == repr(slow)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert repr(view.to_dict()) == repr(slow.to_dict())  # NaN-safe
        assert dir(view) == dir(slow)
        # the fast path did the reading: views all the way down, many fields and lists
        assert stats["views"] > 300 and stats["fields"] > 1000, (profile, stats)
        assert stats["fast lists"] > 20 and stats["errors"] == 0, (profile, stats)
        assert stats["struct lists"] > 50, (profile, stats)


def test_the_robot_schemas_defaults_read_from_an_empty_payload() -> None:
    """Fields never set read as the schema's declared defaults (stored XOR default):
    bools defaulting to true, 1.5, -40 in a group, an enum default, a nested struct's
    defaults, a Text default (left to pycapnp)."""
    schema = robot_schema()
    msg = schema.event.new_message()
    msg.init("armState")
    data = msg.to_bytes()
    view = _view(schema, "armState", data)
    assert isinstance(view, StructView)
    assert view.enabled is True and view.speedLimit == 1.5
    assert view.mode == "position" and view.mode.raw == 1
    assert isinstance(view.gripper, StructView)
    assert view.gripper.closed is True and view.gripper.force == 12.5
    assert view.gripper.temperature == -40
    assert isinstance(view.joints, StructListView) and len(view.joints) == 0
    with pytest.raises(IndexError):
        view.joints[0]
    msg = schema.event.new_message()
    msg.init("cameraFrame")
    data = msg.to_bytes()
    view = _view(schema, "cameraFrame", data)
    assert view.exposure == pytest.approx(0.01) and view.sensor.rateHz == 100.0
    assert view.sensor.name == "unnamed" and view.sensor.level == "ok"


def test_non_struct_payloads_and_other_members_fall_back() -> None:
    """A Data-list or text payload has no view; bytes whose union holds another member
    are handed back (pycapnp raises on them, as for any reader)."""
    schema = robot_schema()
    msg = schema.event.new_message()
    msg.init("rawChunks", 2)
    assert schema.views.view("rawChunks", msg.to_bytes(), lambda: None) is FALLBACK
    msg = schema.event.new_message()
    msg.missionLog = "go"
    assert schema.views.view("missionLog", msg.to_bytes(), lambda: None) is FALLBACK
    msg = schema.event.new_message()
    msg.init("armState")
    assert schema.views.view("imu", msg.to_bytes(), lambda: None) is FALLBACK


def test_damaged_messages_read_as_pycapnp_or_fall_back() -> None:
    """Random damage to every byte (segment table, pointers, tags, data) and truncation:
    identify() is EventLayout.identify's answer; a view is made only where pycapnp takes
    the message, and then every field read through it is pycapnp's value or pycapnp's
    exception type. Nothing crashes or reads out of bounds."""
    rng = random.Random(29)
    outcomes = {"view": 0, "fallback": 0, "not an event": 0}
    for profile, schema in _schemas():
        stats = {"views": 0, "fields": 0, "fast lists": 0, "struct lists": 0, "errors": 0}
        for service in _struct_services(schema):
            good = random_message(rng, schema, service)
            for _ in range(60):
                data = damage_message(rng, good, truncate=0.05)
                identified = schema.views.identify(data)
                assert identified == schema.layout.identify(data), (profile, service)
                if identified is None:
                    outcomes["not an event"] += 1
                    continue
                member = identified[2]
                if member not in _struct_services(schema):
                    continue
                view = _view(schema, member, data)
                if view is FALLBACK:
                    outcomes["fallback"] += 1
                    continue
                outcomes["view"] += 1
                slow = getattr(schema.decode(data), member)  # pycapnp takes the message
                _same(view, slow, f"{profile}:{member}", stats)
        assert stats["errors"] > 5, (profile, stats)  # damage pycapnp refuses, read alike
    assert min(outcomes.values()) > 50, outcomes


def test_submaster_hands_out_views_with_pycapnps_values() -> None:
    """Over real sockets: sm[s] of a struct service is a view; its fields, nested
    struct, enum, list and which()/to_dict() (pycapnp, decoded once) are the sent ones;
    a list-of-structs payload is a list view."""
    pm = PubMaster(["vehicleState", "can"])
    sm = SubMaster(["vehicleState", "can"])
    try:
        pm.wait_for_readers_to_update("vehicleState", 5.0)
        pm.wait_for_readers_to_update("can", 5.0)
        msg = new_message("vehicleState", valid=True)
        msg.vehicleState.speed = 12.5
        msg.vehicleState.gear = "drive"
        msg.vehicleState.cruiseState.setSpeed = 30.0
        msg.vehicleState.faults = ["a", "b"]
        pm.send("vehicleState", msg)
        can = new_message("can", 1, valid=True)
        can.can[0].address = 0x123
        pm.send("can", can)
        for _ in range(100):
            sm.update(100)
            if sm.updated["vehicleState"] or sm.recv_frame["vehicleState"] > 0:
                if sm.recv_frame["can"] > 0 or sm.updated["can"]:
                    break
        vs = sm["vehicleState"]
        assert isinstance(vs, StructView) and sm.valid["vehicleState"]
        assert vs.speed == 12.5 and vs.gear == "drive" and vs.cruiseState.setSpeed == 30.0
        assert vs.faults == ["a", "b"] and vs.to_dict()["speed"] == 12.5
        assert isinstance(sm["can"], StructListView) and len(sm["can"]) == 1
        assert sm["can"][0].address == 0x123 and [f.address for f in sm["can"]] == [0x123]
    finally:
        sm.close()


def test_a_list_view_indexes_and_iterates_as_pycapnps_list() -> None:
    """Negative indexes count modulo the length, past the end is IndexError, iteration
    stops at the end, str()/repr() are pycapnp's: what pycapnp's list reader does."""
    schema = robot_schema()
    msg = schema.event.new_message()
    frames = msg.init("canFrames", 3)
    for i, frame in enumerate(frames):
        frame.address = 10 + i
    data = msg.to_bytes()
    view = _view(schema, "canFrames", data)
    slow = schema.decode(data).canFrames
    assert isinstance(view, StructListView)
    for index in (0, 2, -1, -3, -4, -7):
        assert view[index].address == slow[index].address, index
    for lst in (view, slow):
        with pytest.raises(IndexError):
            lst[3]
    assert [f.address for f in view] == [f.address for f in slow] == [10, 11, 12]
    assert str(view) == str(slow) and repr(view) == repr(slow)
    assert view[1].src == 128 and view[1].dat == b""  # defaults inside list elements
    msg = schema.event.new_message()
    msg.init("canFrames", 0)
    data = msg.to_bytes()
    empty, slow = _view(schema, "canFrames", data), schema.decode(data).canFrames
    assert len(empty) == len(slow) == 0 and list(empty) == []
    for lst in (empty, slow):
        with pytest.raises(ZeroDivisionError):
            lst[-1]


def test_a_submaster_with_views_is_freed_without_the_cycle_collector() -> None:
    """A view asks pycapnp through a callable that must not hold the SubMaster: a
    SubMaster -> view -> SubMaster cycle would keep its sockets open until the cycle
    collector ran."""
    import gc
    import weakref

    pm = PubMaster(["vehicleState"])
    sm = SubMaster(["vehicleState"])
    pm.wait_for_readers_to_update("vehicleState", 5.0)
    pm.send("vehicleState", new_message("vehicleState", valid=True))
    for _ in range(100):
        sm.update(100)
        if sm.seen["vehicleState"]:
            break
    assert isinstance(sm["vehicleState"], StructView)
    assert sm["vehicleState"].to_dict()["speed"] == 0.0  # the pycapnp reader made too
    gc.disable()
    try:
        ref = weakref.ref(sm)
        del sm
        assert ref() is None
    finally:
        gc.enable()
