"""Compact rows: the event rows of a msgqlog read packed per segment file and service.

The first stage of :func:`msgq.spark.analyses.log_stats`. Each Arrow batch of event rows
(file, segment, offset, logMonoTime, service, valid, size, problem) becomes one row per
(segment file, service) in it, holding the count, the invalid count, the byte sum and
the events' logMonoTimes packed as little-endian int64 bytes (``monos``, in the batch's
order); problem rows pass through as rows of kind ``problem``. A few dozen rows per
batch of thousands: what Spark moves afterwards is the timestamps, not a row per event.

It runs in two places with the same result: in the msgqlog source's Python worker, on
the batches it has just read (option ``compact``: :func:`msgq.spark.read_logs` with
``compact=True``, what ``msgq logstats`` reads: Spark never sees a row per event), and
in ``mapInArrow`` over any DataFrame of event rows (what ``log_stats`` does with one).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["COMPACT_COLUMNS", "COMPACT_SCHEMA", "LOGGERD_FILE", "LOGGERD_FOLDER",
           "GroupableRead", "arrow_schema", "compact_batches", "ddl_columns",
           "events_rows", "loggerd_route", "pack_monos", "problem_rows", "recording_of",
           "spark_schema"]

#: The columns of compact rows (a Spark DDL string).
COMPACT_SCHEMA = ("kind string, recording string, file string, segment int, service string, "
                  "offset bigint, problem string, count bigint, invalid bigint, "
                  "size_sum bigint, monos binary")


def ddl_columns(ddl: str) -> list[tuple[str, str]]:
    """The (name, type) pairs of a DDL string of plain columns ("name type, ...")."""
    return [(name, kind) for name, kind in (column.split() for column in ddl.split(", "))]


#: Their names, in order.
COMPACT_COLUMNS = tuple(name for name, _ in ddl_columns(COMPACT_SCHEMA))


class GroupableRead:
    """A compact read whose rows can be grouped in the tasks that read them (a lake's
    compact table, :func:`msgq.spark.lake.read_lake`): the DataFrame, :attr:`frame`,
    and the grouping that reads the table itself, :meth:`group_in_tasks`, held together
    here and nowhere else.

    Used as the DataFrame it holds: any other attribute or method is the frame's
    (``read.inputFiles()``, ``read["service"]``, ``a.unionByName(read)`` on a classic
    session), so ``read.select("*")`` and any other frame derived from it is a plain
    DataFrame, which ``log_stats`` groups with Spark's shuffle. The frame is made
    (``make_frame()``) when first used: ``log_stats``, which groups in the tasks, never
    needs it (planning it cost 0.1-0.2 s of a 1 s pass at 10 M events). Works alike for
    classic and Spark Connect DataFrames: nothing is set on the frame."""

    __slots__ = ("_frame", "_group", "_make_frame", "sparkSession")

    def __init__(self, spark: Any, make_frame: Any, group: Any) -> None:
        self.sparkSession = spark
        self._make_frame = make_frame
        self._group = group
        self._frame = None

    @property
    def frame(self) -> Any:
        """The DataFrame of the read's rows (made on first use)."""
        if self._frame is None:
            self._frame = self._make_frame()
        return self._frame

    @property
    def columns(self) -> list[str]:
        """The frame's columns: the compact rows' (:data:`COMPACT_COLUMNS`)."""
        return list(COMPACT_COLUMNS)

    def group_in_tasks(self, keys: tuple[str, ...], function: Any, schema: Any) -> Any:
        """``frame.groupBy(*keys).applyInArrow(function, schema)`` without the shuffle:
        every group read whole by one task."""
        return self._group(keys, function, schema)

    def __getattr__(self, name: str) -> Any:  # only names the wrapper has not
        if name == "frame" or name in GroupableRead.__slots__:  # failed in frame itself
            raise AttributeError(name)
        return getattr(self.frame, name)

    def __getitem__(self, item: Any) -> Any:
        return self.frame[item]

    def __repr__(self) -> str:
        return f"GroupableRead({self.frame!r})"


@functools.cache
def arrow_schema(ddl: str) -> Any:
    """The Arrow schema of a DDL string of string/int/bigint/double/binary columns
    (pyspark's parser needs a session, which the executors' workers do not have)."""
    # pyarrow: the optional spark extra, imported when Spark is used
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(),
             "double": pa.float64(), "binary": pa.binary()}
    return pa.schema([pa.field(name, types[kind]) for name, kind in ddl_columns(ddl)])


