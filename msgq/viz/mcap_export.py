"""Recordings → MCAP: every event a message on a channel per service, JSON-encoded with
the JSON Schema of :mod:`msgq.viz.json_schema`, log time and publish time = logMonoTime,
in zstd-compressed chunks with the summary and indexes (viewers seek at once), and
metadata records saying what was exported.

Streaming: one event at a time, the writer keeps one chunk (1 MiB by default) in memory;
memory does not grow with the recording. With ``jobs`` > 1, worker processes convert
whole segments into spool files (on disk, beside the output, a window of two per
worker) that the writing process reads back in segment order: the same file, faster
where there are free cores. Damaged segments export what is intact: each
segment is read on its own, past corrupt data, and what could not be read is listed in
:attr:`ExportStats.problems` (file, byte offset, what).

Metadata records (``Metadata`` in the MCAP file):

* ``msgq`` — ``msgq_version``, ``schema_path``, ``schema_fingerprint``, ``schema_root``,
  ``registry`` (the registry file, if any), ``export_host``, ``source``, ``segments``
  (the segment files, a JSON list), ``recording_host``, ``recording_id`` (from
  ``index.json`` where the recording has one);
* ``recording`` — every other key of the recording's ``index.json`` (values as JSON);
* ``logStart`` — the first ``logStart`` event's fields (JSON values), when the schema has
  that member and the recording holds one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from itertools import chain
from typing import Any

import numpy as np

import msgq.logs
from msgq.logs import LogEvent, LogProblem, LogReader, MessageBatch, segment_paths
from msgq.logs.index import IndexCache, read_recording
from msgq.logs.segment import ROOT_WHOLE, VALID
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.services import unknown_service_error
from msgq.viz import require
from msgq.viz.json_schema import event_converter
from msgq.viz.json_writer import JsonProgram, batch_json, json_program

__all__ = ["ExportStats", "default_jobs", "export_mcap", "first_mono_ns"]

#: Bytes of messages per MCAP chunk (before compression).
CHUNK_SIZE = 1024 * 1024

#: The mcap versions (``>=`` first, ``<`` second) whose Writer internals
#: :class:`_MessageBatcher` was checked against (its file equal byte for byte to
#: ``add_message``'s, tests/test_viz_export.py). mcap's public API adds one message at a
#: time (5 us each, against 1 us batched: measured with mcap 1.6.0; a whole export of
#: 60,000 small events 1.18x slower); with any other version the export uses that API
#: only, and the pinning test fails until the batcher is checked against the new
#: version and this range widened.
MCAP_BATCHED_VERSIONS = ((1, 6), (1, 7))


@dataclass
class ExportStats:
    """What an export wrote and what it could not read."""

    output: str
    messages: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    first_mono_ns: int | None = None
    last_mono_ns: int | None = None
    segments: int = 0
    unreadable_segments: int = 0
    problems: list[str] = field(default_factory=list)
    bytes_in: int = 0  # event bytes read
    bytes_out: int = 0  # size of the MCAP file

    def as_dict(self) -> dict[str, Any]:
        """The stats as a JSON-able dict."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@functools.cache  # importlib.metadata reads the installed packages: ~50 ms a call
