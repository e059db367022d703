"""msgq logs as Spark DataFrames (needs the ``spark`` extra and Java 17+).

* :func:`register` makes ``spark.read.format("msgqlog")`` available
  (:mod:`msgq.spark.datasource`, local paths); :func:`read_logs` is the same read as a
  function, which also reads ``hdfs://``, ``s3a://`` ... URIs through Spark's Hadoop
  file systems (:mod:`msgq.spark.hadoop`).
* :func:`msgq.spark.session.spark_session` — a local (default) or cluster session with
  the source registered.
* :mod:`msgq.spark.analyses` — rates, jitter, gaps, validity per service and segment
  (``msgq logstats``); :mod:`msgq.spark.plot` — rate over time as a PNG.

docs/spark.md describes the columns, options and analyses. Importing this package does
not import pyspark; the functions do.

Layer: a tool — over the services (:mod:`msgq.logs`: the segment reader) and the Event
layer; pyspark, pyarrow, pandas and numpy are imported inside the functions that use them
(the ``spark`` extra is optional, and the executors' Python workers import only what a
task needs).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

# the standard library only at its top: no SparkContext on Spark Connect, the parallelism
# is asked of the session
from msgq.spark.connect import default_parallelism

__all__ = ["PUSHDOWN_CONF", "events", "problems", "pushdown_enabled", "read_logs", "register"]

#: Spark's switch of filter pushdown into Python data sources (PySpark 4.1+; off by
#: default there): :func:`register` turns it on unless it was set.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def pushdown_enabled(spark: Any) -> bool:
    """Whether the session pushes filters into Python data sources
    (:data:`PUSHDOWN_CONF`)."""
    return str(spark.conf.get(PUSHDOWN_CONF, "false")).strip().lower() == "true"


def register(spark: Any, schema: Any = None) -> None:
    """Registers the ``msgqlog`` data source with ``spark`` (a SparkSession); safe to
    call again. Its reads use ``schema`` (a :class:`msgq.schemas.Schema` or
    :class:`msgq.schemas.SchemaSpec`; default: the schema in force in this process now)
    unless their options name one (``schemaSpec``, ``schemaFile``): the spec is sent
    with the source, not read from the Spark workers' environment. After
    :func:`msgq.schemas.use_schema`, register again (:func:`read_logs` always passes the
    schema in force). Relative paths of its reads are taken from this process's working
    folder now.

    Filter pushdown (:mod:`msgq.spark.pushdown`): :data:`PUSHDOWN_CONF` is set to true
    when the session has no value for it. A plain ``spark.read.format("msgqlog")`` read
    takes filters with its option ``pushdown=true`` (a DataFrame of such a read must then
    be queried with a pushable filter every time, as :func:`read_logs` does: see
    :func:`msgq.spark.datasource.source_class`)."""
    # optional extra: the source imports pyspark, which importing msgq.spark alone must not
    from msgq.spark.datasource import source_class

    if spark.conf.get(PUSHDOWN_CONF, None) is None:
        spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(source_class(schema))


def read_logs(
    spark: Any,
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    services: Iterable[str] | None = None,
    decode: bool | Iterable[str] = False,
    schema_file: str | None = None,
    problems: str = "rows",
    data: bool = True,
    via: str = "auto",
    compact: bool = False,
    schema: Any = None,
    start: int | None = None,
    end: int | None = None,
    pushdown: bool | None = None,
    keep_problems: bool = False,
) -> Any:
    """The msgqlog DataFrame of ``paths`` (files, recording folders, globs): events and
    problem rows (see :func:`events`, :func:`problems`). ``data=False`` leaves the
    ``data`` column null (statistics that need only the peeked fields move less).

    ``via``: ``"auto"`` reads local paths and ``file:`` URIs with the msgqlog source
    (``spark.read.format("msgqlog")``) and any other URI (``hdfs://``, ``s3a://``,
    ``abfs://``, ``gs://`` ...) through Spark's Hadoop file systems
    (:mod:`msgq.spark.hadoop`: binaryFile + mapInArrow, same columns); a list with both
    kinds is read both ways and the two unioned. ``"source"`` sends every path to the
    source, ``"hadoop"`` every path to Hadoop (plain paths then resolve against the
    cluster's default file system, as Spark resolves them).

    ``compact=True`` gives the rows :func:`msgq.spark.analyses.log_stats` works on
    instead of events: one row per segment file and service of each batch read, with
    the count, invalid count, byte sum and packed logMonoTimes, and the problem rows
    (:mod:`msgq.spark.compact`; no ``decode``). Packed in the reading worker, the events
    never become Spark rows: the cheapest input of ``log_stats`` (``msgq logstats``).

    The schema the logs were written with: ``schema`` (a :class:`msgq.schemas.Schema` or
    :class:`msgq.schemas.SchemaSpec`), else ``schema_file`` (a ``.capnp`` file: with the
    registry in force when it is the schema in force's file), else the schema in force
    in this process (:func:`msgq.schemas.use_schema`, ``MSGQ_SCHEMA``/``MSGQ_REGISTRY``),
    whatever the Spark workers' environment says: its spec travels with the read
    (option ``schemaSpec``) and the executors rebuild it.

    ``services``, ``start`` and ``end`` (logMonoTime, ns: ``start <= t < end``) are
    plain DataFrame filters (``service IN (...)``, ``logMonoTime >= start``,
    ``logMonoTime < end``), which the source takes over (filter pushdown: segments
    skipped by their sealed index entries, events by their peeked fields); as any filter
    on an event column they leave out the problem rows. A compact read has no event
    columns to filter: the same conditions go to the source as its option ``where``,
    and its problem rows stay; so do they with ``keep_problems=True`` (what ``msgq
    logstats`` reads: the damage of the files read is reported whatever the filter).
    ``pushdown=False`` reads with no pushdown (Spark filters every row); default: the
    session's :data:`PUSHDOWN_CONF`. Relative paths are taken from this process's working
    folder, wherever Spark plans the read.

    A lake folder (:mod:`msgq.spark.lake`, ``msgq lake build``) given alone is read from
    its Parquet tables instead (:func:`msgq.spark.lake.read_lake`: the same columns,
    ``data`` null; ``compact`` packs them as here, reading the tables' files with
    pyarrow).
    """
    # optional extra: these modules import pyspark, which importing msgq.spark alone must not
    from msgq.spark import datasource, hadoop, lake

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    lakes = [p for p in paths if lake.is_lake(p)]
    if lakes:  # a lake (msgq.spark.lake): its tables, with the same columns
        if len(paths) > 1:
            raise ValueError(f"{lakes[0]} is a lake: read it alone (one lake, no raw logs "
                             "beside it)")
        return lake.read_lake(spark, lakes[0], services=services, decode=decode,
                              schema=datasource.read_spec(schema, schema_file), start=start,
                              end=end, keep_problems=keep_problems or compact,
                              compact=compact)
    local, remote = hadoop.split_paths([os.fspath(p) for p in paths], via)
    if local:  # logs of another schema: one line here, before Spark plans the read
        datasource.check_local_logs(local, datasource.read_spec(schema, schema_file))
    options = {"problems": problems, "data": "true" if data else "false",
               "cwd": os.getcwd()}
    if services is not None:
        services = list(services)
    keep_problems = keep_problems or compact
    if compact:
        options["compact"] = "true"
    if keep_problems and (services is not None or start is not None or end is not None):
        options["where"] = datasource.where_option(services, start, end)
    if decode is True:
        options["decode"] = "true"
    elif decode is not False:
        options["decode"] = ",".join(decode)
    options["schemaSpec"] = datasource.spec_option(datasource.read_spec(schema, schema_file))
    frames = []
    if local or not remote:  # no paths at all: the source says what is missing
        register(spark)
        if pushdown is None:
            pushdown = pushdown_enabled(spark)
        elif pushdown and not pushdown_enabled(spark):
            raise ValueError(f"pushdown=True needs the session's {PUSHDOWN_CONF} true "
                             "(spark.conf.set it, or leave pushdown out)")
        options["pushdown"] = "true" if pushdown else "false"
        options["parallelism"] = str(default_parallelism(spark))
        reader = spark.read.format("msgqlog").options(**options)
        frames.append(reader.load(local[0] if len(local) == 1 else local))
    if remote:
        frames.append(hadoop.read_segment_files(spark, remote, options))
    df = frames[0] if len(frames) == 1 else frames[0].union(frames[1])
    if pushdown and local and not compact:
        # Spark (4.1-4.3) reuses the reader of a DataFrame's last query that pushed a
        # filter for a query that pushes none: this always-true filter (no file is
        # named "") makes every query of this DataFrame push, so each plans afresh.
        df = df.where(df.file != "")
    if keep_problems:
        return df
    if services is not None:
        df = df.where(df.service.isin(services))
    if start is not None:
        df = df.where(df.logMonoTime >= start)
    if end is not None:
        df = df.where(df.logMonoTime < end)
    return df


def events(df: Any) -> Any:
    """The event rows of a msgqlog DataFrame (problem rows left out)."""
    return df.where(df.service.isNotNull())


def problems(df: Any) -> Any:
    """The problem rows of a msgqlog DataFrame: damage found, with file and offset (and
    events whose typed decoding failed, which also count as events)."""
    return df.where(df.problem.isNotNull())
