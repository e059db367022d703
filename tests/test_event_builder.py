"""msgq's Event builder (what new_message returns; schemas/_event_builder.pyx): the same
messages as pycapnp's builder for the same calls, on msgq's schema and on the robot
schema (non-zero defaults, groups, a union inside a struct), handles kept across
re-inits, union switches and the hand-over included; pycapnp's behaviour, values and
errors, for everything it hands over; structs assigned between it and pycapnp's builder;
an honest type (``type(x) is x.__class__``) for every object msgq hands out; PubMaster
and LogWriter take it."""

from __future__ import annotations

import math
import random
import struct
from typing import Any

import capnp
import pytest
from schema_profiles import robot_schema

from msgq.schemas import Schema, default_schema, log_from_bytes, new_message
from msgq.schemas._event_builder import StaleBuilderError, StructBuilder, built_bytes

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
        assert type(ours) is StructBuilder is ours.__class__  # honest, not pycapnp's
        assert not isinstance(ours, capnp.lib.capnp._DynamicStructBuilder)
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
    """A struct builder taken before the hand-over and still in the message then keeps
    writing into its own struct (pycapnp's twin of it)."""
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


# -- handles kept across re-inits, union switches and the hand-over ------------------------


class _Handle:
    """A struct (or group) builder kept by the program, ours and pycapnp's side by side:
    ``path`` (field names from the root), the versions of its struct fields when it was
    taken (``taken``), and whether it was taken after the hand-over (pycapnp's objects
    then, never stale)."""

    def __init__(self, ours: Any, theirs: Any, schema: Any, path: tuple[str, ...],
                 taken: tuple[int, ...], after: bool) -> None:
        self.ours, self.theirs, self.schema = ours, theirs, schema
        self.path, self.taken, self.after = path, taken, after
        self.at_hand_over = True  # whether it was in the message when it handed over