def _msgq_version() -> str:
    for name in ("msgq-shm", "msgq"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "unknown"


def _recording_folders(paths: list[str]) -> list[str]:
    return list(dict.fromkeys(os.path.dirname(os.path.abspath(p)) for p in paths))


def first_mono_ns(paths: list[str], schema: Schema) -> int | None:
    """The logMonoTime of a recording's first event: from the index where it is sealed,
    else the first readable event of the first segment that has one."""
    indexes = IndexCache()
    firsts = [e.first_mono_ns for e in (indexes.entry(p) for p in paths)
              if e is not None and e.events]
    if firsts and len(firsts) == len(paths):
        return min(firsts)
    for path in paths:
        try:
            reader = LogReader(path, skip_corrupt=True, schema=schema, warn=False)
            for event in reader.raw():
                return event.mono_ns
        except (OSError, ValueError, EOFError):
            continue
    return None


def _metadata(schema: Schema, source: Iterable[str], paths: list[str]) -> dict[str, dict[str, str]]:
    spec = schema.spec
    msgq_meta = {
        "msgq_version": _msgq_version(),
        "schema_path": schema.path,
        "schema_fingerprint": schema.fingerprint,
        "schema_root": schema.root_name,
        "registry": spec.services_path or ("msgq" if spec.is_msgq_own else ""),
        "export_host": socket.gethostname(),
        "source": json.dumps(list(source)),
        "segments": json.dumps(paths),
    }
    recording: dict[str, str] = {}
    for folder in _recording_folders(paths):
        doc = read_recording(folder)
        if doc is None:
            continue
        for key in ("hostname", "host"):
            if key in doc:
                msgq_meta["recording_host"] = str(doc[key])
        if "recording_id" in doc:
            msgq_meta["recording_id"] = str(doc["recording_id"])
        for key, value in doc.items():
            recording.setdefault(key, value if isinstance(value, str) else json.dumps(value))
        break  # the first recording's (an export of several lists every segment above)
    records = {"msgq": msgq_meta}
    if recording:
        records["recording"] = recording
    return records


def export_mcap(
    source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    output: str,
    services: Iterable[str] | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    schema: Schema | None = None,
    chunk_size: int = CHUNK_SIZE,
    progress: Callable[[int], None] | None = None,
    jobs: int = 1,
    *,
    compiled: bool = True,
) -> ExportStats:
    """Exports the events of ``source`` (a segment, a recording folder, a glob or a list,
    as :class:`msgq.logs.LogReader` takes them) to the MCAP file ``output``.

    ``services``: only these. ``start_ns``/``end_ns``: only events with logMonoTime in
    [start_ns, end_ns]. ``schema``: default the schema in force. ``progress`` is called
    with the event bytes read since its last call. ``jobs``: processes converting
    segments (default 1: this process only; :func:`default_jobs` suggests a number;
    more than one starts worker processes, so a script calling this needs the
    ``if __name__ == "__main__":`` guard); the file is the same whatever the number.
    ``compiled=False``: every event through pycapnp and the EventConverter (the reference
    path, several times slower; the file is the same byte for byte).
    Raises FileNotFoundError when the source names no file,
    :class:`msgq.viz.MissingExtraError` without the ``mcap`` library, and
    ``msgq.logs.SchemaMismatchError`` (one line naming ``--schema``) when the logs were
    written with another schema. Damage does not raise: see
    :attr:`ExportStats.problems`."""
    require("mcap")
    schema = schema_in_force(schema)
    converter = event_converter(schema)
    paths = segment_paths(source)
    wanted = None if services is None else list(dict.fromkeys(services))
    for name in wanted or ():
        if name not in schema.union_fields:
            raise unknown_service_error(name, schema.union_fields)
    check_schema = getattr(msgq.logs, "check_schema", None)
    mismatch = getattr(msgq.logs, "SchemaMismatchError", None)
    if check_schema is not None:
        check_schema(paths, schema)  # before any work: never export mislabeled events
    stats = ExportStats(output=output)
    sources = [os.fspath(source)] if isinstance(source, (str, os.PathLike)) else \
        [os.fspath(s) for s in source]
    tmp = f"{output}.{os.getpid()}.part"
    try:
        _write(tmp, paths, sources, wanted, start_ns, end_ns, schema, converter, stats,
               chunk_size, progress, mismatch, jobs, compiled)
    except BaseException:
        # interrupted or refused: no half-written file left behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    os.replace(tmp, output)
    stats.bytes_out = os.path.getsize(output)
    return stats


@dataclass
class _SegmentResult:
    """What converting one segment found besides its messages."""

    problems: list[str] = field(default_factory=list)
    unreadable: bool = False


def _convert_segment(path: str, wanted: list[str] | None, start_ns: int | None,
                     end_ns: int | None, schema: Schema, converter: Any,
                     indexes: IndexCache, mismatch: Any, result: _SegmentResult,
                     compiled: bool = True) -> Iterator[tuple[str, int, bytes, int]]:
    """(service, logMonoTime, JSON bytes, event bytes) of each event of one segment, in
    file order; damage goes to ``result``. The events the reader would decode (each
    batch's wanted whole roots, then one by one what the scanner left to pycapnp) are
    converted by the compiled JSON writer, a batch per call; what it leaves (see
    :mod:`msgq.viz.json_writer`) goes through pycapnp and the EventConverter as before,
    so that the text is the same."""
    if not compiled:
        yield from _convert_segment_pycapnp(path, wanted, start_ns, end_ns, schema,
                                            converter, indexes, mismatch, result)
        return
    reader = LogReader(path, services=wanted, skip_corrupt=True, start_mono_ns=start_ns,
                       schema=schema, warn=False, indexes=indexes)
    read_any = False
    program = json_program(schema)
    wanted_set = None if wanted is None else frozenset(wanted)
    try:
        # the reader's own choice of segments (its index may say this one has nothing)
        for _ in reader.paths_to_read():
            for item in reader.segment_batches(path):
                if type(item) is not MessageBatch:
                    message = reader.decode(item)  # reported when it does not decode
                    if message is None:
                        continue
                    read_any = True
                    if end_ns is None or item.mono_ns <= end_ns:
                        text = _text_of(item.service, item.mono_ns, message, path, result,
                                        converter)
                        if text is not None:
                            yield item.service, item.mono_ns, text, len(item.data)
                    continue
                for event in _batch_events(item, program, wanted_set, start_ns, path, reader,
                                           schema, converter, result):
                    read_any = True
                    if event[2] is not None and (end_ns is None or event[1] <= end_ns):
                        yield event  # type: ignore[misc]
    except (OSError, ValueError, EOFError) as e:
        if mismatch is not None and isinstance(e, mismatch):
            raise
        _file_failed(e, path, result, read_any)
    _report_damage(reader, result)


def _file_failed(error: Exception, path: str, result: _SegmentResult, read_any: bool) -> None:
    """Records a file that could not be opened or decompressed at all (what was read of it
    before stays exported)."""
    result.problems.append(f"{path}: {_one_line(error)}")
    result.unreadable = not read_any


def _report_damage(reader: Any, result: _SegmentResult) -> None:
    """Records the truncated and corrupt stretches the reader skipped in a file."""
    for problem in (*reader.truncated, *reader.corrupt):
        result.problems.append(_problem_text(problem))


def _batch_events(batch: MessageBatch, program: JsonProgram, wanted: frozenset[str] | None,
                  start_ns: int | None, path: str, reader: LogReader, schema: Schema,
                  converter: Any, result: _SegmentResult
                  ) -> Iterator[tuple[str, int, bytes | None, int]]:
    """The events of one batch that the reader would decode, in file order: whole roots
    of the wanted services from ``start_ns`` on through the JSON writer, broken roots
    decoded alone (and so reported) as the reader does. An event whose text is None did
    not convert (listed in ``result``): it counts as read, and is not written."""
    whole = (batch.flags & ROOT_WHOLE) != 0
    chosen = np.ones(len(batch), bool)
    if wanted is not None:
        chosen &= np.array([name in wanted for name in batch.services], bool)[batch.service]
    if start_ns is not None:
        chosen &= batch.mono_ns >= max(start_ns, 0)
    indexes = np.flatnonzero(chosen)
    if not len(indexes):
        return
    converted = indexes[whole[indexes]]
    texts = iter(batch_json(program, batch, converted))
    names = batch.services
    data = batch.data
    limit = LogReader.traversal_limit(int(batch.length[indexes].max()))
    for i, service_index, mono, size, is_whole in zip(
            indexes.tolist(), batch.service[indexes].tolist(), batch.mono_ns[indexes].tolist(),
            batch.length[indexes].tolist(), whole[indexes].tolist(), strict=True):
        service = names[service_index]
        if is_whole:
            text = next(texts)
            if text is None:  # left to pycapnp: the old path, the same text
                at = int(batch.offset[i])
                message = next(iter(schema.event.read_multiple_bytes(
                    data[at:at + size], traversal_limit_in_words=limit)))
                text = _text_of(service, mono, message, path, result, converter)
            yield service, mono, text, size
            continue
        at = int(batch.offset[i])
        event = LogEvent(data[at:at + size], mono, bool(batch.flags[i] & VALID), service,
                         path, batch.stream_offset + at)
        message = reader.decode(event)  # reported when it does not decode
        if message is not None:
            yield service, mono, _text_of(service, mono, message, path, result, converter), size


def _text_of(service: str, mono: int, message: Any, path: str, result: _SegmentResult,
             converter: Any) -> bytes | None:
    """The JSON text of a pycapnp reader; None, and a problem in ``result``, when a
    damaged pointer under the root makes pycapnp fail (the export goes on)."""
    try:
        return converter.dumps(service, converter.to_json(message))
    except Exception as e:  # noqa: BLE001 - pycapnp raises KjException for damaged bytes
        result.problems.append(f"{path}: a {service} event (logMonoTime {mono}) does not "
                               f"convert: {_one_line(e)}")
        return None


def _convert_segment_pycapnp(path: str, wanted: list[str] | None, start_ns: int | None,
                     end_ns: int | None, schema: Schema, converter: Any,
                     indexes: IndexCache, mismatch: Any, result: _SegmentResult
                     ) -> Iterator[tuple[str, int, bytes, int]]:
    """:func:`_convert_segment` through pycapnp and the EventConverter, every event (the
    reference path: ``export_mcap(..., compiled=False)``)."""
    reader = LogReader(path, services=wanted, skip_corrupt=True, start_mono_ns=start_ns,
                       schema=schema, warn=False, indexes=indexes)
    read_any = False
    try:
        # readers of the scanner's batches (one buffer each); an event that does not
        # decode is one of the reader's problems, listed below
        for service, mono, size, message in reader.decoded_events():
            read_any = True
            if end_ns is not None and mono > end_ns:
                continue
            text = _text_of(service, mono, message, path, result, converter)
            if text is not None:
                yield service, mono, text, size
    except (OSError, ValueError, EOFError) as e:
        if mismatch is not None and isinstance(e, mismatch):
            raise
        _file_failed(e, path, result, read_any)
    _report_damage(reader, result)


# -- parallel conversion: each worker converts whole segments into a spool file, which
# -- the writing process reads back in segment order (memory stays bounded: the spools
# -- are on disk, at most a window of them at a time).

_SPOOL_RECORD = struct.Struct("<BQI")  # service name length, logMonoTime, JSON length
_U32 = struct.Struct("<I")  # after each record: the event's size in the log
_worker: dict[str, Any] = {}


def _worker_init(spec: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the writing process's to handle
    schema = spec.load()
    _worker["schema"] = schema
    _worker["converter"] = event_converter(schema)
    _worker["indexes"] = IndexCache()


def _spool_segment(path: str, wanted: list[str] | None, start_ns: int | None,
                   end_ns: int | None, spool: str, compiled: bool = True) -> _SegmentResult:
    """Converts one segment into the spool file ``spool`` (in a worker)."""
    result = _SegmentResult()
    mismatch = getattr(msgq.logs, "SchemaMismatchError", None)
    pack = _SPOOL_RECORD.pack
    with open(spool, "wb", buffering=1 << 20) as out:
        for service, mono, data, size in _convert_segment(
                path, wanted, start_ns, end_ns, _worker["schema"], _worker["converter"],
                _worker["indexes"], mismatch, result, compiled):
            name = service.encode()
            out.write(pack(len(name), mono, len(data)) + name + data)
            out.write(_U32.pack(size))
    return result


def _read_spool(spool: str) -> Iterator[tuple[str, int, bytes, int]]:
    names: dict[bytes, str] = {}
    header = _SPOOL_RECORD.size
    with open(spool, "rb", buffering=1 << 20) as f:
        while head := f.read(header):
            name_len, mono, data_len = _SPOOL_RECORD.unpack(head)
            name = f.read(name_len)
            service = names.get(name)
            if service is None:
                service = names[name] = name.decode()
            data = f.read(data_len)
            size = _U32.unpack(f.read(4))[0]
            yield service, mono, data, size


def default_jobs(paths: list[str]) -> int:
    """Processes an export uses by default: one per core (at most 8) when the logs are
    large enough (over 16 MB of files, two segments or more) to repay starting them."""
    try:
        size = sum(os.path.getsize(p) for p in paths)
    except OSError:
        return 1
    if len(paths) < 2 or size < 16 * 1024 * 1024:
        return 1
    return max(1, min(8, os.cpu_count() or 1, len(paths)))


def _segments_in_parallel(paths: list[str], jobs: int, wanted: list[str] | None,
                          start_ns: int | None, end_ns: int | None, schema: Schema,
                          spool_dir: str, results: list[_SegmentResult],
                          compiled: bool = True) -> Iterator[tuple[str, int, bytes, int]]:
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods
                                          else "spawn")
    window: deque[tuple[Any, str]] = deque()
    pending = iter(enumerate(paths))
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init,
                               initargs=(schema.spec,))

    def submit() -> None:
        for index, path in pending:
            spool = os.path.join(spool_dir, f"{index}.spool")
            window.append((pool.submit(_spool_segment, path, wanted, start_ns, end_ns,
                                       spool, compiled), spool))
            return

    finished = False
    try:
        for _ in range(2 * jobs):  # a window of segments ahead: bounded disk and memory
            submit()
        while window:
            future, spool = window.popleft()
            results.append(future.result())
            submit()
            yield from _read_spool(spool)
            os.remove(spool)
        finished = True
    finally:
        # on an error or Ctrl-C nothing waits for the segments still being converted
        pool.shutdown(wait=finished, cancel_futures=True)


