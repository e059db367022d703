"""Logs benchmark: how fast logs read, and how fast the recorder keeps up. One table.

Run ``python -m msgq.bench.logs`` (``--help`` for the options; ``--quick`` for a short
run). What is measured:

* **read** — a recording of realistic mixed traffic is generated (every ``should_log``
  service of the registry at its registry rate, contents filled with random values,
  lists of typical lengths, a 16 KiB raw model output; about 950 events and 0.7 MB per
  second of log) and written once per compression, and the controller recording of
  ``msgq bench spark`` (20 services at their registry rates, 60 s zstd segments;
  ``--controller-seconds``, default five times ``--read-seconds``: 300 s, about 232,000
  events). Over each, alternating, the best of ``--repeat`` runs: the loop an openpilot
  user writes with pycapnp (decompress a segment, ``read_multiple_bytes``, ``which()``
  and ``valid`` counted per service; and ``which()`` only), ``LogReader.raw()`` counted
  the same way, ``LogReader`` decoded with ``which()``, and plain ``raw()`` and decoded
  passes: events/s and MB/s of uncompressed event bytes. With ``none`` among the
  compressions, a copy of the uncompressed recording damaged every 64 KiB (a zeroed range
  of 8 to 63 bytes) is read with ``skip_corrupt``: the scanner's resynchronisation. Read
  and replay rows time the CPU time of this process (every loop runs in it, on one
  core), so that other work on the machine does not count; the loops alternate, best of
  ``--repeat``.
* **record** — for each rate, a :class:`~msgq.logs.recorder.Recorder` runs in one process
  and a publisher in another sends small sequence-numbered messages (about 80 bytes)
  round-robin over five services at that total rate for ``--seconds``, scheduled
  against an absolute start. Then the recorder is stopped, and the log is checked: for
  each service the sequence numbers must be exactly 0..n-1, once each and in order.
  ``lost`` is what the log misses; ``drops`` is what the recorder itself counted (reader
  resets). The highest rate with nothing lost is printed under the table.
* **replay** — :class:`~msgq.logs.replayer.Replayer` with ``fast=True`` (no timing)
  publishes the read rows' recording: events/s and MB/s of event bytes sent, the best of
  ``--repeat`` runs (one row per compression, with the read rows).

The publisher makes its messages by patching the sequence number and logMonoTime into
a pre-encoded template (their byte offsets are found once by encoding marker values), so
it can offer rates far above what pycapnp could build; every message is still a valid
Event, and the check decodes a sample with pycapnp to confirm the offsets.

Processes are started with the "forkserver" method (else "spawn"); queues live in a
prefix of their own (``MSGQ_PREFIX``), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.context import BaseContext
from typing import Any

import msgq
from msgq.bench.fixtures import pycapnp_loop
from msgq.bench.spark import make_recording  # the Spark suite's recording (no pyspark)
from msgq.logs import LogReader, LogWriter
from msgq.logs.recorder import Recorder
from msgq.logs.replayer import Replayer
from msgq.logs.sources import segment_paths
from msgq.logs.writer import COMPRESSIONS
from msgq.messaging import new_message
from msgq.schemas import SERVICE_LIST, default_schema
from msgq.schemas.events import decode_event
from msgq.tables import format_table

__all__ = [
    "RECORD_SERVICES",
    "SequencedTemplate",
    "main",
    "mixed_events",
    "sequence_number",
    "sequenced_message",
    "write_mixed_recording",
]

#: Services of the record benchmark and the integer field carrying the sequence number.
RECORD_SERVICES: dict[str, str] = {
    "gyroscope": "status",
    "accelerometer": "status",
    "magnetometer": "status",
    "controllerState": "step",
    "roadCameraState": "frameId",
}
DEFAULT_RATES: tuple[int, ...] = (1000, 5000, 20000, 50000, 100000, 150000, 200000)
DEFAULT_SECONDS = 1.5
DEFAULT_READ_SECONDS = 60.0
DEFAULT_REPEAT = 3

MB = 1e6


# --- sequence-numbered messages -------------------------------------------------------


def sequenced_message(service: str, seq: int, mono_ns: int | None = None) -> bytes:
    """An Event of ``service`` (one of RECORD_SERVICES) carrying ``seq``, built with
    pycapnp."""
    kwargs = {} if mono_ns is None else {"logMonoTime": mono_ns}
    msg = new_message(service, valid=True, **kwargs)
    payload = getattr(msg, service)
    setattr(payload, RECORD_SERVICES[service], seq)
    if service in ("gyroscope", "accelerometer", "magnetometer"):
        payload.value.x, payload.value.y, payload.value.z = 0.125, -9.81, 0.5
    return msg.to_bytes()


def sequence_number(data: bytes, service: str) -> int:
    """The sequence number in an Event made by :func:`sequenced_message` (decoded with
    pycapnp)."""
    msg = decode_event(data)
    return int(getattr(getattr(msg, service), RECORD_SERVICES[service]))


class SequencedTemplate:
    """The encoded Event of one service with the byte offsets of its logMonoTime and
    sequence number, so that ``make(seq, mono)`` is a copy and two stores."""

    _MONO_MARK = 0x1D2C3B4A59687766
    _SEQ_MARK = 0x5EC1A3B7

    def __init__(self, service: str) -> None:
        self.service = service
        data = sequenced_message(service, self._SEQ_MARK, self._MONO_MARK)
        self.data = data
        self.seq_format = struct.Struct("<I")
        self.mono_offset = self._find(data, struct.pack("<Q", self._MONO_MARK))
        self.seq_offset = self._find(data, self.seq_format.pack(self._SEQ_MARK))

    @staticmethod
    def _find(data: bytes, mark: bytes) -> int:
        offset = data.find(mark)
        if offset < 0 or data.find(mark, offset + 1) >= 0:
            raise RuntimeError("a marker is not unique in the template")
        return offset

    def make(self, seq: int, mono_ns: int) -> bytes:
        """The template with ``seq`` (< 2**32) and ``mono_ns`` stored."""
        buf = bytearray(self.data)
        struct.pack_into("<Q", buf, self.mono_offset, mono_ns)
        self.seq_format.pack_into(buf, self.seq_offset, seq)
        return bytes(buf)

    def sequence_of(self, data: bytes) -> int | None:
        """The sequence number of a message made by ``make`` (None: not one of them)."""
        if len(data) != len(self.data):
            return None
        return int(self.seq_format.unpack_from(data, self.seq_offset)[0])


# --- realistic mixed traffic --------------------------------------------------------------

_INT_RANGES = {
    "int8": (-128, 128), "int16": (-(2**15), 2**15), "int32": (-(2**31), 2**31),
    "int64": (-(2**63), 2**63), "uint8": (0, 2**8), "uint16": (0, 2**16),
    "uint32": (0, 2**32), "uint64": (0, 2**64),
}
# Per service: elements per list, bytes per Data field (default: 4 and 8).
_SHAPES: dict[str, tuple[int, int]] = {
    "can": (16, 8),
    "sendcan": (4, 8),
    "gnssMeasurements": (12, 8),
    "plan": (33, 8),
    "modelOutput": (33, 16384),
    "radarState": (16, 8),
    "managerState": (24, 8),
}


def _random_value(kind: str, rng: random.Random, name: str, data_len: int) -> Any:
    if kind in ("float32", "float64"):
        return rng.uniform(-100.0, 100.0)
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        return rng.randrange(max(lo, -1000), min(hi, 1_000_000))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "text":
        return f"{name}-{rng.randrange(1000)}"
    if kind == "data":
        return rng.randbytes(data_len)
    return None


def _fill(builder: Any, rng: random.Random, list_len: int, data_len: int, depth: int = 0
          ) -> None:
    """Random values in every plain field of ``builder`` (union members and enums keep
    their defaults), lists of ``list_len`` elements."""
    for name, fld in builder.schema.fields.items():
        if fld.proto.discriminantValue != 0xFFFF or fld.proto.which() != "slot":
            continue
        typ = fld.proto.slot.type
        kind = typ.which()
        if kind == "struct":
            if depth < 4:
                _fill(builder.init(name), rng, list_len, data_len, depth + 1)
        elif kind == "list":
            element = typ.list.elementType.which()
            if element in ("list", "enum", "anyPointer", "interface"):
                continue
            items = builder.init(name, list_len)
            for i in range(list_len):
                if element == "struct":
                    if depth < 4:
                        _fill(items[i], rng, max(1, list_len // 4), data_len, depth + 1)
                else:
                    items[i] = _random_value(element, rng, name, data_len)
        else:
            value = _random_value(kind, rng, name, data_len)
            if value is not None:
                setattr(builder, name, value)


def _payloads(service: str, rng: random.Random, variants: int) -> list[Any]:
    """``variants`` filled payload readers of ``service``."""
    list_len, data_len = _SHAPES.get(service, (4, 8))
    out = []
    for _ in range(variants):
        if service in default_schema().sized_fields:
            msg = new_message(service, list_len)
            items = getattr(msg, service)
            for i in range(list_len):
                _fill(items[i], rng, 4, data_len)
        else:
            msg = new_message(service)
            _fill(getattr(msg, service), rng, list_len, data_len)
        out.append(getattr(msg.as_reader(), service))
    return out


def mixed_events(seconds: float, seed: int = 0, start_ns: int = 10**9) -> Iterator[bytes]:
    """Encoded Events of every ``should_log`` service with a rate (except logStart), at
    their registry rates over ``seconds`` of log time, in time order."""
    rng = random.Random(seed)
    rates = {name: s.frequency for name, s in SERVICE_LIST.items()
             if s.should_log and s.frequency >= 1 and name != "logStart"}
    payloads = {name: _payloads(name, rng, 8) for name in rates}
    schedule: list[tuple[int, str, int]] = []
    for name, hz in rates.items():
        period = 1e9 / hz
        phase = rng.uniform(0, period)
        n = int(seconds * hz)
        schedule += [(start_ns + int(phase + i * period), name, i) for i in range(n)]
    schedule.sort()
    for mono, name, i in schedule:
        msg = new_message(logMonoTime=mono, valid=True)
        setattr(msg, name, payloads[name][i % len(payloads[name])])
        yield msg.to_bytes()


def write_mixed_recording(folder: str, seconds: float, compression: str = "zstd",
                          seed: int = 0) -> tuple[int, int]:
    """Writes :func:`mixed_events` to a recording; returns (events, uncompressed bytes)."""
    return _write(folder, list(mixed_events(seconds, seed)), compression)


def _write(folder: str, events: list[bytes], compression: str) -> tuple[int, int]:
    with LogWriter(folder, compression=compression) as writer:
        for data in events:
            writer.write(data)
    return len(events), sum(len(e) for e in events)


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
               if n.startswith("segment-"))


# --- results ---------------------------------------------------------------------------


@dataclass
class ReadResult:
    """One read measurement."""

    compression: str
    mode: str  # "raw" or "decoded"
    events: int
    event_bytes: int  # uncompressed
    file_bytes: int
    seconds: float  # best run
    recording: str = "mixed"  # "mixed" or "controller"

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.event_bytes / MB / self.seconds if self.seconds else 0.0


@dataclass
class RecordResult:
    """One record measurement."""

    rate: int  # offered, messages per second
    sent: int
    send_seconds: float
    logged: int  # distinct expected sequence numbers in the log
    lost: int  # sent but not in the log
    extra: int  # in the log more than once, out of order, or never sent
    drops: int | None  # reader resets the recorder counted
    bad: int
    logged_bytes: int
    error: str | None = None

    @property
    def achieved_rate(self) -> float:
        return self.sent / self.send_seconds if self.send_seconds else 0.0

    @property
    def clean(self) -> bool:
        return self.error is None and self.lost == 0 and self.extra == 0 and not self.drops


# --- read benchmark ----------------------------------------------------------------------


#: The read rows: what each loop does per event. The pycapnp rows are the loop an
#: openpilot user writes (decompress a segment, ``read_multiple_bytes``, iterate), over
#: the same files in the same run; "counted" loops count events per service and the
#: valid ones.
READ_MODES: dict[str, str] = {
    "pycapnp counted": "pycapnp read_multiple_bytes: which(), valid counted",
    "raw counted": "LogReader.raw(): service, valid counted",
    "pycapnp which": "pycapnp read_multiple_bytes: which()",
    "decoded which": "LogReader (decoded): which()",
    "raw": "LogReader.raw()",
    "decoded": "LogReader (decoded)",
}
#: The damaged-log row (not one of the modes every recording is read in).
DAMAGED_MODE = "raw damaged"
DAMAGED_LABEL = "LogReader.raw(), skip_corrupt, damaged copy"
#: The damaged copy: a zeroed range of 8 to 63 bytes in every DAMAGE_EVERY bytes.
DAMAGE_EVERY = 64 * 1024


def _time_read(folder: str, mode: str) -> tuple[int, int, float]:
    """(events, bytes of events, seconds) of one pass over the recording."""
    n = size = valid = 0
    counts: dict[str, int] = {}
    start = time.process_time()
    if mode.startswith("pycapnp"):
        n = pycapnp_loop(folder, counted=mode == "pycapnp counted")
    elif mode == "raw counted":
        for e in LogReader(folder).raw():
            service = e.service
            n += 1
            counts[service] = counts.get(service, 0) + 1
            if e.valid:
                valid += 1
    elif mode == "decoded which":
        for msg in LogReader(folder):
            msg.which()
            n += 1
    elif mode == "raw":
        for e in LogReader(folder).raw():
            n += 1
            size += len(e.data)
    else:
        for _msg in LogReader(folder):
            n += 1
    seconds = time.process_time() - start
    if counts and sum(counts.values()) != n:
        raise RuntimeError(f"{mode}: {n} events, {sum(counts.values())} counted")
    return n, size, seconds


def write_damaged_copy(source: str, folder: str, seed: int = 1) -> int:
    """Copies the recording ``source`` to ``folder`` with a zeroed range of 8 to 63 bytes
    somewhere in every :data:`DAMAGE_EVERY` bytes of each segment (the file sizes stay);
    returns the number of ranges. Read with ``skip_corrupt``, it times the scanner's
    resynchronisation (meant for an uncompressed recording: in zstd a hit loses a
    frame)."""
    shutil.copytree(source, folder)
    rng = random.Random(seed)
    ranges = 0
    for path in segment_paths(folder):
        with open(path, "rb") as f:
            data = bytearray(f.read())
        for at in range(4096, len(data) - 4096 - 64, DAMAGE_EVERY):
            at += rng.randrange(4096)
            size = rng.randrange(8, 64)
            data[at:at + size] = bytes(size)
            ranges += 1
        with open(path, "wb") as f:
            f.write(data)
    return ranges


def _time_damaged(folder: str) -> tuple[int, int, float]:
    """(events, bytes of events, seconds) of one ``skip_corrupt`` pass over ``folder``."""
    n = size = 0
    start = time.process_time()
    for e in LogReader(folder, skip_corrupt=True, warn=False).raw():
        n += 1
        size += len(e.data)
    return n, size, time.process_time() - start


def _recordings(workdir: str) -> list[tuple[str, str, str]]:
    """(recording, compression, folder) of the recordings bench_read wrote."""
    found = []
    for name in sorted(os.listdir(workdir)):
        if name.startswith("read-controller"):
            found.append(("controller", "zstd", os.path.join(workdir, name)))
        elif name.startswith("read-"):
            found.append(("mixed", name.removeprefix("read-"), os.path.join(workdir, name)))
    return sorted(found, key=lambda r: r[0] != "mixed")


def bench_read(workdir: str, seconds: float, compressions: Sequence[str], repeat: int,
               controller_seconds: float = 0.0) -> list[ReadResult]:
    """Writes the mixed recording once per compression (and, with
    ``controller_seconds``, the controller recording of ``msgq bench spark``: 20 services
    at their registry rates, 60 s zstd segments) and times reading them."""
    events = list(mixed_events(seconds))
    for compression in compressions:
        _write(os.path.join(workdir, f"read-{compression}"), events, compression)
    if controller_seconds > 0:
        make_recording(os.path.join(workdir, "read-controller"), controller_seconds, 60.0)
    results = []
    for recording, compression, folder in _recordings(workdir):
        file_bytes = _folder_bytes(folder)
        count, event_bytes, _ = _time_read(folder, "raw")  # with the logStart events
        # the runs of all modes alternate, so that load on the machine hits them alike
        best = dict.fromkeys(READ_MODES, float("inf"))
        for _ in range(repeat):
            for mode in READ_MODES:
                got, _, took = _time_read(folder, mode)
                if got != count:
                    raise RuntimeError(f"{mode} read {got} events of {count}")
                best[mode] = min(best[mode], took)
        results += [ReadResult(compression, mode, count, event_bytes, file_bytes, best[mode],
                               recording) for mode in READ_MODES]
    if "none" in compressions:  # the resynchronisation path: a damaged copy, skip_corrupt
        damaged = os.path.join(workdir, "damaged-none")  # not read- (not a read row)
        ranges = write_damaged_copy(os.path.join(workdir, "read-none"), damaged)
        runs = [_time_damaged(damaged) for _ in range(repeat)]
        count, event_bytes, _ = runs[0]
        results.append(ReadResult("none", DAMAGED_MODE, count, event_bytes,
                                  _folder_bytes(damaged), min(t for *_, t in runs),
                                  f"mixed, {ranges} zeroed ranges"))
    return results


def _time_replay(folder: str) -> tuple[int, float]:
    """(events sent, seconds) of one fast replay of the recording."""
    start = time.process_time()
    stats = Replayer(folder, fast=True).run(handle_signals=False)
    return stats.events, time.process_time() - start


def bench_replay(workdir: str, compressions: Sequence[str], repeat: int
                 ) -> list[ReadResult]:
    """Times a fast replay of each recording :func:`bench_read` wrote."""
    results = []
    for recording, compression, folder in _recordings(workdir):
        events, event_bytes, _ = _time_read(folder, "raw")
        runs = [_time_replay(folder) for _ in range(repeat)]
        sent = runs[0][0]
        # bytes of the events sent: all of the log's but the logStart events
        per_event = event_bytes / events if events else 0.0
        results.append(ReadResult(compression, "replay", sent, int(per_event * sent),
                                  _folder_bytes(folder), min(t for _, t in runs), recording))
    return results


# --- record benchmark ----------------------------------------------------------------------


def _record_child(folder: str, services: list[str], compression: str, ready: Any,
                  stop: Any, results: Any) -> None:
    """Runs a Recorder until ``stop`` is set; puts its counts on ``results``."""
    try:
        recorder = Recorder(folder, services, compression=compression)

        def wait_for_stop() -> None:
            stop.wait()
            recorder.stop()

        threading.Thread(target=wait_for_stop, daemon=True).start()
        stats = recorder.run(handle_signals=False, on_ready=ready.set)
        results.put(("recorder", stats.as_dict()))
    except BaseException as e:
        ready.set()
        results.put(("recorder", {"error": f"{type(e).__name__}: {e}"}))


def _publish_child(services: list[str], rate: int, seconds: float, results: Any) -> None:
    """Sends ``rate * seconds`` sequence-numbered messages round-robin over ``services``
    at ``rate`` per second; puts (sent per service, seconds) on ``results``."""
    try:
        templates = [SequencedTemplate(s) for s in services]
        pubs = [msgq.pub_sock(s) for s in services]
        k = len(services)
        total = max(k, int(rate * seconds))
        total -= total % k  # every service gets the same count
        clock = time.monotonic_ns
        start = clock()
        period_ns = 1e9 / rate
        i = 0
        while i < total:
            due = min(total, int((clock() - start) / period_ns) + 1)
            while i < due:
                j = i % k
                pubs[j].send(templates[j].make(i // k, clock()))
                i += 1
            if i < total:
                wait = (start + i * period_ns - clock()) / 1e9
                if wait > 0.0002:
                    time.sleep(wait - 0.0001)
        elapsed = (clock() - start) / 1e9
        results.put(("publisher", {"sent": total // k, "seconds": elapsed}))
    except BaseException as e:
        results.put(("publisher", {"error": f"{type(e).__name__}: {e}"}))


def _check_log(folder: str, services: list[str], sent: int) -> tuple[int, int, int]:
    """(logged, extra, bytes) of the recording: sequence numbers 0..sent-1 of every
    service, each once and in order."""
    templates = {s: SequencedTemplate(s) for s in services}
    expected = dict.fromkeys(services, 0)
    logged = extra = size = 0
    checked: set[str] = set()
    for event in LogReader(folder, services=services).raw():
        size += len(event.data)
        template = templates[event.service]
        seq = template.sequence_of(event.data)
        if event.service not in checked:  # the offsets hold: pycapnp reads the same
            checked.add(event.service)
            if seq != sequence_number(event.data, event.service):
                raise RuntimeError(f"{event.service}: template offsets are wrong")
        nxt = expected[event.service]
        if seq is not None and nxt <= seq < sent:
            logged += 1
            expected[event.service] = seq + 1
        else:
            extra += 1
    return logged, extra, size


def bench_record(ctx: BaseContext, workdir: str, rate: int, seconds: float,
                 services: list[str], compression: str, timeout: float = 60.0
                 ) -> RecordResult:
    """One rate: recorder and publisher processes, then the log checked."""
    folder = os.path.join(workdir, f"record-{rate}")
    ready, stop = ctx.Event(), ctx.Event()
    results = ctx.Queue()
    recorder = ctx.Process(target=_record_child,
                           args=(folder, services, compression, ready, stop, results))
    recorder.start()
    got: dict[str, dict[str, Any]] = {}
    try:
        if not ready.wait(timeout):
            raise TimeoutError("the recorder did not start")
        publisher = ctx.Process(target=_publish_child, args=(services, rate, seconds, results))
        publisher.start()
        publisher.join(timeout + seconds)
        stop.set()
        deadline = time.monotonic() + timeout
        while len(got) < 2 and time.monotonic() < deadline:
            try:
                kind, value = results.get(timeout=0.5)
            except Exception:  # queue.Empty: look whether the children are still there
                if not recorder.is_alive() and results.empty():
                    break
                continue
            got[kind] = value
        recorder.join(timeout)
    finally:
        stop.set()
        for proc in (recorder,):
            if proc.is_alive():
                proc.kill()
    pub = got.get("publisher", {"error": "the publisher reported nothing"})
    rec = got.get("recorder", {"error": "the recorder reported nothing"})
    error = pub.get("error") or rec.get("error")
    sent = int(pub.get("sent", 0))
    result = RecordResult(rate=rate, sent=sent * len(services),
                          send_seconds=float(pub.get("seconds", 0.0)), logged=0,
                          lost=sent * len(services), extra=0, drops=rec.get("drops"),
                          bad=int(rec.get("bad", 0)), logged_bytes=0, error=error)
    if error is None:
        logged, extra, size = _check_log(folder, services, sent)
        result.logged, result.extra, result.logged_bytes = logged, extra, size
        result.lost = result.sent - logged
    shutil.rmtree(folder, ignore_errors=True)
    return result


# --- the table --------------------------------------------------------------------------


def _num(x: float) -> str:
    return f"{x:,.0f}"


def table(reads: list[ReadResult], records: list[RecordResult],
          replays: Sequence[ReadResult] = ()) -> str:
    """The benchmark table."""
    rows: list[list[object]] = [["benchmark", "case", "events/s", "MB/s", "events", "lost",
                                 "drops"]]
    for r in [*reads, *replays]:
        what = "replay --fast" if r.mode == "replay" else \
            f"read {READ_MODES.get(r.mode, DAMAGED_LABEL)}"
        case = (f"{r.recording}, {r.compression}, {r.event_bytes / MB:.1f} MB in "
                f"{r.file_bytes / MB:.1f} MB of files")
        rows.append([what, case, _num(r.events_per_s), f"{r.mb_per_s:.1f}",
                     _num(r.events), "-", "-"])
    for r in records:
        if r.error is not None:
            rows.append([f"record {_num(r.rate)}/s", f"error: {r.error}", "-", "-", "-", "-",
                         "-"])
            continue
        mb = r.logged_bytes / MB / r.send_seconds if r.send_seconds else 0.0
        rows.append([f"record {_num(r.rate)}/s", f"{len(RECORD_SERVICES)} services, "
                     f"{r.logged_bytes // max(1, r.logged)} B messages",
                     _num(r.achieved_rate), f"{mb:.1f}", f"{_num(r.logged)}/{_num(r.sent)}",
                     _num(r.lost + r.extra), "?" if r.drops is None else _num(r.drops)])
    return format_table(rows)


def zero_drop_rate(records: list[RecordResult]) -> RecordResult | None:
    """The fastest measurement below which every rate was recorded completely."""
    best = None
    for r in sorted(records, key=lambda r: r.rate):
        if not r.clean:
            break
        best = r
    return best


# --- main ----------------------------------------------------------------------------------


def _context() -> BaseContext:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["msgq.logs", "msgq.logs.recorder", "msgq.messaging"])
        return ctx
    return multiprocessing.get_context("spawn")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m msgq.bench.logs",
        description="Read throughput of LogReader and the rate the recorder keeps up with.",
    )
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 10 s of log, rates 1000 and 20000, 0.5 s each")
    parser.add_argument("--read-seconds", type=float, default=None,
                        help=f"log seconds of the generated recording (default "
                             f"{DEFAULT_READ_SECONDS:g}; 0 skips the read rows)")
    parser.add_argument("--controller-seconds", type=float, default=None,
                        help="log seconds of the controller recording read beside the mixed "
                             "one (20 services at their registry rates, as msgq bench spark "
                             "writes it; default 5 x --read-seconds; 0 leaves it out)")
    parser.add_argument("--compressions", default="zstd,none",
                        help="compressions of the read rows (default zstd,none)")
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT,
                        help="read runs per row, the best counts (default 3)")
    parser.add_argument("--rates", default=None,
                        help="record rates in messages/s, comma-separated (default "
                             f"{','.join(map(str, DEFAULT_RATES))}; empty skips them)")
    parser.add_argument("--seconds", type=float, default=None,
                        help=f"seconds of publishing per rate (default {DEFAULT_SECONDS:g})")
    parser.add_argument("--record-compression", default="zstd",
                        help="compression of the recorder's log (default zstd)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.read_seconds is None:
        args.read_seconds = 10.0 if args.quick else DEFAULT_READ_SECONDS
    if args.controller_seconds is None:
        args.controller_seconds = 5 * args.read_seconds
    if args.seconds is None:
        args.seconds = 0.5 if args.quick else DEFAULT_SECONDS
    if args.rates is None:
        args.rates = "1000,20000" if args.quick else ",".join(map(str, DEFAULT_RATES))
    try:
        args.rate_list = [int(float(r)) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--rates takes numbers, not {args.rates!r}")
    if any(r <= 0 for r in args.rate_list) or args.seconds <= 0 or args.repeat < 1:
        parser.error("rates, --seconds and --repeat must be positive")
    args.compression_list = [c for c in args.compressions.split(",") if c.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints its table; returns the exit code."""
    args = parse_args(argv)

    for c in [*args.compression_list, args.record_compression]:
        if c not in COMPRESSIONS:
            print(f"unknown compression {c!r}; choose from {', '.join(COMPRESSIONS)}",
                  file=sys.stderr)
            return 2
    prefix = f"logbench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    saved = {k: os.environ.get(k) for k in ("MSGQ_PREFIX", "OPENPILOT_PREFIX")}
    os.environ["MSGQ_PREFIX"] = prefix  # before the fork server starts: children inherit it
    os.environ.pop("OPENPILOT_PREFIX", None)
    workdir = tempfile.mkdtemp(prefix="msgq-logbench-")
    reads: list[ReadResult] = []
    replays: list[ReadResult] = []
    records: list[RecordResult] = []
    try:
        if args.read_seconds > 0:
            reads = bench_read(workdir, args.read_seconds, args.compression_list, args.repeat,
                               args.controller_seconds)
            replays = bench_replay(workdir, args.compression_list, args.repeat)
        if args.rate_list:
            ctx = _context()
            services = list(RECORD_SERVICES)
            for rate in args.rate_list:
                records.append(bench_record(ctx, workdir, rate, args.seconds, services,
                                            args.record_compression))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(os.path.join(os.environ.get("MSGQ_SHM_DIR", "/dev/shm"), prefix),
                      ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    print(f"logs benchmark: {os.cpu_count()} CPUs, read rows best of {args.repeat} "
          "(CPU time of the process), "
          f"record rows {args.seconds:g} s per rate ({args.record_compression})")
    print(table(reads, records, replays))
    if records:
        best = zero_drop_rate(records)
        if best is None:
            print("no rate was recorded without loss")
        else:
            top = "" if best is not max(records, key=lambda r: r.rate) else \
                " (the highest rate tried)"
            print(f"highest rate recorded with zero drops: {_num(best.rate)} msgs/s offered, "
                  f"{_num(best.achieved_rate)} sent{top}")
    if args.json:
        with open(args.json, "w") as f:
            # "read": the raw and decoded rows (the document's shape before the loops
            # came); "read_loops": the pycapnp loops and ours counted the same way
            json.dump({"read": [{**asdict(r), "events_per_s": r.events_per_s,
                                 "mb_per_s": r.mb_per_s} for r in reads
                                if r.mode in ("raw", "decoded") and r.recording == "mixed"],
                       "read_loops": [{**asdict(r), "events_per_s": r.events_per_s,
                                       "mb_per_s": r.mb_per_s} for r in reads
                                      if r.mode not in ("raw", "decoded")
                                      or r.recording != "mixed"],
                       "replay": [{**asdict(r), "events_per_s": r.events_per_s,
                                   "mb_per_s": r.mb_per_s} for r in replays],
                       "record": [{**asdict(r), "achieved_rate": r.achieved_rate,
                                   "clean": r.clean} for r in records],
                       "zero_drop_rate": getattr(zero_drop_rate(records), "rate", None)},
                      f, indent=2)
    return 1 if any(r.error for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
