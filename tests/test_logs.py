"""Logs: LogWriter / LogReader round trips on real files, rotation, filters, the index,
and every kind of damage (truncation, corruption in the middle, garbage files)."""

from __future__ import annotations

import bz2
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from msgq.logs import (
    CorruptLogWarning,
    LogCorruptionError,
    LogEvent,
    LogReader,
    LogWriter,
    TruncatedLogWarning,
    read_index,
    segment_paths,
)
from msgq.logs.index import IndexCache
from msgq.messaging import MessageDecodeError, new_message

SERVICES = ("gyroscope", "vehicleState", "can", "gpsLocation", "logMessage")


def _events(count: int, step_ns: int = 1_000_000) -> list[bytes]:
    """``count`` events of several services with distinct contents, 1 ms apart."""
    out = []
    for i in range(count):
        service = SERVICES[i % len(SERVICES)]
        msg = new_message(service, valid=i % 7 != 0, logMonoTime=10**9 + i * step_ns)
        if service == "gyroscope":
            msg.gyroscope.status = i
        elif service == "vehicleState":
            msg.vehicleState.speed = i * 0.5
        elif service == "can":
            frames = msg.init("can", i % 4)
            for j, frame in enumerate(frames):
                frame.address = i + j
                frame.dat = bytes([i % 256, j])
        elif service == "gpsLocation":
            msg.gpsLocation.latitudeDeg = i / 1000
        else:
            msg.logMessage.text = f"message {i}"
        out.append(msg.to_bytes())
    return out


def _write(folder: Path, events: list[bytes], **kwargs: object) -> LogWriter:
    with LogWriter(str(folder), **kwargs) as writer:  # type: ignore[arg-type]
        for data in events:
            writer.write(data)
    return writer


def _read_raw(source: object, **kwargs: object) -> list[bytes]:
    reader = LogReader(source, **kwargs)  # type: ignore[arg-type]
    return [e.data for e in reader.raw() if e.service != "logStart"]


@pytest.mark.parametrize("compression", ["zstd", "bz2", "none"])
def test_round_trip_exact_bytes_and_order(tmp_path: Path, compression: str) -> None:
    events = _events(10_000)
    writer = _write(tmp_path / "rec", events, compression=compression, rotate_seconds=None)
    assert len(writer.segments) == 1
    assert _read_raw(tmp_path / "rec") == events
    decoded = [m for m in LogReader(tmp_path / "rec") if m.which() != "logStart"]
    assert len(decoded) == 10_000
    assert [m.logMonoTime for m in decoded] == [10**9 + i * 1_000_000 for i in range(10_000)]
    assert decoded[1].vehicleState.speed == 0.5
    assert decoded[3].gpsLocation.latitudeDeg == pytest.approx(0.003)
    assert decoded[4].logMessage.text == "message 4"


def test_every_segment_starts_with_log_start(tmp_path: Path) -> None:
    from msgq.schemas import default_schema

    writer = _write(tmp_path / "rec", _events(3000), rotate_seconds=1.0,
                    metadata={"car": "test"})
    paths = segment_paths(tmp_path / "rec")
    assert len(paths) == 3  # 3 s of events, 1 s segments
    for number, path in enumerate(paths):
        first = next(iter(LogReader(path)))
        assert first.which() == "logStart"
        start = first.logStart
        assert start.segmentNum == number
        assert start.schemaFingerprint == default_schema().fingerprint
        assert start.recordingId == writer.recording_id
        assert start.wallTimeNs > 1_600_000_000 * 10**9
        assert [(kv.key, kv.value) for kv in start.metadata] == [("car", "test")]


def test_rotation_by_time_and_size(tmp_path: Path) -> None:
    events = _events(5000)
    _write(tmp_path / "time", events, rotate_seconds=0.5)
    index = read_index(str(tmp_path / "time"))
    assert index is not None and len(index) == 10
    for entry in index:
        assert entry.last_mono_ns - entry.first_mono_ns < 0.5e9
    _write(tmp_path / "size", events, rotate_seconds=None, rotate_bytes=64 * 1024)
    index = read_index(str(tmp_path / "size"))
    assert index is not None and len(index) > 3
    assert all(e.uncompressed_bytes <= 64 * 1024 for e in index)
    # nothing lost or reordered across segments
    assert _read_raw(tmp_path / "time") == events
    assert _read_raw(tmp_path / "size") == events


