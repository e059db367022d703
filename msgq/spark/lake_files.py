"""The executor side of a lake build: one Spark task reads its segment ranges and turns
their events into the lake's Parquet files, every service at once.

A micro-batch of the build (:mod:`msgq.spark.lake`) is a row per segment range it adds
(:data:`msgq.spark.streaming.RANGE_SCHEMA`: file, segment, bytes ``[start, end)``),
spread over the tasks by size. :class:`TableFiles` runs in ``mapInArrow`` over them: it
reads each range with the msgqlog source's own reading, taken before it becomes Arrow
rows (:func:`msgq.spark.datasource.read_segment_pieces`: the scanner's batches of
events and the rows read on their own, problem rows where the logs are damaged; the
same events, problems and order as the source's rows), splits each scanner batch by
service and partition (date, route) with numpy, gathers each table file's event
columns from the batch's arrays, decodes each service's events into its typed column
with the source's own decoder (:func:`msgq.spark.datasource.member_decoder`: one copy
of the decoding) as each batch comes, while its bytes are in the caches, into one
column per table file (:class:`msgq.spark.datasource.DecodedColumn`: one Arrow array,
not one per batch), packs each range's events into compact rows as they are split
(the rows :func:`msgq.spark.compact.compact_batches` makes of the range's event rows:
the :data:`COMPACT_TABLE`, when the lake has one), and writes one Parquet file per
table and partition (sorted by ``logMonoTime``; cut at :data:`TARGET_FILE_BYTES` of
events) into the batch's staging folder. It yields one row per file written
(:data:`SUMMARY_SCHEMA`); the driver moves exactly those files into the tables
(write-then-rename), so the files of a task attempt that failed are never moved.

Each event is read, decoded and written once, in one task: the events never become JVM
rows (measured in docs/spark.md, "The lake's benchmark").

Layer: part of the Spark tool (imported by msgq.spark.lake; runs in executors' Python
workers, which import pyarrow and pyspark: the spark extra).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema, to_arrow_type
from pyspark.sql.types import StructType

from msgq.logs import LogReader, read_index, segment_paths
from msgq.logs.segment import VALID
from msgq.schemas.events import decode_event
from msgq.spark.capnp_types import member_plan
from msgq.spark.compact import events_rows, problem_rows
from msgq.spark.datasource import (
    ReadOptions,
    ScannerRun,
    member_decoder,
    read_segment_pieces,
    route_name,
    spec_from_option,
)
from msgq.spark.streaming import RANGE_SCHEMA

__all__ = ["COMPACT_TABLE", "PROBLEMS_TABLE", "SUMMARY_SCHEMA", "TARGET_FILE_BYTES",
           "TableFiles", "partition_folder"]

#: The table of the damage found in the logs (file, segment, offset, problem).
PROBLEMS_TABLE = "_problems"
#: The table of compact rows (:data:`msgq.spark.compact.COMPACT_SCHEMA`): what
#: :func:`msgq.spark.compact.compact_batches` makes of each segment range's event rows.
COMPACT_TABLE = "_compact"
#: The size a table file is cut at, in bytes of events (the files are smaller: Parquet).
TARGET_FILE_BYTES = 128 << 20
#: The event bytes a task holds before it writes its largest tables early (memory).
_TASK_BYTES = 512 << 20
#: A row per file written: its table, its path under the staging folder, its rows, its
#: newest logMonoTime, and for a problems file the first problems (JSON).
SUMMARY_SCHEMA = "table string, path string, rows bigint, newest bigint, problems string"
#: The problems a summary row lists at most (all are counted).
LISTED_PROBLEMS = 20
# How files are written: zstd, no dictionaries (zstd does their work: measured 1.7x
# smaller files), values handed to the encoders 64 Ki at a time (write_batch_size: 1 Ki
# by default), level 1 for the service tables (with the batch size, the 10 M
# recording's service tables: 0.36 -> 0.32 CPU-s per 1 M events, the same size) and 3
# (Spark's default) for the compact table (its packed logMonoTimes: 55 -> 35 MiB at
# 10 M, read by every log_stats of the lake: _COMPACT_OPTIONS), the sorted time and offset columns
# delta-encoded (a further 1.3x), statistics (min, max, nulls) for the event columns
# only, which queries filter on (logMonoTime above all): a typed column's, every leaf
# of its nested fields, cost 15 % of the writing (the 1 M recording's service tables:
# 0.44 -> 0.37 CPU-s) to skip files that a filter on a typed field rules out, which the
# file's logMonoTime range already does for a time window (and the compact table's
# columns but its packed times). No Arrow schema in the footer (Spark reads its own).
_PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd", "compression_level": 1, "use_dictionary": False,
    "store_schema": False, "write_batch_size": 1 << 16,
    "write_statistics": ["logMonoTime", "valid", "segment", "file", "offset", "size",
                         "problem", "kind", "recording", "service", "count", "invalid",
                         "size_sum"],
    "column_encoding": {"logMonoTime": "DELTA_BINARY_PACKED", "offset": "DELTA_BINARY_PACKED"}}
_COMPACT_OPTIONS = {**_PARQUET_OPTIONS, "compression_level": 3}
# The columns of a batch's rows that every table stores (a service's, the problems').
_EVENT_COLUMNS = ["logMonoTime", "valid", "segment", "file", "offset", "size", "problem"]
# The largest logMonoTime a long column holds (the source's reading: larger is null).
_MAX_LONG = (1 << 63) - 1
_RANGE_COLUMNS = [column.split()[0] for column in RANGE_SCHEMA.split(", ")]
#: The null value of a partition column in a folder name (Spark's).
_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# The characters Spark escapes in a partition value (%XX) on POSIX file systems.
_ESCAPED = frozenset([*map(chr, range(1, 32)), '"', "#", "%", "'", "*", "/", ":", "=", "?",
                      "\\", "\x7f", "{", "[", "]", "^"])


def partition_folder(column: str, value: str | None) -> str:
    """The folder of a partition value, as Spark's writer names it and its reader parses
    it (``route=a%3Ab``; null: ``__HIVE_DEFAULT_PARTITION__``)."""
    if value is None or value == "":
        return f"{column}={_NULL_PARTITION}"
    return column + "=" + "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")


def _date_of(route: str) -> str | None:
    """The date in a route's name (``YYYY-MM-DD``), else None."""
    found = _DATE.search(route)
    return found.group(1) if found else None


