"""The ``msgqlog`` Spark data source: msgq log segments as a DataFrame, one row per event.

::

    msgq.spark.register(spark)
    df = (spark.read.format("msgqlog")
          .option("services", "vehicleState,gpsLocation")   # others skipped unread
          .option("decode", "true")                          # typed columns
          .load("/data/drive1/*.log.zst"))
    df.select("logMonoTime", "vehicleState.speed")

Columns: ``file``, ``segment``, ``offset``, ``logMonoTime``, ``service``, ``valid``,
``size``, ``data`` (the event's bytes), ``problem``, then one typed column per decoded
service (see :mod:`msgq.spark.capnp_types`). Damage is reported in rows: a row whose
``service`` is null is a *problem row* (``file``, ``segment``, ``offset`` and ``problem``
say what and where); an event whose typed decoding failed keeps its raw columns and says
why in ``problem``. docs/spark.md has the whole contract.

Where things run: Spark calls ``schema()`` and ``reader()``/``partitions()`` in a Python
process of the driver (paths are listed and the recording indexes read there); ``read()``
runs in the executors' Python workers, which load pycapnp and the schema file themselves
(cached per worker process). Only strings, numbers and the schema's
:class:`~msgq.schemas.SchemaSpec` travel between them. The schema is the one in force in
the process that asked for the read — sent as the option ``schemaSpec``
(:func:`msgq.spark.read_logs`) or with the registered source class (:func:`source_class`)
— never the workers' environment, which may predate :func:`msgq.schemas.use_schema`.
"""

from __future__ import annotations

import functools
import gc
import io
import json
import os
import re
import socket
import stat
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from msgq.logs import (
    CorruptLogWarning,
    LogReader,
    MessageBatch,
    TruncatedLogWarning,
    segment_paths,
)
from msgq.logs.index import INDEX_NAME, IndexCache
from msgq.logs.schema_check import check_paths
from msgq.logs.segment import VALID
from msgq.logs.sources import loggerd_log
from msgq.schemas import (
    SCHEMA_DIR,
    Schema,
    SchemaSpec,
    Service,
    ServiceRegistry,
    spec_in_force,
)
from msgq.schemas._typed_reader import FALLBACK, MemberColumn, compile_member, read_member
from msgq.schemas.events import decode_event
from msgq.schemas.schema import spec_of
from msgq.schemas.services import unknown_service_error
from msgq.spark.capnp_types import member_plan
from msgq.spark.compact import COMPACT_SCHEMA, compact_batches, loggerd_route, spark_schema
from msgq.spark.pushdown import EventFilter, push
from msgq.spark.streaming import MsgqLogStreamReader

__all__ = [
    "BASE_COLUMNS",
    "SOURCE_NAME",
    "MsgqLogDataSource",
    "MsgqLogPushdownReader",
    "MsgqLogReader",
    "PackedPartition",
    "ReadOptions",
    "SegmentPartition",
    "local_path",
    "member_decoder",
    "output_schema",
    "pack_segments",
    "plan_segments",
    "read_segment_range",
    "read_spec",
    "segment_number",
    "source_class",
    "spec_from_option",
    "spec_option",
    "undecodable",
    "uri_scheme",
]

#: The format name: ``spark.read.format(SOURCE_NAME)``.
SOURCE_NAME = "msgqlog"

