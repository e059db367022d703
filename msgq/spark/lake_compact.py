"""The executor side of a compact read of a lake: a task reads its tables' Parquet files
with pyarrow and packs their rows as :mod:`msgq.spark.compact` does, or reads the
lake's compact table and groups its rows for ``log_stats`` where they are read.

``read_logs(LAKE, compact=True)`` (what ``msgq logstats`` reads) is the lake's version
of the raw source's compact read: the events never become Spark rows. A lake with a
compact table (the rows packed once, when it was built) is read as a Parquet scan of
it, and ``log_stats`` of that read runs its grouped stage in the tasks that read the
table (:class:`GroupedCompact`), with no shuffle. Otherwise (a window, or a lake made
before the compact table came) a frame of
(table, file) rows goes through ``mapInArrow(ReadCompact(...))``; each task reads the
narrow columns of its files (logMonoTime, valid, size, file, segment, offset, problem),
names each row's service after its table (none for the problems table), keeps the
time window and hands the batches to :func:`msgq.spark.compact.compact_batches`. The
rows are those of :func:`msgq.spark.lake.read_lake` without ``decode``, packed.

Layer: part of the Spark tool (imported by msgq.spark.lake; runs in the executors'
Python workers, which import pyarrow: the spark extra).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgq.spark.compact import (
    COMPACT_COLUMNS,
    COMPACT_SCHEMA,
    arrow_schema,
    compact_batches,
    problem_rows,
)

__all__ = ["FILES_SCHEMA", "GroupedCompact", "ReadCompact"]

#: The rows a compact read of a lake is planned as: a table and one of its files.
FILES_SCHEMA = "table string, path string"
_COLUMNS = ("file", "segment", "offset", "logMonoTime", "service", "valid", "size", "problem")
_PROBLEM_COLUMNS = ("file", "segment", "offset", "problem")
_TYPES = {"file": pa.string(), "segment": pa.int32(), "offset": pa.int64(),
          "logMonoTime": pa.int64(), "service": pa.string(), "valid": pa.bool_(),
          "size": pa.int32(), "problem": pa.string()}


class ReadCompact:
    """The mapInArrow function: (table, path) rows -> compact rows of those files; the
    events of ``start <= logMonoTime < end`` (None: unbounded); ``problems_table``: the
    name of the table whose rows are problems."""

    def __init__(self, problems_table: str, start: int | None, end: int | None) -> None:
        self.problems_table = problems_table
        self.start = start
        self.end = end

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        return compact_batches(self._rows(batches))

    def _rows(self, batches: Iterable[Any]) -> Iterator[Any]:
        for batch in batches:
            for table, path in zip(batch.column("table").to_pylist(),
                                   batch.column("path").to_pylist(), strict=True):
                yield from self._file(table, path)

    def _file(self, table: str, path: str) -> Iterator[Any]:
        problems = table == self.problems_table
        parquet = pq.ParquetFile(path)
        present = set(parquet.schema_arrow.names)
        wanted = [c for c in _COLUMNS if c in present and c != "service"]
        for batch in parquet.iter_batches(columns=wanted, batch_size=1 << 16):
            n = batch.num_rows
            columns = {}
            for name in _COLUMNS:
                if name == "service":
                    columns[name] = pa.array([None if problems else table] * n, pa.string())
                elif name in wanted:
                    columns[name] = batch.column(name).cast(_TYPES[name])
                else:
                    columns[name] = pa.nulls(n, _TYPES[name])
            out = pa.RecordBatch.from_pydict(columns)
            if not problems:
                # a typed decoding that failed while the lake was built is no problem
                # of a read without typed columns (read_lake's rule)
                problem = out.column("problem")
                undecodable = pc.fill_null(pc.starts_with(problem, "undecodable:"), False)
                if pc.any(undecodable).as_py():
                    out = out.set_column(_COLUMNS.index("problem"), "problem",
                                         pc.if_else(undecodable, pa.scalar(None, pa.string()),
                                                    problem))
                keep = None
                mono = out.column("logMonoTime")
                if self.start is not None:
                    keep = pc.greater_equal(mono, self.start)
                if self.end is not None:
                    below = pc.less(mono, self.end)
                    keep = below if keep is None else pc.and_(keep, below)
                if keep is not None:
                    out = out.filter(pc.fill_null(keep, False))
            if out.num_rows:
                yield out


class GroupedCompact:
    """The mapInArrow function of a compact read of a lake's compact table that applies
    a grouped function where the rows are read, with no shuffle: rows of ``id`` (an
    index into ``units``: a service of the compact table, or None: the problems table)
    -> for each group of those services' compact rows (one read of the table per task)
    by ``keys`` (columns of the compact rows, ``service`` among them, so every group
    lies in one service), ``function(group)`` (an Arrow table, as
    ``groupBy(keys).applyInArrow`` gives it)."""

    def __init__(self, compact_files: list[str], problem_files: list[str],
                 units: list[str | None], keys: tuple[str, ...], function: Any) -> None:
        self.compact_files = compact_files
        self.problem_files = problem_files
        self.units = units
        self.keys = keys
        self.function = function

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        services = [self.units[i] for batch in batches for i in batch.column("id").to_pylist()]
        if None in services:
            yield from self._apply(self._problems())
        wanted = [s for s in services if s is not None]
        if wanted:  # the task's services in one read of the table
            yield from self._apply(self._services(wanted))

    def _services(self, services: list[str]) -> Any:
        # pyarrow: the optional spark extra, imported when Spark is used
        import pyarrow.dataset as ds

        return ds.dataset(self.compact_files, format="parquet") \
            .to_table(columns=list(COMPACT_COLUMNS),
                      filter=ds.field("service").isin(services)) \
            .cast(arrow_schema(COMPACT_SCHEMA))

    def _problems(self) -> Any:
        """The problems table's rows as compact problem rows (:func:`problem_rows`)."""
        damage = pq.ParquetDataset(self.problem_files).read(columns=list(_PROBLEM_COLUMNS))
        column = {name: damage.column(name).combine_chunks() for name in _PROBLEM_COLUMNS}
        return pa.Table.from_batches([problem_rows(
            column["file"], column["segment"], pa.nulls(damage.num_rows, pa.string()),
            column["offset"], column["problem"])])

    def _apply(self, rows: Any) -> Iterator[Any]:
        if not rows.num_rows:
            return
        for key in rows.group_by(list(self.keys)).aggregate([]).to_pylist():
            keep = None
            for name, value in key.items():
                column = rows.column(name)
                match = pc.is_null(column) if value is None else \
                    pc.fill_null(pc.equal(column, value), False)
                keep = match if keep is None else pc.and_(keep, match)
            yield from self.function(rows.filter(keep)).to_batches()
