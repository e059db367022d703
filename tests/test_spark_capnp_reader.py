"""Typed columns read straight from Cap'n Proto bytes (``schemas/_typed_reader.pyx``)
against the pycapnp conversion they replace, value for value and type for type: on the
benchmark's realistic messages of every service, on thousands of damaged copies of them
(where pycapnp fails, the fast reader must hand the message back to it), and through the
reading of a whole recording with damaged events (the same rows, problem rows included).
No Spark session: the reader runs as in an executor's Python worker."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from helpers import damage_message

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from msgq.bench.fixtures import SERVICES, filled_message  # noqa: E402
from msgq.logs import LogWriter  # noqa: E402
from msgq.schemas import default_schema  # noqa: E402
from msgq.schemas._typed_reader import FALLBACK, read_member  # noqa: E402
from msgq.spark import datasource  # noqa: E402

_FAILED = object()


def _decoders(services: tuple[str, ...]) -> dict[str, Any]:
    options = datasource.ReadOptions(paths=("unused",), decode=services)
    return datasource._decoders_for(options)


def _pycapnp(decoder: Any, data: bytes) -> Any:
    try:
        return decoder.from_pycapnp(data, default_schema())
    except Exception:  # what pycapnp raises on damaged bytes
        return _FAILED


def _assert_same(fast: Any, slow: Any, where: str) -> None:
    assert type(fast) is type(slow), f"{where}: {type(fast)} != {type(slow)}"
    if isinstance(fast, (tuple, list)):
        assert len(fast) == len(slow), where
        for i, (a, b) in enumerate(zip(fast, slow, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(fast, float):  # bit for bit: -0.0, NaN
        assert struct.pack("<d", fast) == struct.pack("<d", slow) or \
            (math.isnan(fast) and math.isnan(slow)), where
    else:
        assert fast == slow, where


def test_every_benchmark_service_is_read_by_the_fast_reader() -> None:
    decoders = _decoders(SERVICES)
    for service in SERVICES:
        decoder = decoders[service]
        assert decoder.layout is not None, service
        data = filled_message(service).to_bytes()
        fast = read_member(data, decoder.layout)
        assert fast is not FALLBACK, service
        _assert_same(fast, _pycapnp(decoder, data), service)


def test_the_fast_reader_equals_pycapnp_on_damaged_messages() -> None:
    """Random damage to every byte of the messages (pointers, tags, data, the segment
    table): the fast reader's value is pycapnp's, or it hands the message to pycapnp
    (always where pycapnp fails)."""
    rng = random.Random(17)
    decoders = _decoders(SERVICES)
    read = handed_back = failed = 0
    for service in SERVICES:
        decoder = decoders[service]
        good = filled_message(service).to_bytes()
        for _ in range(400):
            damaged = damage_message(rng, good)
            slow = _pycapnp(decoder, damaged)
            fast = read_member(damaged, decoder.layout)
            if fast is FALLBACK:
                handed_back += 1
                failed += slow is _FAILED
                continue
            assert slow is not _FAILED, f"{service}: pycapnp fails, the fast reader reads"
            _assert_same(fast, slow, service)
            read += 1
    # the damage exercised both outcomes
    assert read > 1000 and handed_back > 500 and failed > 100


def test_amplified_lists_are_handed_back_not_expanded() -> None:
    """A list of 2^29 zero-sized structs in a few bytes (an amplification attack): the
    fast reader must not build it; pycapnp's traversal limit refuses it."""
    decoder = _decoders(("can",))["can"]
    data = bytearray(filled_message("can").to_bytes())
    root = int.from_bytes(data[8:16], "little")
    payload = 16 + 8 * (root >> 2 & 0x3FFFFFFF) + 8 * (root >> 32 & 0xFFFF)
    target = payload + 8 + 8 * (int.from_bytes(data[payload:payload + 4], "little") >> 2)
    # the list pointer keeps its place; its tag says 2^29 elements of zero words
    data[target:target + 8] = ((2**29 - 1) << 2).to_bytes(8, "little")
    damaged = bytes(data)
    assert read_member(damaged, decoder.layout) is FALLBACK
    assert _pycapnp(decoder, damaged) is _FAILED


def _rows(folder: str, services: tuple[str, ...]) -> list[dict[str, Any]]:
    options = datasource.ReadOptions(paths=(folder,), decode=services)
    schema = datasource.output_schema(options)
    rows = []
    for partition in datasource.plan_segments(options):
        read = datasource._SegmentRead(options, schema, partition.path, partition.segment)
        for batch in read.batches():
            rows += batch.to_pylist()
    return rows


