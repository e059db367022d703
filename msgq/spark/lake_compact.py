"""The executor side of a compact read of a lake: a task reads its tables' Parquet files
with pyarrow and packs their rows as :mod:`msgq.spark.compact` does.

``read_logs(LAKE, compact=True)`` (what ``msgq logstats`` reads) is the lake's version
of the raw source's compact read: the events never become Spark rows. A frame of
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

from msgq.spark.compact import compact_batches

__all__ = ["FILES_SCHEMA", "ReadCompact"]

#: The rows a compact read of a lake is planned as: a table and one of its files.
FILES_SCHEMA = "table string, path string"
_COLUMNS = ("file", "segment", "offset", "logMonoTime", "service", "valid", "size", "problem")
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
