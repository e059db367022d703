"""Damaged logs through every reader: ``LogReader``, ``msgq replay`` (a real process) and
the Spark ``msgqlog`` source.

Each case copies an intact recording (three segments, zstd with small frames, bz2 or
uncompressed) and damages one segment, seeded: a truncation, bit flips, a zeroed range or
garbage appended (random bytes, a copy of the log's own bytes, a zstd magic). What must
hold, whatever the damage:

* no traceback, no exception but the documented ``LogCorruptionError`` (without
  ``skip_corrupt``);
* every *intact* event is recovered: with ``skip_corrupt`` all of them, without it every
  one before the damage. An event is intact when the bytes it depends on are untouched:
  its own bytes (uncompressed), its zstd frame (a frame decodes or is lost as a whole) or
  its bz2 stream;
* nothing is invented: from zstd segments every event returned is one that was written,
  byte for byte; from the others a changed event may come back only from the damaged
  bytes.

The CI profile runs in well under a minute; ``MSGQ_CHAOS_SECONDS=N`` (set by
``scripts/chaos.sh --minutes M``) runs about N seconds, and ``MSGQ_CHAOS_SEED`` moves the
seeds (a failure names the seed that reproduces it).
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zstandard
from helpers import DAMAGE_KINDS, damage_bytes

import msgq
from msgq.bench.logs import sequenced_message
from msgq.logs import LogCorruptionError, LogReader, LogWriter

pytestmark = pytest.mark.chaos

#: Seconds a long run spends (0: the CI profile, a fixed number of cases).
CHAOS_SECONDS = float(os.environ.get("MSGQ_CHAOS_SECONDS") or 0)
SEED_BASE = int(os.environ.get("MSGQ_CHAOS_SEED") or 0)
COMPRESSIONS = ("zstd", "none", "bz2")
KINDS = DAMAGE_KINDS
SERVICES = ("gyroscope", "accelerometer")
EVENTS = 900
SPARK_BATCH = 12  # damaged segments per Spark read
READER_CASES = 192  # CI profile: damaged copies through LogReader (16 per compression
REPLAY_CASES = 12  # and kind), through msgq replay (each with and without --skip-corrupt)
STEP_NS = 1_000_000


@dataclass
class Segment:
    """One intact segment: its bytes, and per event (bytes, the file byte range it
    depends on)."""

    name: str
    data: bytes
    events: list[tuple[bytes, int, int, int]]  # (bytes, mono, depends_from, depends_to)


@dataclass
class Recording:
    folder: Path
    compression: str
    segments: list[Segment]

    @property
    def events(self) -> list[bytes]:
        return [e[0] for s in self.segments for e in s.events]


@dataclass
class Damage:
    seed: int
    compression: str
    kind: str
    segment: int  # which segment was damaged
    spans: list[tuple[int, int]]  # file byte ranges changed (or cut, or added)
    folder: Path
    detail: str = ""

    def __str__(self) -> str:
        return (f"seed {self.seed} ({self.compression}, {self.kind} of segment "
                f"{self.segment} at {self.spans}{self.detail}); "
                f"MSGQ_CHAOS_SEED={self.seed} reproduces it")

    def hits(self, start: int, end: int) -> bool:
        return any(a < end and start < b for a, b in self.spans)

    @property
    def first(self) -> int:
        return min(a for a, _ in self.spans)


@dataclass
class Expected:
    """What a reader of a damaged copy must return."""

    intact: list[bytes] = field(default_factory=list)  # with skip_corrupt, all of these
    before: list[bytes] = field(default_factory=list)  # without it, at least this prefix
    before_mono: int = -1  # the time of the last event of ``before`` in the damaged segment
    changed_ok: list[tuple[int, int]] = field(default_factory=list)  # where changed bytes
    # may come from: (segment index, file offset) ranges


def _write_recording(folder: Path, compression: str) -> Recording:
    with LogWriter(str(folder), compression=compression, rotate_seconds=None,
                   rotate_bytes=EVENTS * 100 // 3, frame_bytes=2048) as writer:
        for i in range(EVENTS):
            writer.write(sequenced_message(SERVICES[i % 2], i, 10**9 + i * STEP_NS))
    segments = []
    for path in sorted(folder.glob("segment-*")):
        data = path.read_bytes()
        reader = LogReader(path)
        raw = list(reader.raw())
        assert not reader.corrupt and not reader.truncated
        if compression == "zstd":
            frames = _zstd_frames(data)
            spans = [next((a, b) for a, b, lo, hi in frames if lo <= e.offset < hi)
                     for e in raw]
        elif compression == "bz2":
            spans = [(0, len(data))] * len(raw)
        else:
            spans = [(e.offset, e.offset + len(e.data)) for e in raw]
        segments.append(Segment(path.name, data, [
            (e.data, e.mono_ns, a, b) for e, (a, b) in zip(raw, spans, strict=True)
            if e.service != "logStart"]))
    assert len(segments) == 3
    return Recording(folder, compression, segments)


def _zstd_frames(data: bytes) -> list[tuple[int, int, int, int]]:
    """(file start, file end, stream start, stream end) of each frame."""
    frames = []
    pos = stream = 0
    while pos < len(data):
        obj = zstandard.ZstdDecompressor().decompressobj()
        out = obj.decompress(data[pos:])
        used = len(data) - pos - len(obj.unused_data)
        frames.append((pos, pos + used, stream, stream + len(out)))
        pos += used
        stream += len(out)
    return frames


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Recording]:
    base = tmp_path_factory.mktemp("chaos_intact")
    return {c: _write_recording(base / c, c) for c in COMPRESSIONS}


def _damage(recording: Recording, seed: int, dest: Path) -> Damage:
    """A copy of ``recording`` in ``dest`` with one segment damaged (seeded)."""
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    index = rng.randrange(len(recording.segments))
    segment = recording.segments[index]
    data, spans, style = damage_bytes(segment.data, kind, rng)
    detail = f", {style}" if style else ""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(recording.folder, dest)
    (dest / segment.name).write_bytes(bytes(data))
    return Damage(seed, recording.compression, kind, index, spans, dest, detail)


def _expected(recording: Recording, damage: Damage) -> Expected:
    expected = Expected()
    stopped = False
    for i, segment in enumerate(recording.segments):
        for data, mono, start, end in segment.events:
            hit = i == damage.segment and damage.hits(start, end)
            if not hit:
                expected.intact.append(data)
            if i == damage.segment and end > damage.first:
                stopped = True
            if not stopped and not hit:
                expected.before.append(data)
                if i == damage.segment:
                    expected.before_mono = mono
        if i == damage.segment and damage.kind != "truncate":
            stopped = True  # corruption stops a strict reader (a cut file only warns)
    return expected


def _subsequence(needed: list[bytes], got: list[bytes]) -> bool:
    it = iter(got)
    return all(any(n == g for g in it) for n in needed)


def _missing(needed: list[bytes], got: list[bytes]) -> int:
    have = collections.Counter(got)
    return sum((collections.Counter(needed) - have).values())


def _check_returned(recording: Recording, damage: Damage, events: list[Any]) -> None:
    """Nothing invented: a returned event is one that was written, or (not zstd) comes
    from the damaged segment's damaged bytes."""
    written = set(recording.events)
    damaged_name = recording.segments[damage.segment].name
    for e in events:
        if e.data in written or e.service == "logStart":
            continue
        assert damage.compression != "zstd", f"{damage}: bytes never written came back"
        assert os.path.basename(e.path) == damaged_name, f"{damage}: {e.path} changed"
        if damage.compression == "none":
            assert damage.hits(e.offset, e.offset + len(e.data)) or \
                damage.kind == "append", f"{damage}: event at {e.offset} changed"


