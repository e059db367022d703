"""Typed columns read straight from Cap'n Proto bytes (``msgq/spark/_capnp_reader.pyx``)
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

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from msgq.bench.fixtures import SERVICES, filled_message  # noqa: E402
from msgq.logs import LogWriter  # noqa: E402
from msgq.schemas import default_schema  # noqa: E402
from msgq.spark import datasource  # noqa: E402
from msgq.spark._capnp_reader import FALLBACK, read_member  # noqa: E402

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
            data = bytearray(good)
            for _ in range(rng.choice((1, 1, 2, 4))):
                at = rng.randrange(len(data))
                if rng.random() < 0.5:
                    data[at] ^= 1 << rng.randrange(8)
                else:
                    data[at] = rng.randrange(256)
            damaged = bytes(data)
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