def test_index_counts_per_service(tmp_path: Path) -> None:
    events = _events(1000)
    _write(tmp_path / "rec", events, rotate_seconds=None)
    (entry,) = read_index(str(tmp_path / "rec")) or []
    assert entry.events == 1001
    assert entry.counts == {"logStart": 1, **{s: 200 for s in SERVICES}}
    assert entry.first_mono_ns == 10**9 and entry.last_mono_ns == 10**9 + 999 * 1_000_000


def test_filters_sources_and_start(tmp_path: Path) -> None:
    events = _events(2000)
    _write(tmp_path / "rec", events, rotate_seconds=0.5)
    cans = list(LogReader(tmp_path / "rec", services=["can"]))
    assert len(cans) == 400 and {m.which() for m in cans} == {"can"}
    glob = str(tmp_path / "rec" / "segment-0000[01].log.zst")
    assert len(segment_paths(glob)) == 2
    both = segment_paths([tmp_path / "rec" / "segment-00000.log.zst", tmp_path / "rec"])
    assert len(both) == 5
    later = [e for e in LogReader(tmp_path / "rec", start_mono_ns=10**9 + 1500 * 10**6).raw()
             if e.service != "logStart"]
    assert later[0].mono_ns == 10**9 + 1500 * 10**6 and len(later) == 500
    with pytest.raises(FileNotFoundError):
        LogReader(tmp_path / "nothing*here")
    with pytest.raises(KeyError, match="vehicleState"):
        LogReader(tmp_path / "rec", services=["vehicleStat"])


def test_sort_merges_segments_by_time(tmp_path: Path) -> None:
    a = _events(300, step_ns=2_000_000)
    b = [new_message("clocks", logMonoTime=10**9 + 1_000_000 + 2_000_000 * i).to_bytes()
         for i in range(300)]
    _write(tmp_path / "a", a, rotate_seconds=None)
    _write(tmp_path / "b", b, rotate_seconds=None)
    merged = [e for e in LogReader([tmp_path / "a", tmp_path / "b"], sort=True).raw()]
    times = [e.mono_ns for e in merged]
    assert times == sorted(times) and len(merged) == 602
    unsorted = [e.mono_ns for e in LogReader([tmp_path / "a", tmp_path / "b"]).raw()]
    assert unsorted != sorted(unsorted)


def test_paths_to_read_leaves_out_what_the_index_rules_out(tmp_path: Path) -> None:
    # 2 s of events in 0.5 s segments: the index says which ones hold what a reader wants
    _write(tmp_path / "rec", _events(2000), rotate_seconds=0.5)
    paths = segment_paths(tmp_path / "rec")
    assert len(paths) == 4
    assert LogReader(tmp_path / "rec").paths_to_read() == paths
    later = LogReader(tmp_path / "rec", start_mono_ns=10**9 + 1500 * 10**6)
    assert later.paths_to_read() == paths[3:]
    assert LogReader(tmp_path / "rec", services=["can"]).paths_to_read() == paths
    assert LogReader(tmp_path / "rec", services=["clocks"]).paths_to_read() == []
    # a segment without a sealed index entry is read: nothing says it can be skipped
    os.remove(tmp_path / "rec" / "index.json")
    assert LogReader(tmp_path / "rec", services=["clocks"]).paths_to_read() == paths