def _write(tmp: str, paths: list[str], sources: list[str], wanted: list[str] | None,
           start_ns: int | None, end_ns: int | None, schema: Schema, converter: Any,
           stats: ExportStats, chunk_size: int, progress: Callable[[int], None] | None,
           mismatch: Any, jobs: int, compiled: bool = True) -> None:
    """The export proper, into the file ``tmp`` (see :func:`export_mcap`)."""
    # the mcap library: the viz extra, which export_mcap's require() checked
    from mcap.writer import CompressionType, Writer

    indexes = IndexCache()
    paths = [p for p in paths
             if end_ns is None or (entry := indexes.entry(p)) is None
             or entry.first_mono_ns <= end_ns]
    stats.segments = len(paths)
    results: list[_SegmentResult] = []
    spool_dir = None
    if jobs > 1 and len(paths) > 1:
        spool_dir = tempfile.mkdtemp(prefix=".msgq-export-",
                                     dir=os.path.dirname(os.path.abspath(tmp)))
        events: Iterator[tuple[str, int, bytes, int]] = _segments_in_parallel(
            paths, jobs, wanted, start_ns, end_ns, schema, spool_dir, results, compiled)
    else:
        def serial() -> Iterator[tuple[str, int, bytes, int]]:
            for path in paths:
                result = _SegmentResult()
                yield from _convert_segment(path, wanted, start_ns, end_ns, schema,
                                            converter, indexes, mismatch, result, compiled)
                results.append(result)

        events = serial()
    try:
        _write_messages(tmp, events, schema, converter, stats, chunk_size, progress,
                        results, sources, paths, Writer, CompressionType, compiled)
    finally:
        if spool_dir is not None:
            shutil.rmtree(spool_dir, ignore_errors=True)