def test_a_recording_with_damaged_events_reads_the_same_without_the_fast_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    folder = str(tmp_path / "rec")
    with LogWriter(folder, rotate_seconds=1e9) as writer:
        for i in range(1200):
            service = SERVICES[i % len(SERVICES)]
            msg = filled_message(service)
            msg.logMonoTime = 1_000_000_000 + i * 1000
            data = bytearray(msg.to_bytes())
            if i % 3 == 0:  # damage past the peeked header (the root's data section)
                for _ in range(rng.choice((1, 2, 4))):
                    data[rng.randrange(32, len(data))] = rng.randrange(256)
            writer.write(bytes(data))
    fast = _rows(folder, SERVICES)
    monkeypatch.setattr(datasource, "read_member", lambda data, layout: FALLBACK)
    slow = _rows(folder, SERVICES)
    assert len(fast) == len(slow) > 1000
    problems = sum(row["problem"] is not None for row in slow)
    assert 20 < problems < 400  # damaged events became problem rows, most still read
    for i, (a, b) in enumerate(zip(fast, slow, strict=True)):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key], f"row {i} {key}")


KINDS = """\
@0xc1d2e3f4a5b6c7d8;
struct Inner {
  a @0 :Int8 = -7;
  b @1 :Text;
  color @2 :Color = green;
  enum Color { red @0; green @1; blue @2; }
}
struct Kinds {
  i16 @0 :Int16 = -5;
  u16 @1 :UInt16 = 65535;
  i32 @2 :Int32;
  u32 @3 :UInt32 = 4000000000;
  i64 @4 :Int64 = -9000000000;
  u64 @5 :UInt64 = 18446744073709551615;
  f32 @6 :Float32 = 1.5;
  f64 @7 :Float64 = -0.0;
  flag @8 :Bool = true;
  u8 @9 :UInt8 = 200;
  color @10 :Inner.Color = blue;
  text @11 :Text;
  data @12 :Data;
  bools @13 :List(Bool);
  colors @14 :List(Inner.Color);
  texts @15 :List(Text);
  blobs @16 :List(Data);
  nested @17 :List(List(Float32));
  inners @18 :List(Inner);
  inner @19 :Inner;
  i8s @20 :List(Int8);
  u64s @21 :List(UInt64);
  g :group { x @22 :Float64 = 2.5; y @23 :List(Int64); }
  union { none @24 :Void; some @25 :Inner; count @26 :UInt32; }
}
struct Event {
  logMonoTime @0 :UInt64;
  valid @1 :Bool;
  union {
    kinds @2 :Kinds;
    other @3 :Text;
    withDefault @4 :Inner = (a = 1, b = "x");
  }
}
"""


def test_every_kind_and_default_of_a_custom_schema(tmp_path: Path) -> None:
    """Each field kind, defaults of every primitive type (unset fields, and a struct
    written without any field set), unset pointers, union members and groups: the fast
    reader's values are pycapnp's; a member with a pointer default has no layout."""
    from msgq.schemas import ServiceRegistry, load_schema

    path = tmp_path / "kinds.capnp"
    path.write_text(KINDS)
    schema = load_schema(str(path), ServiceRegistry([]), register_services=False)
    options = datasource.ReadOptions(paths=("unused",), decode=("kinds", "withDefault"),
                                     spec=schema.spec)
    decoders = datasource._decoders_for(options)
    assert decoders["withDefault"].layout is None  # a pointer default: pycapnp
    empty = schema.event.new_message(logMonoTime=1, valid=True)
    empty.init("kinds")
    full = schema.event.new_message(logMonoTime=2, valid=True)
    k = full.init("kinds")
    k.i16, k.u16, k.i32, k.u32, k.i64, k.u64 = -1, 7, -(2**31), 2**32 - 1, 2**63 - 1, 0
    k.f32, k.f64, k.flag, k.u8, k.color = float("nan"), 1e300, False, 0, "red"
    k.text, k.data = "größe ✓", b"\x00\xff"
    k.bools = [True, False] * 40
    k.colors = ["red", "blue", "green"]
    k.texts = ["", "a", "bc"]
    k.blobs = [b"", b"\x01"]
    k.nested = [[1.25, -2.0], [], [3.5]]
    inners = k.init("inners", 3)
    inners[0].a, inners[0].b, inners[2].color = 5, "five", "red"
    k.inner.b = "in"
    k.i8s = [-128, 127, 0]
    k.u64s = [2**64 - 1, 1]
    k.g.x, k.g.y = 0.0, [-(2**63), 2**63 - 1]
    k.init("some").b = "member"
    counted = schema.event.new_message(logMonoTime=3, valid=True)
    counted.init("kinds").count = 12
    decoder = decoders["kinds"]
    for msg in (empty, full, counted):
        data = msg.to_bytes()
        fast = read_member(data, decoder.layout)
        assert fast is not FALLBACK
        _assert_same(fast, decoder.from_pycapnp(data, schema), str(msg.logMonoTime))
    # the member of another message is handed back, as pycapnp fails on it
    other = schema.event.new_message(logMonoTime=4, valid=True, other="text").to_bytes()
    assert read_member(other, decoder.layout) is FALLBACK