#: The columns every read has, in order (typed service columns follow them).
BASE_COLUMNS: tuple[StructField, ...] = (
    StructField("file", StringType(), False),
    StructField("segment", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("logMonoTime", LongType(), True),
    StructField("service", StringType(), True),
    StructField("valid", BooleanType(), True),
    StructField("size", IntegerType(), True),
    StructField("data", BinaryType(), True),
    StructField("problem", StringType(), True),
    StructField("route", StringType(), True),
)

_PROBLEM_MODES = ("rows", "fail")
_LOG_KINDS = ("auto", "rlog", "qlog")
_BATCH_ROWS = 4096
_BATCH_BYTES = 16 << 20
_CHUNK_EVENTS = 512
_MAX_LONG = (1 << 63) - 1
_SEGMENT_NUMBER = re.compile(r"(\d+)(?:\.log)?$")
_COMPRESSION_SUFFIX = re.compile(r"\.(?:zst|bz2)$")


_MSGQ_SCHEMA_FILE = os.path.join(SCHEMA_DIR, "log.capnp")
# The options that name the schema of a read.
_SCHEMA_OPTIONS = ("schemaSpec", "schemaFile", "registry", "root", "imports")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", re.DOTALL)


def uri_scheme(path: str) -> str | None:
    """The scheme of a URI (lower case: ``"file"``, ``"hdfs"``, ``"s3a"`` ...), None for a
    plain path (a Windows drive letter is not a scheme)."""
    match = _URI.match(path)
    if match and len(match.group(1)) > 1:
        return match.group(1).lower()
    return None


def local_path(path: str, cwd: str | None = None) -> str:
    """``path`` as an absolute local path: ``file:`` URIs lose their scheme; any other
    scheme is refused (the executors read with Python file I/O, not Hadoop's). A relative
    path is taken from ``cwd`` (the user's working folder, which the read's options
    carry: Spark's planning process may run elsewhere), else this process's."""
    scheme = uri_scheme(path)
    if scheme is not None:
        rest = path.split(":", 1)[1]
        if scheme != "file":
            raise ValueError(
                f"{path!r}: the msgqlog source reads files with Python I/O on the executors, "
                f"so it takes local paths and file: URIs only, not {scheme}: — read it with "
                "msgq.spark.read_logs(spark, paths, ...) or msgq logstats, which load "
                "other URIs through Spark's Hadoop file systems (binaryFile); or mount the "
                "storage at the same path on every executor (NFS, a FUSE mount of "
                "S3/GCS/HDFS)")
        if rest.startswith("//"):  # file://host/path: only an empty host or localhost
            host, _, tail = rest[2:].partition("/")
            if host not in ("", "localhost"):
                raise ValueError(f"{path!r}: file URIs with a host ({host}) are not local")
            rest = "/" + tail
        path = rest
    path = os.path.expanduser(path)
    if cwd is not None and not os.path.isabs(path):
        path = os.path.join(cwd, path)
    return os.path.abspath(path)


def _split_list(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(dict.fromkeys(n.strip() for n in str(value).split(",") if n.strip()))
    return names or None


@dataclass(frozen=True)
class ReadOptions:
    """The options of one read, parsed and checked (plain data: pickled to executors).
    ``spec``: the schema the logs are read with (None: the schema in force where the
    options are made); executors rebuild it with :meth:`SchemaSpec.load`."""

    paths: tuple[str, ...]
    services: tuple[str, ...] | None = None
    decode: tuple[str, ...] = ()
    spec: SchemaSpec | None = None
    problems: str = "rows"
    with_data: bool = True
    compact: bool = False
    #: the filters pushed down (msgq.spark.pushdown), None: none
    where: EventFilter | None = None
    #: whether the reader takes filters from Spark (option pushdown)
    pushdown: bool = True
    #: which log of a loggerd route segment: "auto" (rlog, else qlog), "rlog", "qlog"
    log: str = "auto"
    #: the number of tasks the files are packed into at least (option parallelism)
    parallelism: int = 0

    def __post_init__(self) -> None:
        if self.spec is None:
            object.__setattr__(self, "spec", spec_in_force())

    @property
    def schema(self) -> Schema:
        """The schema of the read (loaded once per process)."""
        assert self.spec is not None  # set by __post_init__
        return self.spec.load()

    @classmethod
    def parse(cls, options: Any, local_paths: bool = True) -> ReadOptions:
        """From the data source's (case-insensitive) options. ``local_paths=False`` keeps
        the paths as given (URIs for Spark's Hadoop file systems: :mod:`msgq.spark.hadoop`)
        instead of making them local absolute paths."""
        get = options.get
        raw_paths: list[str] = []
        if get("paths"):
            raw_paths += list(json.loads(get("paths")))
        if get("path"):
            raw_paths.append(get("path"))
        if not raw_paths:
            raise ValueError("msgqlog needs a path: spark.read.format('msgqlog').load(PATH)")
        cwd = get("cwd") or None
        paths = tuple(local_path(p, cwd) if local_paths else p for p in raw_paths)
        problems = (get("problems") or "rows").strip().lower()
        if problems not in _PROBLEM_MODES:
            raise ValueError(f"option problems must be one of {_PROBLEM_MODES}, not {problems!r}")
        with_data = _flag(get("data"), True, "data")
        compact = _flag(get("compact"), False, "compact")
        services = _split_list(get("services"))
        decode_value = (get("decode") or "").strip()
        spec = _spec_of_options(get)
        members = spec.load().union_fields
        for name in services or ():
            _check_member(name, members)
        if decode_value.lower() in ("", "false", "no", "none", "0"):
            decode: tuple[str, ...] = ()
        elif decode_value.lower() in ("true", "yes", "all", "*", "1"):
            decode = services if services is not None else tuple(members)
        else:
            decode = _split_list(decode_value) or ()
            for name in decode:
                _check_member(name, members)
                if services is not None and name not in services:
                    raise ValueError(f"decode names {name!r}, which option services leaves "
                                     "out: its column would always be null")
        if compact and decode:
            raise ValueError("option compact packs the rows per segment file and service: "
                             "it has no typed columns (leave out decode)")
        if compact:
            with_data = False
        log = (get("log") or "auto").strip().lower()
        if log not in _LOG_KINDS:
            raise ValueError(f"option log must be one of {_LOG_KINDS}, not {log!r}")
        try:
            parallelism = int(get("parallelism") or 0)
        except ValueError:
            raise ValueError(f"option parallelism must be a whole number, not "
                             f"{get('parallelism')!r}") from None
        return cls(paths, services, decode, spec, problems, with_data, compact,
                   _where_option(get("where"), spec), _flag(get("pushdown"), True, "pushdown"),
                   log, parallelism)


def where_option(services: Iterable[str] | None = None, start: int | None = None,
                 end: int | None = None) -> str:
    """The ``where`` option of a compact read (:func:`msgq.spark.read_logs` with
    ``compact=True``, ``msgq logstats``), whose rows have no event columns to filter:
    events of ``services`` with ``start <= logMonoTime < end``, decided as a pushed
    filter is (:mod:`msgq.spark.pushdown`); the problem rows are kept."""
    return json.dumps({"services": None if services is None else sorted(services),
                       "start": start, "end": end})


def _where_option(text: str | None, spec: SchemaSpec) -> EventFilter | None:
    if not text:
        return None
    try:
        doc = json.loads(text)
        services, start, end = doc["services"], doc["start"], doc["end"]
        where = EventFilter(
            services=None if services is None else frozenset(services),
            min_mono=None if start is None else int(start),
            max_mono=None if end is None else int(end) - 1,
            none=(services is not None and not services) or (
                start is not None and end is not None and int(start) >= int(end)))
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"option where is not one msgq.spark.datasource.where_option "
                         f"wrote ({type(e).__name__}: {e})") from None
    members = spec.load().union_fields
    for name in where.services or ():
        _check_member(name, members)
    return where


def spec_option(spec: SchemaSpec) -> str:
    """``spec`` as the value of the source's ``schemaSpec`` option (JSON: the schema
    file, root struct, import folders and the registry itself, so that a registry given
    in code travels too); :func:`msgq.spark.read_logs` sets it to the schema in force."""
    registry = None if spec.services is None else [
        [s.name, s.should_log, s.frequency, s.message_size, s.decimation, s.port]
        for s in spec.services.values()]
    return json.dumps({"path": spec.path, "root": spec.root, "imports": list(spec.imports),
                       "services_path": spec.services_path, "services": registry})


@functools.lru_cache(maxsize=16)
def spec_from_option(text: str) -> SchemaSpec:
    """The :class:`SchemaSpec` a ``schemaSpec`` option holds (:func:`spec_option`);
    parsed once per process (specs are immutable)."""
    try:
        doc = json.loads(text)
        services = doc["services"]
        registry = None if services is None else ServiceRegistry(
            Service(str(n), bool(log), float(hz), size, decimation, port)
            for n, log, hz, size, decimation, port in services)
        return SchemaSpec(path=doc["path"], services=registry, root=str(doc["root"]),
                          imports=tuple(doc["imports"]), services_path=doc["services_path"])
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"option schemaSpec is not one msgq.spark.datasource.spec_option "
                         f"wrote ({type(e).__name__}: {e}): leave it out, or pass schemaFile "
                         "and registry instead") from None


def read_spec(schema: Any = None, schema_file: str | os.PathLike[str] | None = None
              ) -> SchemaSpec:
    """The spec of a read given ``schema`` (a Schema or SchemaSpec), else ``schema_file``
    (see :func:`_spec_of_options`), else the schema in force."""
    if schema is not None:
        if schema_file is not None:
            raise ValueError("give schema or schema_file, not both")
        if isinstance(schema, SchemaSpec):
            return schema
        if isinstance(schema, Schema):
            return schema.spec
        raise TypeError(f"schema is a msgq.schemas.Schema or SchemaSpec, not "
                        f"{type(schema).__name__}")
    if schema_file is None:
        return spec_in_force()
    return _spec_of_options({"schemaFile": os.fspath(schema_file)}.get)


def _spec_of_options(get: Any) -> SchemaSpec:
    """The schema of a read: option ``schemaSpec`` (what :func:`msgq.spark.read_logs`
    passes), else ``schemaFile``/``registry``/``root``/``imports`` (a registry-less file
    takes the registry in force when it is the schema in force's file, msgq's own for
    msgq's file, else none: every member event-driven), else the schema in force in this
    process."""
    text = get("schemaSpec")
    schema_file = get("schemaFile")
    registry = get("registry")
    root = get("root")
    cwd = get("cwd") or None
    imports = tuple(local_path(p, cwd) for p in (get("imports") or "").split(os.pathsep) if p)
    if text:
        if schema_file or registry or root or imports:
            raise ValueError("option schemaSpec already names the schema: leave out "
                             "schemaFile, registry, root and imports")
        return spec_from_option(text)
    in_force = spec_in_force()
    if not (schema_file or registry or imports):
        return in_force if not root or root == in_force.root else replace(in_force, root=root)
    path = local_path(schema_file, cwd) if schema_file else in_force.path
    root = root or "Event"
    if registry:
        try:
            return spec_of(path, local_path(registry, cwd), root, imports)
        except (OSError, ValueError) as e:
            raise ValueError(f"option registry: {e}") from None
    if path is not None and not os.path.isfile(path):
        raise ValueError(f"option schemaFile: {path} does not exist")
    if path is None or os.path.samefile(path, _MSGQ_SCHEMA_FILE):
        if root == "Event" and not imports:
            return SchemaSpec()  # msgq's own, with msgq's registry
        return SchemaSpec(root=root, imports=imports)
    if in_force.path is not None and os.path.samefile(path, in_force.path) \
            and (root, imports) == (in_force.root, in_force.imports):
        return in_force  # the file in force: with its registry
    return SchemaSpec(path=path, root=root, imports=imports)


def _flag(value: str | None, default: bool, name: str) -> bool:
    if value is None or not str(value).strip():
        return default
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise ValueError(f"option {name} must be true or false, not {value!r}")


def _check_member(name: str, members: tuple[str, ...]) -> None:
    if name not in members:
        raise unknown_service_error(name, members)