def _recording_date(folder: str, schema: Any) -> str | None:
    """The UTC date (``YYYY-MM-DD``) a msgq recording began: the wall time of its first
    segment's logStart (the first event of its first frame, there as soon as the
    segment has a frame), else the start of its first index entry (schemas without a
    logStart); None when neither says."""
    wall = None
    try:
        first = segment_paths(folder)[:1]
    except OSError:
        first = []
    if first:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                reader = LogReader(first[0], schema=schema, skip_corrupt=True, warn=False,
                                   check_schema=False)
                event = next(iter(reader.raw()), None)
                if event is not None and event.service == "logStart":
                    wall = int(decode_event(event.data, schema).logStart.wallTimeNs)
            except Exception:  # damage, or no logStart of msgq's shape: the index says
                wall = None
    if not wall:
        entries = sorted(read_index(folder) or [], key=lambda e: e.segment)
        if entries and entries[0].start:
            wall = int(entries[0].start.get("wall_time_ns") or 0)
    if not wall:
        return None
    return datetime.datetime.fromtimestamp(wall / 1e9, datetime.timezone.utc) \
        .strftime("%Y-%m-%d")


def _without_empty(array: Any, kind: Any) -> Any:
    """``array`` as Arrow type ``kind``: its type with the structs of no fields (which
    Parquet cannot hold) left out, and fields and lists of them."""
    if array.type == kind:
        return array
    if pa.types.is_struct(kind):
        names = [array.type.field(i).name for i in range(array.type.num_fields)]
        children = [_without_empty(array.field(names.index(f.name)), f.type) for f in kind]
        return pa.StructArray.from_arrays(children, fields=list(kind),
                                          mask=array.is_null() if array.null_count else None)
    if pa.types.is_list(kind):
        values = _without_empty(array.values, kind.value_type)
        return pa.ListArray.from_arrays(array.offsets, values, type=kind,
                                        mask=array.is_null() if array.null_count else None)
    raise TypeError(f"cannot store {array.type} as {kind}")


@functools.lru_cache(maxsize=512)
def _arrow_schema(stored: str) -> Any:
    """The Arrow schema of a table's stored columns (Spark schema JSON), converted once
    per worker process: pyspark's conversion walks every nested field (70 ms a task for
    msgq's 21 tables), a fixed cost of every task of every batch (a follow's too)."""
    return to_arrow_schema(StructType.fromJson(json.loads(stored)), timezone="UTC")


