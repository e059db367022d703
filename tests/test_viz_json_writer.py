"""The compiled JSON writer of the MCAP export (msgq.viz.json_writer over
msgq.viz._json_writer): the same text, byte for byte, as the EventConverter makes through
pycapnp, for every event of the test recordings on both schema profiles, random events of
every service, hand-made float extremes and damaged bytes (never a crash: the writer
leaves what it does not follow to the old path)."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from schema_profiles import write_loggerd_log
from test_viz_export import events_of, read_mcap, sources, write_recording

from msgq.logs import LogReader, MessageBatch
from msgq.schemas import Schema, msgq_schema
from msgq.viz import _json_writer as native
from msgq.viz.json_schema import WHICH, event_converter
from msgq.viz.json_writer import batch_json, json_program
from msgq.viz.mcap_export import export_mcap


def old_text(schema: Schema, data: bytes) -> bytes:
    """The export's text of one message the old way: pycapnp's reader as LogReader makes
    it for a batch (read_multiple_bytes, no eager check), and the EventConverter."""
    converter = event_converter(schema)
    message = next(iter(schema.event.read_multiple_bytes(
        data, traversal_limit_in_words=8 * 1024 * 1024)))
    value = converter.to_json(message)
    return converter.dumps(value[WHICH] or schema.union_fields[0], value)


def batches_of(schema: Schema, paths: list[str]) -> list[MessageBatch]:
    found = []
    for path in paths:
        reader = LogReader(path, schema=schema, skip_corrupt=True, warn=False)
        found += [b for b in reader.segment_batches(path) if type(b) is MessageBatch]
    return found


def segment_files(schema: Schema, folder: Path) -> list[str]:
    return LogReader(sources(schema, folder), schema=schema).paths


def convert(schema: Schema, messages: list[bytes]) -> list[bytes | None]:
    """The writer's texts of ``messages`` laid back to back in one buffer (as a batch)."""
    data = b"".join(messages)
    lengths = np.array([len(m) for m in messages], np.uint32)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    program = json_program(schema)
    n = len(messages)
    style = np.zeros(n, np.uint8)
    for i, message in enumerate(messages):  # the encoder the old path would pick
        try:
            value = event_converter(schema).to_json(next(iter(
                schema.event.read_multiple_bytes(message))))
            style[i] = program.orjson_style.get(value[WHICH] or schema.union_fields[0])
        except Exception:  # noqa: BLE001, S112 - damaged: whichever, the text must match
            continue
    return native.convert_batch(program.root, data, offsets, lengths, np.arange(n),
                                np.full(n, -1, np.int16), style)


def test_every_event_of_the_recordings_is_the_old_text(schema_profile: Schema,
                                                       tmp_path: Path) -> None:
    schema = schema_profile
    write_recording(schema, tmp_path, events_of(schema, per_service=6))
    program = json_program(schema)
    compared = 0
    paths = segment_files(schema, tmp_path)
    for batch in batches_of(schema, paths):
        texts = batch_json(program, batch, np.arange(len(batch)))
        for i, text in enumerate(texts):
            at, size = int(batch.offset[i]), int(batch.length[i])
            assert text is not None, f"{batch.services[batch.service[i]]} fell back"
            assert text == old_text(schema, batch.data[at:at + size])
            compared += 1
    # every event the reader reads (the writer's logStart per segment included)
    assert compared == sum(1 for _ in LogReader(paths, schema=schema)) >= \
        6 * len(schema.union_fields)


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_random_events_of_every_service(schema_profile: Schema, seed: int) -> None:
    schema = schema_profile
    messages = events_of(schema, per_service=5, seed=seed)
    texts = convert(schema, messages)
    fell_back = [schema.decode(m).which() for m, t in zip(messages, texts, strict=True)
                 if t is None]
    assert fell_back == []
    for message, text in zip(messages, texts, strict=True):
        assert text == old_text(schema, message)


def _double(rng: random.Random) -> float:
    """A double from random bits (every exponent), or from a few decades (every format
    switch of repr and orjson: 1e-5, 1e-4, 1e16 ...)."""
    while True:
        if rng.random() < 0.5:
            value = struct.unpack("<d", rng.randbytes(8))[0]
        else:
            value = rng.uniform(1, 10) * 10.0 ** rng.randrange(-8, 20) * rng.choice((1, -1))
        if value == value:
            return value


