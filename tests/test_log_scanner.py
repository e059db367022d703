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
import heapq
import json
import pickle
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from helpers import DAMAGE_KINDS, damage_bytes

from msgq.logs import LogCorruptionError, LogEvent, LogReader, LogWriter, MessageBatch, _scan
from msgq.schemas import schema_in_force
from msgq.schemas.events import decode_event
from msgq.schemas.framing import FramingError, message_length

DATA = Path(__file__).parent / "data" / "log_scanner"
EXPECTED = DATA / "expected.json"
FILES = {"zstd": "segment.zst", "bz2": "segment.bz2", "none": "segment.raw"}
KINDS = DAMAGE_KINDS
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
    data, spans, style = damage_bytes((DATA / FILES[compression]).read_bytes(), kind, rng)
    (start, end), *_ = spans
    if kind == "truncate":
        what = f"cut at {start}"
    elif kind == "flip":
        what = f"bits flipped at {[at for at, _ in spans]}"
    elif kind == "zero":
        what = f"{end - start} bytes zeroed at {start}"
    else:
        what = f"{end - start} bytes appended ({style})"
    return what, data


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


def _python_scan(buf: bytes, pos: int, layout: Any) -> tuple[list[tuple[Any, ...]], int]:
    """What framing.py's message_length and EventLayout.peek say of buf from pos: the
    (offset, length, mono, valid, service) of each whole, peeked message, and the stop."""
    found = []
    while pos < len(buf):
        try:
            length = message_length(buf, pos)
        except FramingError:
            break
        if not length:
            break
        peeked = layout.peek(buf[pos:pos + length])
        if peeked is None:
            break
        found.append((pos, length, *peeked))
        pos += length
    return found, pos


def test_c_scanner_agrees_with_the_framing_rules() -> None:
    """Mutated streams (random words, bit flips, cut ends): the C scanner splits and
    peeks exactly what framing.py's rules give, and never reads past the buffer (a cut
    buffer ends exactly where the bytes do)."""
    layout = schema_in_force().layout
    scan_layout = _scan.ScanLayout(layout)
    stream = b"".join(_messages()[:60])
    rng = random.Random(31)
    for case in range(400):
        data = bytearray(stream)
        for _ in range(rng.randint(0, 6)):
            at = rng.randrange(len(data))
            if rng.random() < 0.5:
                data[at] ^= 1 << rng.randrange(8)
            else:
                data[at & ~7:(at & ~7) + 8] = rng.randbytes(8)
        data = bytes(data[:rng.randint(0, len(data))])
        start = rng.randrange(0, max(1, len(data)), 8)
        stop, why, offset, length, service, flags, mono = _scan.scan(data, start, scan_layout)
        got = [(int(o), int(n), int(m), bool(f & _scan.VALID), layout.services[s])
               for o, n, s, f, m in zip(offset, length, service, flags, mono, strict=True)]
        expected, expected_stop = _python_scan(data, start, layout)
        assert (got, stop) == (expected, expected_stop), f"case {case}"
        assert (why == _scan.END) == (stop == len(data))
    with pytest.raises(ValueError, match="outside the buffer"):
        _scan.scan(b"x" * 8, 16, scan_layout)


def test_log_event_is_a_value() -> None:
    a = LogEvent(b"ab", 5, True, "can", "p", 8)
    b = LogEvent(b"ab", 5, True, "can", "p", 8)
    assert a == b and hash(a) == hash(b) and a != LogEvent(b"ab", 5, False, "can", "p", 8)
    assert (a.data, a.mono_ns, a.valid, a.service, a.path, a.offset) == \
        (b"ab", 5, True, "can", "p", 8)
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(a) == "LogEvent(data=b'ab', mono_ns=5, valid=True, service='can', " \
        "path='p', offset=8)"
    with pytest.raises(AttributeError):
        a.valid = False  # type: ignore[misc]