def test_decode_gives_the_reader_or_reports_the_event(tmp_path: Path) -> None:
    _write(tmp_path / "rec", _events(10), rotate_seconds=None)
    (path,) = segment_paths(tmp_path / "rec")
    reader = LogReader(path, skip_corrupt=True, warn=False)
    good = next(e for e in reader.raw() if e.service == "vehicleState")
    assert reader.decode(good).vehicleState.speed == 0.5
    # one segment of 1000 words framed, one word there: not a message
    broken = LogEvent(bytes([0, 0, 0, 0, 0xE8, 3, 0, 0]) + bytes(8), good.mono_ns, True,
                      "vehicleState", path, 4096)
    assert reader.decode(broken) is None
    assert reader.decode(good) is not None  # the reader goes on
    (problem,) = reader.corrupt
    assert (problem.path, problem.kind, problem.offset, problem.detail) == \
        (path, "corrupt", 4096, "an event that does not decode")
    with pytest.warns(CorruptLogWarning, match="byte 4096"):
        assert LogReader(path, skip_corrupt=True).decode(broken) is None
    with pytest.raises(LogCorruptionError, match="byte 4096: an event that does not decode"):
        LogReader(path, warn=False).decode(broken)


def test_traversal_limit_is_the_one_schema_decode_gives() -> None:
    assert LogReader.traversal_limit(0) == 8 * 1024 * 1024  # capnp's default at least
    assert LogReader.traversal_limit(16 << 20) == 8 * 1024 * 1024
    assert LogReader.traversal_limit((16 << 20) + 8) == 8 * 1024 * 1024 + 4
    assert LogReader.traversal_limit(64 << 20) == 4 * (64 << 20) // 8  # 4 per word


# --- damage --------------------------------------------------------------------------

@pytest.mark.parametrize("compression", ["zstd", "bz2", "none"])
def test_truncated_file_returns_every_complete_event(tmp_path: Path, compression: str) -> None:
    events = _events(3000)
    _write(tmp_path / "rec", events, compression=compression, rotate_seconds=None,
           frame_bytes=16 * 1024)
    (path,) = segment_paths(tmp_path / "rec")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    reader = LogReader(path)
    with pytest.warns(TruncatedLogWarning):
        got = [e.data for e in reader.raw() if e.service != "logStart"]
    assert len(reader.truncated) == 1 and path in str(reader.truncated[0])
    assert got == events[:len(got)]  # a prefix, exact bytes
    # only the tail is lost: the last unfinished frame (zstd), message (none) or 100 kB
    # block (bz2)
    assert len(got) > (1000 if compression == "bz2" else 2500)


def test_truncated_raw_file_reports_the_offset(tmp_path: Path) -> None:
    events = _events(100)
    _write(tmp_path / "rec", events, compression="none", rotate_seconds=None)
    (path,) = segment_paths(tmp_path / "rec")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 5)
    reader = LogReader(path)
    with pytest.warns(TruncatedLogWarning):
        got = _read_raw_reader(reader)
    assert got == events[:99]
    problem = reader.truncated[0]
    assert problem.offset == os.path.getsize(path) + 5 - len(events[-1])


def read_until_corrupt(path: str, reader: LogReader | None = None,
                       ) -> tuple[list[bytes], LogCorruptionError]:
    """The events (logStart left out) a reader of ``path`` returns before it raises
    LogCorruptionError, and that error; fails the test if it never raises."""
    reader = reader or LogReader(path)
    got: list[bytes] = []
    with pytest.raises(LogCorruptionError) as info:
        for e in reader.raw():
            if e.service != "logStart":
                got.append(e.data)
    return got, info.value