def test_floats_are_written_as_the_encoder_in_use_writes_them() -> None:
    """Float64 and Float32 values over the whole range, in a service whose text goes
    through orjson (shortest digits, 1e16 — 1e+16 from orjson 3.13 on —, 0.00001) and,
    with a NaN among them, through the standard library's encoder (1e+16, 1e-05)."""
    schema = msgq_schema()
    program = json_program(schema)
    assert program.orjson_style["gnssMeasurements"]
    rng = random.Random(7)
    messages = []
    for n in range(40):
        msg = schema.event.new_message()
        gnss = msg.init("gnssMeasurements")
        gnss.gpsTimeOfWeek = float("nan") if n % 4 == 0 else _double(rng)
        for item in gnss.init("measurements", 50):
            item.pseudorange = _double(rng)
            item.carrierPhaseCycles = rng.choice((0.0, -0.0, 1e16, 1e-5, 9.999e-5, 1e-4,
                                                  5e-324, 1.7976931348623157e308))
            item.cn0DbHz = struct.unpack("<f", rng.randbytes(4))[0] if rng.random() < 0.5 \
                else rng.uniform(-1e6, 1e6)
        messages.append(msg.to_bytes())
    data = b"".join(messages)
    lengths = np.array([len(m) for m in messages], np.uint32)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    n = len(messages)
    texts = native.convert_batch(program.root, data, offsets, lengths, np.arange(n),
                                 np.full(n, program.discriminant["gnssMeasurements"], np.int16),
                                 np.ones(n, np.uint8))
    for message, text in zip(messages, texts, strict=True):
        assert text == old_text(schema, message)
    # the stdlib's text (1e-05), then orjson's (0.00001; it never pads an exponent)
    assert b"e-0" in texts[0] and b"e-0" not in texts[1]


def test_shortest_digits_of_a_hundred_thousand_doubles() -> None:
    """The C float text against repr() and orjson themselves: random bit patterns (every
    exponent, subnormals), float32 values widened, integers near 2**53, powers of ten."""
    orjson = pytest.importorskip("orjson")
    rng = random.Random(3)
    values = [_double(rng) for _ in range(60_000)]
    values += [struct.unpack("<f", rng.randbytes(4))[0] for _ in range(30_000)]
    values += [float(2**53 - rng.randrange(10**6)) for _ in range(5_000)]
    values += [10.0 ** e for e in range(-320, 309)] + [5e-324, 2.2250738585072014e-308]
    values = [v for v in values if math.isfinite(v)]
    for value in values:
        assert native.double_text(value) == repr(value).encode(), value
        assert native.double_text(value, True) == orjson.dumps(value), value


def test_a_message_of_another_service_than_the_scanner_said_falls_back() -> None:
    schema = msgq_schema()
    program = json_program(schema)
    message = events_of(schema, per_service=1)[0]
    expected = program.discriminant[schema.decode(message).which()]
    texts = native.convert_batch(program.root, message, np.array([0], np.int64),
                                 np.array([len(message)], np.uint32), np.array([0]),
                                 np.array([expected + 1], np.int16), np.zeros(1, np.uint8))
    assert texts == [None]