def _increasing(column: Any) -> bool:
    """Whether a column of logMonoTimes has no null and rises strictly: then its rows are
    in the order a table file's sort gives them (a service's events in a recording
    almost always are), and sorting them, which moves every typed column, is skipped."""
    if column.null_count:
        return False
    times = column.to_numpy()
    return bool(np.all(times[1:] > times[:-1]))


class _Gathered:
    """The rows of one table file being gathered: numpy parts of its event columns (as
    the reading gives them: each event's logMonoTime, valid, offset and size; runs of
    one segment file), the positions of its null logMonoTimes and offsets and its
    rows' problems; a compact file's rows (record batches); and the service's typed
    column, decoded as the events come (a :class:`msgq.spark.datasource.DecodedColumn`;
    None: none)."""

    __slots__ = ("count", "files", "mono_nulls", "monos", "offset_nulls", "offsets",
                 "problems", "rows", "sizes", "typed", "valid")

    def __init__(self, typed: Any) -> None:
        self.count = 0
        self.files: list[list[Any]] = []  # [path, segment, rows] runs
        self.monos: list[Any] = []
        self.valid: list[Any] = []
        self.offsets: list[Any] = []
        self.sizes: list[Any] = []
        self.mono_nulls: list[int] = []
        self.offset_nulls: list[int] = []
        self.problems: dict[int, str] = {}
        self.rows: list[Any] = []
        self.typed = typed

    def add(self, path: str, segment: int | None, monos: Any, valid: Any, offsets: Any,
            sizes: Any) -> int:
        """Adds events (numpy arrays of one length); returns the position of the first."""
        first = self.count
        count = len(monos)
        last = self.files[-1] if self.files else None
        if last is not None and last[0] == path and last[1] == segment:
            last[2] += count
        else:
            self.files.append([path, segment, count])
        self.monos.append(monos)
        self.valid.append(valid)
        self.offsets.append(offsets)
        self.sizes.append(sizes)
        self.count = first + count
        return first

    def columns(self) -> dict[str, Any]:
        """The event columns of the rows gathered (:data:`_EVENT_COLUMNS`), as Arrow
        arrays."""
        count = self.count
        runs = [run[2] for run in self.files]
        index_of: dict[str, int] = {}  # each file's index in order of first run
        for run in self.files:
            index_of.setdefault(run[0], len(index_of))
        names = list(index_of)
        file_index = np.repeat(np.array([index_of[run[0]] for run in self.files],
                                        np.int32), runs)
        segments = np.repeat(np.array([-1 if run[1] is None else run[1]
                                       for run in self.files], np.int32), runs)
        no_segment = np.repeat(np.array([run[1] is None for run in self.files]), runs)
        problem = pa.nulls(count, pa.string())
        if self.problems:
            listed: list[str | None] = [None] * count
            for at, text in self.problems.items():
                listed[at] = text
            problem = pa.array(listed, type=pa.string())
        return {
            "logMonoTime": pa.array(np.concatenate(self.monos),
                                    mask=_mask(count, self.mono_nulls)),
            "valid": pa.array(np.concatenate(self.valid)),
            "segment": pa.array(segments, mask=no_segment if no_segment.any() else None),
            "file": pa.array(names, pa.string()).take(pa.array(file_index)),
            "offset": pa.array(np.concatenate(self.offsets),
                               mask=_mask(count, self.offset_nulls)),
            "size": pa.array(np.concatenate(self.sizes)),
            "problem": problem,
        }


def _mask(count: int, nulls: list[int]) -> Any:
    """A null mask of ``count`` values true at ``nulls``; None when there are none."""
    if not nulls:
        return None
    mask = np.zeros(count, bool)
    mask[nulls] = True
    return mask