def _read(damage: Damage, skip: bool) -> tuple[list[Any], LogReader, Exception | None]:
    reader = LogReader(damage.folder, skip_corrupt=skip, warn=False)
    events: list[Any] = []
    error: Exception | None = None
    try:
        for e in reader.raw():
            events.append(e)
    except LogCorruptionError as e:
        error = e
    return events, reader, error


def _cases(count: int, share: float) -> Iterator[tuple[int, str]]:
    """(seed, compression) for ``count`` cases, or for ``share`` of a long run's time."""
    began = time.monotonic()
    seed = SEED_BASE
    while True:
        if CHAOS_SECONDS:
            if time.monotonic() - began >= CHAOS_SECONDS * share:
                return
        elif seed - SEED_BASE >= count:
            return
        yield seed, COMPRESSIONS[(seed // len(KINDS)) % len(COMPRESSIONS)]
        seed += 1


def test_log_reader_recovers_every_intact_event(recordings: dict[str, Recording],
                                                tmp_path: Path) -> None:
    kinds: collections.Counter[str] = collections.Counter()
    noticed = 0
    for seed, compression in _cases(READER_CASES, 0.5):
        recording = recordings[compression]
        damage = _damage(recording, seed, tmp_path / "copy")
        expected = _expected(recording, damage)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warn=False: none may come out
            skipped, skipping, error = _read(damage, skip=True)
            assert error is None, f"{damage}: {error}"
            got = [e.data for e in skipped if e.service != "logStart"]
            assert _subsequence(expected.intact, got), \
                f"{damage}: {_missing(expected.intact, got)} intact events lost"
            _check_returned(recording, damage, skipped)

            strict, reader, error = _read(damage, skip=False)
            got = [e.data for e in strict if e.service != "logStart"]
            assert got[:len(expected.before)] == expected.before, \
                f"{damage}: {_missing(expected.before, got)} events before the damage lost"
            _check_returned(recording, damage, strict)
        if error is not None:
            assert reader.corrupt and str(damage.folder) in str(error), damage
        kinds[f"{compression} {damage.kind}"] += 1
        noticed += bool(skipping.corrupt or skipping.truncated)
    assert sum(kinds.values()) >= (1 if CHAOS_SECONDS else READER_CASES), kinds
    # the damage is real: most copies were found damaged (a flip or zeroed range may land
    # where nothing is checked, e.g. in a message's unused padding)
    assert noticed >= 0.6 * sum(kinds.values()), (noticed, kinds)
    print(f"LogReader: {sum(kinds.values())} damaged copies: {dict(sorted(kinds.items()))}")


def _replay(damage: Damage, skip: bool) -> tuple[subprocess.CompletedProcess[str], list[bytes]]:
    subs = [msgq.sub_sock(s, segment_size=4 << 20) for s in SERVICES]
    args = [sys.executable, "-m", "msgq", "replay", str(damage.folder), "--fast", "--json"]
    proc = subprocess.run([*args, *(["--skip-corrupt"] if skip else [])],
                          capture_output=True, text=True, timeout=60)
    got = []
    for sub in subs:
        while (data := sub.receive(non_blocking=True)) is not None:
            got.append(data)
    return proc, got


@pytest.mark.multiprocess
def test_replay_sends_every_intact_event(recordings: dict[str, Recording],
                                         tmp_path: Path) -> None:
    count = 0
    for seed, compression in _cases(REPLAY_CASES, 0.3):
        recording = recordings[compression]
        damage = _damage(recording, seed, tmp_path / "copy")
        expected = _expected(recording, damage)
        for skip in (True, False):
            proc, got = _replay(damage, skip)
            where = f"{damage}, {'with' if skip else 'without'} --skip-corrupt:\n" \
                    f"{proc.stdout}{proc.stderr}"
            assert "Traceback" not in proc.stderr, where
            if skip or proc.returncode == 0:
                assert proc.returncode == 0, where
                assert json.loads(proc.stdout)["events"] == len(got), where
                needed = expected.intact if skip else expected.before
            else:
                assert proc.returncode == 1, where
                (line,) = proc.stderr.strip().splitlines()
                assert line.startswith("msgq replay: error:") and "--skip-corrupt" in line
                # the events logged before the damage (a time-ordered merge of segments)
                needed = [d for d, mono in _monos(recording) if mono <= expected.before_mono
                          and d in set(expected.before)]
            assert _missing(needed, got) == 0, \
                f"{where}\n{_missing(needed, got)} intact events not sent"
            count += 1
    print(f"msgq replay: {count} runs")


def _monos(recording: Recording) -> list[tuple[bytes, int]]:
    return [(e[0], e[1]) for s in recording.segments for e in s.events]


@pytest.mark.spark
def test_spark_source_returns_every_intact_event(spark: Any, recordings: dict[str, Recording],
                                                 tmp_path: Path) -> None:
    import msgq.spark

    msgq.spark.register(spark)
    rounds = 0
    began = time.monotonic()
    while True:
        # one Spark read of many damaged segments (one partition each): only the
        # damaged segment of each copy (the intact ones are the reader test's business)
        damages = []
        for i in range(SPARK_BATCH):
            seed = SEED_BASE + 10_000 + rounds * SPARK_BATCH + i
            compression = COMPRESSIONS[(seed // len(KINDS)) % len(COMPRESSIONS)]
            damages.append(_damage(recordings[compression], seed,
                                   tmp_path / f"r{rounds}" / f"copy{seed}"))
        files = {str(d.folder / recordings[d.compression].segments[d.segment].name): d
                 for d in damages}
        rows = (spark.read.format("msgqlog").option("paths", json.dumps(list(files)))
                .load().select("file", "service", "data", "problem").collect())
        by_file: dict[str, list[Any]] = collections.defaultdict(list)
        for row in rows:
            by_file[row.file.removeprefix("file:")].append(row)
        assert set(by_file) <= set(files), set(by_file) - set(files)
        for path, damage in files.items():
            recording = recordings[damage.compression]
            expected = _expected(recording, damage)
            wanted = [d for d, *_ in recording.segments[damage.segment].events
                      if d in set(expected.intact)]
            got = [bytes(r.data) for r in by_file[path] if r.service not in (None, "logStart")]
            assert _missing(wanted, got) == 0, \
                f"{damage}: {_missing(wanted, got)} intact events missing in Spark"
            if damage.compression == "zstd":
                assert set(got) <= set(recording.events), f"{damage}: invented rows"
        rounds += 1
        if not CHAOS_SECONDS or time.monotonic() - began >= CHAOS_SECONDS * 0.2:
            break
    print(f"Spark msgqlog: {rounds * SPARK_BATCH} damaged copies")