def output_schema(options: ReadOptions) -> StructType:
    """The DataFrame schema of a read with ``options``."""
    if options.compact:
        return spark_schema(COMPACT_SCHEMA)
    fields = list(BASE_COLUMNS)
    taken = {f.name for f in fields}
    if options.decode:
        schema = options.schema
        for service in options.decode:
            if service in taken:
                raise ValueError(f"service {service!r} has the name of a base column; it "
                                 "cannot be decoded into a column of its own")
            plan = member_plan(schema.event.schema, service)
            if plan is not None:  # Void members have nothing to decode
                fields.append(StructField(service, plan.spark_type, True))
    return StructType(fields)


class SegmentPartition(InputPartition):
    """One segment file: what :func:`plan_segments` lists."""

    def __init__(self, path: str, segment: int | None) -> None:
        super().__init__(path)
        self.path = path
        self.segment = segment

    def __repr__(self) -> str:
        return f"SegmentPartition({self.path!r}, segment={self.segment})"


class PackedPartition(InputPartition):
    """The unit of work of an executor task: whole segment files, read one after the
    other (a file's events are never split between tasks)."""

    def __init__(self, files: list[SegmentPartition]) -> None:
        super().__init__([f.path for f in files])
        self.files = files

    def __repr__(self) -> str:
        return f"PackedPartition({len(self.files)} files, first {self.files[0].path!r})"


def segment_number(path: str) -> int | None:
    """The segment number of a segment file: the last digits of its name
    (``segment-00003.log.zst`` -> 3), or, for a loggerd segment (``rlog.zst``,
    ``qlog.bz2``, ``rlog`` ...), of its folder ``<route>--<n>`` (``route--7/rlog.zst`` ->
    7); None when neither has any."""
    if loggerd_route(path) is not None:
        return int(path.rpartition("/")[0].rpartition("--")[2])
    # the digits before .log/.zst/.bz2 (never the 2 of .bz2)
    match = _SEGMENT_NUMBER.search(_COMPRESSION_SUFFIX.sub("", path.rpartition("/")[2]))
    return int(match.group(1)) if match else None


def route_name(path: str) -> str | None:
    """The route of a loggerd segment file, as its folders name it
    (``/data/a2a0ccea32023010|2023-07-27--13-01-19--4/rlog.zst`` ->
    ``a2a0ccea32023010|2023-07-27--13-01-19``); None for any other file."""
    route = loggerd_route(path)
    return None if route is None else route.rpartition("/")[2]


def _chosen_log(path: str, log: str) -> str | None:
    """The loggerd file of ``path``'s segment folder that option ``log`` asks for (the
    path itself for any other file); None when the folder has none of that kind."""
    if log == "auto" or loggerd_route(path) is None:
        return path
    folder = os.path.dirname(path)
    try:
        names = [n for n in os.listdir(folder) if n.startswith(log)]
    except OSError:
        return path  # read, and reported, as it is
    chosen = loggerd_log(names)
    return os.path.join(folder, chosen[0]) if chosen else None


def plan_segments(options: ReadOptions) -> list[SegmentPartition]:
    """The segment files of a read, in reading order. With ``services``, or filters
    pushed down (``options.where``, :mod:`msgq.spark.pushdown`), a segment whose final
    index entry says it holds no matching event is left out unread (see
    :class:`msgq.logs.index.IndexCache` for which entries are final), and one whose path,
    route or number fails a pushed filter too."""
    partitions = []
    indexes = IndexCache()
    wanted = None if options.services is None else set(options.services)
    where = options.where
    for listed in dict.fromkeys(segment_paths(list(options.paths))):
        path = _chosen_log(listed, options.log)
        if path is None:
            continue
        need_entry = wanted is not None or (where is not None and where.active)
        entry = indexes.entry(path) if need_entry else None
        if entry is not None and wanted is not None and not wanted & set(entry.counts):
            continue
        segment = entry.segment if entry is not None else segment_number(path)
        if where is not None and not where.keeps_file(path, segment, route_name(path), entry):
            continue
        partitions.append(SegmentPartition(path, segment))
    return partitions


#: What one task reads at most, in file bytes, unless a single file is larger.
MAX_TASK_BYTES = 128 << 20
#: What a task reads at least when there are enough files (a task costs milliseconds).
MIN_TASK_BYTES = 4 << 20
#: The tasks the planner aims at when the read does not say (option parallelism).
DEFAULT_PARALLELISM = 8