class _RangeCompact:
    """The compact rows of one segment range (:func:`msgq.spark.compact.compact_batches`
    of its event rows, all in one batch), gathered as its events are split by service:
    a row per service (count, invalid count, byte sum, its logMonoTimes packed in
    reading order) after a problem row per event whose logMonoTime is out of range."""

    __slots__ = ("bad", "services")

    def __init__(self) -> None:
        self.services: dict[str, list[Any]] = {}  # service -> [monos, count, invalid, bytes]
        self.bad: list[tuple[str, int | None, str]] = []  # (service, offset, problem)

    def add(self, service: str, monos: Any, count: int, invalid: int, size: int) -> None:
        """``count`` events of ``service`` whose logMonoTimes (a numpy array) are in
        range, ``invalid`` of them not valid, of ``size`` bytes in all."""
        if not count:
            return
        entry = self.services.get(service)
        if entry is None:
            entry = self.services[service] = [[], 0, 0, 0]
        entry[0].append(monos)
        entry[1] += count
        entry[2] += invalid
        entry[3] += size

    def batches(self, path: str, segment: int | None, schema: Any) -> list[Any]:
        """The range's compact rows: its problem rows, then its events rows."""
        out = []
        if self.bad:
            services, offsets, problems = zip(*self.bad, strict=True)
            n = len(problems)
            out.append(problem_rows([path] * n, [segment] * n, list(services), list(offsets),
                                    list(problems), schema))
        if self.services:
            n = len(self.services)
            entries = self.services.values()
            out.append(events_rows(
                [path] * n, [segment] * n, list(self.services), [e[1] for e in entries],
                [e[2] for e in entries], [e[3] for e in entries],
                (monos[0] if len(monos) == 1 else np.concatenate(monos)
                 for monos, *_ in entries), schema))
        return out


class TableFiles:
    """The ``mapInArrow`` function of a build's batch (module docstring): segment ranges
    (:data:`msgq.spark.streaming.RANGE_SCHEMA` rows) in, a row per file written out.
    ``spec``: the schema's ``schemaSpec`` option; ``staging``: the batch's staging
    folder; ``tables``: table -> Spark schema JSON of its stored columns (partition
    columns left out); :data:`COMPACT_TABLE` among them: its rows are written too."""

    def __init__(self, spec: str, staging: str, tables: dict[str, str]) -> None:
        self.spec = spec
        self.staging = staging
        self.tables = tables

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        return _TaskFiles(self).run(batches)