@pytest.mark.parametrize("name", list(FILES.values()))
def test_decoded_iteration_matches_raw(name: str) -> None:
    """Decoded events (one buffer per batch) are the raw events decoded, with the service
    and time filters, far-root events (decoded alone) included."""
    path = DATA / name
    for kwargs in ({}, {"services": ["can", "logMessage"]}, {"start_mono_ns": 10**9 + 10**8},
                   {"services": ["gyroscope"], "start_mono_ns": 10**9 + 5 * 10**7}):
        raw = list(LogReader(path, check_schema=False, **kwargs).raw())
        decoded = list(LogReader(path, check_schema=False, **kwargs))
        assert [m.to_dict() for m in decoded] == \
            [decode_event(e.data).to_dict() for e in raw], kwargs
        assert [m.which() for m in decoded] == [e.service for e in raw]
        detailed = list(LogReader(path, check_schema=False, **kwargs).decoded_events())
        assert [(s, t, n) for s, t, n, _ in detailed] == \
            [(e.service, e.mono_ns, len(e.data)) for e in raw]
        assert [m.to_dict() for *_, m in detailed] == [m.to_dict() for m in decoded]
        # the batches, filtered by hand, are the same events
        reader = LogReader(path, check_schema=False, **kwargs)
        from_batches = []
        for item in reader.segment_batches(path):
            if isinstance(item, MessageBatch):
                from_batches += [m for m in item.messages()
                                 if m.identity[2] in kwargs.get("services", [m.identity[2]])
                                 and m.identity[0] >= kwargs.get("start_mono_ns", 0)]
            else:
                from_batches.append(item)
        assert [m.data for m in from_batches] == [e.data for e in raw]
        assert len(raw) > 5


def test_an_event_whose_root_is_broken_is_reported_by_decoded_iteration(tmp_path: Path) -> None:
    """A message whose root struct's pointer section runs past its segment: raw() returns
    it (its data section peeks), decoded iteration reports it as an event that does not
    decode (a corrupt problem) and, with skip_corrupt, goes on with the next one."""
    messages = _messages()[:6]
    broken = bytearray(messages[2])
    broken[8 + 6:8 + 8] = (0x7FFF).to_bytes(2, "little")  # root pointer: 32767 pointers
    path = tmp_path / "broken.raw"
    path.write_bytes(b"".join([*messages[:2], bytes(broken), *messages[3:]]))
    raw = list(LogReader(path, check_schema=False).raw())
    assert [e.data for e in raw] == [*messages[:2], bytes(broken), *messages[3:]]
    reader = LogReader(path, check_schema=False, skip_corrupt=True, warn=False)
    decoded = list(reader)
    assert [m.logMonoTime for m in decoded] == \
        [e.mono_ns for i, e in enumerate(raw) if i != 2]
    ((kind, offset, detail),) = [(p.kind, p.offset, p.detail) for p in reader.corrupt]
    assert (kind, offset, detail) == ("corrupt", raw[2].offset, "an event that does not decode")
    with pytest.raises(LogCorruptionError, match=f"corrupt at byte {raw[2].offset}"):
        list(LogReader(path, check_schema=False))


def _recording(folder: Path, monos: list[int]) -> None:
    with LogWriter(str(folder), rotate_seconds=None, rotate_bytes=4000) as writer:
        for i, mono in enumerate(monos):
            msg = schema_in_force().event.new_message(logMonoTime=mono, valid=True)
            msg.init("gyroscope").value.x = i
            writer.write(msg.to_bytes())


