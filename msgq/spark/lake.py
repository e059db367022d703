"""The route lake: recordings as one Parquet table per service, built and kept current by
Spark, read with Spark's own pruning.

The raw log (what ``msgq record`` and openpilot's loggerd write) stays the record of truth;
the lake is a columnar copy of it made for queries, which can always be built again from
it. Under a lake folder ``LAKE``::

    LAKE/msgq-lake.json                   the schema the lake was built under (its tables'
                                          columns), written once, widened by a later
                                          schema that only adds fields
    LAKE/<service>/date=<d>/route=<r>/*.parquet   one table per service
    LAKE/_problems/date=<d>/route=<r>/*.parquet   the damage found in the logs
    LAKE/_compact/date=<d>/route=<r>/*.parquet    the compact rows of each segment range
    LAKE/_checkpoints/<source key>/       Spark's streaming checkpoint of each source

A service table has the columns ``logMonoTime``, ``valid``, ``segment``, ``file`` (the raw
segment file) and ``offset`` (the event's byte in the segment's uncompressed stream, as
the msgqlog source's ``offset``: ``LogReader`` reads the event back from there),
``size`` (its bytes), ``problem`` (a typed decoding that failed, else null), then one
column named after the service holding its typed value (the plan of
:mod:`msgq.spark.capnp_types`, the msgqlog source's ``decode`` columns: scalars typed,
enums as names, structs as structs, lists as arrays, Data as binary), and the partition
columns ``date`` (``YYYY-MM-DD``: a loggerd route's date, from its name; the UTC day a
msgq recording began, from its first segment's logStart wall time, else its index's
start of it, a date in the folder's name first; null when none says) and ``route`` (a
loggerd route's name, or the name of a msgq recording's folder). Rows are
sorted by logMonoTime within a file; a file holds one route of one task of a batch (a
task per core), at most about :data:`TARGET_FILE_BYTES` of events.

The compact table holds, for each segment range a batch read and each service in it,
the row :func:`msgq.spark.compact.compact_batches` makes of the range's event rows (all
of them in one batch: count, invalid count, byte sum, the logMonoTimes packed; and an
event's own problem, a logMonoTime out of range, as its ``problem`` row), exactly the
rows of the msgqlog source's compact read of those bytes less its problem rows, which
are the problems table's; what ``log_stats`` on a lake reads instead of every event's
row. A lake made before the table existed has none (it is listed in the lake file from
a lake's first build on; its reader then packs the service tables' rows).

Building (:func:`build`) is a Structured Streaming query per source over the msgqlog
stream's offsets (:mod:`msgq.spark.streaming`): trigger ``availableNow`` reads what is
there and stops; :func:`follow` runs the same query every few seconds. Its checkpoint
(Spark's offset and commit logs) makes it incremental and exactly once: a run reads only
the bytes after the last committed offset, and a batch that was cut short (kill -9) is
run again from the same offsets by the next run. A micro-batch's rows are not events but
the segment ranges it adds (:mod:`msgq.spark.lake_stream`: a row per segment file's new
bytes, spread over a task per core by size, a file never split); it is one Spark job: the rows
go through ``mapInArrow`` into :mod:`msgq.spark.lake_files`, whose tasks read their
ranges with the msgqlog source's own reading, decode each event once and write every
service's Parquet files (and the compact rows) into a staging folder: the events never
become Spark rows. The files the tasks report are then moved into the tables file by
file under names made of the source and the batch id (write-then-rename: a reader never
sees a partial file; a batch run again first removes what an interrupted run of it had
moved, and replaces the rest under the same names, so no row is doubled). The lake has
no transaction log of its own: a reader that lists a table while a batch is being moved
in may see some of that batch's files and not yet the others.

Reading (:func:`read_table`, :func:`read_lake`, :func:`sql`) is Spark's Parquet source
with the table's schema from the schema in force: partition pruning on ``date`` and
``route``, row groups skipped by their logMonoTime statistics, only the columns a query
names read. A lake built under another schema is refused in one line; a schema that
only adds fields reads older files with those fields null.

Layer: part of the Spark tool, over the msgqlog source (whose module, imported at the
top, imports pyspark: the spark extra). Only DataFrame and SQL calls (no RDD, no
SparkContext): the reading runs on a Spark Connect session too; building needs a local
(or cluster) session, as its foreachBatch function runs in this process.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from msgq.logs import segment_paths
from msgq.schemas import Schema, SchemaSpec, spec_in_force
from msgq.schemas.services import unknown_service_error
from msgq.spark.capnp_types import member_plan
from msgq.spark.compact import COMPACT_SCHEMA, GroupableRead
from msgq.spark.connect import default_parallelism, is_connect
from msgq.spark.datasource import (
    check_local_logs,
    local_path,
    read_spec,
    spec_option,
    uri_scheme,
)
from msgq.spark.lake_compact import FILES_SCHEMA, GroupedCompact, ReadCompact
from msgq.spark.lake_files import (
    COMPACT_TABLE,
    LISTED_PROBLEMS,
    PROBLEMS_TABLE,
    SUMMARY_SCHEMA,
    TARGET_FILE_BYTES,
    TableFiles,
)
from msgq.spark.lake_stream import RANGES_SOURCE, SegmentRanges

__all__ = [
    "COMPACT_TABLE",
    "LAKE_FILE",
    "PROBLEMS_TABLE",
    "TARGET_FILE_BYTES",
    "BatchReport",
    "Lake",
    "LakeError",
    "build",
    "follow",
    "is_lake",
    "lake_sources",
    "open_lake",
    "read_lake",
    "read_table",
    "sql",
    "table_schema",
]

#: The file that makes a folder a lake: its format and the schema it was built under
#: (no leading "_": Spark's file listing, which reads it from Hadoop paths, hides such
#: names).
LAKE_FILE = "msgq-lake.json"
#: Where each source's streaming checkpoint lives, under the lake.
CHECKPOINTS = "_checkpoints"
#: Where a batch is written before its files are moved into the tables.
STAGING = "_staging"
_FORMAT = "msgq-lake"
_VERSION = 1
#: The event columns of every service table, before the service's own column.
EVENT_COLUMNS = ("logMonoTime", "valid", "segment", "file", "offset", "size", "problem")
PARTITION_COLUMNS = ("date", "route")
_PROBLEM_COLUMNS = ("file", "segment", "offset", "problem")
_ROUTE_SEGMENT = re.compile(r"^(.+)--(\d+)$")
#: The tables that are no service's.
_OWN_TABLES = (PROBLEMS_TABLE, COMPACT_TABLE)


class LakeError(ValueError):
    """A lake that cannot be used as asked: not a lake, built under another schema, a
    source that is no recording (one line saying what to do)."""


def _ddl(name: str, kind: str) -> Any:
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql.types import (
        BinaryType,
        BooleanType,
        IntegerType,
        LongType,
        StringType,
        StructField,
    )

    types = {"long": LongType(), "int": IntegerType(), "boolean": BooleanType(),
             "string": StringType(), "binary": BinaryType()}
    return StructField(name, types[kind], True)


def _event_fields() -> list[Any]:
    return [_ddl(n, k) for n, k in (("logMonoTime", "long"), ("valid", "boolean"),
                                    ("segment", "int"), ("file", "string"),
                                    ("offset", "long"), ("size", "int"),
                                    ("problem", "string"))]


def _partition_fields() -> list[Any]:
    return [_ddl("date", "string"), _ddl("route", "string")]


def table_schema(service: str, schema: Any = None) -> Any:
    """The Spark schema (StructType) of ``service``'s table under ``schema`` (a Schema or
    SchemaSpec; default the schema in force): the event columns, the service's typed
    column (none for a Void member) and the partition columns; :data:`PROBLEMS_TABLE`
    for the problems table, :data:`COMPACT_TABLE` for the compact rows' table (the
    columns of :data:`msgq.spark.compact.COMPACT_SCHEMA`)."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql.types import StructField, StructType

    if service == PROBLEMS_TABLE:
        fields = [f for f in _event_fields() if f.name in _PROBLEM_COLUMNS]
        return StructType([*sorted(fields, key=lambda f: _PROBLEM_COLUMNS.index(f.name)),
                           *_partition_fields()])
    if service == COMPACT_TABLE:
        kinds = {"bigint": "long", "int": "int", "string": "string", "binary": "binary"}
        return StructType([*(_ddl(name, kinds[kind]) for name, kind in
                             (c.split() for c in COMPACT_SCHEMA.split(", "))),
                           *_partition_fields()])
    loaded = _schema_of(schema)
    if service not in loaded.union_fields:
        raise unknown_service_error(service, loaded.union_fields)
    plan = member_plan(loaded.event.schema, service)
    kind = None if plan is None else _storable(plan.spark_type)
    typed = [] if kind is None else [StructField(service, kind, True)]
    return StructType([*_event_fields(), *typed, *_partition_fields()])