def pack_segments(files: list[SegmentPartition], parallelism: int = 0,
                  max_bytes: int = MAX_TASK_BYTES) -> list[PackedPartition]:
    """Whole segment files packed into tasks by size, in reading order: about the total
    over ``parallelism`` (default :data:`DEFAULT_PARALLELISM`) bytes a task, between
    :data:`MIN_TASK_BYTES` and about ``max_bytes``: thousands of small route segments
    become a few tasks per core, a few huge files one task each. The tasks are of even
    size: a file goes to the task its middle byte falls in when the files' bytes are cut
    into equal shares (a greedy fill leaves a small last task, which on a session of N
    cores made N + 1 tasks: two rounds for the time of one). A file that cannot be sized
    counts as empty."""
    if not files:
        return []
    sizes = []
    for f in files:
        try:
            sizes.append(os.path.getsize(f.path))
        except OSError:
            sizes.append(0)
    total = sum(sizes)
    tasks = parallelism if parallelism > 0 else DEFAULT_PARALLELISM
    target = min(max_bytes, max(MIN_TASK_BYTES, -(-total // tasks)))
    shares = max(1, -(-total // target))
    share = total / shares if total else 1.0
    packed: list[PackedPartition] = []
    current: list[SegmentPartition] = []
    current_task = 0
    done = 0
    for f, size in zip(files, sizes, strict=True):
        task = min(shares - 1, int((done + size / 2) // share))
        if current and task != current_task:
            packed.append(PackedPartition(current))
            current = []
        current_task = task
        current.append(f)
        done += size
    packed.append(PackedPartition(current))
    return packed


class MsgqLogDataSource(DataSource):
    """``spark.read.format("msgqlog")``: msgq log segments, one row per event (options
    and columns: module docstring and docs/spark.md). ``default_spec``: the
    ``schemaSpec`` option of reads that name no schema (:func:`source_class`; None: the
    schema in force in the planning worker)."""

    default_spec: str | None = None
    #: option ``cwd`` of reads that give none: where relative paths are taken from
    default_cwd: str | None = None
    #: option ``pushdown`` of reads that give none (see :func:`source_class`)
    default_pushdown: bool = False

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _options(self) -> ReadOptions:
        """The read's options; with no schema option, the source class's spec."""
        options = self.options
        named = {key.lower(): value for key, value in options.items()}
        if self.default_spec is not None and not any(
                options.get(key) for key in _SCHEMA_OPTIONS):
            named["schemaspec"] = self.default_spec
        if self.default_cwd is not None and not options.get("cwd"):
            named["cwd"] = self.default_cwd
        if options.get("pushdown") is None:
            named["pushdown"] = "true" if self.default_pushdown else "false"
        return ReadOptions.parse(_CaseInsensitive(named))

    def schema(self) -> StructType:
        options = self._options()
        # a path that names nothing, or logs of another schema, fail at load()
        _check_paths(segment_paths(list(options.paths)), options)
        return output_schema(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._options()
        ours = output_schema(options)
        if schema != ours:
            raise ValueError("the msgqlog source defines its own schema (from the capnp "
                             "schema and the decode option): do not pass .schema(...)")
        if options.pushdown and not options.compact:  # compact rows: no event columns
            return MsgqLogPushdownReader(options, ours)
        return MsgqLogReader(options, ours)

    def streamReader(self, schema: StructType) -> Any:  # noqa: N802 - Spark's name
        """``spark.readStream.format("msgqlog").load(folder)``: the events a recorder
        writes, micro-batch by micro-batch (:mod:`msgq.spark.streaming`)."""
        options = self._options()
        ours = output_schema(options)
        if schema != ours:
            raise ValueError("the msgqlog source defines its own schema (from the capnp "
                             "schema and the decode option): do not pass .schema(...)")
        return MsgqLogStreamReader(options, ours, read_segment_range, segment_number)


_checked: dict[Any, bool] = {}


def _check_paths(paths: list[str], options: ReadOptions) -> None:
    """:func:`msgq.logs.schema_check.check_paths` of a read's files, once per planning
    process for the same files unchanged (path, size and modification time of each) and
    the same schema: the check samples the first segment of every folder, a fixed cost
    of every query (0.15 ms a file; 0.3 s for the 1,800 folders of 600 routes), while
    Spark's planning process, which runs it, lives on across queries."""
    try:
        stats: tuple[Any, ...] | None = tuple(
            (p, s.st_size, s.st_mtime_ns) for p in paths for s in (os.stat(p),))
    except OSError:
        stats = None
    if stats is not None:  # and each folder's index, which the check reads first
        indexes = []
        for folder in dict.fromkeys(os.path.dirname(p) for p in paths):
            try:
                s = os.stat(os.path.join(folder, INDEX_NAME))
                indexes.append((folder, s.st_size, s.st_mtime_ns))
            except OSError:
                indexes.append((folder, None, None))
        stats += tuple(indexes)
    key = None if stats is None else (options.spec, stats)
    if key is not None and key in _checked:
        return
    check_paths(paths, options.schema)
    if key is not None:
        if len(_checked) > 64:
            _checked.clear()
        _checked[key] = True


def check_local_logs(paths: list[str], spec: SchemaSpec) -> None:
    """The schema check of a read's local paths (and ``file:`` URIs) in this process:
    :func:`msgq.spark.read_logs` calls it on the driver before Spark plans the read, so
    that logs of another schema raise one :class:`msgq.logs.SchemaMismatchError` here,
    not Spark's AnalysisException around the planning worker's. Paths that name no log
    are left to the source, which says so at load()."""
    try:
        files = segment_paths([local_path(p) for p in paths])
    except (OSError, ValueError):
        return
    _check_paths(files, ReadOptions(paths=tuple(paths), spec=spec))


class _CaseInsensitive:
    """Options looked up by name in any case (as Spark's own)."""

    def __init__(self, options: dict[str, str]) -> None:
        self._options = options

    def get(self, key: str) -> str | None:
        return self._options.get(key.lower())


def source_class(schema: Any = None, pushdown: bool = False) -> type[MsgqLogDataSource]:
    """The msgqlog data source class whose reads default to ``schema`` (a Schema or
    SchemaSpec; None: the schema in force here): a subclass carrying the spec, which
    Spark pickles by value to the workers that plan the reads, whatever their
    environment says. It carries this process's working folder too: relative paths are
    the user's, not those of the folder Spark's planning process runs in. ``pushdown``:
    whether its reads take filters from Spark when their option ``pushdown`` does not
    say (never where the session's ``spark.sql.python.filterPushdown.enabled`` is false,
    which makes Spark refuse a reader that would). Off by default for plain
    ``spark.read.format("msgqlog")``: Spark 4.1-4.3 keeps the reader of a DataFrame's
    last pushed query for its next query that has no filter to push (which would then
    get the filtered rows); :func:`msgq.spark.read_logs` guards against that and pushes
    by default."""
    spec = read_spec(schema)
    return type(MsgqLogDataSource.__name__, (MsgqLogDataSource,),
                {"default_spec": spec_option(spec), "default_cwd": os.getcwd(),
                 "default_pushdown": pushdown, "__doc__": MsgqLogDataSource.__doc__,
                 "__module__": __name__})


class MsgqLogReader(DataSourceReader):
    """Plans the segment files into tasks (:func:`pack_segments`) and reads them (in the
    executors). Takes no filters from Spark: the reader of option ``pushdown=false``,
    and of sessions where ``spark.sql.python.filterPushdown.enabled`` is false."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return list(pack_segments(plan_segments(self.options), self.options.parallelism))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, SegmentPartition):
            files = [partition]
        elif isinstance(partition, PackedPartition):
            files = partition.files
        else:  # no files: Spark's empty partition
            return iter(())
        return _task_batches(self.options, self.schema, files)


class MsgqLogPushdownReader(MsgqLogReader):
    """:class:`MsgqLogReader` that also takes the filters of a query it can decide
    exactly (:mod:`msgq.spark.pushdown`): files skipped unread by their sealed index
    entries, events dropped on their peeked fields before decoding."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:  # noqa: N802 - Spark's name
        where, rest = push(filters, self.options.where)
        if where.services is not None:  # a name the schema lacks matches no event
            members = set(self.options.schema.union_fields)
            where = replace(where, services=where.services & members,
                            none=where.none or not where.services & members)
        self.options = replace(self.options, where=where)
        return iter(rest)


# -- executor side -------------------------------------------------------------------


@dataclass
class _Decoder:
    column: int  # position among the typed columns
    field: Any  # the union member's field of the root struct
    convert: Any  # None: the pycapnp value is the column value
    layout: Any  # compiled for _typed_reader.read_member (None: pycapnp always)

    def value(self, data: bytes, schema: Any) -> Any:
        """The column value of an event's bytes: read straight from them
        (:mod:`msgq.schemas._typed_reader`), or by pycapnp for a message that reader leaves
        to it (so the value, or the error, is always pycapnp's)."""
        if self.layout is not None:
            value = read_member(data, self.layout)
            if value is not FALLBACK:
                return value
        return self.from_pycapnp(data, schema)

    def from_pycapnp(self, data: bytes, schema: Any) -> Any:
        """The column value by pycapnp (bounded decoding, the generated converter);
        raises what pycapnp raises on bytes it cannot read."""
        value = decode_event(data, schema)._get_by_field(self.field)
        return value if self.convert is None else self.convert(value)

    def values(self, buffer: Any, starts: list[int], lengths: list[int], schema: Any
               ) -> tuple[list[int], list[Any], dict[int, str]]:
        """The column values of the events at ``starts``/``lengths`` of ``buffer``
        (bytes-like): (the positions decoded, their values, position -> problem of each
        event that could not be: ``undecodable: ...``)."""
        view = memoryview(buffer).cast("B")  # an Arrow buffer's is of signed bytes
        layout = self.layout
        decoded: list[int] = []
        values: list[Any] = []
        failed: dict[int, str] = {}
        for i, (a, n) in enumerate(zip(starts, lengths, strict=True)):
            try:
                value = FALLBACK if layout is None else read_member(view[a:a + n], layout)
                if value is FALLBACK:
                    value = self.from_pycapnp(bytes(view[a:a + n]), schema)
            except Exception as e:  # pycapnp raises KjException, ValueError, ...
                failed[i] = undecodable(e)
                continue
            decoded.append(i)
            values.append(value)
        return decoded, values, failed

    def arrow(self, buffer: Any, starts: Any, lengths: Any, schema: Any, arrow_type: Any
              ) -> tuple[Any, dict[int, str]]:
        """The column of the events at ``starts``/``lengths`` of ``buffer`` (bytes-like)
        as one Arrow array of ``arrow_type`` (the member's Spark type as Arrow's), and
        position -> problem of each event that could not be decoded (null there): the
        array :meth:`values`'s values make, read straight into Arrow's buffers
        (:func:`~msgq.schemas._typed_reader.read_member_arrow`); the messages that reader
        leaves are converted by pycapnp and put in their places. One
        :meth:`decoded_column` read once."""
        column = self.decoded_column(schema, arrow_type)
        column.add(buffer, starts, lengths)
        return column.finish()

    def decoded_column(self, schema: Any, arrow_type: Any) -> DecodedColumn:
        """An empty :class:`DecodedColumn` of this member (``arrow_type``: its Spark type
        as Arrow's), to add the events of many buffers to and make one array of."""
        return DecodedColumn(self, schema, arrow_type)


class DecodedColumn:
    """The typed column of one service's events, read from many buffers (an
    :meth:`add` each: a scanner batch's events, say, decoded while their bytes are
    fresh in the caches) into one Arrow array (:meth:`finish`): what
    :meth:`_Decoder.arrow` makes of all of them at once. The typed reader's
    :class:`~msgq.schemas._typed_reader.MemberColumn` reads them; the events it leaves
    are converted by pycapnp as they are added (their bytes are the buffer's) and put
    in their places at the end."""

    def __init__(self, decoder: _Decoder, schema: Any, arrow_type: Any) -> None:
        self.decoder = decoder
        self.schema = schema
        self.arrow_type = arrow_type
        self.reader = None if decoder.layout is None else \
            MemberColumn(decoder.layout, arrow_type)
        self.count = 0
        self.rows: list[int] = []  # positions converted by pycapnp, and their values
        self.values: list[Any] = []
        self.failed: dict[int, str] = {}  # position -> problem

    def add(self, buffer: Any, starts: Any, lengths: Any) -> None:
        """Adds the events at ``starts``/``lengths`` of ``buffer`` (bytes-like)."""
        first = self.count
        count = len(starts)
        if self.reader is not None:
            positions = self.reader.add(buffer, starts, lengths)
        else:
            positions = range(first, first + count)
        self.count = first + count
        if not positions:
            return
        view = memoryview(buffer).cast("B")  # an Arrow buffer's is of signed bytes
        for position in positions:
            a, n = int(starts[position - first]), int(lengths[position - first])
            try:
                self.values.append(self.decoder.from_pycapnp(bytes(view[a:a + n]),
                                                             self.schema))
            except Exception as e:  # pycapnp raises KjException, ValueError, ...
                self.failed[position] = undecodable(e)
                continue
            self.rows.append(position)

    def finish(self) -> tuple[Any, dict[int, str]]:
        """(the Arrow array of every event added, in order; position -> problem of each
        event that could not be decoded, null there)."""
        import pyarrow as pa  # the spark extra: executors only

        count = self.count
        if self.reader is not None:
            array, left = self.reader.finish()
        else:
            array, left = pa.array([], type=self.arrow_type), range(count)
        if not left:
            return array, {}
        rows = self.rows
        # each position's row in [the array read, the pycapnp rows]; failed ones null
        index = np.zeros(count, np.int64)
        walked = np.ones(count, bool)
        walked[np.asarray(left, np.int64)] = False
        index[walked] = np.arange(len(array))
        index[np.asarray(rows, np.int64)] = len(array) + np.arange(len(rows))
        mask = None
        if self.failed:
            mask = np.zeros(count, bool)
            mask[list(self.failed)] = True
        both = pa.concat_arrays([array, pa.array(self.values, type=self.arrow_type)])
        return both.take(pa.array(index, mask=mask)), dict(self.failed)


def undecodable(error: BaseException) -> str:
    """The ``problem`` of an event whose typed decoding failed with ``error``."""
    return f"undecodable: {' '.join(str(error).split())}"


@functools.lru_cache(maxsize=256)
def member_decoder(spec: SchemaSpec, service: str) -> _Decoder | None:
    """How to fill the typed column of ``service`` under ``spec`` (None: a member with
    nothing to decode), built once per process."""
    root = spec.load().event.schema
    plan = member_plan(root, service)
    if plan is None:
        return None
    layout = None if plan.layout is None else compile_member(plan.layout)
    return _Decoder(0, root.fields[service], plan.convert, layout)


_decoders: dict[tuple[SchemaSpec | None, tuple[str, ...]], dict[str, _Decoder]] = {}


def _decoders_for(options: ReadOptions) -> dict[str, _Decoder]:
    """service -> how to fill its typed column (built once per worker process)."""
    key = (options.spec, options.decode)
    decoders = _decoders.get(key)
    if decoders is None:
        assert options.spec is not None  # set by ReadOptions.__post_init__
        decoders = {}
        for service in options.decode:
            decoder = member_decoder(options.spec, service)
            if decoder is not None:
                decoders[service] = replace(decoder, column=len(decoders))
        _decoders[key] = decoders
    return decoders


@contextmanager
def _few_collections() -> Iterator[None]:
    """Python's cyclic garbage collector, rarely, while a segment is read: a batch of
    typed rows is tens of thousands of tuples and lists alive at once, which made the
    collector run every few events and rescan them (a fifth of the reading time). None
    of them is in a reference cycle: reference counting frees them with the batch. The
    thresholds are restored when the reading ends (or is closed)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 100_000), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


class _FailOnProblemError(RuntimeError):
    """Damage found while reading with ``problems=fail``."""


class _Column:
    """One nullable column of a batch being built, in parts: numpy arrays (with a null
    mask) for the runs of events a scanner batch gives, Python lists for rows added one
    by one (events the scanner leaves to pycapnp, problem rows)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[Any] = []

    def extend(self, values: Any, mask: Any = None) -> None:
        self.parts.append((values, mask))

    def append_list(self, values: list[Any]) -> None:
        self.parts.append(values)

    def arrow(self, pa: Any, kind: Any) -> Any:
        # numpy arrays of the column's own type, converted without a type argument
        # (Arrow's fast path)
        arrays = [pa.array(part, type=kind) if type(part) is list else
                  pa.array(part[0], mask=part[1]) for part in self.parts]
        return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


class _Rows:
    """The rows of one task (one or more segment files, read one after the other),
    gathered column by column into Arrow record batches of the source's schema.

    A run of events of a scanner batch adds numpy arrays (no Python object per event
    unless a typed column or the ``data`` column needs its bytes: then they are
    gathered by numpy, not sliced per event); ``file``, ``segment`` and ``route`` are
    runs of one value per file, so the rows of many small files share a batch. A typed
    column holds only the values of its own service (with their row numbers: Arrow arrays
    read straight from a scanner batch's bytes, :meth:`_Decoder.arrow`), placed at those
    rows by Arrow's ``take`` when the batch is made, so unrelated services cost nothing
    per event.
    """

    def __init__(self, arrow_schema: Any, with_data: bool) -> None:
        # pyarrow: the optional spark extra, imported when Spark is used
        import pyarrow as pa

        self._pa = pa
        self.arrow_schema = arrow_schema
        self.types = [f.type for f in arrow_schema]
        self.with_data = with_data
        self.typed_types = self.types[len(BASE_COLUMNS):]
        self._reset()

    def _reset(self) -> None:
        self.count = 0
        self.bytes = 0
        self._runs: list[list[Any]] = []  # [(path, segment, route), rows]
        self._offset = _Column()
        self._mono = _Column()
        self._service = _Column()  # codes into self._names; -1: null
        self._names: dict[str, int] = {}
        self._tables: dict[int, tuple[tuple[str, ...], Any]] = {}
        self._valid = _Column()
        self._size = _Column()
        self._data: list[Any] = []  # (buffer, starts, lengths) or a list of bytes/None
        # scanner runs (batch, offset base, [picked]) and lists of rows added one by one,
        # made into columns at the flush
        self._pending: list[Any] = []
        self._tail: list[list[Any]] | None = None
        self.problems: dict[int, str] = {}  # row -> problem
        # typed values added one by one (events the scanner leaves to pycapnp): rows and
        # values; and the scanner batches' as Arrow arrays: (rows, array) parts
        self.typed_rows: list[list[int]] = [[] for _ in self.typed_types]
        self.typed_values: list[list[Any]] = [[] for _ in self.typed_types]
        self.typed_parts: list[list[tuple[Any, Any]]] = [[] for _ in self.typed_types]

    def full(self) -> bool:
        """Whether the batch has its rows (or bytes) and should be flushed."""
        return self.count >= _BATCH_ROWS or self.bytes >= _BATCH_BYTES

    def _run(self, file: tuple[str, int | None, str | None], rows: int) -> None:
        if self._runs and self._runs[-1][0] is file:
            self._runs[-1][1] += rows
        else:
            self._runs.append([file, rows])
        self.count += rows

    def _code(self, name: str) -> int:
        code = self._names.get(name)
        if code is None:
            code = self._names[name] = len(self._names)
        return code

    def add_row(self, file: tuple[str, int | None, str | None], offset: int | None,
                mono: int | None, service: str | None, valid: bool | None,
                data: bytes | None) -> int:
        """Adds one row (an event, or a problem row: ``service`` None); returns its row
        number in the batch."""
        row = self.count
        self._run(file, 1)
        tail = self._tail_row()
        tail[0].append(offset)
        tail[1].append(mono)
        tail[2].append(-1 if service is None else self._code(service))
        tail[3].append(valid)
        tail[4].append(None if data is None else len(data))
        if self.with_data:
            tail[5].append(data)
            if data is not None:
                self.bytes += len(data)
        return row

    def add_batch(self, file: tuple[str, int | None, str | None], batch: MessageBatch,
                  picked: Any, base: int) -> None:
        """Adds the messages ``picked`` (numpy indices) of a scanner batch, their offsets
        shifted by ``base``. Their columns are made when the batch is flushed, adjacent
        runs of one scanner batch as one (a reader commits its rows in small chunks)."""
        self._run(file, len(picked))
        self._tail = None
        last = self._pending[-1] if self._pending else None
        if last is not None and last[0] is batch and last[1] == base:
            last[2].append(picked)
        else:
            self._pending.append((batch, base, [picked]))
        if self.with_data:
            self.bytes += int(batch.length[picked].sum())

    def _tail_row(self) -> list[list[Any]]:
        """The Python lists rows added one by one go to (a part of their own)."""
        if self._tail is None:
            self._tail = [[], [], [], [], [], []]
            self._pending.append(self._tail)
        return self._tail

    def _columns(self) -> None:
        """Makes the columns of the pending parts (scanner runs and lists of rows)."""
        start = 0
        for part in self._pending:
            if type(part) is list:
                offset, mono, service, valid, size, data = part
                self._offset.append_list(offset)
                self._mono.append_list(mono)
                self._service.extend(np.array(service, np.int32))
                self._valid.append_list(valid)
                self._size.append_list(size)
                if self.with_data:
                    self._data.append(data)
                start += len(offset)
                continue
            batch, base, pieces = part
            picked = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            at = batch.offset[picked]
            monos = batch.mono_ns[picked]
            self._offset.extend(at + (batch.stream_offset + base))
            over = monos > np.uint64(_MAX_LONG)
            if over.any():
                self._mono.extend(monos.astype(np.int64), over)
                for row in np.flatnonzero(over).tolist():
                    # an undecodable typed value's problem, set before, stays
                    self.problems.setdefault(
                        start + row, f"out of range: logMonoTime {int(monos[row])} is over "
                        "2^63-1")
            else:
                self._mono.extend(monos.astype(np.int64))
            cached = self._tables.get(id(batch.services))
            if cached is None or cached[0] is not batch.services:
                cached = (batch.services, np.array([self._code(n) for n in batch.services],
                                                   np.int32))
                self._tables[id(batch.services)] = cached
            self._service.extend(cached[1][batch.service[picked]])
            self._valid.extend((batch.flags[picked] & VALID) != 0)
            lengths = batch.length[picked]
            self._size.extend(lengths.astype(np.int32))
            if self.with_data:
                self._data.append((batch.data, at, lengths))
            start += len(picked)

    def _data_column(self) -> Any:
        pa = self._pa
        if not self.with_data:
            return pa.nulls(self.count, type=self.types[7])
        arrays = []
        for part in self._data:
            if type(part) is list:
                arrays.append(pa.array(part, type=self.types[7]))
                continue
            buffer, starts, lengths = part
            lengths = lengths.astype(np.int64)
            offsets = np.zeros(len(lengths) + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            total = int(offsets[-1])
            if total >= 1 << 31:
                raise ValueError(f"{total} bytes of events in one batch: over Arrow's 2 GiB")
            a = int(starts[0]) if len(starts) else 0
            if np.array_equal(starts, offsets[:-1] + a):  # back to back: one slice
                values = pa.py_buffer(memoryview(buffer)[a:a + total])
            else:
                gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(total)
                values = pa.py_buffer(np.frombuffer(buffer, np.uint8)[gather])
            arrays.append(pa.Array.from_buffers(
                self.types[7], len(lengths),
                [None, pa.py_buffer(offsets.astype(np.int32)), values]))
        return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)

    def _service_column(self) -> Any:
        pa = self._pa
        codes = np.concatenate([np.asarray(p, np.int32) if type(p) is list else p[0]
                                for p in self._service.parts])
        names = pa.array(list(self._names), type=self.types[4])
        null = codes < 0
        return names.take(pa.array(codes, mask=null if null.any() else None))

    def _file_columns(self) -> list[Any]:
        pa = self._pa
        files = [run[0] for run in self._runs]
        if len(files) == 1:
            path, segment, route = files[0]
            return [pa.repeat(pa.scalar(value, type=self.types[i]), self.count)
                    for i, value in ((0, path), (1, segment), (9, route))]
        index = pa.array(np.repeat(np.arange(len(files), dtype=np.int32),
                                   [run[1] for run in self._runs]))
        return [pa.array([f[k] for f in files], type=self.types[i]).take(index)
                for k, i in ((0, 0), (1, 1), (2, 9))]

    def flush(self) -> Any:
        """The rows gathered as one record batch; starts the next."""
        pa = self._pa
        rows = self.count
        types = self.types
        self._columns()
        problems: list[str | None] = [None] * rows
        for row, problem in self.problems.items():
            problems[row] = problem
        path, segment, route = self._file_columns()
        arrays = [
            path, segment,
            self._offset.arrow(pa, types[2]),
            self._mono.arrow(pa, types[3]),
            self._service_column(),
            self._valid.arrow(pa, types[5]),
            self._size.arrow(pa, types[6]),
            self._data_column(),
            pa.array(problems, type=types[8]),
            route,
        ]
        for kind, at, values, parts in zip(self.typed_types, self.typed_rows,
                                           self.typed_values, self.typed_parts, strict=True):
            if values:
                parts.append((np.asarray(at, np.int64), pa.array(values, type=kind)))
            if not parts:
                arrays.append(pa.nulls(rows, type=kind))
                continue
            # each row's value among the parts' (null: another service's row)
            placed = np.concatenate([part[0] for part in parts])
            index = np.full(rows, -1, np.int64)
            index[placed] = np.arange(len(placed))
            column = parts[0][1] if len(parts) == 1 else \
                pa.concat_arrays([part[1] for part in parts])
            arrays.append(column.take(pa.array(index, mask=index < 0)))
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


class _SegmentRead:
    """Reading one segment into Arrow record batches of the source's schema: from its
    local ``path``, or from ``content`` (the file's bytes, loaded by Spark's binaryFile
    source: :mod:`msgq.spark.hadoop`), ``path`` then being its URI, for the ``file`` column.
    The rows go to ``rows`` (a :class:`_Rows` that the files of a task share, flushed by
    the caller after the last: :func:`_task_batches`; or a :class:`_Pieces`, which keeps
    what the reading adds as it comes: :func:`read_segment_pieces`), else to rows of its
    own, of ``schema`` (needed only then).
    """

    def __init__(self, options: ReadOptions, schema: StructType | None, path: str,
                 segment: int | None, content: bytes | None = None, *,
                 stream_offset: int = 0, file_offset: int = 0,
                 rows: _Rows | _Pieces | None = None) -> None:
        self.options = options
        self.path = path
        self.segment = segment
        self.route = route_name(path)
        self._file = (path, segment, self.route)
        self.content = content
        # where ``content`` starts in the segment (a stream's byte range): in the
        # uncompressed stream (the offset column) and in the file
        self._stream_offset = stream_offset
        self._file_offset = file_offset
        where = options.where
        self._events_only = where is not None and where.events_only
        self._event_test = where.event_test() if where is not None and where.checks_events \
            else None
        self.schema = options.schema
        self.decoders = _decoders_for(options)
        self._owns_rows = rows is None
        if rows is None:
            if schema is None:
                raise ValueError("a segment read with rows of its own needs their schema")
            rows = _rows_for(options, schema)
        self.rows = rows

    def _problem(self, kind: str, offset: int | None, detail: str) -> None:
        if self.options.problems == "fail":
            where = f" at byte {offset}" if offset is not None else ""
            raise _FailOnProblemError(
                f"{self.path}: {kind}{where}: {detail} (read with option problems=rows to "
                "get the readable events and a row per problem)")
        if self._events_only:  # a pushed filter on an event column: no problem rows
            return
        row = self.rows.add_row(self._file, None if offset is None else
                                offset + self._stream_offset, None, None, None, None)
        self.rows.problems[row] = f"{kind}: {detail}"

    def _add_log_problem(self, problem: Any) -> None:
        detail = problem.detail
        if problem.file_offset != problem.offset or self._file_offset != self._stream_offset:
            detail += f" (file byte {problem.file_offset + self._file_offset})"
        self._problem(problem.kind, problem.offset, detail)

    # events ----------------------------------------------------------------------

    def _add_typed(self, row: int, event: Any) -> None:
        decoder = self.decoders.get(event.service)
        if decoder is None:
            return
        try:
            value = decoder.value(event.data, self.schema)
        except Exception as e:  # pycapnp raises KjException, ValueError, ...
            self.rows.problems[row] = undecodable(e)
            return
        self.rows.typed_rows[decoder.column].append(row)
        self.rows.typed_values[decoder.column].append(value)

    def _add_events(self, events: list[Any]) -> None:
        rows = self.rows
        base = self._stream_offset
        for event in events:
            over = event.mono_ns > _MAX_LONG
            row = rows.add_row(self._file, event.offset + base,
                               None if over else event.mono_ns, event.service, event.valid,
                               event.data)
            if over:
                rows.problems[row] = \
                    f"out of range: logMonoTime {event.mono_ns} is over 2^63-1"
            if self.decoders:
                self._add_typed(row, event)

    def _add_batch(self, batch: MessageBatch, picked: Any) -> None:
        """The rows of the messages ``picked`` (numpy indices) of a scanner batch, made
        from its arrays: no Python object per event."""
        first = self.rows.count
        self.rows.add_batch(self._file, batch, picked, self._stream_offset)
        if self.decoders:
            self._add_batch_typed(batch, picked, first)

    def _add_batch_typed(self, batch: MessageBatch, picked: Any, first: int) -> None:
        services = batch.service[picked]
        for index in np.unique(services).tolist():  # the services present only
            decoder = self.decoders.get(batch.services[index])
            if decoder is None:
                continue
            at = np.flatnonzero(services == index)
            chosen = picked[at]
            rows = self.rows
            # straight into Arrow's buffers (undecodable events: null, and a problem)
            column, failed = decoder.arrow(batch.data, batch.offset[chosen],
                                           batch.length[chosen], self.schema,
                                           rows.typed_types[decoder.column])
            for i, problem in failed.items():
                rows.problems[first + int(at[i])] = problem
            rows.typed_parts[decoder.column].append((first + at, column))

    def _readable(self) -> bool:
        """Whether the partition's path is a file here; a problem row when not (on a
        cluster: the file must be at the same path on every executor)."""
        try:
            mode = os.stat(self.path).st_mode
        except OSError as e:
            self._problem("unreadable", None, f"{e.strerror} (on host {socket.gethostname()})")
            return False
        if not stat.S_ISREG(mode):
            self._problem("unreadable", None, "not a regular file")
            return False
        return True

    def batches(self) -> Iterator[Any]:
        """The rows of the segment as Arrow record batches: its events in file order, a
        problem row after the events read before each problem found; with option
        ``compact``, those batches packed per segment file and service
        (:mod:`msgq.spark.compact`)."""
        if not self.options.compact:
            return self._event_rows()

        return compact_batches(self._event_rows())

    def _event_rows(self) -> Iterator[Any]:
        if self.content is not None or self._readable():
            try:
                yield from self._event_batches()
            except _FailOnProblemError:
                raise
            except Exception as e:  # an executor reports, it does not crash
                # Damage the reader could not step over, or an I/O error: what was read
                # stays, and the rest is reported with the reason.
                offset = getattr(getattr(e, "problem", None), "offset", None)
                self._problem("unreadable", offset, f"{type(e).__name__}: {e}")
        if self._owns_rows and self.rows.count:
            yield self.rows.flush()

    def _event_batches(self) -> Iterator[Any]:
        with _few_collections():
            yield from self._read_batches()

    def _read_batches(self) -> Iterator[Any]:
        if self.content is None:
            source: Any = self.path
        else:
            source = io.BytesIO(self.content)
            source.name = self.path  # names it in the reader's problems
        # The LogReader's reading of one segment (framing, peek, damage), from a path or
        # the bytes in memory; no path listing, no index. Its batches come unfiltered:
        # the services and time filters are masks over their arrays here.
        services = self.options.services
        start = None
        where = self.options.where
        if where is not None:
            services = where.services_within(services)
            start = where.min_mono if where.min_mono is not None and where.min_mono > 0 \
                else None
        reader = LogReader([], services=services, skip_corrupt=True, schema=self.schema,
                           start_mono_ns=start)
        items = reader.segment_batches(source)
        wanted = None if services is None else frozenset(services)
        # Rows are committed a chunk of _CHUNK_EVENTS (service- and time-filtered) events
        # at a time, the problems found while reading a chunk after it, as the event
        # reader's chunks were: the same rows, in the same order, the same problem rows
        # (and a chunk cut short by an error that stops the reading is not committed).
        pending: list[Any] = []  # (batch, message indices) or a LogEvent
        in_chunk = 0
        seen = [0, 0]
        while True:
            with warnings.catch_warnings():  # problems become rows here, not warnings
                warnings.simplefilter("ignore", TruncatedLogWarning)
                warnings.simplefilter("ignore", CorruptLogWarning)
                item = next(items, None)
            if item is None:
                break
            if type(item) is MessageBatch:
                picked = _picked(item, wanted, start)
            else:  # an event the scanner left to pycapnp: filtered already
                picked = None
            count = 1 if picked is None else len(picked)
            at = 0
            while at < count:
                take = min(count - at, _CHUNK_EVENTS - in_chunk)
                pending.append(item if picked is None else (item, picked[at:at + take]))
                at += take
                in_chunk += take
                if in_chunk == _CHUNK_EVENTS:
                    yield from self._commit(pending, reader, seen)
                    pending, in_chunk = [], 0
        yield from self._commit(pending, reader, seen)

    def _commit(self, pending: list[Any], reader: LogReader, seen: list[int]
                ) -> Iterator[Any]:
        """Adds a chunk's events (the pushed event filter applied to them) and then the
        problems the reader found since the last chunk, yielding each full batch."""
        where = self.options.where
        for piece in pending:
            if type(piece) is tuple:
                batch, picked = piece
                if self._event_test is not None and len(picked):
                    assert where is not None
                    picked = picked[where.event_mask(batch.mono_ns[picked],
                                                     (batch.flags[picked] & VALID) != 0)]
                while len(picked):  # batches end at a message boundary past the bounds
                    room = max(1, _BATCH_ROWS - self.rows.count)
                    self._add_batch(batch, picked[:room])
                    picked = picked[room:]
                    if self.rows.full():
                        yield self.rows.flush()
            elif self._event_test is None or self._event_test(piece.mono_ns, piece.valid):
                self._add_events([piece])
                if self.rows.full():
                    yield self.rows.flush()
        new = reader.corrupt[seen[0]:] + reader.truncated[seen[1]:]
        for problem in sorted(new, key=lambda p: p.offset):
            self._add_log_problem(problem)
        seen[0], seen[1] = len(reader.corrupt), len(reader.truncated)


def read_segment_range(options: ReadOptions, schema: StructType, path: str,
                       segment: int | None, start: int, end: int, stream: int
                       ) -> Iterator[Any]:
    """The rows of file bytes ``[start, end)`` of the segment file ``path`` (zstd frame
    boundaries, or the whole file), whose uncompressed stream begins at ``stream`` there:
    Arrow record batches of a read with ``options`` (DataFrame ``schema``), offsets
    counted from the segment's start. What a streaming micro-batch reads of a segment
    (:mod:`msgq.spark.streaming`), and a lake build's tasks (:mod:`msgq.spark.lake_files`):
    one reading of a range for both."""
    with open(path, "rb") as f:
        f.seek(start)
        content = f.read(end - start)
    read = _SegmentRead(options, schema, path, segment, content, stream_offset=stream,
                        file_offset=start)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield from read.batches()


class ScannerRun:
    """Messages of a scanner batch a reading took: ``batch`` (a
    :class:`msgq.logs.segment.MessageBatch`), ``picked`` (numpy indices into it) and
    ``base``, added to its offsets (their uncompressed stream's start in the segment)."""

    __slots__ = ("base", "batch", "parts")

    def __init__(self, batch: MessageBatch, picked: Any, base: int) -> None:
        self.batch = batch
        self.base = base
        self.parts = [picked]

    def continues(self, batch: MessageBatch, base: int) -> bool:
        """Whether messages of ``batch`` at ``base`` continue this run (a reader commits
        a scanner batch in small chunks, and the sink's flushes cut a run apart)."""
        return self.batch is batch and self.base == base

    @property
    def picked(self) -> Any:
        """The indices of the messages taken, in reading order."""
        if len(self.parts) > 1:
            self.parts = [np.concatenate(self.parts)]
        return self.parts[0]


class OneRow:
    """A row a reading added on its own: an event the scanner left to pycapnp
    (``service`` set, ``data`` its bytes) or a problem row (``service`` None); the
    ``problem`` of either (an event's logMonoTime out of range: ``mono`` None), else
    None. ``offset`` counts from the segment's start, as the offset column does."""

    __slots__ = ("data", "mono", "offset", "problem", "service", "valid")

    def __init__(self, offset: int | None, mono: int | None, service: str | None,
                 valid: bool | None, data: bytes | None) -> None:
        self.offset = offset
        self.mono = mono
        self.service = service
        self.valid = valid
        self.data = data
        self.problem: str | None = None


class _Pieces:
    """What a :class:`_SegmentRead` adds, kept as it comes instead of made into Arrow
    columns (its ``rows``, in place of a :class:`_Rows`): the runs of scanner batches
    and the rows added one by one, in reading order (:func:`read_segment_pieces`)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.count = 0
        self.pieces: list[Any] = []
        self.problems: dict[int, str] = {}  # a OneRow's index in pieces -> its problem

    def full(self) -> bool:
        return self.count >= _BATCH_ROWS

    def add_row(self, file: Any, offset: int | None, mono: int | None, service: str | None,
                valid: bool | None, data: bytes | None) -> int:
        self.pieces.append(OneRow(offset, mono, service, valid, data))
        self.count += 1
        return len(self.pieces) - 1

    def add_batch(self, file: Any, batch: MessageBatch, picked: Any, base: int) -> None:
        last = self.pieces[-1] if self.pieces else None
        if type(last) is ScannerRun and last.continues(batch, base):
            last.parts.append(picked)
        else:
            self.pieces.append(ScannerRun(batch, picked, base))
        self.count += len(picked)

    def flush(self) -> list[Any]:
        pieces = self.pieces
        for at, problem in self.problems.items():
            pieces[at].problem = problem
        self._reset()
        return pieces


def read_segment_pieces(options: ReadOptions, path: str, segment: int | None, start: int,
                        end: int, stream: int) -> Iterator[Any]:
    """What :func:`read_segment_range` reads of file bytes ``[start, end)`` of ``path``,
    before it becomes Arrow rows: the same reading (the same events, problems and
    order), as :class:`ScannerRun` and :class:`OneRow` pieces in reading order. For a
    reader that makes its own columns of the events (a lake build's tasks,
    :mod:`msgq.spark.lake_files`, which split them by service as they come): no Arrow
    batch of every event is made and taken apart again. ``options`` without typed
    columns (``decode``): those are the caller's to decode."""
    if options.decode:
        raise ValueError("read_segment_pieces reads no typed column: the caller decodes")
    with open(path, "rb") as f:
        f.seek(start)
        content = f.read(end - start)
    pieces = _Pieces()
    read = _SegmentRead(options, None, path, segment, content, stream_offset=stream,
                        file_offset=start, rows=pieces)
    def everything() -> Iterator[Any]:
        for flushed in read.batches():
            yield from flushed
        yield from pieces.flush()  # what the reading added after its last flush

    held: ScannerRun | None = None  # a run that the next piece may continue
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for piece in everything():
            if type(piece) is ScannerRun and held is not None and \
                    held.continues(piece.batch, piece.base):
                held.parts += piece.parts
                continue
            if held is not None:
                yield held
                held = None
            if type(piece) is ScannerRun:
                held = piece
            else:
                yield piece
    if held is not None:
        yield held


def _picked(batch: MessageBatch, wanted: frozenset[str] | None, start: int | None) -> Any:
    """The indices of the messages of ``batch`` a reader of services ``wanted`` (None:
    all) from logMonoTime ``start`` on (None: all) reads, as a numpy array."""
    keep = None
    if wanted is not None:
        table = np.fromiter((name in wanted for name in batch.services), bool,
                            len(batch.services))
        keep = table[batch.service]
    if start is not None:
        late = batch.mono_ns >= np.uint64(start)
        keep = late if keep is None else keep & late
    return np.arange(len(batch)) if keep is None else np.flatnonzero(keep)


def _task_batches(options: ReadOptions, schema: StructType,
                  files: list[SegmentPartition]) -> Iterator[Any]:
    """The record batches of a task's files, read one after the other into shared
    batches (the rows of many small files fill one batch; a file's events stay together
    and in order); compacted with option ``compact``."""

    def events() -> Iterator[Any]:
        rows = None
        for f in files:
            read = _SegmentRead(options, schema, f.path, f.segment, rows=rows)
            read._owns_rows = False
            rows = read.rows
            yield from read._event_rows()
        if rows is not None and rows.count:
            yield rows.flush()

    return compact_batches(events()) if options.compact else events()


def _rows_for(options: ReadOptions, schema: StructType) -> _Rows:
    """An empty :class:`_Rows` of a read with ``options`` and DataFrame ``schema``
    (compact reads build event rows, then pack them)."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql.pandas.types import to_arrow_schema

    if options.compact:
        schema = _event_schema(options)
    return _Rows(_arrow_schema(schema, to_arrow_schema), options.with_data)


@functools.lru_cache(maxsize=16)
def _event_schema(options: ReadOptions) -> StructType:
    """The event rows' schema of a compact read (one object per read's options, so that
    its Arrow schema is converted once)."""
    return output_schema(replace(options, compact=False))


_arrow_schemas: dict[int, tuple[StructType, Any]] = {}


def _arrow_schema(schema: StructType, convert: Any) -> Any:
    """The Arrow schema of ``schema``, converted once per worker process for each read's
    schema object: the conversion walks every field (a few milliseconds for typed
    columns), which was a fixed cost of every file read, thousands of times for many
    small route segments."""
    cached = _arrow_schemas.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_arrow_schemas) > 64:
            _arrow_schemas.clear()
        cached = _arrow_schemas[id(schema)] = (schema, convert(schema, timezone="UTC"))
    return cached[1]


@functools.lru_cache(maxsize=64)
def _names(services: tuple[str, ...]) -> Any:
    """A layout's service names as a numpy object array, to be indexed by a batch's
    service indices (one array per layout)."""
    return np.array(services, dtype=object)