def _read_raw_reader(reader: LogReader) -> list[bytes]:
    return [e.data for e in reader.raw() if e.service != "logStart"]


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_corruption_in_the_middle(tmp_path: Path, compression: str) -> None:
    events = _events(4000)
    _write(tmp_path / "rec", events, compression=compression, rotate_seconds=None,
           frame_bytes=8 * 1024)
    (path,) = segment_paths(tmp_path / "rec")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 64)
    got, error = read_until_corrupt(path)
    message = str(error)
    assert path in message and "byte" in message and "skip_corrupt" in message
    assert 0 < len(got) < 4000 and got == events[:len(got)]
    problem = error.problem
    assert abs(problem.file_offset - size // 2) < (16 * 1024 if compression == "zstd" else 1024)

    skipping = LogReader(path, skip_corrupt=True)
    with pytest.warns(CorruptLogWarning):
        after = _read_raw_reader(skipping)
    assert len(skipping.corrupt) >= 1
    assert len(after) > len(got)
    lost = [e for e in events if e not in set(after)]
    assert len(lost) < 400  # one frame (zstd) or a few events (uncompressed)
    assert after == [e for e in events if e in set(after)]  # order kept, nothing invented


def test_garbage_and_empty_files(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.log"
    garbage.write_bytes(os.urandom(4096))
    reader = LogReader(garbage)
    with pytest.raises(LogCorruptionError, match="garbage.log"):
        list(reader.raw())
    skipping = LogReader(garbage, skip_corrupt=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert list(skipping) == []
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert list(LogReader(empty)) == []
    fake_zstd = tmp_path / "fake.log.zst"
    fake_zstd.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(1000))
    with pytest.raises(LogCorruptionError, match="zstd"):
        list(LogReader(fake_zstd).raw())
    fake_bz2 = tmp_path / "fake.log.bz2"
    fake_bz2.write_bytes(b"BZh9" + os.urandom(1000))
    with pytest.raises(LogCorruptionError, match="bz2"):
        list(LogReader(fake_bz2).raw())


def test_foreign_single_frame_and_bz2_files_read(tmp_path: Path) -> None:
    import zstandard

    events = _events(500)
    (tmp_path / "one.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(events)))
    (tmp_path / "one.bz2").write_bytes(bz2.compress(b"".join(events)))
    assert _read_raw(tmp_path / "one.zst") == events
    assert _read_raw(tmp_path / "one.bz2") == events


def test_writer_refuses_bad_input(tmp_path: Path) -> None:
    with LogWriter(str(tmp_path / "rec")) as writer:
        with pytest.raises(MessageDecodeError):
            writer.write(b"\x00" * 8 + b"garbage!")
        clocks = new_message("clocks").to_bytes()
        for cut in (clocks + b"\x00" * 8, clocks[:-8]):  # bytes left over, bytes missing
            with pytest.raises(MessageDecodeError):  # either would leave the log unreadable
                writer.write(cut)
        with pytest.raises(TypeError):
            writer.write(12)  # type: ignore[arg-type]
        writer.write(new_message("clocks"))
    with pytest.raises(ValueError, match="closed"):
        writer.write(new_message("clocks"))
    with pytest.raises(FileExistsError):
        LogWriter(str(tmp_path / "rec"))
    with pytest.raises(ValueError, match="compression"):
        LogWriter(str(tmp_path / "other"), compression="lz4")
    assert len(list(LogReader(tmp_path / "rec"))) == 2


def test_sigterm_leaves_a_complete_log(tmp_path: Path) -> None:
    folder = tmp_path / "rec"
    script = textwrap.dedent(f"""
        import sys, time
        from msgq.logs import LogWriter, close_on_termination
        from msgq.messaging import new_message
        close_on_termination()
        written = 0
        try:
            with LogWriter({str(folder)!r}, flush_seconds=60) as w:
                while True:
                    m = new_message("gyroscope", logMonoTime=written)
                    m.gyroscope.status = written
                    w.write(m)
                    written += 1
                    if written == 500:
                        print("ready", flush=True)
                    if written > 500:
                        time.sleep(0.001)
        finally:
            print("written", written, flush=True)  # after the writer closed
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM
    word, count = proc.stdout.read().split()
    written = int(count)
    reader = LogReader(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no truncation: the writer closed the frame
        statuses = [m.gyroscope.status for m in reader if m.which() == "gyroscope"]
    # every event the writer returned from is in the log (SIGTERM inside a write may
    # have let that one in too), in order
    assert word == "written" and written >= 500
    assert len(statuses) in (written, written + 1)
    assert statuses == list(range(len(statuses)))
    # the index says so, sealed, and the recording is marked complete
    (entry,) = read_index(str(folder)) or [None]
    assert entry is not None
    assert entry.counts == {"logStart": 1, "gyroscope": len(statuses)}
    assert entry.events == len(statuses) + 1
    assert entry.last_mono_ns == len(statuses) - 1 and entry.seal
    assert json.loads((folder / "index.json").read_text())["complete"] is True
    assert IndexCache().entry(str(folder / entry.file)) == entry  # the seal matches


def test_unclosed_recording_index_does_not_hide_events(tmp_path: Path) -> None:
    # A writer that died after its last index update: the index's last entry lacks what
    # came later, so filtering by service must not skip that segment on its word.
    writer = LogWriter(str(tmp_path / "rec"), rotate_seconds=None)
    writer.write(new_message("gyroscope", logMonoTime=1))
    writer.flush()  # index: segment 0 holds logStart + gyroscope
    writer.write(new_message("vehicleState", logMonoTime=2))
    writer._segment.flush()  # type: ignore[union-attr]  # on disk, index not updated
    found = [m.logMonoTime for m in LogReader(tmp_path / "rec", services=["vehicleState"])]
    assert found == [2]
    writer.close()  # now the index is complete and trusted
    index = read_index(str(tmp_path / "rec"))
    assert index is not None and index[0].counts["vehicleState"] == 1


def test_segment_events_from_bytes_in_memory(tmp_path: Path) -> None:
    import io

    events = _events(300)
    _write(tmp_path / "rec", events, rotate_seconds=None)
    (path,) = segment_paths(tmp_path / "rec")
    with open(path, "rb") as f:
        memory = io.BytesIO(f.read())
    memory.name = "remote://bucket/segment-00000.log.zst"
    got = list(LogReader([]).segment_events(memory))
    assert [e.data for e in got if e.service != "logStart"] == events
    assert {e.path for e in got} == {"remote://bucket/segment-00000.log.zst"}


# --- damage that used to be misread --------------------------------------------------------


def _quiet_raw(reader: LogReader) -> list[bytes]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _read_raw_reader(reader)


@pytest.mark.slow
def test_bytes_of_a_damaged_zstd_frame_never_come_out(tmp_path: Path) -> None:
    # A flipped bit inside a frame often still decodes (to wrong bytes): only the frame's
    # checksum, at its end, tells. The reader holds a frame's output until then, so every
    # event it returns is one that was written, byte for byte.
    events = _events(2000)
    _write(tmp_path / "rec", events, rotate_seconds=None, frame_bytes=4096)
    (path,) = segment_paths(tmp_path / "rec")
    original = Path(path).read_bytes()
    written = set(events)
    checksum_failures = 0
    for seed in range(60):
        data = bytearray(original)
        spot = 200 + (seed * 7919) % (len(data) - 400)
        data[spot] ^= 1 << (seed % 8)
        Path(path).write_bytes(bytes(data))
        reader = LogReader(path, skip_corrupt=True)
        got = _quiet_raw(reader)
        assert all(e in written for e in got), f"flip at {spot} gave bytes never written"
        assert got == [e for e in events if e in set(got)]  # in order
        assert len(got) >= len(events) - 100  # a damaged frame is ~40 events
        checksum_failures += any("checksum" in p.detail for p in reader.corrupt)
    assert checksum_failures > 0  # the case this test is about did happen


def test_a_length_field_past_the_end_is_corruption_not_truncation(tmp_path: Path) -> None:
    # A damaged length field makes a message seem to run past the end of the file: that
    # is not a file cut short, and the events after it are still there.
    events = _events(200)
    _write(tmp_path / "rec", events, compression="none", rotate_seconds=None)
    (path,) = segment_paths(tmp_path / "rec")
    data = bytearray(Path(path).read_bytes())
    at = data.index(events[50])
    data[at + 4:at + 8] = (1 << 24).to_bytes(4, "little")  # segment 0: 128 MiB
    Path(path).write_bytes(bytes(data))
    reader = LogReader(path)
    got, error = read_until_corrupt(path, reader)
    assert "runs past the end" in str(error)
    assert got == events[:50] and reader.truncated == []
    skipping = LogReader(path, skip_corrupt=True)
    assert _quiet_raw(skipping) == events[:50] + events[51:]
    assert [p.offset for p in skipping.corrupt] == [at] and skipping.truncated == []


def test_garbage_after_the_log_is_reported_for_every_compression(tmp_path: Path) -> None:
    events = _events(300)
    for compression in ("zstd", "bz2", "none"):
        folder = tmp_path / compression
        _write(folder, events, compression=compression, rotate_seconds=None)
        (path,) = segment_paths(folder)
        size = os.path.getsize(path)
        with open(path, "ab") as f:
            f.write(bytes(range(7, 250)) * 3)
        got, error = read_until_corrupt(path)
        assert got == events, compression  # every event before the garbage
        assert error.problem.file_offset == size, compression
        skipping = LogReader(path, skip_corrupt=True)
        assert _quiet_raw(skipping) == events and len(skipping.corrupt) == 1


def test_multi_stream_bz2_reads_as_one(tmp_path: Path) -> None:
    events = _events(300)
    path = tmp_path / "parallel.log.bz2"  # as pbzip2 and friends write
    path.write_bytes(bz2.compress(b"".join(events[:100])) + bz2.compress(b"".join(events[100:])))
    reader = LogReader(path)
    assert _read_raw_reader(reader) == events and reader.corrupt == reader.truncated == []


def test_a_lying_index_is_not_trusted(tmp_path: Path) -> None:
    # index.json says segment 0 holds no gyroscope, ends before 1.5 s and starts 100 s
    # earlier than it does: filters, seeking and replay timing must come from the
    # segments, not from what the index claims.
    import json

    from msgq.logs.index import IndexCache
    from msgq.logs.replayer import Replayer

    events = _events(400, step_ns=10_000_000)  # 4 s, 10 ms apart
    _write(tmp_path / "rec", events, rotate_seconds=2)
    paths = segment_paths(tmp_path / "rec")
    assert len(paths) >= 2
    assert all(IndexCache().entry(p) for p in paths)  # sealed and matching: trusted
    expected = _read_raw(tmp_path / "rec", services=["gyroscope"])
    late = _read_raw(tmp_path / "rec", start_mono_ns=10**9 + 1_500_000_000)

    index_path = tmp_path / "rec" / "index.json"
    doc = json.loads(index_path.read_text())
    doc["segments"][0]["counts"].pop("gyroscope")
    doc["segments"][0]["events"] -= 80
    doc["segments"][0]["last_mono_ns"] = 10**9 + 500_000_000
    doc["segments"][0]["first_mono_ns"] -= 100 * 10**9
    index_path.write_text(json.dumps(doc))
    assert IndexCache().entry(paths[0]) is None  # only the entry that lies
    assert _read_raw(tmp_path / "rec", services=["gyroscope"]) == expected
    assert _read_raw(tmp_path / "rec", start_mono_ns=10**9 + 1_500_000_000) == late
    replayer = Replayer(tmp_path / "rec", fast=True)
    assert replayer.first_mono_ns == 10**9  # the first event: no 100 s wait
    assert replayer.end_mono_ns is None  # unknown rather than made up


def test_a_stale_index_is_not_trusted(tmp_path: Path) -> None:
    from msgq.logs.index import IndexCache

    _write(tmp_path / "rec", _events(100))
    (path,) = segment_paths(tmp_path / "rec")
    assert IndexCache().entry(path) is not None
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0x10  # same size, other bytes
    Path(path).write_bytes(bytes(data))
    assert IndexCache().entry(path) is None


def test_a_message_one_word_too_long_does_not_take_the_next_one(tmp_path: Path) -> None:
    # One flipped bit in a size field makes a message swallow the first word of the next
    # one, and the framing shows it only after that (or at the end of the file). The
    # reader looks back into the long message for the next one instead of losing it.
    events = _events(100)
    _write(tmp_path / "rec", events, compression="none", rotate_seconds=None)
    (path,) = segment_paths(tmp_path / "rec")
    for victim, field in ((40, 4), (98, 4), (60, 0)):  # size: middle, near the end; count
        data = bytearray(Path(path).read_bytes())
        at = data.index(events[victim])
        data[at + field] ^= 1  # segment 0 one word more, or two segments
        damaged = tmp_path / f"damaged{victim}.log"
        damaged.write_bytes(bytes(data))
        reader = LogReader(damaged, skip_corrupt=True)
        got = _quiet_raw(reader)
        assert [e for e in events if e in got] == events[:victim] + events[victim + 1:]
        assert len(reader.corrupt) == 1


def test_a_damaged_zstd_magic_loses_only_the_first_frame(tmp_path: Path) -> None:
    # Recognising the compression by the magic alone read a zstd segment whose first
    # bytes were hit as an uncompressed log: garbage from the first byte to the last.
    events = _events(1000)
    _write(tmp_path / "rec", events, rotate_seconds=None, frame_bytes=4096)
    (path,) = segment_paths(tmp_path / "rec")
    data = bytearray(Path(path).read_bytes())
    data[2] ^= 0x40
    for name in ("segment.log.zst", "no_suffix"):  # by the suffix, or a magic one byte off
        damaged = tmp_path / name
        damaged.write_bytes(bytes(data))
        reader = LogReader(damaged, skip_corrupt=True)
        got = _quiet_raw(reader)
        assert len(got) >= 900 and got == events[len(events) - len(got):], name
        assert "not a zstd frame" in reader.corrupt[0].detail


def test_looking_back_into_a_message_never_invents_events(tmp_path: Path) -> None:
    # Damage right after a message makes the reader look for the next message inside it
    # (its length field may have been hit); bytes inside an intact message can look like
    # a message though. A candidate there counts only when the message before it, cut at
    # that point, is exactly whole (message_extent); else the search goes on after it.
    from msgq.logs._scan import message_extent

    events = _events(200)
    assert all(message_extent(e) == (len(e) - 8) // 8 for e in events)
    _write(tmp_path / "rec", events, compression="none", rotate_seconds=None)
    (path,) = segment_paths(tmp_path / "rec")
    data = bytearray(Path(path).read_bytes())
    start = len(data) - len(b"".join(events))  # the logStart before the events
    for zero_from, zero_to in ((100, start + 75), (start - 8, start + 200)):
        damaged = bytearray(data)
        damaged[zero_from:zero_to] = bytes(zero_to - zero_from)
        target = tmp_path / f"damaged{zero_from}.log"
        target.write_bytes(bytes(damaged))
        reader = LogReader(target, skip_corrupt=True)
        got = _quiet_raw(reader)
        assert all(e in events for e in got), "an event that was never written"
        offsets = [start + sum(map(len, events[:i])) for i in range(len(events) + 1)]
        intact = [e for i, e in enumerate(events) if offsets[i] >= zero_to]
        assert got[len(got) - len(intact):] == intact


def test_every_log_path_reads_through_the_c_scanner(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # One scanner: every tool that reads a log splits it with the C scanner
    # (msgq.logs._scan.Splitter); nothing reads a log stream another way.
    import io

    from msgq.logs import _scan, check_schema, segment
    from msgq.logs.replayer import Replayer
    from msgq.viz.mcap_export import export_mcap

    events = _events(60)
    _write(tmp_path / "rec", events, rotate_seconds=None)
    (path,) = segment_paths(tmp_path / "rec")
    loose = tmp_path / "loose.log.zst"  # no index beside it: the schema check samples it
    loose.write_bytes(Path(path).read_bytes())
    made: list[bool] = []

    class Counting(_scan.Splitter):  # type: ignore[misc]
        def __init__(self, *args: object) -> None:
            super().__init__(*args)
            made.append(True)

    monkeypatch.setattr(segment._scan, "Splitter", Counting)
    layout = LogReader(path).schema.layout
    paths = {
        "raw": lambda: list(LogReader(path).raw()),
        "decoded": lambda: list(LogReader(path)),
        "segment_batches": lambda: list(LogReader(path).segment_batches(path)),
        "decoded_events": lambda: list(LogReader(path).decoded_events()),
        "segment_events": lambda: list(LogReader(path).segment_events(
            io.BytesIO(Path(path).read_bytes()))),
        "check_schema": lambda: check_schema(str(loose)),
        "replay": lambda: Replayer(path, fast=True).run(handle_signals=False),
        "export": lambda: export_mcap(path, str(tmp_path / "out.mcap")),
        "read_messages": lambda: list(segment.read_messages(
            path, lambda p: None, True, lambda d: layout.identify(d, True))),
    }
    for name, read in paths.items():
        before = len(made)
        read()
        assert len(made) > before, name
    assert len(list(LogReader(path).raw())) == len(events) + 1  # and it reads (logStart)


def test_the_logs_and_the_export_use_no_private_name_of_another_module() -> None:
    """msgq.logs and the MCAP export import nothing private from another package (the
    reader took the schema layer's traversal constants; it calls its public
    traversal_limit now), and reach into no name-mangled attribute of another library
    except the pinned MCAP batcher (tests/test_viz_export.py pins its mcap versions)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "msgq"
    files = sorted((root / "logs").glob("*.py")) + [root / "viz" / "mcap_export.py"]
    found = []
    for path in files:
        package = "msgq." + ".".join(path.relative_to(root).parent.parts)
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module != package:
                found += [f"{path.name}: from {node.module} import {alias.name}"
                          for alias in node.names if alias.name.startswith("_")
                          and not alias.name.startswith("__")]
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and "__" in node.attr.strip("_") and node.attr.split("__")[0] != "":
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    allowed = {f"mcap_export.py:{n}: .{a}" for n, a in _pinned_batcher_attributes(root)}
    assert [f for f in found if f not in allowed] == []


def _pinned_batcher_attributes(root: Path) -> list[tuple[int, str]]:
    """(line, attribute) of the mcap Writer's mangled names _MessageBatcher reads."""
    lines = (root / "viz" / "mcap_export.py").read_text().splitlines()
    return [(n, attr) for n, line in enumerate(lines, 1)
            for attr in ("_Writer__chunk_builder", "_Writer__statistics",
                         "_Writer__finalize_chunk") if f"writer.{attr}" in line]


def test_small_segments_write_the_index_a_bounded_number_of_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording of many tiny segments (one event each): the index bytes written stay
    within a constant times the final index's size (amortised, a few entries per
    segment), where rewriting it at every closed segment wrote the quadratic sum (300x
    here); and the index the writer ends with lists every segment, sealed and trusted."""
    from msgq.logs import writer as writer_module

    written: list[int] = []
    write_index = writer_module.write_index

    def counting(folder: str, *args: object) -> None:
        write_index(folder, *args)  # type: ignore[arg-type]
        written.append(os.path.getsize(os.path.join(folder, "index.json")))

    monkeypatch.setattr(writer_module, "write_index", counting)
    monkeypatch.setattr(writer_module, "INDEX_SECONDS", 3600.0)  # the count rule alone
    events = _events(600)
    folder = tmp_path / "rec"
    writer = _write(folder, events, rotate_seconds=None, rotate_bytes=1)
    assert len(writer.segments) == 600 and writer.index_writes == len(written)
    final = (folder / "index.json").stat().st_size
    assert sum(written) <= 8 * final, (len(written), sum(written), final)
    assert len(written) <= 40
    index = read_index(str(folder))
    assert index is not None and len(index) == 600
    cache = IndexCache()
    assert all(cache.entry(str(folder / e.file)) == e for e in index)
    assert _read_raw(folder) == events


def test_a_writer_killed_between_index_writes_leaves_a_readable_recording(
        tmp_path: Path) -> None:
    """SIGKILL while tiny segments rotate: the index on disk lists a prefix of the closed
    segments (each entry sealed and trusted), the segments it does not list are read, and
    every event written before the last closed segment is there, in order."""
    folder = tmp_path / "rec"
    script = textwrap.dedent(f"""
        from msgq.logs import LogWriter
        from msgq.messaging import new_message
        w = LogWriter({str(folder)!r}, rotate_seconds=None, rotate_bytes=1)
        n = 0
        while True:
            m = new_message("gyroscope", logMonoTime=10**9 + n)
            m.gyroscope.status = n
            w.write(m)
            n += 1
            if n == 300:
                print("ready", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    files = segment_paths(folder)
    assert len(files) >= 300
    index = read_index(str(folder))
    assert index is not None and 0 < len(index) < len(files)
    assert [e.file for e in index] == [os.path.basename(p) for p in files[:len(index)]]
    cache = IndexCache()
    assert all(e.seal and cache.entry(str(folder / e.file)) == e for e in index[:-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the segment being written when killed
        statuses = [m.gyroscope.status for m in LogReader(folder) if m.which() == "gyroscope"]
    assert statuses == list(range(len(statuses))) and len(statuses) >= len(files) - 1