def _storable(kind: Any) -> Any:
    """``kind`` without what Parquet cannot store: structs with no fields (a struct
    declared empty, as schemas reserve members), and fields and arrays of them; None
    when nothing is left."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql.types import ArrayType, StructField, StructType

    if isinstance(kind, StructType):
        fields = [StructField(f.name, t, True) for f in kind.fields
                  if (t := _storable(f.dataType)) is not None]
        return StructType(fields) if fields else None
    if isinstance(kind, ArrayType):
        element = _storable(kind.elementType)
        return None if element is None else ArrayType(element, kind.containsNull)
    return kind


def _schema_of(schema: Any) -> Any:
    if schema is None:
        return spec_in_force().load()
    if isinstance(schema, SchemaSpec):
        return schema.load()
    if isinstance(schema, Schema):
        return schema
    raise TypeError(f"schema is a msgq.schemas.Schema or SchemaSpec, not {type(schema).__name__}")


def _spec_of(schema: Any) -> SchemaSpec:
    return read_spec(schema)


# -- the lake file ------------------------------------------------------------------------


@dataclass
class Lake:
    """An opened lake: its ``path``, the schema it was built under (``spec``: the
    msgqlog source's ``schemaSpec`` JSON; ``fingerprint``, ``schema_path``) and its
    ``tables``: table name -> Spark schema JSON, for every table written so far."""

    path: str
    spec: str
    fingerprint: str
    schema_path: str | None
    tables: dict[str, str] = field(default_factory=dict)

    def table_names(self) -> list[str]:
        """The service tables written so far (problems and compact tables left out),
        sorted."""
        return sorted(t for t in self.tables if t not in _OWN_TABLES)

    def to_json(self) -> str:
        """The content of :data:`LAKE_FILE`."""
        return json.dumps({"format": _FORMAT, "version": _VERSION, "spec": self.spec,
                           "fingerprint": self.fingerprint, "schema": self.schema_path,
                           "tables": self.tables}, indent=1, sort_keys=True)


def _is_remote(path: str) -> bool:
    return uri_scheme(path) not in (None, "file")


def _local(path: str) -> str:
    return local_path(os.fspath(path))


def is_lake(path: str | os.PathLike[str]) -> bool:
    """Whether a local ``path`` is a lake folder (holds :data:`LAKE_FILE`)."""
    path = os.fspath(path)
    if _is_remote(path):
        return False
    return os.path.isfile(os.path.join(_local(path), LAKE_FILE))


def _parse(path: str, text: str) -> Lake:
    try:
        doc = json.loads(text)
        if doc.get("format") != _FORMAT:
            raise ValueError("not a msgq lake file")
        if int(doc["version"]) > _VERSION:
            raise LakeError(f"{path} is a lake of a newer msgq (format {doc['version']}); "
                            "upgrade msgq to read it")
        return Lake(path, str(doc["spec"]), str(doc["fingerprint"]), doc.get("schema"),
                    {str(k): str(v) for k, v in dict(doc["tables"]).items()})
    except LakeError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise LakeError(f"{path}: {LAKE_FILE} is damaged ({type(e).__name__}: {e}); "
                        "build the lake again from the raw logs") from None


def _load(spark: Any, path: str) -> Lake:
    """The lake at ``path`` (local, or a Hadoop URI read through Spark)."""
    if _is_remote(path):
        marker = path.rstrip("/") + "/" + LAKE_FILE
        try:
            rows = spark.read.text(marker, wholetext=True).collect()
        except Exception:  # Spark's AnalysisException: the path does not exist
            rows = []
        if not rows:
            raise LakeError(f"{path} is not a lake (no {LAKE_FILE}: make one with "
                            "msgq lake build SRC --to LAKE)")
        return _parse(path, rows[0][0])
    local = _local(path)
    try:
        with open(os.path.join(local, LAKE_FILE), encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        what = "does not exist" if not os.path.exists(local) else f"has no {LAKE_FILE}"
        raise LakeError(f"{path} is not a lake ({what}: make one with msgq lake build "
                        "SRC --to LAKE)") from None
    except OSError as e:
        raise LakeError(f"{path}: cannot read {LAKE_FILE}: {e.strerror}") from None
    return _parse(local, text)


def _save(lake: Lake) -> None:
    """Writes the lake file whole (a temporary file renamed over it)."""
    target = os.path.join(lake.path, LAKE_FILE)
    temporary = target + f".{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(lake.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, target)


def _widens(old: Any, new: Any, where: str) -> str | None:
    """Why Spark type ``new`` does not read data of type ``old`` (a field removed or
    retyped); None when it does (the same, or with fields added)."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql.types import ArrayType, StructType

    if isinstance(old, StructType) and isinstance(new, StructType):
        fields = {f.name: f for f in new.fields}
        for f in old.fields:
            if f.name not in fields:
                return f"{where}.{f.name} is gone"
            reason = _widens(f.dataType, fields[f.name].dataType, f"{where}.{f.name}")
            if reason:
                return reason
        return None
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return _widens(old.elementType, new.elementType, f"{where}[]")
    if old != new:
        return f"{where} is {new.simpleString()} here, {old.simpleString()} in the lake"
    return None


def _check_schema(lake: Lake, spec: SchemaSpec, tables: Iterable[str]) -> dict[str, Any]:
    """The Spark schemas of ``tables`` under ``spec``, having checked that they read what
    the lake holds (LakeError naming the first difference otherwise)."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql.types import StructType

    schema = spec.load()
    out = {}
    for table in tables:
        stored = lake.tables.get(table)
        if table not in _OWN_TABLES and table not in schema.union_fields:
            if stored is None:
                table_schema(table, schema)  # the registry's words for an unknown name
            raise LakeError(_mismatch(lake, schema, f"it has no service {table!r}"))
        ours = table_schema(table, schema)
        if stored is not None:
            reason = _widens(StructType.fromJson(json.loads(stored)), ours, table)
            if reason:
                raise LakeError(_mismatch(lake, schema, reason))
        out[table] = ours
    return out


def _mismatch(lake: Lake, schema: Any, reason: str) -> str:
    built = lake.schema_path or "msgq's own schema"
    here = schema.path or "msgq's own schema"
    return (f"{lake.path} was built under another schema ({built}, fingerprint "
            f"{lake.fingerprint}) than the one in force ({here}, fingerprint "
            f"{schema.fingerprint}): {reason}; read it with --schema {built}")


def open_lake(spark: Any, path: str | os.PathLike[str], schema: Any = None) -> Lake:
    """The lake at ``path``, checked against ``schema`` (default the schema in force):
    every table it holds must read the same under it, or with fields added (LakeError
    otherwise, as for a path that is not a lake)."""
    return _opened(spark, path, _spec_of(schema))


def _opened(spark: Any, path: str | os.PathLike[str], spec: SchemaSpec) -> Lake:
    lake = _load(spark, os.fspath(path))
    if spec.load().fingerprint != lake.fingerprint:
        _check_schema(lake, spec, lake.tables)
    return lake


def _open_for_build(path: str, spec: SchemaSpec) -> Lake:
    """The lake to build into: made when ``path`` is missing or an empty folder;
    widened to ``spec`` when the lake's schema is an older version of it."""
    schema = spec.load()
    if _is_remote(path):
        raise LakeError(f"{path}: a lake is built in a local folder (or storage mounted as "
                        "one); its tables can be read through Hadoop paths afterwards")
    local = _local(path)
    if not os.path.exists(os.path.join(local, LAKE_FILE)):
        if os.path.isdir(local) and [n for n in os.listdir(local) if not n.startswith(".")]:
            raise LakeError(f"{path} is not a lake (no {LAKE_FILE}) and not empty: give a "
                            "new folder for msgq lake build --to")
        if os.path.exists(local) and not os.path.isdir(local):
            raise LakeError(f"{path} is not a folder")
        os.makedirs(local, exist_ok=True)
        # the compact table from the first batch on (a lake built before it had none:
        # its reader packs the service tables' rows instead)
        lake = Lake(local, spec_option(spec), schema.fingerprint, schema.path,
                    {COMPACT_TABLE: table_schema(COMPACT_TABLE).json()})
        _save(lake)
        return lake
    lake = _load(None, local)
    if lake.fingerprint != schema.fingerprint:
        _check_schema(lake, spec, lake.tables)  # refuses a schema that is not a widening
        lake.spec, lake.fingerprint, lake.schema_path = \
            spec_option(spec), schema.fingerprint, schema.path
        lake.tables = {t: table_schema(t, schema).json() for t in lake.tables}
        _save(lake)
    return lake


# -- sources --------------------------------------------------------------------------------


def _is_recording(folder: str) -> bool:
    """A msgq recording (segment files or an index), or a folder of loggerd route
    segments (``<route>--<n>`` folders)."""
    try:
        paths = segment_paths(folder)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return bool(paths) or os.path.isfile(os.path.join(folder, "index.json"))


def lake_sources(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The sources a build follows, one streaming query each: every path that is a
    msgq recording folder or a folder of loggerd route segments (``<route>--<n>/``),
    else its subfolders that are (a fleet's folder of recordings). A loggerd segment
    folder itself, a file or a folder with none is refused (LakeError)."""
    sources: list[str] = []
    for given in paths:
        path = os.fspath(given)
        if _is_remote(path):
            raise LakeError(f"{path}: the lake is built from local recordings (the "
                            "streaming source reads files with Python I/O)")
        folder = _local(path)
        if not os.path.isdir(folder):
            raise LakeError(f"{path} is not a folder: give recording folders or folders "
                            "of loggerd route segments")
        if _ROUTE_SEGMENT.match(os.path.basename(folder)) and any(
                n.startswith(("rlog", "qlog")) for n in os.listdir(folder)):
            raise LakeError(f"{path} is one segment of a route: give the folder that "
                            "holds the route's <route>--<n> folders")
        if _is_recording(folder):
            sources.append(folder)
            continue
        found = [os.path.join(folder, n) for n in sorted(os.listdir(folder))
                 if not n.startswith((".", "_"))
                 and os.path.isdir(os.path.join(folder, n))
                 and _is_recording(os.path.join(folder, n))]
        if not found:
            raise LakeError(f"no recordings in {path} (msgq segment-*.log* files, "
                            "<route>--<n>/rlog.zst folders, or folders of them)")
        sources += found
    return list(dict.fromkeys(sources))


def source_key(source: str) -> str:
    """The name of a source in the lake (its checkpoint, its files): a hash of its
    absolute path."""
    return hashlib.sha1(os.path.abspath(source).encode()).hexdigest()[:12]


# -- building -------------------------------------------------------------------------------


@dataclass
class BatchReport:
    """What one micro-batch added: the source, the batch id, rows per table, the
    problems found (file, offset, reason: at most 20 listed, all counted), the seconds
    it took and the age of its newest event when it became queryable (seconds from its
    logMonoTime to now on this machine's monotonic clock: the write-to-queryable latency
    of a live recording)."""

    source: str
    batch: int
    rows: dict[str, int]
    problems: list[dict[str, Any]]
    problem_count: int
    seconds: float
    newest_age_s: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"source": self.source, "batch": self.batch, "rows": self.rows,
                "problems": self.problems, "problem_count": self.problem_count,
                "seconds": self.seconds, "newest_age_s": self.newest_age_s}


class _BatchWriter:
    """The foreachBatch function of a source's streaming query (module docstring)."""

    def __init__(self, lake: Lake, source: str, spec: SchemaSpec, schemas: dict[str, Any],
                 on_batch: Callable[[BatchReport], None] | None) -> None:
        # pyspark: the optional spark extra, imported when Spark is used
        from pyspark.sql.types import StructType

        self.lake = lake
        self.source = source
        self.key = source_key(source)
        self.schemas = schemas
        self.spec = spec_option(spec)
        # the stored columns of each table: its schema without the partition columns
        self.stored = {t: StructType([f for f in kind.fields
                                      if f.name not in PARTITION_COLUMNS]).json()
                       for t, kind in schemas.items()}
        self.on_batch = on_batch
        self.reports: list[BatchReport] = []

    def _name(self, batch_id: int) -> str:
        return f"part-{self.key}-{batch_id:010d}"

    def __call__(self, batch: Any, batch_id: int) -> None:
        began = time.monotonic()
        staging = os.path.join(self.lake.path, STAGING, f"{self.key}-{batch_id}")
        shutil.rmtree(staging, ignore_errors=True)  # an interrupted run of this batch
        # One job: the batch's rows are its segment ranges, spread over a task per core
        # by size (the stream's partitions); each task reads its ranges, decodes and
        # writes every service of them (lake_files).
        files = TableFiles(self.spec, staging, self.stored)
        written = batch.mapInArrow(files, SUMMARY_SCHEMA).collect()
        rows: dict[str, int] = {}
        problems: list[dict[str, Any]] = []
        newest = None
        for f in written:
            rows[f.table] = rows.get(f.table, 0) + int(f.rows)
            if f.problems:
                problems += json.loads(f.problems)
            if f.newest is not None and (newest is None or f.newest > newest):
                newest = f.newest
        problems.sort(key=lambda p: (p["file"], p["offset"] is None, p["offset"] or 0))
        self._commit(staging, batch_id, [f.path for f in written])
        problem_count = rows.pop(PROBLEMS_TABLE, 0)
        rows.pop(COMPACT_TABLE, None)
        age = None if newest is None else (time.monotonic_ns() - int(newest)) / 1e9
        report = BatchReport(self.source, batch_id, rows, problems[:LISTED_PROBLEMS],
                             problem_count, time.monotonic() - began, age)
        self.reports.append(report)
        if self.on_batch is not None:
            self.on_batch(report)

    def _commit(self, staging: str, batch_id: int, paths: list[str]) -> None:
        """Moves the batch's files (``paths`` under ``staging``: ``table/date=…/route=…/
        file``) into the tables, under names of the source and batch (an interrupted
        earlier run of this batch: its files in the same partitions removed first), and
        records new tables in the lake file. Only the files the tasks reported are
        moved: a failed task attempt's stay in staging, which is removed."""
        name = self._name(batch_id)
        folders: dict[str, list[str]] = {}
        for path in paths:
            folders.setdefault(os.path.dirname(path), []).append(path)
        moves: list[tuple[str, str]] = []
        for folder, parts in sorted(folders.items()):
            target = os.path.join(self.lake.path, folder)
            for k, part in enumerate(sorted(parts)):
                moves.append((os.path.join(staging, part),
                              os.path.join(target, f"{name}-{k:05d}.parquet")))
        new_tables = {folder.split(os.sep)[0] for folder in folders} - set(self.lake.tables)
        if new_tables:  # listed before their files appear: readers know their columns
            for table in new_tables:
                self.lake.tables[table] = self.schemas[table].json()
            _save(self.lake)
        for folder in folders:
            target = os.path.join(self.lake.path, folder)
            for stale in glob.glob(os.path.join(glob.escape(target), f"{name}-*.parquet")):
                os.remove(stale)
        for src, dst in moves:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)
        shutil.rmtree(staging, ignore_errors=True)


def _stream(spark: Any, source: str, spec: SchemaSpec) -> Any:
    """The stream of ``source``'s segment ranges (:class:`msgq.spark.lake_stream.
    SegmentRanges`), spread over a task per core: the writing tasks read them
    (:mod:`msgq.spark.lake_files`). Only this source is registered: the build reads no
    events through msgqlog (registering it again, a class pickled by value, cost 4-14 ms
    of every build's start)."""
    spark.dataSource.register(SegmentRanges)
    return (spark.readStream.format(RANGES_SOURCE)
            .option("schemaSpec", spec_option(spec))
            .option("parallelism", str(max(1, default_parallelism(spark))))
            .option("cwd", os.getcwd()).load(source))


def _start(spark: Any, lake: Lake, source: str, spec: SchemaSpec, trigger: dict[str, Any],
           on_batch: Callable[[BatchReport], None] | None) -> tuple[Any, _BatchWriter]:
    # segments of another schema: SchemaMismatchError here, in one line, before the
    # query (whose planning worker checks them too) writes anything
    check_local_logs([source], spec)
    schema = spec.load()
    schemas = {s: table_schema(s, schema) for s in schema.union_fields}
    schemas[PROBLEMS_TABLE] = table_schema(PROBLEMS_TABLE)
    if COMPACT_TABLE in lake.tables:  # a lake made before it: none
        schemas[COMPACT_TABLE] = table_schema(COMPACT_TABLE)
    writer = _BatchWriter(lake, source, spec, schemas, on_batch)
    checkpoint = os.path.join(lake.path, CHECKPOINTS, writer.key)
    os.makedirs(checkpoint, exist_ok=True)
    with open(os.path.join(lake.path, CHECKPOINTS, writer.key + ".source"), "w",
              encoding="utf-8") as f:
        f.write(source + "\n")  # which source a checkpoint is, for a person
    query = (_stream(spark, source, spec).writeStream.foreachBatch(writer)
             .option("checkpointLocation", checkpoint)
             .queryName(f"msgq lake {writer.key}").trigger(**trigger).start())
    return query, writer


def build(spark: Any, sources: Iterable[str | os.PathLike[str]], lake: str | os.PathLike[str],
          schema: Any = None, on_batch: Callable[[BatchReport], None] | None = None
          ) -> list[BatchReport]:
    """Brings the lake at ``lake`` up to date with ``sources`` (recording folders,
    folders of loggerd route segments, or folders of those: :func:`lake_sources`): for
    each, a streaming query with trigger ``availableNow`` from its checkpoint, so that
    only what is new since the last build is read (a segment still being written: its
    whole frames, the rest next time). Made under ``schema`` (default the schema in
    force; a lake built under an older version of it that only lacked fields is widened,
    any other is refused: LakeError). ``on_batch`` is called with each batch's
    :class:`BatchReport`; returns them all."""
    _check_local(spark, "msgq lake build")
    spec = _spec_of(schema)
    found = lake_sources(sources)
    opened = _open_for_build(os.fspath(lake), spec)
    reports: list[BatchReport] = []
    for source in found:
        # A batch a killed run left unfinished is run again first, with its offsets, and
        # then Spark (4.3) ends the availableNow query there: a second query reads the
        # rest.
        for _ in range(2 if _unfinished_batch(opened, source) else 1):
            query, writer = _start(spark, opened, source, spec, {"availableNow": True},
                                   on_batch)
            try:
                query.awaitTermination()
            finally:
                query.stop()
            if query.exception() is not None:
                raise RuntimeError(f"building from {source} failed: {query.exception()}")
            reports += writer.reports
    return reports


def _check_local(spark: Any, what: str) -> None:
    """Refuses a Spark Connect session: the build's foreachBatch function would run in
    the server's Python, its reports never reaching this process."""
    if is_connect(spark):
        raise LakeError(f"{what} runs on a local (or cluster) Spark session, not on Spark "
                        "Connect: each micro-batch is written by a function of this process "
                        "(foreachBatch)")


def _unfinished_batch(lake: Lake, source: str) -> bool:
    """Whether the checkpoint of ``source`` has a batch planned and not committed (its
    offsets logged, no commit: a run killed or stopped while writing it)."""
    checkpoint = os.path.join(lake.path, CHECKPOINTS, source_key(source))

    def batches(log: str) -> set[int]:
        try:
            return {int(n) for n in os.listdir(os.path.join(checkpoint, log)) if n.isdigit()}
        except OSError:
            return set()

    planned = batches("offsets")
    return bool(planned) and max(planned) not in batches("commits")


def follow(spark: Any, source: str | os.PathLike[str], lake: str | os.PathLike[str],
           every_s: float = 5.0, duration_s: float | None = None, schema: Any = None,
           on_batch: Callable[[BatchReport], None] | None = None) -> list[BatchReport]:
    """Follows one recording (or folder of loggerd route segments) being written into
    the lake: the query of :func:`build` with a micro-batch every ``every_s`` seconds,
    until ``duration_s`` passed (None: until interrupted); exactly once across restarts
    (the same checkpoint as :func:`build`'s). Returns the batch reports."""
    if not every_s > 0:
        raise ValueError(f"every_s must be positive, not {every_s}")
    _check_local(spark, "msgq lake follow")
    spec = _spec_of(schema)
    found = lake_sources([source])
    if len(found) != 1:
        raise LakeError(f"{source} holds {len(found)} recordings: follow one")
    opened = _open_for_build(os.fspath(lake), spec)
    query, writer = _start(spark, opened, found[0], spec,
                           {"processingTime": f"{every_s:g} seconds"}, on_batch)
    deadline = None if duration_s is None else time.monotonic() + duration_s
    try:
        while deadline is None or time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"following {found[0]} failed: {query.exception()}")
            if not query.isActive:
                break
            time.sleep(0.2 if deadline is None else
                       max(0.0, min(0.2, deadline - time.monotonic())))
    finally:
        query.stop()
    return writer.reports


# -- reading --------------------------------------------------------------------------------


def _table_path(lake: Lake, table: str) -> str:
    return lake.path.rstrip("/") + "/" + table


#: A local table of at most this many bytes of Parquet is read by one task. Spark packs
#: files into a task up to max(4 MiB, (bytes + 4 MiB per file) / cores), counting 4 MiB
#: to open each file, so a small table of two files was two tasks and, under an
#: aggregate, a shuffle and a second stage (the benchmark's narrow query, 0.7 MB in two
#: files at 10 M events: its collect 0.066 -> 0.040 s, 2 cores).
ONE_TASK_BYTES = 4 << 20


def _read(spark: Any, lake: Lake, table: str, schema: Any) -> Any:
    if table not in lake.tables:
        return spark.createDataFrame([], schema)
    df = spark.read.schema(schema).parquet(_table_path(lake, table))
    return df.coalesce(1) if _is_small(lake, table) else df


def _is_small(lake: Lake, table: str) -> bool:
    """Whether a table of a local lake holds at most :data:`ONE_TASK_BYTES` of Parquet
    (its files listed until they add up to more)."""
    if _is_remote(lake.path):
        return False
    total = 0
    for folder, dirs, files in os.walk(os.path.join(lake.path, table)):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for name in files:
            if name.endswith(".parquet") and not name.startswith((".", "_")):
                total += os.path.getsize(os.path.join(folder, name))
                if total > ONE_TASK_BYTES:
                    return False
    return True


def read_table(spark: Any, lake: str | os.PathLike[str], service: str,
               schema: Any = None) -> Any:
    """One table of the lake (a service's, or :data:`PROBLEMS_TABLE`) as a DataFrame,
    read with its columns under ``schema`` (default the schema in force; refused in one
    line when the lake holds what it reads otherwise). A service with no events yet
    gives no rows. Filters and column choices are Spark's to push into the Parquet
    scan."""
    spec = _spec_of(schema)
    opened = _opened(spark, lake, spec)
    schemas = _check_schema(opened, spec, [service])
    return _read(spark, opened, service, schemas[service])


def read_lake(spark: Any, lake: str | os.PathLike[str], services: Iterable[str] | None = None,
              decode: bool | Iterable[str] = False, schema: Any = None,
              start: int | None = None, end: int | None = None,
              keep_problems: bool = False, compact: bool = False) -> Any:
    """The lake as the msgqlog source's DataFrame (:func:`msgq.spark.read_logs`'s
    columns: file, segment, offset, logMonoTime, service, valid, size, data (null: the
    raw bytes stay in the logs), problem, route, then the typed columns of ``decode``):
    the rows of the tables of ``services`` (default all), and the problem rows. Each
    table is read apart, with only the columns asked for, and unioned; without
    ``decode``, every table in one Parquet scan (:func:`_narrow`).

    ``start``/``end`` (logMonoTime, ns, ``start <= t < end``) and ``services`` filter
    the events as read_logs's do; as there, filtered reads leave out the problem rows
    unless ``keep_problems``. Without ``decode`` the rows are those of a read with no
    typed decoding: a typed decoding that failed while the lake was built is not a
    problem of theirs (``problem`` null), as in read_logs(decode=False).

    ``compact=True`` (no ``decode``): the same rows packed as the msgqlog source's
    compact read packs them (:mod:`msgq.spark.compact`, the input of ``log_stats``),
    the tables' files read by pyarrow in the executors' Python workers
    (:mod:`msgq.spark.lake_compact`): the events never become Spark rows. A lake with
    a compact table (:data:`COMPACT_TABLE`, written by every build since it came) and
    no ``start``/``end`` gives that table's rows instead, read in one Parquet scan
    (local or Hadoop path): the packing was done once, when the lake was built. On a
    local path that read is a :class:`msgq.spark.compact.GroupableRead` (used as the
    DataFrame it holds), which ``log_stats`` groups in the tasks that read its files.
    Otherwise a lake on a Hadoop path gives event rows (which log_stats takes as
    well)."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import functions as sf

    spec = _spec_of(schema)
    opened = _opened(spark, lake, spec)
    loaded = spec.load()
    if services is None:
        names = [t for t in opened.table_names() if t in loaded.union_fields]
    else:
        names = list(dict.fromkeys(services))
        for name in names:
            table_schema(name, loaded)  # an unknown service: the registry's words
    if decode is True:
        typed = set(names)
    elif decode is False:
        typed = set()
    else:
        typed = set(decode)
        for name in typed:
            table_schema(name, loaded)
            if name not in names:
                raise ValueError(f"decode names {name!r}, which services leaves out: its "
                                 "column would always be null")
    tables = [n for n in names if n in opened.tables]
    schemas = _check_schema(opened, spec, [*tables, PROBLEMS_TABLE])
    typed_columns = {n: schemas[n][n].dataType for n in typed if n in schemas
                     and n in schemas[n].fieldNames()}
    if decode is not False:  # typed columns of services with no table yet: null
        for n in typed:
            if n not in typed_columns and n not in schemas:
                plan = table_schema(n, loaded)
                if n in plan.fieldNames():
                    typed_columns[n] = plan[n].dataType
    typed_order = [n for n in names if n in typed_columns]
    filtered = services is not None or start is not None or end is not None
    if compact and typed:
        raise ValueError("a compact read has no typed columns: leave out decode")
    if compact and start is None and end is None and _has_compact_table(opened):
        sizes = {n: s.frequency for n, s in loaded.services.items() if n in tables}
        return _compact_table(spark, opened, tables, schemas[PROBLEMS_TABLE],
                              not filtered or keep_problems, sizes)
    if compact and not _is_remote(opened.path):
        return _compact(spark, opened, tables, start, end, not filtered or keep_problems)
    if not typed:
        return _narrow(spark, opened, tables, schemas[PROBLEMS_TABLE], start, end,
                       not filtered or keep_problems)
    frames = []
    for name in tables:
        df = _read(spark, opened, name, schemas[name])
        if start is not None:
            df = df.where(sf.col("logMonoTime") >= start)
        if end is not None:
            df = df.where(sf.col("logMonoTime") < end)
        problem = sf.col("problem") if name in typed else \
            sf.when(~sf.col("problem").startswith("undecodable:"), sf.col("problem"))
        frames.append(df.select(
            "file", "segment", "offset", "logMonoTime", sf.lit(name).alias("service"),
            "valid", "size", sf.lit(None).cast("binary").alias("data"),
            problem.alias("problem"), "route",
            *[(sf.col(t) if t == name else sf.lit(None).cast(typed_columns[t])).alias(t)
              for t in typed_order]))
    if not filtered or keep_problems:
        df = _read(spark, opened, PROBLEMS_TABLE, schemas[PROBLEMS_TABLE])
        frames.append(df.select(
            "file", "segment", "offset", sf.lit(None).cast("long").alias("logMonoTime"),
            sf.lit(None).cast("string").alias("service"),
            sf.lit(None).cast("boolean").alias("valid"),
            sf.lit(None).cast("int").alias("size"),
            sf.lit(None).cast("binary").alias("data"), "problem", "route",
            *[sf.lit(None).cast(typed_columns[t]).alias(t) for t in typed_order]))
    if not frames:
        frames.append(_read(spark, opened, PROBLEMS_TABLE, schemas[PROBLEMS_TABLE]).select(
            "file", "segment", "offset", sf.lit(None).cast("long").alias("logMonoTime"),
            sf.lit(None).cast("string").alias("service"),
            sf.lit(None).cast("boolean").alias("valid"),
            sf.lit(None).cast("int").alias("size"),
            sf.lit(None).cast("binary").alias("data"), "problem", "route").limit(0))
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    # a union of a scan per table is a task per table file at least: dozens of small
    # tasks for a small lake, each starting the Python work of a later mapInArrow
    # (log_stats: measured 4.4 s -> 2.9 s on 1 M events in 21 tables, 2 cores)
    return out.coalesce(2 * default_parallelism(spark))


def _narrow(spark: Any, lake: Lake, tables: list[str], problems_schema: Any,
            start: int | None, end: int | None, problems: bool) -> Any:
    """read_lake's rows with no typed column: the event columns of every table of
    ``tables`` in one Parquet scan (their columns are the same), and the problem rows
    when ``problems``. One scan instead of a union of a scan per table: one plan to
    analyse and one file listing, however many tables (21 tables, 100 k events: 0.05 s
    to plan instead of 0.7-3.8 s, and the job 3x quicker). Spark's partition discovery
    cannot take the tables' folders as one table (their names are no ``key=value``), so
    the files are listed whole and each row's service and route come from its file's
    path (``<table>/date=<d>/route=<r>/<name>``, URL-encoded, the route's folder name
    escaped as Spark's writer escapes it)."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import functions as sf
    from pyspark.sql.types import StructType

    def problem_rows() -> Any:
        return _read(spark, lake, PROBLEMS_TABLE, problems_schema).select(
            "file", "segment", "offset", sf.lit(None).cast("long").alias("logMonoTime"),
            sf.lit(None).cast("string").alias("service"),
            sf.lit(None).cast("boolean").alias("valid"),
            sf.lit(None).cast("int").alias("size"),
            sf.lit(None).cast("binary").alias("data"), "problem", "route")

    def unescaped(text: Any) -> Any:  # %XX sequences (a "+" is itself)
        return sf.when(sf.instr(text, "%") > 0,
                       sf.url_decode(sf.replace(text, sf.lit("+"), sf.lit("%2B")))) \
            .otherwise(text)

    out = None
    if tables:
        events = spark.read.schema(StructType(_event_fields())) \
            .option("recursiveFileLookup", "true") \
            .parquet(*[_table_path(lake, t) for t in tables])
        if start is not None:
            events = events.where(sf.col("logMonoTime") >= start)
        if end is not None:
            events = events.where(sf.col("logMonoTime") < end)
        path = sf.col("_metadata.file_path")
        depth = len(PARTITION_COLUMNS) + 2
        table = sf.substring_index(sf.substring_index(path, "/", -depth), "/", 1)
        folder = sf.substring_index(sf.substring_index(path, "/", -2), "/", 1)
        route = unescaped(unescaped(sf.substring(folder, len("route=") + 1, 1 << 20)))
        out = events.select(
            "file", "segment", "offset", "logMonoTime", table.alias("service"), "valid",
            "size", sf.lit(None).cast("binary").alias("data"),
            sf.when(~sf.col("problem").startswith("undecodable:"), sf.col("problem"))
            .alias("problem"),
            sf.when(route != "__HIVE_DEFAULT_PARTITION__", route).alias("route"))
    if problems or out is None:
        rows = problem_rows()
        if out is None:
            out = rows if problems else rows.limit(0)
        else:
            out = out.unionByName(rows)
    # a scan is a task per table file at least: dozens of small tasks for a small lake
    return out.coalesce(2 * default_parallelism(spark))


def _compact(spark: Any, lake: Lake, tables: list[str], start: int | None, end: int | None,
             problems: bool) -> Any:
    """read_lake(compact=True) of a local lake: a (table, file) row per Parquet file of
    ``tables`` (and of the problems table when ``problems``), spread over the tasks by
    size, each task reading its files with pyarrow (:class:`ReadCompact`)."""
    names = [*tables, *([PROBLEMS_TABLE] if problems and PROBLEMS_TABLE in lake.tables
                        else [])]
    found = [(size, table, path) for table in names for size, path in _files(lake, table)]
    # createDataFrame slices the rows in order: every slice gets big and small files
    slices = max(1, min(len(found), default_parallelism(spark)))
    ordered = sorted(found, key=lambda f: (-f[0], f[2]))
    rows = [(table, path) for k in range(slices) for _, table, path in ordered[k::slices]]
    return spark.createDataFrame(rows, FILES_SCHEMA) \
        .mapInArrow(ReadCompact(PROBLEMS_TABLE, start, end), COMPACT_SCHEMA)


def _files(lake: Lake, table: str) -> list[tuple[int, str]]:
    """(size, path) of each Parquet file of a table of a local lake."""
    found = []
    for folder, dirs, files in os.walk(os.path.join(lake.path, table)):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found += [(os.path.getsize(os.path.join(folder, f)), os.path.join(folder, f))
                  for f in sorted(files)
                  if f.endswith(".parquet") and not f.startswith((".", "_"))]
    return found


def _has_compact_table(lake: Lake) -> bool:
    """Whether the lake's builds wrote the compact table: listed in the lake file (from
    a lake's first build on, since the table came) and, for a local lake, present."""
    if COMPACT_TABLE not in lake.tables:
        return False
    return _is_remote(lake.path) or os.path.isdir(_table_path(lake, COMPACT_TABLE))


def _compact_table(spark: Any, lake: Lake, tables: list[str], problems_schema: Any,
                   problems: bool, rates: dict[str, float]) -> Any:
    """read_lake(compact=True) from the compact table: its rows of ``tables``' services
    (one Parquet scan, the service filter pushed into it), and the problems table's
    rows as compact problem rows when ``problems``: the rows of :func:`_compact`, with
    no event read. A window (start/end) cannot be cut from them (a row's invalid count
    and byte sum are of all its events), so windowed reads pack the service tables.
    ``rates``: the services' expected Hz, which spreads them over the tasks."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import functions as sf

    def frame() -> Any:
        columns = [c.split() for c in COMPACT_SCHEMA.split(", ")]
        rows = _read(spark, lake, COMPACT_TABLE, table_schema(COMPACT_TABLE)) \
            .where(sf.col("service").isin(tables)).select(*[name for name, _ in columns])
        if problems:  # one expression string: a py4j call, not one per column
            damage = _read(spark, lake, PROBLEMS_TABLE, problems_schema).selectExpr(*[
                "'problem' AS kind" if name == "kind" else "'' AS recording"
                if name == "recording" else f"CAST({name} AS {kind}) AS {name}"
                if name in _PROBLEM_COLUMNS else f"CAST(NULL AS {kind}) AS {name}"
                for name, kind in columns])
            rows = rows.unionByName(damage)
        return rows

    if _is_remote(lake.path):
        return frame()
    # log_stats groups them where they are read, and never plans the frame
    return GroupableRead(spark, frame, lambda keys, function, schema: _group_in_tasks(
        spark, lake, tables, problems, rates, keys, function, schema))


def _group_in_tasks(spark: Any, lake: Lake, tables: list[str], problems: bool,
                    rates: dict[str, float], keys: tuple[str, ...], function: Any,
                    schema: Any) -> Any:
    """:meth:`msgq.spark.compact.GroupableRead.group_in_tasks` of :func:`_compact_table`'s
    read: a task per few services, each reading its services' rows of the compact table
    with pyarrow (:class:`GroupedCompact`), the problems table's with them. The services
    are dealt to the tasks by expected rate (the busiest first, round the tasks), so
    each task gets a like share of the events."""
    compact = [path for _, path in _files(lake, COMPACT_TABLE)]
    damage = [path for _, path in _files(lake, PROBLEMS_TABLE)] \
        if problems and PROBLEMS_TABLE in lake.tables else []
    units = [*sorted(tables, key=lambda t: (-(rates.get(t) or 0), t)),
             *([None] if damage else [])]
    # a task's units are a run of spark.range's numbers (partition k: the k-th of
    # `slices` equal runs), which index `dealt`: every run gets busy and quiet services.
    # range, not createDataFrame of the names: no rows sent from Python, no schema parsed
    # (0.03 s of the driver's time at 10 M events)
    slices = max(1, min(len(units), default_parallelism(spark)))
    dealt = [unit for k in range(slices) for unit in units[k::slices]]
    return spark.range(0, len(dealt), 1, slices) \
        .mapInArrow(GroupedCompact(compact, damage, dealt, keys, function), schema)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def sql(spark: Any, lake: str | os.PathLike[str], query: str, schema: Any = None) -> Any:
    """The DataFrame of a SQL ``query`` over the lake's tables: each service table a
    view named after the service (``SELECT vehicleState.speed FROM vehicleState WHERE
    logMonoTime > ...``), the damage as ``problems``. Only the tables the query names
    are opened."""
    spec = _spec_of(schema)
    opened = _opened(spark, lake, spec)
    loaded = spec.load()
    words = set(_WORD.findall(query))
    names = [t for t in loaded.union_fields if t in words]
    schemas = _check_schema(opened, spec, [*names, PROBLEMS_TABLE])
    for name in names:
        _read(spark, opened, name, schemas[name]).createOrReplaceTempView(name)
    if "problems" in words:
        _read(spark, opened, PROBLEMS_TABLE, schemas[PROBLEMS_TABLE]) \
            .createOrReplaceTempView("problems")
    return spark.sql(query)