@pytest.mark.parametrize("overlap", [False, True])
def test_sorted_reading_is_the_merge_by_time(tmp_path: Path, overlap: bool) -> None:
    """sort=True gives heapq.merge's order whether the segments follow one another in
    time (read one after another, on the word of their sealed index) or overlap, and a
    damaged segment (its seal no longer matches) is merged, not trusted."""
    rng = random.Random(5)
    # events a little out of order within a segment (arrival order), and with overlap
    # one event far too late: it lands in a segment after later ones
    monos = [10**9 + i * 10**6 + rng.randrange(3 * 10**5) for i in range(300)]
    if overlap:
        monos[20] = monos[250]
    _recording(tmp_path / "rec", monos)
    paths = sorted(str(p) for p in (tmp_path / "rec").glob("segment-*"))
    assert len(paths) > 3

    def merged() -> list[Any]:
        return list(heapq.merge(*(LogReader(p, check_schema=False).raw() for p in paths),
                                key=lambda e: e.mono_ns))

    reader = LogReader(tmp_path / "rec", sort=True)
    assert reader._in_order(paths) is not overlap
    assert list(reader.raw()) == merged()
    assert [m.logMonoTime for m in LogReader(tmp_path / "rec", sort=True)] == \
        [e.mono_ns for e in merged()]
    # a segment changed after its seal: its index entry is not trusted
    data = bytearray(Path(paths[1]).read_bytes())
    data[-1] ^= 0xFF
    Path(paths[1]).write_bytes(bytes(data))
    assert not LogReader(tmp_path / "rec", sort=True)._in_order(paths)


# -- every decision of the splitter, recorded ---------------------------------------------
#
# The events and problems LogReader lists are not all a change of the scanner can alter:
# how runs are cut into batches, which messages come one by one, the order of events and
# problems, and which bytes ``identify`` is asked about (and in which order) are recorded
# too, per case, as a digest in splits.json (``--expect-splits``), from read_batches (the
# reader's path) and from read_messages with an identify of its own (schema_check's and
# the fuzz harness's path), over the damaged corpus, a chaos-style recording and raw
# streams whose length fields are hit one word off.

SPLITS = DATA / "splits.json"


class _RefusedError(Exception):
    pass


def _split_digest(file: bytes, mode: str, skip: bool) -> str:
    """A digest of everything one read of ``file`` hands out, in order."""
    import io

    from msgq.logs import segment

    layout = schema_in_force().layout
    log: list[Any] = []
    asked = [0]

    def identify(data: bytes) -> Any:
        asked[0] += 1
        log.append(("identify", len(data), hashlib.sha256(data).hexdigest()[:8]))
        if mode == "picky":  # refuses some real messages, so that resyncing starts there
            found = layout.identify(data, True)
            if found is None or found[0] % 3 == 0:
                return None
            return found
        if mode == "raising" and asked[0] == 40:
            raise _RefusedError("the 40th message")
        return layout.identify(data, True)

    def on_problem(problem: Any) -> None:
        log.append(("problem", problem.kind, problem.offset, problem.file_offset,
                    problem.detail))

    source = io.BytesIO(file)
    items = segment.read_batches(source, on_problem, skip, layout) if mode == "batches" \
        else segment.read_messages(source, on_problem, skip, identify)
    try:
        for item in items:
            if isinstance(item, MessageBatch):
                log.append(("batch", item.stream_offset, item.file_offset, len(item.data),
                            hashlib.sha256(item.data).hexdigest()[:8],
                            item.offset.tolist(), item.length.tolist(),
                            item.service.tolist(), item.flags.tolist(),
                            item.mono_ns.tolist()))
            else:
                log.append(("message", hashlib.sha256(item.data).hexdigest()[:8],
                            item.offset, item.file_offset, repr(item.identity)))
    except _RefusedError as e:
        log.append(("raised", str(e)))
    return hashlib.sha256(repr(log).encode()).hexdigest()[:24]