def _damaged(message: bytes, rng: random.Random) -> bytes:
    data = bytearray(message)
    how = rng.randrange(4)
    if how == 0:  # random bytes anywhere, the segment table included
        for _ in range(rng.randrange(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif how == 1:  # a pointer word: offsets, sizes, far-pointer bits
        word = 8 * rng.randrange(1, len(data) // 8)
        data[word + rng.randrange(8)] ^= 1 << rng.randrange(8)
    elif how == 2:  # cut short, with the segment table still claiming the whole
        data = data[:rng.randrange(8, len(data))]
    else:  # another segment count
        data[0] = rng.randrange(256)
    return bytes(data)


def test_damaged_bytes_never_crash_and_what_is_written_is_the_old_text(
        schema_profile: Schema) -> None:
    schema = schema_profile
    rng = random.Random(11)
    originals = events_of(schema, per_service=3, seed=5)
    damaged = [_damaged(rng.choice(originals), rng) for _ in range(1500)]
    texts = convert(schema, damaged)
    written = 0
    for data, text in zip(damaged, texts, strict=True):
        if text is None:
            continue
        written += 1
        try:
            expected = old_text(schema, data)
        except Exception:  # noqa: BLE001 - the old path refuses bytes the writer took
            pytest.fail(f"the writer converted bytes pycapnp refuses: {data.hex()}")
        assert text == expected
    assert 0 < written < len(damaged)  # some damage is harmless, some is not


def _message(*words: int, segments: tuple[int, ...] | None = None) -> bytes:
    """A message of one segment (or ``segments`` sizes) from raw words."""
    sizes = segments or (len(words),)
    table = struct.pack("<I", len(sizes) - 1) + b"".join(struct.pack("<I", s) for s in sizes)
    table += b"\0" * (-len(table) % 8)
    return table + b"".join(struct.pack("<Q", w) for w in words)


def test_hand_made_damage_falls_back() -> None:
    """Pointers out of the segment, a far pointer to a segment that is not there, a text
    without its NUL, a list too long for its bytes: None, every one."""
    schema = msgq_schema()
    root = struct.pack("<Q", 0)  # placeholders: root struct pointer with 2 data, 1 ptr words
    del root

    def struct_ptr(offset: int, data: int, ptrs: int) -> int:
        return ((offset & 0x3FFFFFFF) << 2) | (data << 32) | (ptrs << 48)

    def list_ptr(offset: int, size: int, count: int) -> int:
        return 1 | ((offset & 0x3FFFFFFF) << 2) | (size << 32) | (count << 35)

    def far_ptr(segment: int, offset: int) -> int:
        return 2 | (offset << 3) | (segment << 32)

    cases = [
        _message(struct_ptr(100, 2, 1)),  # the root beyond the segment
        _message(far_ptr(5, 0)),  # a far pointer to a segment that is not there
        _message(far_ptr(1, 9), 0, segments=(1, 1)),  # a landing pad beyond its segment
        _message(struct_ptr(0, 1, 1), 0, list_ptr(0, 2, 10_000)),  # a long list
    ]
    assert convert(schema, cases) == [None] * len(cases)


@pytest.mark.parametrize("chunk_size", [1024 * 1024, 3000])
def test_the_export_file_is_the_same_byte_for_byte(schema_profile: Schema, tmp_path: Path,
                                                   chunk_size: int) -> None:
    """The compiled writer and the batched MCAP messages against pycapnp, the
    EventConverter and mcap's add_message per event: one chunk, and many (channels
    registered between messages of a chunk, chunks closed inside a batch)."""
    schema = schema_profile
    folder = tmp_path / "rec"
    write_recording(schema, folder, events_of(schema, per_service=4, seed=9))
    fast, reference = tmp_path / "fast.mcap", tmp_path / "reference.mcap"
    stats = export_mcap(sources(schema, folder), str(fast), chunk_size=chunk_size)
    export_mcap(sources(schema, folder), str(reference), chunk_size=chunk_size,
                compiled=False)
    assert stats.messages >= 4 * len(schema.union_fields)  # and each segment's logStart
    assert fast.read_bytes() == reference.read_bytes()
    _, messages, _ = read_mcap(fast)  # every CRC checked
    assert len(messages) == stats.messages


def test_a_damaged_segment_exports_the_same_file_both_ways(tmp_path: Path) -> None:
    """Damage the scanner finds (broken roots, reported) and damage only the writer
    finds (a list pointer's size code changed: left to pycapnp) give the file, and the
    problems, the reference path gives."""
    schema = msgq_schema()
    events = events_of(schema, per_service=3, seed=3)
    segment = Path(write_loggerd_log(str(tmp_path / "r--0" / "rlog"), events, "none"))
    data = bytearray(segment.read_bytes())
    starts = np.cumsum([0] + [len(e) for e in events])
    data[starts[20]:starts[20] + 16] = b"\xff" * 16  # a root the scanner rejects
    changed = 0
    for k in range(30, len(events)):  # list pointers of other messages: another size code
        body = range(starts[k] + 16, starts[k + 1] - 8, 8)
        pointers = [at for at in body if data[at] & 3 == 1 and data[at + 4] & 7 == 4]
        if pointers:
            data[pointers[0] + 4] = (data[pointers[0] + 4] & ~7) | 5  # 4-byte → 8-byte
            changed += 1
    assert changed >= 5
    segment.write_bytes(bytes(data))
    program = json_program(schema)
    fell_back = 0
    for batch in batches_of(schema, [str(segment)]):
        fell_back += batch_json(program, batch, np.arange(len(batch))).count(None)
    assert fell_back >= 5  # the writer left them to pycapnp
    fast, reference = tmp_path / "fast.mcap", tmp_path / "reference.mcap"
    results: list[Any] = []
    for out, compiled in ((fast, True), (reference, False)):
        try:
            results.append(export_mcap(str(segment), str(out), compiled=compiled).problems)
        except Exception as e:  # noqa: BLE001 - both ways must fail alike
            results.append(repr(e))
    assert results[0] == results[1]
    # the export goes on past events pycapnp cannot convert (it raised KjException)
    assert isinstance(results[0], list) and any("corrupt" in p for p in results[0])
    assert sum("does not convert" in p for p in results[0]) >= 1
    assert fast.read_bytes() == reference.read_bytes()


def test_an_mcap_writer_without_the_batched_path_adds_messages_one_by_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched messages use the mcap Writer's private chunk builder: where it is not
    there (another mcap version: AttributeError), the export adds them one by one with
    add_message, and the file is the same."""
    import mcap.writer

    from msgq.viz import mcap_export

    schema = msgq_schema()
    folder = tmp_path / "rec"
    write_recording(schema, folder, events_of(schema, per_service=2, seed=4))
    export_mcap(str(folder), str(tmp_path / "batched.mcap"), chunk_size=3000)

    class Unbatchable(mcap_export._MessageBatcher):
        def __init__(self, writer: Any, chunk_size: int) -> None:
            raise AttributeError("_Writer__chunk_builder")

    added: list[int] = []
    original = mcap.writer.Writer.add_message

    def add_message(self: Any, *args: Any, **kwargs: Any) -> None:
        added.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(mcap_export, "_MessageBatcher", Unbatchable)
    monkeypatch.setattr(mcap.writer.Writer, "add_message", add_message)
    stats = export_mcap(str(folder), str(tmp_path / "single.mcap"), chunk_size=3000)
    assert len(added) == stats.messages > 0
    assert (tmp_path / "single.mcap").read_bytes() == (tmp_path / "batched.mcap").read_bytes()