_MESSAGE_HEAD = struct.Struct("<BQHIQQ")  # opcode, record length, channel, sequence, times


@functools.cache
def _message_index_class() -> type:
    """mcap's MessageIndex record with its (log time, offset) pairs written by one struct
    pack instead of two packs and writes each (~2 us a message); the same bytes."""
    # the mcap library: the viz extra, which export_mcap's require() checked
    from mcap.opcode import Opcode
    from mcap.records import MessageIndex

    class PackedMessageIndex(MessageIndex):
        def write(self, stream: Any) -> None:
            records = self.records
            stream.start_record(Opcode.MESSAGE_INDEX)
            stream.write2(self.channel_id)
            stream.write4(len(records) * 16)
            stream.write(struct.pack(f"<{2 * len(records)}Q", *chain.from_iterable(records)))
            stream.finish_record()

    return PackedMessageIndex


def mcap_batches() -> bool:
    """Whether the installed mcap is one :class:`_MessageBatcher` was checked against
    (:data:`MCAP_BATCHED_VERSIONS`): otherwise messages go through ``add_message``."""
    try:
        installed = version("mcap")
    except PackageNotFoundError:
        return False
    numbers = []
    for part in installed.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits or 0))
    low, high = MCAP_BATCHED_VERSIONS
    return low <= tuple(numbers) < high