class _TaskFiles:
    """The files of one task: events gathered per (table, date, route), written when a
    table's events reach TARGET_FILE_BYTES, when the task holds _TASK_BYTES, and at
    the end."""

    def __init__(self, plan: TableFiles) -> None:
        self.plan = plan
        self.spec = spec_from_option(plan.spec)
        self.schema = self.spec.load()
        # the msgqlog source's reading, with no typed column (decoded here)
        self.options = ReadOptions(paths=(), spec=self.spec)
        self.compact = COMPACT_TABLE in plan.tables
        self._dates: dict[str, str | None] = {}  # a msgq recording's folder -> its date
        self.task = uuid.uuid4().hex[:16]
        self.pending: dict[tuple[str, str | None, str], _Gathered] = {}
        self.sizes: dict[tuple[str, str | None, str], int] = {}
        self.held = 0
        self.written = 0
        self._arrow: dict[str, Any] = {}
        self._typed: dict[str, tuple[Any, Any, Any] | None] = {}
        self.summary = pa.schema([pa.field(n, pa.string() if k == "string" else pa.int64())
                                  for n, k in (c.split() for c in SUMMARY_SCHEMA.split(", "))])

    def run(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            columns = [batch.column(name).to_pylist() for name in _RANGE_COLUMNS]
            for path, segment, start, end, stream in zip(*columns, strict=True):
                yield from self._read(path, segment, start, end, stream)
        for key in list(self.pending):
            yield self._write(key)

    def _read(self, path: str, segment: int | None, start: int, end: int,
              stream: int) -> Iterator[Any]:
        """Reads one segment range with the msgqlog source's reading (its pieces:
        :func:`msgq.spark.datasource.read_segment_pieces`) and gathers its events per
        table file as they come (and, with the compact table, its compact rows)."""
        date, route = self._place(path)
        compact = _RangeCompact() if self.compact else None
        for piece in read_segment_pieces(self.options, path, segment, start, end, stream):
            if type(piece) is ScannerRun:
                yield from self._add_run(piece, path, segment, date, route, compact)
            else:
                yield from self._add_row(piece, path, segment, date, route, compact)
        if compact is not None and (compact.bad or compact.services):
            self._gathered((COMPACT_TABLE, date, route), None).rows.extend(
                compact.batches(path, segment, self._stored(COMPACT_TABLE)))

    # -- gathering ---------------------------------------------------------------------

    def _place(self, path: str) -> tuple[str | None, str]:
        """The (date, route) partition of a segment file's rows: a loggerd route's name
        and the date in it; for a msgq recording, its folder's name and the date it
        began (:func:`_recording_date`; a date in the name first)."""
        route = route_name(path)
        if route is not None:
            return _date_of(route), route
        folder = os.path.dirname(path)
        route = os.path.basename(folder)
        if folder not in self._dates:
            self._dates[folder] = _date_of(route) or _recording_date(folder, self.schema)
        return self._dates[folder], route

    def _stored(self, table: str) -> Any:
        arrow = self._arrow.get(table)
        if arrow is None:
            arrow = self._arrow[table] = _arrow_schema(self.plan.tables[table])
        return arrow

    def _typed_plan(self, service: str) -> tuple[Any, Any, Any] | None:
        """(decoder, Arrow type of the decoded values, Arrow type stored) of a service's
        typed column; None when it has none (a Void member, or nothing Parquet holds)."""
        if service not in self._typed:
            stored = self._stored(service)
            decoder = member_decoder(self.spec, service)
            plan = member_plan(self.schema.event.schema, service)
            if decoder is None or plan is None or service not in stored.names:
                self._typed[service] = None
            else:
                self._typed[service] = (decoder, to_arrow_type(plan.spark_type),
                                        stored.field(service).type)
        return self._typed[service]

    def _gathered(self, key: tuple[str, str | None, str], service: str | None) -> _Gathered:
        """The rows gathered for a table file (made on first need: with the service's
        typed column, when it has one)."""
        gathered = self.pending.get(key)
        if gathered is None:
            typed = None if service is None else self._typed_plan(service)
            column = None if typed is None else \
                typed[0].decoded_column(self.schema, typed[1])
            gathered = self.pending[key] = _Gathered(column)
        return gathered

    def _add_run(self, run: Any, path: str, segment: int | None, date: str | None,
                 route: str, compact: _RangeCompact | None) -> Iterator[Any]:
        """Gathers a scanner batch's messages (a ScannerRun) by service: their event
        columns from the batch's arrays (sorted by service once, each service's rows a
        slice), their typed values decoded now, while the batch's bytes are in the
        caches, into the one column of the file."""
        batch = run.batch
        picked = run.picked
        codes = batch.service[picked]
        order = np.argsort(codes, kind="stable")  # each service's rows in reading order
        codes = codes[order]
        rows = picked[order]
        firsts = np.concatenate(([0], np.flatnonzero(np.diff(codes)) + 1))
        ends = np.append(firsts[1:], len(rows)).tolist()
        raw_monos = batch.mono_ns[rows]
        over = raw_monos > np.uint64(_MAX_LONG)
        monos = raw_monos.astype(np.int64)
        valid = (batch.flags[rows] & VALID) != 0
        starts = batch.offset[rows]
        lengths = batch.length[rows]
        offsets = starts + (batch.stream_offset + run.base)
        sizes = lengths.astype(np.int32)
        size_sums = np.add.reduceat(lengths.astype(np.int64), firsts).tolist()
        invalid = np.add.reduceat(~valid, firsts, dtype=np.int64).tolist()
        any_over = bool(over.any())
        for k, (a, b) in enumerate(zip(firsts.tolist(), ends, strict=True)):
            service = batch.services[codes[a]]
            if service not in self.plan.tables:  # a member this schema lacks: never here
                raise ValueError(f"events of {service!r}, which the schema lacks")
            key = (service, date, route)
            gathered = self._gathered(key, service)
            first = gathered.add(path, segment, monos[a:b], valid[a:b], offsets[a:b],
                                 sizes[a:b])
            if any_over and over[a:b].any():  # the source's reading: null, and why
                out = over[a:b]
                for at in np.flatnonzero(out).tolist():
                    problem = f"out of range: logMonoTime {int(raw_monos[a + at])} is " \
                              "over 2^63-1"
                    gathered.mono_nulls.append(first + at)
                    gathered.problems[first + at] = problem
                    if compact is not None:
                        compact.bad.append((service, int(offsets[a + at]), problem))
                if compact is not None:
                    keep = ~out
                    compact.add(service, monos[a:b][keep], int(keep.sum()),
                                int(np.count_nonzero(~valid[a:b][keep])),
                                int(lengths[a:b][keep].sum(dtype=np.int64)))
            elif compact is not None:
                compact.add(service, monos[a:b], b - a, invalid[k], size_sums[k])
            if gathered.typed is not None:
                gathered.typed.add(batch.data, starts[a:b], lengths[a:b])
            yield from self._grown(key, size_sums[k])

    def _add_row(self, row: Any, path: str, segment: int | None, date: str | None,
                 route: str, compact: _RangeCompact | None) -> Iterator[Any]:
        """Gathers a row the reading added on its own (a OneRow): a problem row (the
        problems table's), or an event the scanner left to pycapnp."""
        service = row.service
        table = PROBLEMS_TABLE if service is None else service
        if table not in self.plan.tables:  # a member this schema lacks: never here
            raise ValueError(f"events of {service!r}, which the schema lacks")
        key = (table, date, route)
        gathered = self._gathered(key, service)
        size = 0 if row.data is None else len(row.data)
        first = gathered.add(path, segment, np.array([row.mono or 0], np.int64),
                             np.array([bool(row.valid)]),
                             np.array([row.offset or 0], np.int64),
                             np.array([size], np.int32))
        if row.mono is None:
            gathered.mono_nulls.append(first)
        if row.offset is None:
            gathered.offset_nulls.append(first)
        if row.problem is not None:
            gathered.problems[first] = row.problem
        if service is None:
            return
        if compact is not None:
            if row.mono is None:
                compact.bad.append((service, row.offset, row.problem or ""))
            else:
                compact.add(service, np.array([row.mono], np.int64), 1,
                            0 if row.valid else 1, size)
        if gathered.typed is not None:
            gathered.typed.add(row.data, np.zeros(1, np.int64), np.array([size], np.int64))
        yield from self._grown(key, size)

    def _grown(self, key: tuple[str, str | None, str], size: int) -> Iterator[Any]:
        """Counts ``size`` more bytes of events for a table file; writes it when it has
        TARGET_FILE_BYTES, and the largest while the task holds _TASK_BYTES."""
        self.sizes[key] = self.sizes.get(key, 0) + size
        self.held += size
        if self.sizes[key] >= TARGET_FILE_BYTES:
            yield self._write(key)
        while self.held >= _TASK_BYTES:
            yield self._write(max(self.sizes, key=self.sizes.__getitem__))

    def _table(self, table: str, gathered: _Gathered) -> Any:
        """The stored columns of a table file's gathered rows, one chunk each: the
        event columns (or the compact rows) and the service's typed column, an event
        whose typed decoding failed null there and its ``problem`` saying why."""
        stored = self._stored(table)
        if table == COMPACT_TABLE:
            return pa.Table.from_batches(gathered.rows, schema=stored)
        columns = gathered.columns()
        if gathered.typed is not None:
            service = stored.names[len(_EVENT_COLUMNS)]
            column, failed = gathered.typed.finish()
            columns[service] = _without_empty(column, stored.field(service).type)
            if failed:
                problems = columns["problem"].to_pylist()
                for i, problem in failed.items():
                    problems[i] = problem
                columns["problem"] = pa.array(problems, type=pa.string())
        return pa.Table.from_arrays([columns[f.name] for f in stored], schema=stored)

    # -- writing -----------------------------------------------------------------------

    def _write(self, key: tuple[str, str | None, str]) -> Any:
        table, date, route = key
        rows = self._table(table, self.pending.pop(key))
        self.held -= self.sizes.pop(key, 0)
        if table == PROBLEMS_TABLE:
            rows = rows.sort_by([("file", "ascending"), ("offset", "ascending")])
            listed = rows.slice(0, LISTED_PROBLEMS).to_pylist()
            problems = json.dumps(listed)
            newest = None
        elif table == COMPACT_TABLE:
            rows = rows.sort_by([("file", "ascending"), ("service", "ascending")])
            problems = newest = None
        else:
            if not _increasing(rows.column("logMonoTime")):  # else sorted already
                rows = rows.sort_by([("logMonoTime", "ascending"), ("file", "ascending"),
                                     ("offset", "ascending")])  # nulls (out of range) last
            problems = None
            newest = pc.max(rows.column("logMonoTime")).as_py()
        folder = os.path.join(table, partition_folder("date", date),
                              partition_folder("route", route))
        path = os.path.join(folder, f"{self.task}-{self.written:05d}.parquet")
        self.written += 1
        os.makedirs(os.path.join(self.plan.staging, folder), exist_ok=True)
        pq.write_table(rows, os.path.join(self.plan.staging, path),
                       **(_COMPACT_OPTIONS if table == COMPACT_TABLE else _PARQUET_OPTIONS))
        return pa.record_batch([pa.array([table]), pa.array([path]),
                                pa.array([rows.num_rows], pa.int64()),
                                pa.array([newest], pa.int64()), pa.array([problems])],
                               schema=self.summary)
