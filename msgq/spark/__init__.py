"""msgq logs as Spark DataFrames (needs the ``spark`` extra and Java 17+).

* :func:`register` makes ``spark.read.format("msgqlog")`` available
  (:mod:`msgq.spark.datasource`); :func:`read_logs` is the same read as a function.
* :func:`msgq.spark.session.spark_session` — a local (default) or cluster session with
  the source registered.
* :mod:`msgq.spark.analyses` — rates, jitter, gaps, validity per service and segment
  (``msgq logstats``); :mod:`msgq.spark.plot` — rate over time as a PNG.

docs/spark.md describes the columns, options and analyses. Importing this package does
not import pyspark; the functions do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

__all__ = ["events", "problems", "read_logs", "register"]


def register(spark: Any) -> None:
    """Registers the ``msgqlog`` data source with ``spark`` (a SparkSession); safe to
    call again."""
    from msgq.spark.datasource import MsgqLogDataSource

    spark.dataSource.register(MsgqLogDataSource)


def read_logs(
    spark: Any,
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    services: Iterable[str] | None = None,
    decode: bool | Iterable[str] = False,
    schema_file: str | None = None,
    problems: str = "rows",
    data: bool = True,
) -> Any:
    """``spark.read.format("msgqlog")`` with these options over ``paths`` (files,
    recording folders, globs; local paths or ``file:`` URIs): a DataFrame of events and
    problem rows (see :func:`events`, :func:`problems`). ``data=False`` leaves the
    ``data`` column null (statistics that need only the peeked fields move less)."""
    register(spark)
    reader = spark.read.format("msgqlog").option("problems", problems) \
        .option("data", "true" if data else "false")
    if services is not None:
        reader = reader.option("services", ",".join(services))
    if decode is True:
        reader = reader.option("decode", "true")
    elif decode is not False:
        reader = reader.option("decode", ",".join(decode))
    if schema_file is not None:
        reader = reader.option("schemaFile", os.fspath(schema_file))
    if isinstance(paths, (str, os.PathLike)):
        return reader.load(os.fspath(paths))
    return reader.load([os.fspath(p) for p in paths])


def events(df: Any) -> Any:
    """The event rows of a msgqlog DataFrame (problem rows left out)."""
    return df.where(df.service.isNotNull())


def problems(df: Any) -> Any:
    """The problem rows of a msgqlog DataFrame: damage found, with file and offset (and
    events whose typed decoding failed, which also count as events)."""
    return df.where(df.problem.isNotNull())