class _MessageBatcher:
    """Messages added to an ``mcap`` Writer a batch at a time: the same records, chunks,
    indexes and statistics as its ``add_message`` called once per message (the file is
    the same byte for byte), without the per-message Message object, struct packs and
    BytesIO writes that cost ~15 us each. Works on the Writer's own chunk builder and
    statistics: mcap's private attributes, so it is used only with the mcap versions it was
    checked against (:func:`mcap_batches`; AttributeError when made if they are not there,
    and the export adds its messages one by one): :meth:`flush` before anything else is
    written (a new channel, metadata, finish)."""

    LIMIT = 2048  # messages held before they are written

    def __init__(self, writer: Any, chunk_size: int) -> None:
        self.writer = writer
        self.builder = writer._Writer__chunk_builder
        self.statistics = writer._Writer__statistics
        self.finalize_chunk = writer._Writer__finalize_chunk
        for name in ("message_indices", "num_messages", "message_start_time",
                     "message_end_time"):
            getattr(self.builder, name)  # all there, or AttributeError now, not mid-file
        self.builder.record_writer._buffer.tell()
        self.statistics.channel_message_counts  # noqa: B018 - checked as above
        self.chunk_size = chunk_size
        self.channels: list[int] = []
        self.sequences: list[int] = []
        self.times: list[int] = []
        self.texts: list[bytes] = []
        self.held = 0  # bytes of the texts held
        self.message_index = _message_index_class()

    def add(self, channel_id: int, sequence: int, log_time: int, data: bytes) -> None:
        """One message (publish time = log time), written at the next :meth:`flush`."""
        self.channels.append(channel_id)
        self.sequences.append(sequence)
        self.times.append(log_time)
        self.texts.append(data)
        self.held += len(data)
        if self.held >= self.chunk_size or len(self.texts) >= self.LIMIT:
            self.flush()  # memory: at most a chunk's worth held

    def flush(self) -> None:
        """Writes the messages held, as add_message would have one by one."""
        channels, sequences, times, texts = self.channels, self.sequences, self.times, \
            self.texts
        if not texts:
            return
        self.channels, self.sequences, self.times, self.texts = [], [], [], []
        self.held = 0
        statistics = self.statistics
        if statistics.message_count == 0:
            statistics.message_start_time = min(times)
        else:
            statistics.message_start_time = min(statistics.message_start_time, min(times))
        statistics.message_end_time = max(statistics.message_end_time, max(times))
        counts = statistics.channel_message_counts
        for channel in channels:
            counts[channel] += 1
        statistics.message_count += len(texts)
        builder = self.builder
        pack = _MESSAGE_HEAD.pack
        n = len(texts)
        i = 0
        while i < n:
            buffer = builder.record_writer._buffer
            at = buffer.tell()
            parts = []
            indices = builder.message_indices
            j = i
            full = False
            while j < n:
                data = texts[j]
                channel, log_time = channels[j], times[j]
                index = indices.get(channel)
                if not index:
                    index = indices[channel] = self.message_index(channel_id=channel,
                                                                  records=[])
                index.records.append((log_time, at))
                parts.append(pack(5, 22 + len(data), channel, sequences[j], log_time,
                                  log_time))
                parts.append(data)
                at += 31 + len(data)
                j += 1
                if at > self.chunk_size:
                    full = True
                    break
            buffer.write(b"".join(parts))
            if builder.num_messages == 0:
                builder.message_start_time = min(times[i:j])
            else:
                builder.message_start_time = min(builder.message_start_time, min(times[i:j]))
            builder.message_end_time = max(builder.message_end_time, max(times[i:j]))
            builder.num_messages += j - i
            if full:
                self.finalize_chunk()
            i = j