def _split_files() -> dict[str, bytes]:
    """The inputs of the split record, by name."""
    files: dict[str, bytes] = {}
    for compression, name in FILES.items():
        files[f"{compression}/intact"] = (DATA / name).read_bytes()
        for seed in range(0, SEEDS_PER_KIND * len(KINDS), 3):
            files[f"{compression}/{seed}"] = _damaged(compression, seed)[1]
    # chaos-style: a recording of sequenced messages, damaged the chaos test's ways
    from msgq.bench.logs import sequenced_message

    stream = b"".join(sequenced_message(("gyroscope", "accelerometer")[i % 2], i,
                                        10**9 + i * 10**6) for i in range(150))
    import zstandard

    frames = b"".join(zstandard.ZstdCompressor(write_checksum=True).compress(
        stream[at:at + 2048]) for at in range(0, len(stream), 2048))
    for seed in range(40):
        rng = random.Random(seed)
        base = stream if seed % 2 else frames
        files[f"chaos/{seed}"] = damage_bytes(base, KINDS[seed % len(KINDS)], rng)[0]
    # raw streams with a message's length fields one word off, or its header zeroed
    raw = (DATA / FILES["none"]).read_bytes()
    starts = []
    at = 0
    while at < len(raw):
        starts.append(at)
        at += message_length(raw, at) or len(raw)
    for seed in range(60):
        rng = random.Random(1000 + seed)
        data = bytearray(raw)
        for _ in range(1 + seed % 3):
            start = rng.choice(starts[1:-1])
            how = rng.randrange(4)
            size = int.from_bytes(data[start + 4:start + 8], "little")
            if how == 0:
                size += rng.choice((-2, -1, 1, 2))
                data[start + 4:start + 8] = (size & 0xFFFFFFFF).to_bytes(4, "little")
            elif how == 1:
                data[start:start + 8] = bytes(8)
            elif how == 2:
                data[start:start + 4] = rng.choice((1, 600, 0xFFFFFFFF)).to_bytes(4, "little")
            else:
                data[start + 8:start + 16] = rng.randbytes(8)
        files[f"words/{seed}"] = bytes(data[:len(data) - rng.choice((0, 0, 3, 8, 40))])
    return files


def run_splits() -> dict[str, str]:
    """Every split case: ``name/mode/skip`` -> digest."""
    out = {}
    for name, file in _split_files().items():
        modes = ("batches", "messages", "picky", "raising") if not name.endswith(("1", "2")) \
            else ("batches",)
        for mode in modes:
            for skip in (True, False):
                out[f"{name}/{mode}/{skip}"] = _split_digest(file, mode, skip)
    return out


def test_splits_are_as_recorded() -> None:
    """Batches, single messages, problems and identify calls, in order: as recorded."""
    expected = json.loads(SPLITS.read_text())
    got = run_splits()
    assert set(got) == set(expected)
    differ = sorted(key for key in expected if got[key] != expected[key])
    assert not differ, f"{len(differ)} cases differ: {differ[:10]}"


def test_a_splitter_never_initialised_raises_instead_of_crashing() -> None:
    """A subclass that skips Splitter.__init__ leaves the C state as __cinit__ made it:
    splitting asks its identify (None) and raises; before, C called a null function."""
    from types import SimpleNamespace

    class Bare(_scan.Splitter):  # type: ignore[misc]
        def __init__(self) -> None:
            pass

    message = _messages()[0]
    chunks = [SimpleNamespace(data=message, file_offset=0, problem=None, breaks_after=False)]
    with pytest.raises(TypeError, match="not callable"):
        list(Bare().split(chunks, "p", print, True, MessageBatch, tuple, tuple))


if __name__ == "__main__":
    if "--corpus" in sys.argv:
        write_corpus()
    if "--expect" in sys.argv:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            EXPECTED.write_text(json.dumps(run_corpus(Path(folder)), indent=0,
                                           sort_keys=True) + "\n")
    if "--expect-splits" in sys.argv:
        SPLITS.write_text(json.dumps(run_splits(), indent=0, sort_keys=True) + "\n")
    if not {"--corpus", "--expect", "--expect-splits"} & set(sys.argv):
        pytest.main([__file__, "-q"])
