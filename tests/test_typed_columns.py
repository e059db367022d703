"""The typed columns read straight into Arrow (``_typed_reader.read_member_arrow``, and
``MemberColumn`` through ``DecodedColumn``, one array from many buffers, which the lake's
build uses): for every service of both schema
profiles, the array equals what ``pa.array`` makes of the read path's values
(``_Decoder.values``: read_member, pycapnp for what it leaves), nulls, unset structs,
empty lists, unions, defaults and enum numbers the schema does not know included; damaged
bytes (bits flipped, bytes replaced, messages cut, pointers out of range) never crash,
fall back exactly where read_member does and give the read path's problems."""

from __future__ import annotations

import math
import random
import re
import struct
from typing import Any

import pytest
from helpers import damage_message

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

import numpy as np  # noqa: E402
from pyspark.sql.pandas.types import to_arrow_type  # noqa: E402
from test_spark_lake import _random_event  # noqa: E402  (the lake tests' generator)

from msgq.schemas import Schema  # noqa: E402
from msgq.schemas._typed_reader import (  # noqa: E402
    FALLBACK,
    MemberColumn,
    read_member,
    read_member_arrow,
)
from msgq.spark.capnp_types import member_plan  # noqa: E402
from msgq.spark.datasource import member_decoder, read_spec  # noqa: E402


def _same(a: Any, b: Any) -> bool:
    """Python values of two arrays are equal: floats bit for bit, NaNs alike (Arrow's
    equals() takes no NaN as equal to itself)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _without_stack(problems: dict[int, str]) -> dict[int, str]:
    """Problems without the addresses of kj's stack trace (they name the caller)."""
    return {i: re.sub(r" stack: [0-9a-f ]*$", "", p) for i, p in problems.items()}


def _packed(rng: random.Random, messages: list[bytes]) -> tuple[bytes, Any, Any]:
    """The messages in one buffer, with gaps of random bytes: (buffer, starts, lengths).
    The read path reads each message's own bytes only; a read of the buffer past a
    message would read garbage, and differ."""
    buffer = bytearray()
    starts, lengths = [], []
    for m in messages:
        buffer += bytes(rng.randrange(256) for _ in range(rng.randrange(17)))
        starts.append(len(buffer))
        lengths.append(len(m))
        buffer += m
    return bytes(buffer), np.array(starts, np.int64), np.array(lengths, np.int64)


def _check(schema: Schema, service: str, messages: list[bytes], rng: random.Random
           ) -> tuple[int, int]:
    """The column of ``messages`` read into Arrow equals the read path's; returns (the
    messages left to pycapnp, the undecodable ones)."""
    decoder = member_decoder(read_spec(schema), service)
    assert decoder is not None, service
    kind = to_arrow_type(member_plan(schema.event.schema, service).spark_type)
    buffer, starts, lengths = _packed(rng, messages)
    decoded, values, failed = decoder.values(buffer, starts.tolist(), lengths.tolist(),
                                             schema)
    column: list[Any] = [None] * len(messages)
    for i, value in zip(decoded, values, strict=True):
        column[i] = value
    expected = pa.array(column, type=kind)
    got, got_failed = decoder.arrow(buffer, starts, lengths, schema, kind)
    got.validate(full=True)
    assert got.type == kind, service
    assert _same(got.to_pylist(), expected.to_pylist()), service
    assert got.null_count == expected.null_count == len(failed), service
    assert _without_stack(got_failed) == _without_stack(failed), service
    # the same messages added to one column from several buffers (the lake's build: a
    # scanner batch at a time): the same array and problems, positions over them all
    column_of_parts = decoder.decoded_column(schema, kind)
    at = 0
    while at < len(messages):
        part = messages[at:at + rng.randrange(0, 9)]
        column_of_parts.add(*_packed(rng, part))
        at += len(part)
    assert column_of_parts.count == len(messages)
    parts, parts_failed = column_of_parts.finish()
    parts.validate(full=True)
    assert _same(parts.to_pylist(), expected.to_pylist()), service
    assert _without_stack(parts_failed) == _without_stack(failed), service
    left = len(messages)
    if decoder.layout is not None:
        _, fallback = read_member_arrow(buffer, starts, lengths, decoder.layout, kind)
        assert fallback == [i for i, m in enumerate(messages)
                            if read_member(m, decoder.layout) is FALLBACK], service
        left = len(fallback)
    return left, len(failed)


def _services(schema: Schema) -> list[str]:
    spec = read_spec(schema)
    return [s for s in schema.union_fields if member_decoder(spec, s) is not None]