def _write_messages(tmp: str, events: Iterator[tuple[str, int, bytes, int]], schema: Schema,
                    converter: Any, stats: ExportStats, chunk_size: int,
                    progress: Callable[[int], None] | None, results: list[_SegmentResult],
                    sources: list[str], paths: list[str], writer_class: Any,
                    compression: Any, compiled: bool = True) -> None:
    with open(tmp, "wb") as stream:
        writer = writer_class(stream, chunk_size=chunk_size, compression=compression.ZSTD)
        writer.start(profile="", library=f"msgq {_msgq_version()} (mcap)")
        batcher = None
        if compiled and mcap_batches():
            try:
                batcher = _MessageBatcher(writer, chunk_size)
            except AttributeError:  # an mcap whose Writer is built otherwise: one by one
                batcher = None
        channels: dict[str, int] = {}
        sequences: dict[str, int] = {}
        log_start: dict[str, Any] | None = None
        has_log_start = "logStart" in schema.union_fields

        def channel_of(service: str) -> int:
            if batcher is not None:
                batcher.flush()  # the channel record goes after the messages before it
            schema_id = writer.register_schema(
                name=converter.schema_name(service), encoding="jsonschema",
                data=json.dumps(converter.json_schema(service)).encode())
            service_info = schema.services.get(service)
            meta = {"service": service}
            if service_info is not None:
                meta["frequency_hz"] = f"{service_info.frequency:g}"
            channel_id = writer.register_channel(
                topic=f"/{service}", message_encoding="json", schema_id=schema_id,
                metadata=meta)
            channels[service] = channel_id
            sequences[service] = 0
            return channel_id

        add = writer.add_message
        first = last = None
        for service, mono, data, size in events:
            channel_id = channels.get(service)
            if channel_id is None:
                channel_id = channel_of(service)
            sequence = sequences[service]
            sequences[service] = sequence + 1
            if batcher is not None:
                batcher.add(channel_id, sequence & 0xFFFFFFFF, mono, data)
            else:
                add(channel_id=channel_id, log_time=mono, data=data, publish_time=mono,
                    sequence=sequence & 0xFFFFFFFF)
            if has_log_start and log_start is None and service == "logStart":
                log_start = json.loads(data).get("logStart")
            stats.messages += 1
            if first is None or mono < first:
                first = mono
            if last is None or mono > last:
                last = mono
            stats.bytes_in += size
            if progress is not None:
                progress(size)
        if batcher is not None:
            batcher.flush()
        stats.first_mono_ns, stats.last_mono_ns = first, last
        stats.counts = dict(sequences)
        for result in results:
            stats.problems += result.problems
            stats.unreadable_segments += result.unreadable
        for name, record in _metadata(schema, sources, paths).items():
            writer.add_metadata(name, record)
        if isinstance(log_start, dict):
            writer.add_metadata("logStart", {k: v if isinstance(v, str) else json.dumps(v)
                                             for k, v in log_start.items()})
        writer.finish()


def _problem_text(problem: LogProblem) -> str:
    return str(problem)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