class _Model:
    """What the program did, to say which handles are still in the message: ``version``
    of each struct field path (bumped by an init), ``active`` union member of each
    struct path."""

    def __init__(self, event: Any, service: str) -> None:
        self.version: dict[tuple[str, ...], int] = {}
        self.active: dict[tuple[str, ...], str] = {(): service}
        self.schemas: dict[tuple[str, ...], Any] = {(): event}

    def default_member(self, path: tuple[str, ...]) -> str | None:
        schema = self.schemas[path]
        for name in schema.union_fields:
            if schema.fields[name].proto.discriminantValue == 0:
                return name
        return None

    def initialised(self, path: tuple[str, ...]) -> None:
        """A new struct at ``path``: its unions, and those of what it holds, as new."""
        self.version[path] = self.version.get(path, 0) + 1
        for known in [p for p in self.active if p[:len(path)] == path]:
            del self.active[known]

    def member(self, path: tuple[str, ...]) -> str | None:
        return self.active.get(path, self.default_member(path))

    def versions(self, path: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(self.version.get(path[:i + 1], 0) for i in range(len(path)))

    def current(self, handle: _Handle) -> bool:
        """Whether the handle's struct is in the message now: no struct on its path was
        initialised again since it was taken, and each union on it holds its member."""
        if handle.after:
            return True
        if self.versions(handle.path) != handle.taken:
            return False
        for i, name in enumerate(handle.path):
            if name in self.schemas[handle.path[:i]].union_fields \
                    and self.member(handle.path[:i]) != name:
                return False
        return True


def _struct_fields(schema: Any) -> list[tuple[str, str]]:
    """(name, "struct" | "group") of the fields of ``schema`` the builder follows."""
    out = []
    for field in schema.fields_list:
        proto = field.proto
        if proto.which() == "group":
            out.append((proto.name, "group"))
        elif proto.slot.type.which() == "struct" and not proto.slot.hadExplicitDefault:
            out.append((proto.name, "struct"))
    return out


def _scalar_fields(schema: Any) -> list[tuple[str, str, Any]]:
    out = []
    for field in schema.fields_list:
        proto = field.proto
        if proto.which() == "slot":
            kind = proto.slot.type.which()
            if kind in ("bool", "enum", "float32", "float64", *_INT_RANGES, *_UINT_RANGES):
                out.append((proto.name, kind, field))
    return out


def _handles_program(rng: random.Random, schema: Schema, service: str) -> None:
    """One random program on msgq's builder and pycapnp's: handles taken (get, init),
    kept, written through after their struct was initialised again or their union
    switched, the message handed over once at a random step (``to_dict()`` or
    ``as_pycapnp()``); then the same message, and every stale handle refused after the
    hand-over (StaleBuilderError) and only then."""
    ours = new_message(service, schema=schema)
    theirs = _pycapnp_message(schema, service, ours.logMonoTime)
    event = schema.event.schema
    model = _Model(event, service)
    handles = [_Handle(ours, theirs, event, (), (), False)]
    handed_over = False
    hand_over_at = rng.randrange(4, 40)
    for step in range(40):
        if step == hand_over_at:
            if rng.random() < 0.5:
                ours.to_dict()
            else:
                rng.choice([h for h in handles if h.at_hand_over]).ours.as_pycapnp()
            handed_over = True
        handle = rng.choice(handles)
        current = model.current(handle)
        op = rng.random()
        if op < 0.4 and current:  # take a struct or group of it
            choices = [(n, k) for n, k in _struct_fields(handle.schema)
                       if n not in handle.schema.union_fields
                       or model.member(handle.path) == n]
            if not choices:
                continue
            name, kind = rng.choice(choices)
            init = kind == "struct" and rng.random() < 0.5
            path = handle.path + (name,)
            if init:
                model.initialised(path)
            if name in handle.schema.union_fields:
                model.active[handle.path] = name
            sub = handle.schema.fields[name].schema
            model.schemas[path] = sub
            if init:
                pair = handle.ours.init(name), handle.theirs.init(name)
            else:
                pair = getattr(handle.ours, name), getattr(handle.theirs, name)
            handles.append(_Handle(*pair, sub, path, model.versions(path), handed_over))
        elif op < 0.55 and current:  # init a struct field (a union member: a switch)
            choices = [n for n, k in _struct_fields(handle.schema) if k == "struct"]
            if not choices:
                continue
            name = rng.choice(choices)
            path = handle.path + (name,)
            model.initialised(path)
            model.schemas[path] = handle.schema.fields[name].schema
            if name in handle.schema.union_fields:
                model.active[handle.path] = name
            handle.ours.init(name)
            handle.theirs.init(name)
        else:  # set a number, bool or enum, through any handle, stale ones included
            fields = _scalar_fields(handle.schema)
            if not fields:
                continue
            name, kind, field = rng.choice(fields)
            value = _value(rng, kind, field)
            if handed_over and not handle.at_hand_over:
                with pytest.raises(StaleBuilderError, match="take it again"):
                    setattr(handle.ours, name, value)
                continue
            setattr(handle.ours, name, value)
            setattr(handle.theirs, name, value)
            if name in handle.schema.union_fields and current:
                model.active[handle.path] = name
        if not handed_over:
            for h in handles:  # what is current when it hands over decides
                h.at_hand_over = model.current(h)
    assert ours.handed_over == handed_over
    got = log_from_bytes(ours.to_bytes(), schema.event).to_dict()
    assert got == log_from_bytes(theirs.to_bytes(), schema.event).to_dict()


@pytest.mark.parametrize("profile", ["msgq", "robot"])
def test_handles_across_reinit_switch_and_hand_over_match_pycapnp(profile: str) -> None:
    schema = default_schema() if profile == "msgq" else robot_schema()
    event = schema.event.schema
    services = sorted(name for name in schema.union_fields
                      if event.fields[name].proto.slot.type.which() == "struct")
    rng = random.Random(20261128)
    for round_ in range(300):
        _handles_program(rng, schema, services[round_ % len(services)])


def test_a_handle_kept_across_a_reinit_writes_its_old_struct_then_is_refused() -> None:
    """Before the hand-over a handle of a struct initialised again writes into the struct
    left behind (as pycapnp's does: invisible); after it, using the handle raises
    StaleBuilderError, where the message used to find the new struct by its field names
    and write there."""
    msg = new_message("vehicleState")
    old = msg.vehicleState
    old_wheels = old.wheelSpeeds
    msg.init("vehicleState")
    msg.vehicleState.speed = 2.0
    old.speed = 9.0  # the struct left behind
    old_wheels.frontLeft = 9.0
    assert msg.vehicleState.speed == 2.0
    kept = msg.vehicleState  # in the message when it hands over: stays valid
    msg.to_dict()  # hands over
    assert msg.handed_over
    with pytest.raises(StaleBuilderError, match="initialised again"):
        old.speed = 5.0
    with pytest.raises(StaleBuilderError):
        assert old_wheels.frontLeft is None
    with pytest.raises(StaleBuilderError):
        old.as_pycapnp()
    kept.speed = 3.0
    kept.wheelSpeeds.frontLeft = 4.0
    event = log_from_bytes(msg.to_bytes())
    assert event.vehicleState.speed == 3.0 and event.vehicleState.wheelSpeeds.frontLeft == 4.0
    assert "no longer in its message" in repr(old)


def test_a_handle_kept_across_a_union_switch_is_refused_after_the_hand_over() -> None:
    schema = robot_schema()
    msg = new_message("armState", schema=schema)
    arm = msg.armState
    msg.init("diagnostics")  # the Event's union now holds another member
    arm_schema = schema.event.schema.fields["armState"].schema
    arm_struct_fields = [n for n, k in _struct_fields(arm_schema)]
    assert arm_struct_fields  # (the robot schema's armState has nested structs)
    msg.as_pycapnp()
    with pytest.raises(StaleBuilderError, match="union switched"):
        getattr(arm, arm_struct_fields[0])
    assert msg.which() == "diagnostics"
    # a union inside a struct (a group): its struct member switched to a void one
    msg = new_message("diagnostics", schema=schema)
    source = msg.diagnostics.source
    sensor = source.init("sensor")
    sensor.rateHz = 50.0
    source.none = None
    sensor.rateHz = 25.0  # before the hand-over: the struct left behind, as pycapnp's
    assert source.which() == "none" and not msg.handed_over
    msg.diagnostics.level = "ok"  # an enum by name: still msgq's
    msg.to_dict()
    with pytest.raises(StaleBuilderError, match="union switched"):
        sensor.rateHz = 10.0
    source.init("sensor").rateHz = 5.0  # the group itself is still in the message
    assert log_from_bytes(msg.to_bytes(), schema.event).diagnostics.source.sensor.rateHz \
        == 5.0


def test_structs_assign_between_msgq_and_pycapnp_builders() -> None:
    schema = default_schema()
    ours = new_message("vehicleState")
    ours.vehicleState.speed = 1.25
    ours.vehicleState.wheelSpeeds.rearLeft = 2.5
    theirs = schema.event.new_message()
    # pycapnp's setters take pycapnp's objects only (they check type()): ask for it
    with pytest.raises(Exception, match="unsupported type"):
        theirs.vehicleState = new_message("vehicleState").vehicleState
    theirs.vehicleState = ours.vehicleState.as_pycapnp()
    assert theirs.vehicleState.speed == 1.25
    assert theirs.vehicleState.wheelSpeeds.rearLeft == 2.5
    assert ours.vehicleState.speed == 1.25  # ours is still the same message
    # and the reverse: a pycapnp struct (builder or reader) into ours
    back = new_message("vehicleState")
    back.vehicleState = theirs.vehicleState
    assert back.handed_over and back.which() == "vehicleState"
    assert log_from_bytes(back.to_bytes()).vehicleState.wheelSpeeds.rearLeft == 2.5
    reader = log_from_bytes(theirs.to_bytes())
    again = new_message("vehicleState")
    again.vehicleState = reader.vehicleState
    assert log_from_bytes(again.to_bytes()).vehicleState.speed == 1.25


def _assert_honest(obj: Any, where: str) -> None:
    assert type(obj) is obj.__class__, (where, type(obj), obj.__class__)


def _walk_view(view: Any, schema: Any, where: str, depth: int = 3) -> int:
    """Checks every field of a view (and of its nested views) for an honest type; the
    number of objects checked."""
    _assert_honest(view, where)
    checked = 1
    for field in schema.fields_list:
        name = field.proto.name
        if name in schema.union_fields and view.which() != name:
            continue
        try:
            value = getattr(view, name)
        except Exception:  # noqa: BLE001 - an unknown enum number: nothing handed out
            continue
        _assert_honest(value, f"{where}.{name}")
        checked += 1
        kind = field.proto.which() if field.proto.which() == "group" else \
            field.proto.slot.type.which()
        if depth and kind in ("struct", "group"):
            checked += _walk_view(value, field.schema, f"{where}.{name}", depth - 1)
        elif kind == "list" and len(value) and hasattr(value[0], "schema"):
            checked += _walk_view(value[0], field.schema.elementType, f"{where}.{name}[0]",
                                  depth - 1) if depth else 0
    return checked


def test_every_object_msgq_hands_out_has_an_honest_type(prefix: str) -> None:
    """``type(x) is x.__class__`` for what msgq's public API returns: builders (root,
    nested, group, handed over), readers, views (struct, nested, list, element, enum),
    sockets, PubMaster and SubMaster and SubMaster's values."""
    import msgq
    from msgq.messaging import PubMaster, SubMaster, decode_event, recv_one

    schema = default_schema()
    ours = new_message("vehicleState")
    for obj, where in ((ours, "root"), (ours.vehicleState, "nested"),
                       (ours.vehicleState.wheelSpeeds, "nested twice"),
                       (new_message(), "no member"),
                       (new_message("can", 2), "list member (pycapnp's)"),
                       (new_message("vehicleState", valid=True), "keywords (pycapnp's)")):
        _assert_honest(obj, where)
    robot = robot_schema()
    grouped = new_message("armState", schema=robot).armState
    for field in robot.event.schema.fields["armState"].schema.fields_list:
        if field.proto.which() == "group":
            _assert_honest(getattr(grouped, field.proto.name), "group")
    handed = new_message("gyroscope")
    assert handed.gyroscope.source == "unknown"  # an enum read: hands over
    assert handed.handed_over
    for obj, where in ((handed, "handed over"), (handed.gyroscope, "pycapnp's nested"),
                       (handed.as_pycapnp(), "as_pycapnp")):
        _assert_honest(obj, where)
    ctx = msgq.Context()
    pm = PubMaster(["vehicleState", "can", "gyroscope"])
    sm = SubMaster(["vehicleState", "can", "gyroscope"])
    sub = msgq.sub_sock("vehicleState", timeout=1000)
    poller = msgq.Poller()
    try:
        for obj, where in ((ctx, "Context"), (pm, "PubMaster"), (sm, "SubMaster"),
                           (sub, "sub_sock"), (poller, "Poller"),
                           (pm.sock["vehicleState"], "PubMaster's socket")):
            _assert_honest(obj, where)
        pm.wait_for_readers_to_update("vehicleState", 5.0)
        frames = new_message("can", 2)
        frames.can[0].address = 3
        gyro = new_message("gyroscope")
        gyro.gyroscope.source = "imu1"
        ours.vehicleState.speed = 1.5
        sent = ours.to_bytes()
        for service, msg in (("vehicleState", ours), ("can", frames), ("gyroscope", gyro)):
            pm.send(service, msg)
        received = recv_one(sub)
        _assert_honest(received, "recv_one")
        _assert_honest(decode_event(sent), "decode_event")
        _assert_honest(log_from_bytes(sent), "log_from_bytes")
        deadline = __import__("time").monotonic() + 5
        while not all(sm.updated.values()) and __import__("time").monotonic() < deadline:
            sm.update(100)
        checked = 0
        for service in ("vehicleState", "can", "gyroscope"):
            value = sm[service]
            _assert_honest(value, f"sm[{service!r}]")
            _assert_honest(value.as_pycapnp(), f"sm[{service!r}].as_pycapnp()")
            field = schema.event.schema.fields[service]
            if service == "can":
                checked += _walk_view(value[0], field.schema.elementType, "sm['can'][0]")
            else:
                checked += _walk_view(value, field.schema, f"sm[{service!r}]")
        assert checked > 20
        for name in ("updated", "alive", "valid", "freq_ok", "recv_time", "logMonoTime"):
            _assert_honest(getattr(sm, name), f"sm.{name}")
    finally:
        pm.close()
        sm.close()
        sub.close() if hasattr(sub, "close") else None