def test_columns_equal_the_read_paths_values_on_random_messages(
        schema_profile: Schema) -> None:
    """Every service with a column: random messages (every kind of field, unions, unset
    fields read as defaults, empty lists, unknown enum numbers), then the same with
    another service's messages among them (the root union holds another member)."""
    rng = random.Random(42)
    services = _services(schema_profile)
    walked = followed = 0
    for service in services:
        messages = [_random_event(rng, schema_profile, service, 1000 + i) for i in range(40)]
        left, failed = _check(schema_profile, service, messages, rng)
        if member_decoder(read_spec(schema_profile), service).layout is not None:
            walked += len(messages) - left
            followed += len(messages)
        other = rng.choice([s for s in services if s != service])
        mixed = messages[:5] + [_random_event(rng, schema_profile, other, 1)] + messages[5:10]
        _check(schema_profile, service, mixed, rng)
    assert walked > 0.9 * followed  # the common messages are read into Arrow


def test_unset_members_and_defaults(schema_profile: Schema) -> None:
    """A member whose pointer is null (a struct of defaults, an empty list or text) and
    a member initialised but empty: its defaults, as the read path gives them."""
    rng = random.Random(7)
    event = schema_profile.event
    for service in _services(schema_profile):
        field = event.schema.fields[service]
        if field.proto.which() != "slot" or field.proto.slot.type.which() not in (
                "struct", "list", "text", "data"):
            continue
        empty = event.new_message()
        if field.proto.slot.type.which() == "struct":
            empty.init(service)
        else:
            empty.init(service, 0) if field.proto.slot.type.which() == "list" \
                else setattr(empty, service, "" if field.proto.slot.type.which() == "text"
                             else b"")
        data = bytearray(empty.to_bytes())
        null = bytearray(data)
        root = 8 + 8 + 8 * (struct.unpack_from("<i", data, 8)[0] >> 2)  # root's data
        data_words = struct.unpack_from("<H", data, 12)[0]
        struct.pack_into("<Q", null, root + 8 * (data_words + field.proto.slot.offset), 0)
        _check(schema_profile, service, [bytes(data), bytes(null)], rng)


def test_unknown_enum_numbers_are_their_numbers_as_text(robot: Schema) -> None:
    """An enum number the schema does not know reads as the number, as text (the read
    path's), in a field and in the union's neighbour fields alike."""
    msg = robot.event.new_message()
    arm = msg.init("armState")
    arm.mode = 9
    data = msg.to_bytes()
    decoder = member_decoder(read_spec(robot), "armState")
    kind = to_arrow_type(member_plan(robot.event.schema, "armState").spark_type)
    column, failed = decoder.arrow(data, [0], [len(data)], robot, kind)
    assert not failed
    assert column.field("mode").to_pylist() == ["9"]
    assert column.field("gripper").to_pylist() == [
        {"closed": True, "force": 12.5, "temperature": -40}]
    _check(robot, "armState", [data], random.Random(1))


def test_damaged_messages_fall_back_as_read_member_and_never_crash(
        schema_profile: Schema) -> None:
    """Bits flipped, bytes replaced, messages cut anywhere (pointers out of range, bad
    tags, lengths past the segment): the same values and problems as the read path, the
    same messages left to pycapnp; nothing read outside a message (the messages lie in
    one buffer between random bytes)."""
    rng = random.Random(1234)
    left = failed = total = 0
    for service in _services(schema_profile):
        good = [_random_event(rng, schema_profile, service, 5 + i) for i in range(10)]
        damaged = [damage_message(rng, rng.choice(good), truncate=0.2) for _ in range(40)]
        damaged += [m[:rng.randrange(len(m))] for m in good[:4]]
        n, bad = _check(schema_profile, service, damaged, rng)
        left += n
        failed += bad
        total += len(damaged)
    assert failed > 0 and left > failed  # damage pycapnp refuses, and some it reads


def test_bad_arguments_are_refused_in_one_line(schema_profile: Schema) -> None:
    """A message past the buffer, or an Arrow type of another plan: a ValueError."""
    services = _services(schema_profile)
    service = next(s for s in services
                   if member_decoder(read_spec(schema_profile), s).layout is not None)
    decoder = member_decoder(read_spec(schema_profile), service)
    kind = to_arrow_type(member_plan(schema_profile.event.schema, service).spark_type)
    data = _random_event(random.Random(3), schema_profile, service, 1)
    with pytest.raises(ValueError, match="not inside the buffer"):
        read_member_arrow(data, [1], [len(data)], decoder.layout, kind)
    with pytest.raises(ValueError, match="not inside the buffer"):
        read_member_arrow(data, [-1], [4], decoder.layout, kind)
    with pytest.raises(ValueError):
        read_member_arrow(data, [0], [len(data)], decoder.layout, pa.int64())
    empty, left = read_member_arrow(b"", [], [], decoder.layout, kind)
    assert len(empty) == 0 and left == [] and empty.type == kind
    column = MemberColumn(decoder.layout, kind)
    column.add(data, [0], [len(data)])
    with pytest.raises(ValueError, match="not inside the buffer"):
        column.add(data, [0, 1], [len(data), len(data)])  # refused whole: nothing added
    assert column.count == 1
    assert len(column.finish()[0]) == 1
    with pytest.raises(ValueError, match="finished"):
        column.finish()
