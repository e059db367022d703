"""The log scanner against stored expectations: a damaged-log corpus (one intact segment
per compression, stored in tests/data/log_scanner, damaged here by seed: truncations, bit
flips, zeroed ranges, garbage appended) read through ``LogReader.raw()`` with and without
``skip_corrupt``; the events recovered and every problem reported (kind, offsets, detail)
must be those recorded in tests/data/log_scanner/expected.json, which the Python scanner
that came before the C one produced. A change of the scanner that recovers other events or
reports damage elsewhere fails here.

``python tests/test_log_scanner.py --corpus`` writes the intact segments anew (only when
the corpus itself must change); ``--expect`` records what the scanner of this checkout
returns (only for a deliberate change of behaviour, said in the commit).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from msgq.logs import LogCorruptionError, LogReader, LogWriter
from msgq.schemas import schema_in_force

DATA = Path(__file__).parent / "data" / "log_scanner"
EXPECTED = DATA / "expected.json"
FILES = {"zstd": "segment.zst", "bz2": "segment.bz2", "none": "segment.raw"}
KINDS = ("truncate", "flip", "zero", "append")
SEEDS_PER_KIND = 25
SERVICES = ("gyroscope", "accelerometer", "can", "logMessage")


def _messages() -> list[bytes]:
    """Events of several services and sizes; every 25th one with its root struct in a
    second segment (a far root pointer: the scanner cannot peek it, pycapnp decodes it)."""
    schema = schema_in_force()
    out = []
    for i in range(240):
        service = SERVICES[i % len(SERVICES)]
        extra = {"num_first_segment_words": 1} if i % 25 == 3 else {}
        msg = schema.event.new_message(logMonoTime=10**9 + i * 1_000_000, valid=i % 7 != 0,
                                       **extra)
        if service == "can":
            frames = msg.init("can", i % 5)
            for j, frame in enumerate(frames):
                frame.address = i + j
                frame.dat = bytes([i % 256, j]) * (i % 9)
        elif service == "logMessage":
            msg.init("logMessage").text = "x" * (i % 50)
        else:
            payload = msg.init(service)
            payload.value.x = i / 8
        out.append(msg.to_bytes())
    return out


def write_corpus() -> None:
    """The intact segments (one per compression, small zstd frames)."""
    import tempfile

    DATA.mkdir(parents=True, exist_ok=True)
    messages = _messages()
    for compression, name in FILES.items():
        with tempfile.TemporaryDirectory() as folder:
            with LogWriter(folder, compression=compression, rotate_seconds=None,
                           frame_bytes=1024) as writer:
                for data in messages:
                    writer.write(data)
            (segment,) = writer.segments
            (DATA / name).write_bytes((Path(folder) / segment.file).read_bytes())


def _damaged(compression: str, seed: int) -> tuple[str, bytes]:
    """(what was done, the damaged bytes) of the corpus segment of ``compression``."""
    rng = random.Random(seed * 7919 + len(compression))
    kind = KINDS[seed % len(KINDS)]
    data = bytearray((DATA / FILES[compression]).read_bytes())
    size = len(data)
    if kind == "truncate":
        cut = rng.randrange(size)
        del data[cut:]
        what = f"cut at {cut}"
    elif kind == "flip":
        spots = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            at = rng.randrange(size)
            data[at] ^= 1 << rng.randrange(8)
            spots.append(at)
        what = f"bits flipped at {spots}"
    elif kind == "zero":
        at = rng.randrange(size)
        length = min(rng.randint(1, 256), size - at)
        data[at:at + length] = bytes(length)
        what = f"{length} bytes zeroed at {at}"
    else:
        style = rng.choice(("random", "own bytes", "zstd magic"))
        n = rng.randint(1, 600)
        if style == "random":
            extra = rng.randbytes(n)
        elif style == "own bytes":
            at = rng.randrange(size)
            extra = bytes(data[at:at + n])
        else:
            extra = b"\x28\xb5\x2f\xfd" + rng.randbytes(n)
        data += extra
        what = f"{len(extra)} bytes appended ({style})"
    return what, bytes(data)


def _cases() -> list[tuple[str, int]]:
    return [(c, seed) for c in FILES for seed in range(SEEDS_PER_KIND * len(KINDS))]


def read_case(path: Path, skip: bool) -> dict[str, Any]:
    """What ``LogReader.raw()`` returns from ``path``: the events (count and a digest of
    offset, service, time, validity and bytes of each), the problems listed and the error
    that stopped it."""
    reader = LogReader(path, skip_corrupt=skip, warn=False, check_schema=False)
    digest = hashlib.sha256()
    count = 0
    error = None
    try:
        for e in reader.raw():
            digest.update(f"{e.offset} {e.service} {e.mono_ns} {e.valid} ".encode())
            digest.update(hashlib.sha256(e.data).digest())
            count += 1
    except LogCorruptionError as e:
        error = str(e.problem).replace(str(path), path.name)

    def problems(found: list[Any]) -> list[list[Any]]:
        return [[p.kind, p.offset, p.file_offset, p.detail] for p in found]

    return {"events": count, "digest": digest.hexdigest()[:24],
            "truncated": problems(reader.truncated), "corrupt": problems(reader.corrupt),
            "error": error}


def run_corpus(folder: Path) -> dict[str, Any]:
    """Every case of the corpus read both ways, keyed ``compression/seed/skip``."""
    results: dict[str, Any] = {}
    for compression, name in FILES.items():
        path = folder / name
        path.write_bytes((DATA / name).read_bytes())
        for skip in (True, False):
            results[f"{compression}/intact/{skip}"] = read_case(path, skip)
    for compression, seed in _cases():
        what, data = _damaged(compression, seed)
        path = folder / FILES[compression]
        path.write_bytes(data)
        for skip in (True, False):
            result = read_case(path, skip)
            result["damage"] = what
            results[f"{compression}/{seed}/{skip}"] = result
    return results


def test_corpus_is_intact() -> None:
    """The stored segments read whole: every message, no problem (the far-root ones too)."""
    messages = _messages()
    for name in FILES.values():
        reader = LogReader(DATA / name, check_schema=False)
        got = [e.data for e in reader.raw() if e.service != "logStart"]
        assert got == messages, name
        assert not reader.truncated and not reader.corrupt


def test_damaged_corpus_reads_as_recorded(tmp_path: Path) -> None:
    expected = json.loads(EXPECTED.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warn=False: no warning may come out
        got = run_corpus(tmp_path)
    assert set(got) == set(expected)
    differ = [key for key in expected if got[key] != expected[key]]
    assert not differ, "\n".join(
        f"{key} ({expected[key].get('damage', 'intact')}):\n  expected {expected[key]}\n"
        f"  got      {got[key]}" for key in differ[:5])
    # the corpus is damaged for real: most cases report a problem, some recover events
    # after the damage only with skip_corrupt
    reported = sum(bool(v["truncated"] or v["corrupt"]) for v in got.values())
    assert reported >= 0.6 * len(got)
    assert any(got[f"{c}/{s}/True"]["events"] > got[f"{c}/{s}/False"]["events"]
               for c, s in _cases())


if __name__ == "__main__":
    if "--corpus" in sys.argv:
        write_corpus()
    if "--expect" in sys.argv:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            EXPECTED.write_text(json.dumps(run_corpus(Path(folder)), indent=0,
                                           sort_keys=True) + "\n")
    if not {"--corpus", "--expect"} & set(sys.argv):
        pytest.main([__file__, "-q"])
