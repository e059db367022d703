"""Log segments from any file system Spark's Hadoop layer reaches (``hdfs://``,
``s3a://``, ``abfs://``, ``gs://`` ...), as the same DataFrame the ``msgqlog`` source gives.

The msgqlog source reads files with Python I/O on the executors, so it takes local paths
only. Here the JVM reads instead: Spark's ``binaryFile`` source lists the URIs (globs and
folders: the files ending like segments, :data:`SEGMENT_GLOB`) and loads each segment
file whole as one row (path, content), with the cluster's Hadoop connectors, credentials
and configuration. ``DataFrame.mapInArrow`` then turns every file's bytes into the
msgqlog rows on the executors, with the source's own executor code
(:class:`msgq.spark.datasource._SegmentRead`, reading from memory instead of a path): one
copy of the framing, peek, damage and decoding logic, the same columns and options.

What differs from the source: the ``file`` column is the URI Spark reports
(``hdfs://nn:8020/logs/drive1/segment-00000.log.zst``, ``file:/data/...``), ``segment``
comes from the file name's digits (no ``index.json`` is read, so ``services`` does not
skip segments unread), a file is loaded whole (one binary row each: far below Spark's
2 GB limit for a segment) and Spark packs several files into one task
(``spark.sql.files.maxPartitionBytes``). :func:`msgq.spark.read_logs` picks this path for
URIs with a scheme other than ``file:``, or for every path with ``via="hadoop"``.

Logs of another schema are refused on the driver before any row is read, by the check
every reader runs (:func:`msgq.logs.schema_check.check_paths`), its files read through
Spark: each folder's ``index.json``, and the start of the segments it samples.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from types import SimpleNamespace
from typing import Any

from msgq.logs.index import INDEX_NAME, parse_index_document
from msgq.logs.schema_check import SAMPLE_BYTES, check_paths
from msgq.logs.sources import LOGGERD_NAME, loggerd_log  # the one rule of which copy
from msgq.spark.datasource import (
    ReadOptions,
    _SegmentRead,
    output_schema,
    segment_number,
    uri_scheme,
)

__all__ = ["SEGMENT_GLOB", "VIA", "loggerd_choice", "read_segment_files", "split_paths"]

#: How :func:`msgq.spark.read_logs` reads paths: ``auto`` (local paths and ``file:`` URIs
#: with the msgqlog source, other URIs through Hadoop), ``source`` (all with the source),
#: ``hadoop`` (all through Spark's Hadoop file systems, as Spark resolves them).
VIA = ("auto", "source", "hadoop")

#: The files of a folder (or a glob's folders) read as segments: the suffixes
#: :func:`msgq.logs.segment_paths` takes (``.log``, ``.log.zst``, ``.log.bz2``, ``.zst``,
#: ``.bz2``), and loggerd's raw ``rlog``/``qlog``. Spark skips names starting with ``.``
#: or ``_`` itself.
SEGMENT_GLOB = "{*.log,*.zst,*.bz2,rlog,qlog}"


def split_paths(paths: Iterable[str], via: str = "auto") -> tuple[list[str], list[str]]:
    """(paths for the msgqlog source, paths for Spark's Hadoop file systems), in the given
    order within each. ``auto``: a URI whose scheme is not ``file`` goes to Hadoop."""
    if via not in VIA:
        raise ValueError(f"via must be one of {VIA}, not {via!r}")
    source: list[str] = []
    hadoop: list[str] = []
    for path in paths:
        scheme = uri_scheme(path)
        if via == "hadoop" or (via == "auto" and scheme not in (None, "file")):
            hadoop.append(path)
        else:
            source.append(path)
    return source, hadoop


def read_segment_files(spark: Any, uris: Iterable[str | os.PathLike[str]],
                       options: Mapping[str, str]) -> Any:
    """The msgqlog DataFrame of the segment files ``uris`` name (files, folders, globs; any
    URI Spark's Hadoop file systems take; plain paths resolve against the cluster's
    default file system), read through binaryFile + mapInArrow. ``options``: the msgqlog
    source's (``services``, ``decode``, ``schemaSpec``, ``schemaFile``, ``registry``,
    ``root``, ``imports``, ``problems``, ``data``; names case-insensitive), checked here
    on the driver as the source checks them (no schema named: the one in force here)."""
    uris = [os.fspath(u) for u in uris]
    named = {key.lower(): value for key, value in options.items()}  # as Spark's options
    named["paths"] = json.dumps(uris)
    parsed = ReadOptions.parse(SimpleNamespace(get=lambda key: named.get(key.lower())),
                               local_paths=False)
    schema = output_schema(parsed)
    reader = (spark.read.format("binaryFile")
              .option("pathGlobFilter", SEGMENT_GLOB)
              .option("recursiveFileLookup", "false"))
    try:
        files = reader.load(uris)
    except Exception as e:
        missing = _missing_file_system(str(e))
        if missing is None:
            raise
        schemes = sorted({uri_scheme(u) or "(none)" for u in uris})
        raise ValueError(
            f"Spark has no Hadoop file system for {', '.join(s + ':' for s in schemes)} "
            f"URIs ({' '.join(uris)}; {missing}): add the connector's jars to the session "
            "(spark.jars.packages: org.apache.hadoop:hadoop-aws for s3a:, hadoop-azure "
            "for abfs:, the gcs-connector for gs:) and its settings (spark.hadoop.*)"
        ) from None
    # A loggerd segment folder holds its events more than once (rlog and qlog, zstd and
    # bz2): one of them is read, as segment_paths picks it (the listing, not a job).
    listed = files.inputFiles()
    # the path column spells URIs its own way (file:/x, not file:///x): choose among its
    # values (a job that lists, reading no content)
    paths = sorted(row.path for row in files.select("path").collect())
    if len(loggerd_choice(listed)) < len(listed):
        paths = loggerd_choice(paths)
        files = files.where(files.path.isin(paths))
    # logs of another schema: refused here, on the driver, before any row is read (the
    # one check of every reader, its indexes and samples read through Spark)
    check_paths(paths, parsed.schema, _HadoopFiles(spark, files, paths))
    # A plain module function and plain data: that is all the executors are sent.
    read = functools.partial(_segment_batches, parsed, schema)
    return files.select("path", "content").mapInArrow(read, schema)


class _HadoopFiles:
    """The indexes and segment starts :func:`msgq.logs.schema_check.check_paths` reads,
    through Spark's Hadoop file systems: each folder's ``index.json`` (one small job for
    all folders) and the first :data:`SAMPLE_BYTES` of the segments it samples (one job)."""

    def __init__(self, spark: Any, files: Any, paths: list[str]) -> None:
        self.spark = spark
        self.files = files  # the binaryFile DataFrame of the segment files
        self.folders = sorted({path.rpartition("/")[0] for path in paths})
        self.documents: dict[str, dict[str, Any] | None] | None = None

    def index(self, folder: str) -> dict[str, Any] | None:
        if self.documents is None:
            self.documents = {}
            folders = self.folders
            found = (self.spark.read.format("binaryFile")
                     .option("pathGlobFilter", INDEX_NAME).load(folders)
                     .select("path", "content").collect()) if folders else []
            for row in found:
                self.documents[row.path.rpartition("/")[0]] = \
                    parse_index_document(bytes(row.content))
        return self.documents.get(folder)

    def segments(self, paths: list[str]) -> dict[str, Any]:
        from pyspark.sql import functions  # optional extra: pyspark, when Spark reads

        files = self.files
        rows = (files.where(files.path.isin(paths))
                .select("path", functions.substring("content", 1, SAMPLE_BYTES)
                        .alias("head")).collect())
        return {row.path: io.BytesIO(bytes(row.head)) for row in rows}


def loggerd_choice(paths: Iterable[str]) -> list[str]:
    """``paths`` without the second copies of a loggerd segment: of the ``rlog``/``qlog``
    files of one folder, only the one :func:`msgq.logs.segment_paths` reads (rlog over
    qlog, zstd over bz2 over raw); other files stay."""
    paths = list(paths)
    by_folder: dict[str, list[str]] = {}
    for path in paths:
        folder, _, name = path.rpartition("/")
        if LOGGERD_NAME.match(name):
            by_folder.setdefault(folder, []).append(name)
    keep = {f"{folder}/{name}" for folder, names in by_folder.items()
            for name in loggerd_log(names)}
    return [p for p in paths if p in keep or not LOGGERD_NAME.match(p.rpartition("/")[2])]


def _missing_file_system(error: str) -> str | None:
    """What the JVM's error says is missing when no file system serves a scheme: no
    class named for it at all, or a named class (a connector) not on the classpath."""
    match = re.search(r"No FileSystem for scheme \"?([^\"\s]+)", error)
    if match:
        return f"no FileSystem for scheme {match.group(1)}"
    match = re.search(r"Class (\S+) not found", error)
    if match and match.group(1).endswith("FileSystem"):
        return f"class {match.group(1)} not found"
    return None


def _segment_batches(options: ReadOptions, schema: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """In the executors: the msgqlog rows (Arrow record batches) of every file in the
    binaryFile batches, file after file, each in file order."""
    for batch in batches:
        paths = batch.column("path").to_pylist()
        contents = batch.column("content")
        for row, path in enumerate(paths):
            content = contents[row].as_py() or b""
            yield from _SegmentRead(options, schema, path, segment_number(path),
                                    content).batches()