def spark_schema(ddl: str) -> Any:
    """The Spark StructType of a DDL string of string/int/bigint/double/binary columns,
    made here (a DDL string given to Spark is parsed by the JVM's SQL parser, a py4j
    call each time)."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import types as t

    kinds = {"string": t.StringType(), "int": t.IntegerType(), "bigint": t.LongType(),
             "double": t.DoubleType(), "binary": t.BinaryType()}
    return t.StructType([t.StructField(name, kinds[kind]) for name, kind in ddl_columns(ddl)])


#: A loggerd segment file's name: rlog or qlog, zstd, bz2 or uncompressed.
LOGGERD_FILE = r"^[rq]log(?:\.zst|\.bz2)?$"
#: A loggerd segment's folder: ``<route>--<segment number>``.
LOGGERD_FOLDER = r"^(.*)--([0-9]+)$"
_LOGGERD_FILE = re.compile(LOGGERD_FILE)
_LOGGERD_FOLDER = re.compile(LOGGERD_FOLDER)


def loggerd_route(file: str) -> str | None:
    """The route of a loggerd segment file (``/data/<route>--<n>/rlog.zst`` ->
    ``/data/<route>``), None for any other file."""
    folder, _, name = file.rpartition("/")
    if not _LOGGERD_FILE.match(name):
        return None
    match = _LOGGERD_FOLDER.match(folder)
    return match.group(1) if match else None


def recording_of(file: str) -> str:
    """The recording of a segment file: the text before the last '/' ("" without one),
    or a loggerd segment's route (its segments ``<route>--<n>/rlog.zst`` are one
    recording: one monotonic clock, intervals taken across their boundaries)."""
    route = loggerd_route(file)
    if route is not None:
        return route
    head, slash, _ = file.rpartition("/")
    return head if slash else ""


def pack_monos(values: Any) -> bytes:
    """logMonoTimes (a numpy integer array) as compact rows hold them in ``monos``:
    little-endian int64 bytes, in the order given."""
    return np.asarray(values).astype("<i8", copy=False).tobytes()


def problem_rows(file: Any, segment: Any, service: Any, offset: Any, problem: Any,
                 schema: Any = None) -> Any:
    """Compact rows of kind ``problem``, one per damaged spot (``recording`` empty, no
    counts). Each argument is a column of one length (an Arrow array or a list);
    ``schema``: the Arrow schema to make them in (default :data:`COMPACT_SCHEMA`'s)."""
    n = len(problem)
    return _compact_rows(schema, n, kind=["problem"] * n, recording=[""] * n, file=file,
                         segment=segment, service=service, offset=offset, problem=problem)


def events_rows(file: list[str], segment: Any, service: Any, count: Any, invalid: Any,
                size_sum: Any, monos: Iterable[Any], schema: Any = None) -> Any:
    """Compact rows of kind ``events``, one per (segment file, service) of a read:
    columns as :func:`problem_rows` takes them, the file's recording
    (:func:`recording_of`) added, and ``monos``: each row's logMonoTimes (numpy integer
    arrays, in reading order), packed here (:func:`pack_monos`)."""
    n = len(file)
    return _compact_rows(schema, n, kind=["events"] * n,
                         recording=[recording_of(f) for f in file], file=file,
                         segment=segment, service=service, count=count, invalid=invalid,
                         size_sum=size_sum, monos=[pack_monos(m) for m in monos])


def _compact_rows(schema: Any, n: int, **columns: Any) -> Any:
    """An Arrow batch of ``n`` compact rows: the columns given, nulls in the others."""
    # pyarrow: the optional spark extra, imported when Spark is used
    import pyarrow as pa

    schema = arrow_schema(COMPACT_SCHEMA) if schema is None else schema
    return pa.RecordBatch.from_pydict(
        {field.name: columns[field.name] if field.name in columns else
         pa.nulls(n, field.type) for field in schema}, schema=schema)


def compact_batches(batches: Iterable[Any]) -> Iterator[Any]:
    """Arrow batches of event rows -> Arrow batches of compact rows (module docstring)."""
    # pyarrow: the optional spark extra, imported when Spark is used
    import pyarrow as pa

    # pyarrow: the optional spark extra, imported when Spark is used
    import pyarrow.compute as pc

    for batch in batches:
        if not batch.num_rows:
            continue
        service, mono = batch.column("service"), batch.column("logMonoTime")
        bad = pc.or_(pc.or_(pc.is_null(service), pc.is_null(mono)),
                     pc.is_valid(batch.column("problem")))
        if pc.any(bad).as_py():
            rows = batch.filter(bad)
            yield problem_rows(rows.column("file").to_pylist(), rows.column("segment"),
                               rows.column("service"), rows.column("offset"),
                               rows.column("problem"))
        good = pc.and_(pc.is_valid(service), pc.is_valid(mono))
        events = batch if pc.all(good).as_py() else batch.filter(good)
        if not events.num_rows:
            continue
        file_codes = pc.dictionary_encode(events.column("file"))
        service_codes = pc.dictionary_encode(events.column("service"))
        key = (file_codes.indices.to_numpy().astype(np.int64) * len(service_codes.dictionary)
               + service_codes.indices.to_numpy())
        order = np.argsort(key, kind="stable")
        key = key[order]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(key)) + 1))
        ends = np.append(starts[1:], len(key))
        monos = events.column("logMonoTime").to_numpy()[order]
        invalid = (~events.column("valid").fill_null(False).to_numpy(zero_copy_only=False))
        sizes = events.column("size").fill_null(0).to_numpy().astype(np.int64)
        first = order[starts]
        file_index = file_codes.indices.to_numpy()[first]
        service_index = service_codes.indices.to_numpy()[first]
        yield events_rows(
            file_codes.dictionary.take(pa.array(file_index)).to_pylist(),
            events.column("segment").take(pa.array(first)),
            service_codes.dictionary.take(pa.array(service_index)),
            (ends - starts).tolist(),
            np.add.reduceat(invalid[order].astype(np.int64), starts).tolist(),
            np.add.reduceat(sizes[order], starts).tolist(),
            (monos[a:b] for a, b in zip(starts, ends, strict=True)))
