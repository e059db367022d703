"""Ready analyses of msgq logs in Spark: rates, inter-arrival jitter, gaps, validity and
size, per service and per segment, in one pass over the rows (Arrow batches into numpy in
the executors' Python workers; the stages are described below), so they run wherever
the DataFrame does (one machine or a cluster).

Definitions (docs/spark.md has them with examples):

* an **interval** (``dt``) is the logMonoTime difference between consecutive events of one
  service, in time order. Per service, intervals are taken within a recording (the folder
  of the segment files; segment boundaries included, different recordings never mixed);
  per segment, within the segment file.
* **measured rate** = intervals / their total duration (= 1 / mean dt), in Hz; the
  **expected rate** is the registry's frequency (none for event-driven services);
  ``rate_ratio`` = measured / expected.
* **jitter**: p50, p99 and max of dt in ms. Percentiles are exact, interpolated linearly
  between the two nearest intervals (Spark's ``percentile``, as numpy's default), or
  approximate with ``approx_percentiles`` (a logarithmic histogram: within
  :data:`APPROX_RELATIVE_ERROR`, bounded memory).
* a **gap** is an interval longer than ``gap_factor`` expected periods (default
  :data:`GAP_FACTOR` = 2.5: two or more messages lost in a row, while a single lost
  message, two periods, with up to half a period of jitter is not a gap).
* ``invalid_fraction`` = events with ``valid`` false / events; ``mean_size`` = mean of the
  event size in bytes.

Event rows are the rows with a service and a logMonoTime; problem rows (damage) are
listed apart in ``problems``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal
from functools import partial
from typing import Any

import numpy as np

from msgq.schemas import registry_in_force
from msgq.spark.compact import (
    COMPACT_COLUMNS,
    COMPACT_SCHEMA,
    LOGGERD_FILE,
    LOGGERD_FOLDER,
    GroupableRead,
    arrow_schema,
    compact_batches,
    ddl_columns,
    spark_schema,
)

__all__ = ["APPROX_RELATIVE_ERROR", "GAP_FACTOR", "LogStats", "expected_rates", "log_stats",
           "rate_timeline"]

#: Default gap threshold, in expected periods.
GAP_FACTOR = 2.5

_NS = 1_000_000_000


def expected_rates(registry: Mapping[str, Any] | None = None) -> dict[str, float | None]:
    """service -> expected Hz from a service registry (default: the registry in force,
    :func:`msgq.schemas.registry_in_force`: ``--registry``, ``MSGQ_REGISTRY`` or
    :func:`msgq.schemas.use_schema`'s, else msgq's own); None for event-driven
    services."""
    if registry is None:
        registry = registry_in_force()
    return {name: (s.frequency if s.frequency > 0 else None) for name, s in registry.items()}


def _recording(sf: Any) -> Any:
    """The recording of a row: the folder of its segment file, or a loggerd segment's
    route (as :func:`msgq.spark.compact.recording_of`)."""
    folder = sf.regexp_extract(sf.col("file"), r"^(.*)/[^/]*$", 1)
    name = sf.regexp_extract(sf.col("file"), r"([^/]*)$", 1)
    return sf.when(name.rlike(LOGGERD_FILE) & folder.rlike(LOGGERD_FOLDER),
                   sf.regexp_extract(folder, LOGGERD_FOLDER, 1)).otherwise(folder)


# -- the one pass over the rows -------------------------------------------------------------
#
# Stage 1 (no shuffle): each Arrow batch of narrow rows becomes one row per (segment
# file, service) holding the count, invalid count, byte sum and the events' logMonoTimes
# packed as int64 bytes; problem rows pass through (msgq.spark.compact). A few thousand
# rows instead of a million: what crosses the shuffle is the timestamps, not Spark rows.
# On a compact read (read_logs(..., compact=True)) the source's Python worker has done it
# already, so Spark never holds a row per event; on any other frame, mapInArrow does it.
# Stage 2 (groupBy service + applyInArrow; with approximate percentiles groupBy recording,
# service): numpy sorts a recording's timestamps of one service (ties: by file, as the
# first implementation's window order did; equal times give equal intervals in any
# order) and computes everything per segment file, the gaps, and a partial per recording
# (sums and the sorted intervals, or their histogram). With exact percentiles the group
# holds every recording of the service, so its row (the recordings' sorted intervals
# merged) is made there too and no interval leaves the worker. Stage 3, on the driver:
# stage 2's rows are collected as Arrow (one Spark job, the only one: a few rows per
# segment file and service, per gap, per problem, and the histograms) and the services'
# rows of approximate percentiles merged from the histograms. LogStats's frames are made
# from the collected rows, so the logs are read once and nothing is cached.
#
# The functions below run in the executors' Python workers. They have no annotations:
# pyspark reads a grouped function's type hints to choose its calling convention.

#: Relative error of approximate percentiles (``approx_percentiles=True``): each is within
#: this fraction of the exact (interpolated) value.
APPROX_RELATIVE_ERROR = 0.005
_GAMMA = (1 + APPROX_RELATIVE_ERROR) / (1 - APPROX_RELATIVE_ERROR)
_ZERO_BUCKET = -(1 << 62)

# what LogStats publishes per service and per segment, in this order
_PUBLISHED = ("count bigint, segments bigint, expected_hz double, measured_hz double, "
              "rate_ratio double, dt_p50_ms double, dt_p99_ms double, dt_max_ms double, "
              "gaps bigint, invalid bigint, invalid_fraction double, mean_size double, "
              "first_mono_ns bigint, last_mono_ns bigint, duration_s double, intervals bigint")
_GAP_COLUMNS = ("start_mono_ns bigint, end_mono_ns bigint, start_s double, "
                "duration_ms double, missed bigint")
_PARTIAL_SCHEMA = ("kind string, recording string, file string, segment int, service string, "
                   "offset bigint, problem string, " + _PUBLISHED + ", dt_sum_ns bigint, "
                   "dt_max_ns bigint, gap_count bigint, size_sum bigint, dts binary, "
                   + _GAP_COLUMNS)
# with exact percentiles the intervals never leave the workers: no dts column
_EXACT_PARTIAL_SCHEMA = _PARTIAL_SCHEMA.replace(", dts binary", "")
_SERVICE_SCHEMA = "service string, " + _PUBLISHED


def _names(ddl):
    return [name for name, _ in ddl_columns(ddl)]


_PARTIAL_COLUMNS = _names(_PARTIAL_SCHEMA)
_EXACT_PARTIAL_COLUMNS = _names(_EXACT_PARTIAL_SCHEMA)
_SERVICE_COLUMNS = _names(_SERVICE_SCHEMA)
_PUBLISHED_COLUMNS = _names(_PUBLISHED)


def _bucket_values(index):
    """The value a histogram bucket stands for (within APPROX_RELATIVE_ERROR of all its
    members)."""
    values = 2 * np.power(_GAMMA, index.astype(np.float64)) / (_GAMMA + 1)
    return np.where(index == _ZERO_BUCKET, 0.0, values)


def _bucket_index(dts):
    """The histogram bucket of each non-negative interval: logarithmic buckets of ratio
    _GAMMA, zero on its own."""
    index = np.full(len(dts), _ZERO_BUCKET, dtype=np.int64)
    positive = dts > 0
    index[positive] = np.ceil(np.log(dts[positive].astype(np.float64)) / math.log(_GAMMA))
    return index


def _histogram(dts):
    """(bucket index, count) arrays of non-negative intervals (:func:`_bucket_index`: a
    mergeable sketch of bounded size)."""
    buckets, counts = np.unique(_bucket_index(dts), return_counts=True)
    return buckets, counts.astype(np.int64)


def _pack_histogram(buckets, counts):
    return np.concatenate((buckets, counts)).astype("<i8").tobytes()


def _unpack_histogram(data):
    packed = np.frombuffer(data, dtype="<i8")
    half = len(packed) // 2
    return packed[:half], packed[half:]


def _percentiles(at_rank, n):
    """p50 and p99 of n values, ``at_rank(i)`` the i-th smallest: linear interpolation
    between the two nearest ranks, the arithmetic of Spark's ``percentile`` (so the
    results are equal to the last bit)."""
    if n == 0:
        return None, None
    out = []
    for p in (0.5, 0.99):
        position = (n - 1) * p
        lower, higher = math.floor(position), math.ceil(position)
        low = at_rank(lower)
        if higher == lower:
            out.append(float(low))
            continue
        high = at_rank(higher)
        if high == low:
            out.append(float(low))
            continue
        out.append(float(low) + (position - lower) * (float(high) - float(low)))
    return out[0], out[1]


def _exact_percentiles(ordered):
    return _percentiles(lambda i: int(ordered[i]), len(ordered))


def _approx_percentiles(buckets, counts):
    cumulative = np.cumsum(counts)
    values = _bucket_values(buckets)
    n = int(cumulative[-1]) if len(cumulative) else 0
    return _percentiles(lambda i: float(values[np.searchsorted(cumulative, i, "right")]), n)


def _interval_stats(dts, hz, gap_factor, approx):
    """The aggregates of one set of intervals (numpy int64), and what stage 3 merges."""
    if approx:
        buckets, counts = _histogram(dts)
        p50, p99 = _approx_percentiles(buckets, counts)
        packed = _pack_histogram(buckets, counts)
    else:  # the sorted intervals themselves: they stay in the worker
        packed = np.sort(dts)
        p50, p99 = _exact_percentiles(packed)
    gaps = 0 if hz is None else \
        int(np.count_nonzero(dts.astype(np.float64) > gap_factor * _NS / hz))
    return {"intervals": len(dts), "dt_sum_ns": int(dts.sum()) if len(dts) else None,
            "dt_p50_ns": p50, "dt_p99_ns": p99,
            "dt_max_ns": int(dts.max()) if len(dts) else None, "gap_count": gaps}, packed


def _published(row):
    """Adds the published columns to ``row`` (its aggregates and dt_p50_ns/dt_p99_ns), by
    the expressions of the first implementation, in the same double arithmetic (so the
    numbers are equal to the last bit)."""
    hz, intervals, dt_sum = row["expected_hz"], row["intervals"], row["dt_sum_ns"]
    measured = intervals * float(_NS) / dt_sum if dt_sum is not None and dt_sum > 0 else None
    p50, p99 = row.pop("dt_p50_ns"), row.pop("dt_p99_ns")
    row.update(
        measured_hz=measured,
        rate_ratio=None if measured is None or not hz else measured / hz,
        dt_p50_ms=None if p50 is None else p50 / 1e6,
        dt_p99_ms=None if p99 is None else p99 / 1e6,
        dt_max_ms=None if row["dt_max_ns"] is None else row["dt_max_ns"] / 1e6,
        gaps=None if hz is None else row["gap_count"],
        invalid_fraction=row["invalid"] / row["count"],
        mean_size=row["size_sum"] / row["count"],
        duration_s=(row["last_mono_ns"] - row["first_mono_ns"]) / 1e9,
    )
    return row


def _missed(dt, hz):
    """Messages lost in a gap: round(dt x rate) - 1, rounding half up on the decimal form
    of the double (Spark's ``round``)."""
    return int(Decimal(repr(dt * hz / 1e9)).quantize(Decimal(1), ROUND_HALF_UP)) - 1


def _packed_runs(column, rows):
    """The logMonoTimes of a column of packed ``monos`` (Arrow binary, a row's events as
    little-endian int64) as one int64 array, the rows taken in the order of ``rows``, and
    each row's count: one copy out of the column's Arrow buffers (not a bytes object per
    row, then a concatenation)."""
    # pyarrow: the optional spark extra, imported when Spark is used
    import pyarrow as pa
    import pyarrow.compute as pc

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count:
        array = pc.fill_null(array, b"")
    wide = pa.types.is_large_binary(array.type)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if wide else np.int32)[
        array.offset:array.offset + len(array) + 1].astype(np.int64)
    lengths = np.diff(offsets) // 8
    if offsets[-1] == offsets[0]:
        return np.zeros(0, dtype=np.int64), lengths
    data = np.frombuffer(array.buffers()[2], dtype=np.uint8)
    begins = offsets[:-1].tolist()
    ends = offsets[1:].tolist()
    return np.concatenate([data[begins[r]:ends[r]] for r in rows.tolist()]) \
        .view("<i8").astype(np.int64), lengths


def _sorted_runs(values, lengths):
    """``values`` (runs of ``lengths`` each, one after another) with each run sorted: one
    sort of (run, value) keys, not a sort per run."""
    if len(values) < 2:
        return values
    low = int(values.min())
    span = int(values.max()) - low + 1
    if span * len(lengths) >= 1 << 62:  # the keys would not fit in int64
        return values[np.lexsort((values, np.repeat(np.arange(len(lengths)), lengths)))]
    bases = np.repeat(np.arange(len(lengths), dtype=np.int64) * span, lengths)
    keys = values - low
    keys += bases
    keys.sort()
    keys -= bases
    keys += low
    return keys


def _recording_rows(add, recording, service, hz, table, gap_factor, approx):
    """The compact rows of one (recording, service): adds its segment rows, gap rows and
    partial row; returns the partial (with its intervals, ``dts``: sorted, or with
    approximate percentiles their packed histogram)."""
    files = table.column("file").to_pylist()
    names = sorted(set(files))
    rank = {name: i for i, name in enumerate(names)}
    segment_of = dict(zip(files, table.column("segment").to_pylist(), strict=True))
    file_rows = np.array([rank[f] for f in files], dtype=np.int64)
    counts = table.column("count").to_numpy()
    invalid = table.column("invalid").to_numpy()
    size_sum = table.column("size_sum").to_numpy()

    # Every segment file at once (a numpy call and a sort per file cost more than the
    # work: 217 files at 10 M events): the events taken file by file in name order
    # (every file has one at least), sorted within each (nearly always sorted already);
    # a file's intervals are the steps that do not cross into the next file
    times, lengths = _packed_runs(table.column("monos"), np.argsort(file_rows, kind="stable"))
    events = np.zeros(len(names), dtype=np.int64)
    np.add.at(events, file_rows, lengths)
    file_invalid = np.zeros(len(names), dtype=np.int64)
    np.add.at(file_invalid, file_rows, invalid)
    file_sizes = np.zeros(len(names), dtype=np.int64)
    np.add.at(file_sizes, file_rows, size_sum)
    ends = np.cumsum(events)
    begins = ends - events
    crossing = ends[:-1] - 1  # the step from a file's last event to the next file's first
    steps = np.diff(times)
    backwards = steps < 0
    backwards[crossing] = False
    if np.any(backwards):  # events out of time order in a file
        times = _sorted_runs(times, events)
        steps = np.diff(times)
    inside = np.ones(len(steps), dtype=bool)
    inside[crossing] = False
    dts = steps[inside]
    intervals = events - 1
    dt_begins = np.cumsum(intervals) - intervals
    firsts, lasts = times[begins], times[ends - 1]
    dt_sums = lasts - firsts  # the intervals of a sorted file add up to its span
    dt_maxima = np.zeros(len(names), dtype=np.int64)
    some = intervals > 0
    if np.any(some):
        dt_maxima[some] = np.maximum.reduceat(dts, dt_begins[some])
    gap_counts = np.zeros(len(names), dtype=np.int64)
    if hz is not None:
        over = np.flatnonzero(dts.astype(np.float64) > gap_factor * _NS / hz)
        gap_counts = np.bincount(np.searchsorted(dt_begins, over, "right") - 1,
                                 minlength=len(names))
    ordered = _sorted_runs(dts, intervals)
    # the value at a rank: the interval, or (approximate) its histogram bucket's
    ranked = _bucket_values(_bucket_index(ordered)) if approx else ordered
    for i, (name, n, begin, first, last) in enumerate(zip(
            names, intervals.tolist(), dt_begins.tolist(), firsts.tolist(), lasts.tolist(),
            strict=True)):
        p50, p99 = _percentiles(lambda r, b=begin: ranked[b + r].item(), n)
        add(kind="segment", recording=recording, file=name, segment=segment_of[name],
            service=service, **_published(dict(
                expected_hz=hz, count=n + 1, segments=1, first_mono_ns=first,
                last_mono_ns=last, invalid=int(file_invalid[i]), size_sum=int(file_sizes[i]),
                intervals=n, dt_sum_ns=int(dt_sums[i]) if n else None, dt_p50_ns=p50,
                dt_p99_ns=p99, dt_max_ns=int(dt_maxima[i]) if n else None,
                gap_count=int(gap_counts[i]))))

    # the recording: time order, ties by file (the event that ends a gap is the first).
    # Where each file ends before the next one begins (a recording's segments do) the
    # events are in that order already; else a stable sort of them (ties: by file)
    file_of = np.repeat(np.arange(len(names), dtype=np.int64), events)
    if np.any(steps[crossing] < 0):
        order = np.argsort(times, kind="stable")
        times, file_of = times[order], file_of[order]
        steps = np.diff(times)
    stats, packed = _interval_stats(steps, hz, gap_factor, approx)
    if hz is not None and stats["gap_count"]:
        where = np.flatnonzero(steps.astype(np.float64) > gap_factor * _NS / hz)
        for dt, begin, end, f in zip(steps[where].tolist(), times[where].tolist(),
                                     times[where + 1].tolist(), file_of[where + 1].tolist(),
                                     strict=True):
            name = names[f]
            add(kind="gap", recording=recording, file=name, segment=segment_of[name],
                service=service, expected_hz=hz, start_mono_ns=begin, end_mono_ns=end,
                duration_ms=dt / 1e6, missed=_missed(dt, hz))
    row = _published(dict(expected_hz=hz, count=int(counts.sum()), segments=len(names),
                          first_mono_ns=int(times[0]), last_mono_ns=int(times[-1]),
                          invalid=int(invalid.sum()), size_sum=int(size_sum.sum()), **stats))
    # the exact intervals stay in the worker (the service's row is made here); a
    # histogram is small and goes to the driver, which merges the recordings'
    add(kind="partial", recording=recording, service=service,
        dts=packed if approx else None, **row)
    return {"service": service, "dts": packed, **row}


def _partials(params, table):
    """Stage 2: the compact rows of one group -> its segment rows, gap rows and a partial
    per recording; problem rows pass through. Exact percentiles: the group is a service
    (every recording of it), and its published row (kind ``service``) is made here, from
    the recordings' sorted intervals. Approximate: the group is a (recording, service),
    and the driver merges the partials' histograms."""
    # pyarrow: the optional spark extra, imported when Spark is used
    import pyarrow as pa

    # pyarrow: the optional spark extra, imported when Spark is used
    import pyarrow.compute as pc

    rates, gap_factor, approx = params
    rows: list[dict[str, Any]] = []

    def add(**values):
        rows.append(values)

    def table_of_rows():  # column by column: a list each, not an append per cell
        ddl, columns = (_PARTIAL_SCHEMA, _PARTIAL_COLUMNS) if approx else \
            (_EXACT_PARTIAL_SCHEMA, _EXACT_PARTIAL_COLUMNS)
        return pa.Table.from_pydict({name: [row.get(name) for row in rows]
                                     for name in columns}, schema=arrow_schema(ddl))

    if table.num_rows and table.column("kind")[0].as_py() == "problem":
        for row in table.select(["file", "segment", "offset", "service", "problem"]).to_pylist():
            add(kind="problem", **row)
        return table_of_rows()
    service = table.column("service")[0].as_py()
    hz = rates.get(service)
    hz = None if hz is None else float(hz)
    recordings = table.column("recording")
    names = sorted(set(recordings.to_pylist()))
    partials = []
    for recording in names:
        mine = table if len(names) == 1 else table.filter(pc.equal(recordings, recording))
        partials.append(_recording_rows(add, recording, service, hz, mine, gap_factor,
                                        approx))
    if not approx:
        merged = _service_row({name: [p[name] for p in partials] for name in partials[0]},
                              approx)
        add(kind="service", **merged)
    return table_of_rows()


def _service_row(rows, approx):
    """Stage 3: the partials of one service's recordings (a dict of column lists) -> its
    published row."""
    if approx:
        histograms = [_unpack_histogram(b) for b in rows["dts"]]
        buckets = np.concatenate([h[0] for h in histograms])
        counts = np.concatenate([h[1] for h in histograms])
        merged, where = np.unique(buckets, return_inverse=True)
        p50, p99 = _approx_percentiles(
            merged, np.bincount(where, weights=counts).astype(np.int64))
    elif len(rows["dts"]) == 1:  # one recording: its intervals are sorted already
        p50, p99 = _exact_percentiles(rows["dts"][0])
    else:
        together = np.concatenate(rows["dts"])
        together.sort()
        p50, p99 = _exact_percentiles(together)
    sums = [s for s in rows["dt_sum_ns"] if s is not None]
    maxima = [m for m in rows["dt_max_ns"] if m is not None]
    row = _published({
        "expected_hz": rows["expected_hz"][0],
        "count": sum(rows["count"]), "segments": sum(rows["segments"]),
        "first_mono_ns": min(rows["first_mono_ns"]), "last_mono_ns": max(rows["last_mono_ns"]),
        "intervals": sum(rows["intervals"]), "dt_sum_ns": sum(sums) if sums else None,
        "dt_p50_ns": p50, "dt_p99_ns": p99, "dt_max_ns": max(maxima) if maxima else None,
        "gap_count": sum(rows["gap_count"]), "invalid": sum(rows["invalid"]),
        "size_sum": sum(rows["size_sum"]),
    })
    return {"service": rows["service"][0], **{k: row[k] for k in _PUBLISHED_COLUMNS}}


# LogStats' frames and their columns
_FRAME_SCHEMAS = {
    "services": _SERVICE_SCHEMA,
    "segments": "recording string, file string, segment int, service string, " + _PUBLISHED,
    "gaps": "recording string, file string, segment int, service string, "
            "start_mono_ns bigint, end_mono_ns bigint, start_s double, duration_ms double, "
            "missed bigint",
    "problems": "file string, segment int, offset bigint, service string, problem string",
}


def _frame_table(rows: list[dict[str, Any]], frame: str) -> Any:
    """Rows of one of LogStats' frames (dicts) as an Arrow table of its columns."""
    # pyarrow: the optional spark extra, imported when Spark is used
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=arrow_schema(_FRAME_SCHEMAS[frame]))


def _document(gap_factor: float, services: Any, segments: Any, gaps: Any,
              problems: Any) -> dict[str, Any]:
    """What :meth:`LogStats.to_dict` returns, from Arrow tables holding (at least) the
    columns of each frame: the rows in Spark's order (ascending, nulls first; strings
    by their UTF-8 bytes, as Arrow sorts them), each with the columns of its frame, the
    gaps' ``start_s`` from their recording's first event. Sorted and selected as
    columns, then made dicts once (a sort key and a dict per row cost more than the
    rest of the driver's work at 10 M events)."""

    def ordered(table: Any, frame: str, *keys: str) -> list[dict[str, Any]]:
        table = table.select(_names(_FRAME_SCHEMAS[frame]))
        try:  # pyarrow >= 25: the null placement of each key
            table = table.sort_by([(key, "ascending", "at_start") for key in keys])
        except (TypeError, ValueError):  # older: one for all keys
            table = table.sort_by([(key, "ascending") for key in keys],
                                  null_placement="at_start")
        return table.to_pylist()

    segment_rows = ordered(segments, "segments", "recording", "segment", "file", "service")
    starts: dict[str, int] = {}
    for s in segment_rows:
        start = starts.get(s["recording"])
        if start is None or s["first_mono_ns"] < start:
            starts[s["recording"]] = s["first_mono_ns"]
    gap_rows = ordered(gaps, "gaps", "recording", "start_mono_ns", "service")
    for g in gap_rows:
        g["start_s"] = (g["start_mono_ns"] - starts[g["recording"]]) / 1e9
    return {
        "gap_factor": gap_factor,
        "services": ordered(services, "services", "service"),
        "segments": segment_rows,
        "gaps": gap_rows,
        "problems": ordered(problems, "problems", "file", "offset"),
    }


def _finish(table: Any, gap_factor: float, approx: bool) -> dict[str, Any]:
    """Stage 3, on the driver: the collected rows of stage 2 (an Arrow table) ->
    :func:`_document`. With exact percentiles each service's row was made in its group;
    approximate ones merge the recordings' histograms here (:func:`_service_row`)."""
    # pyarrow: the optional spark extra, imported when Spark is used
    import pyarrow.compute as pc

    kinds = table.column("kind")

    def of(kind: str) -> Any:
        return table.filter(pc.fill_null(pc.equal(kinds, kind), False))

    if approx:
        partials: dict[str, dict[str, list[Any]]] = {}
        for row in of("partial").to_pylist():
            merged = partials.setdefault(row["service"], {})
            for name, value in row.items():
                merged.setdefault(name, []).append(value)
        services = _frame_table([_service_row(merged, approx) for merged in partials.values()],
                                "services")
    else:
        services = of("service")
    return _document(gap_factor, services, of("segment"), of("gap"), of("problem"))


class LogStats:
    """The analyses of one set of logs: :meth:`to_dict` (plain rows) and Spark
    DataFrames of the same rows.

    ``services``: one row per service; ``segments``: one row per segment file and
    service; ``gaps``: one row per gap; ``problems``: damage found while reading.
    ``events``: the narrow event rows (recording, file, segment, service, logMonoTime,
    ...; None for a compact read), for :meth:`timeline`. The Python engine computes all
    four in one Spark job and holds them on the driver (a row per segment file and
    service, per gap, per problem; never a row per event): ``to_dict()`` runs nothing
    and each frame is made from those rows (a local relation) when first asked for.
    The SQL engine's are selections of its cached aggregates (``partials``).
    """

    def __init__(self, services: Any, segments: Any, gaps: Any, problems: Any, events: Any,
                 gap_factor: float, partials: Any = None, cached: tuple[Any, ...] = (),
                 collected: dict[str, Any] | None = None, spark: Any = None) -> None:
        self._frames = {"services": services, "segments": segments, "gaps": gaps,
                        "problems": problems}
        self.events = events
        self.gap_factor = gap_factor
        self.partials = partials  # the SQL engine's cached aggregates
        self.cached = cached  # what unpersist() drops
        self._collected = collected  # the Python engine's rows (to_dict's document)
        self._spark = spark

    def _frame(self, name: str) -> Any:
        frame = self._frames[name]
        if frame is None:
            # pyarrow: the optional spark extra, imported when Spark is used
            import pyarrow as pa

            assert self._collected is not None
            frame = self._spark.createDataFrame(pa.Table.from_pylist(
                self._collected[name], schema=arrow_schema(_FRAME_SCHEMAS[name])))
            self._frames[name] = frame
        return frame

    @property
    def services(self) -> Any:
        """One row per service (a DataFrame)."""
        return self._frame("services")

    @property
    def segments(self) -> Any:
        """One row per segment file and service (a DataFrame)."""
        return self._frame("segments")

    @property
    def gaps(self) -> Any:
        """One row per gap (a DataFrame)."""
        return self._frame("gaps")

    @property
    def problems(self) -> Any:
        """One row per problem: damage found while reading (a DataFrame)."""
        return self._frame("problems")

    def timeline(self, bin_seconds: float = 1.0) -> Any:
        """Rate over time: see :func:`rate_timeline` (reads the rows again unless
        ``log_stats(cache=True)`` kept them). Not on the stats of a compact read
        (ValueError): it has no event rows."""
        if self.events is None:
            raise ValueError("the statistics of a compact read have no event rows for a "
                             "timeline: read with compact=False")
        return rate_timeline(self.events, bin_seconds)

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain lists of dicts (JSON-ready), sorted (a copy: computed when
        log_stats ran)."""
        assert self._collected is not None
        return {name: [dict(row) for row in rows] if isinstance(rows, list) else rows
                for name, rows in self._collected.items()}

    def unpersist(self) -> None:
        """Drops what was cached."""
        for frame in self.cached:
            frame.unpersist()


# -- log_stats as SQL aggregates (event rows: a lake, or a read of event rows) ---------------
#
# No window and no Python worker: two small aggregations after one scan of the narrow
# columns (logMonoTime, valid, size, file, segment, service; offset and problem for the
# damage), one Spark job of three stages:
#
# 1. groupBy(service, file): a segment file's count, invalid count, byte sum and its
#    events' logMonoTimes as one sorted array (collect_list: the shuffle moves 8 bytes
#    per event, not a row); its intervals, their sorted copy (percentiles), maximum and
#    gaps are array functions of it. Problem rows go to the group with no service.
# 2. groupBy(service): its files in (recording, first event, name) order. Where each
#    file of a recording ends before the next one begins (as a recording's segments
#    do), the recording's intervals are its files' and the one between each file and
#    the next: no event is sorted again but for the percentiles (whose sort meets
#    presorted runs). Where files overlap, the service's events are sorted together by
#    (recording, logMonoTime, file), the tie order of the Python path.
#
# The result is a row per service (and one with no service holding the problems), with
# its segment rows and gaps as arrays, cached: every frame of LogStats is a selection of
# it, and to_dict() collects it (a small job).


def _percentile_sql(sorted_array: str, n: str, p: float) -> str:
    """SQL of the ``p`` percentile of the ``n`` values of a sorted array: the arithmetic
    of :func:`_percentiles` (Spark's ``percentile``), in doubles."""
    position = f"(CAST(({n}) - 1 AS DOUBLE) * {p!r}D)"
    lower = f"CAST(floor({position}) AS INT)"
    higher = f"CAST(ceil({position}) AS INT)"
    low = f"try_element_at({sorted_array}, {lower} + 1)"
    high = f"try_element_at({sorted_array}, {higher} + 1)"
    return (f"CASE WHEN ({n}) <= 0 THEN NULL "
            f"WHEN {higher} = {lower} OR {high} = {low} THEN CAST({low} AS DOUBLE) "
            f"ELSE CAST({low} AS DOUBLE) + ({position} - {lower}) "
            f"* (CAST({high} AS DOUBLE) - CAST({low} AS DOUBLE)) END")


def _sql_partials(df: Any, rates: Mapping[str, float | None], gap_factor: float) -> Any:
    """The cached rows of a SQL log_stats (see above): per service its published
    columns, ``segment_list`` (its segment rows) and ``gap_list``; the row with no
    service holds ``problem_list``."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import functions as sf

    hz_of = {name: float(hz) for name, hz in rates.items() if hz is not None}
    # the gap threshold per service, computed here as the Python path computes it
    thresholds = {name: gap_factor * _NS / hz for name, hz in hz_of.items()}

    def lookup(table: dict[str, float]) -> Any:
        if not table:
            return sf.lit(None).cast("double")
        pairs = [c for name, value in sorted(table.items())
                 for c in (sf.lit(name), sf.lit(value))]
        return sf.create_map(*pairs)[sf.col("service")]

    e = sf.expr
    is_event = sf.col("service").isNotNull() & sf.col("logMonoTime").isNotNull() \
        & sf.col("problem").isNull()
    rows = df.select(
        sf.when(is_event, sf.col("service")).alias("service"), "file",
        sf.when(is_event, sf.col("segment")).alias("segment"),
        sf.when(is_event, sf.col("logMonoTime")).alias("mono"),
        sf.when(is_event, sf.when(sf.coalesce(sf.col("valid"), sf.lit(False)), 0)
                .otherwise(1)).alias("bad"),
        sf.when(is_event, sf.coalesce(sf.col("size"), sf.lit(0)).cast("long")).alias("size"),
        sf.when(~is_event, sf.struct("file", "segment", "offset", "service", "problem"))
        .alias("problem_row"))
    # 1. per segment file and service
    files = rows.groupBy("service", "file").agg(
        sf.count("mono").alias("count"), sf.min("segment").alias("segment"),
        sf.sum("bad").alias("invalid"), sf.sum("size").alias("size_sum"),
        sf.sort_array(sf.collect_list("mono")).alias("monos"),
        sf.collect_list("problem_row").alias("problem_list"))
    files = files.select(
        "*", _recording(sf).alias("recording"), lookup(thresholds).alias("threshold"),
        e("try_element_at(monos, 1)").alias("first_mono_ns"),
        e("try_element_at(monos, -1)").alias("last_mono_ns"),
        e("zip_with(slice(monos, 2, count), slice(monos, 1, greatest(count - 1, 0)), "
          "(b, a) -> b - a)")
        .alias("dts"))
    files = files.select(
        "*", sf.sort_array("dts").alias("sorted_dts"),
        e("filter(zip_with(slice(monos, 1, greatest(count - 1, 0)), slice(monos, 2, count), "
          "(a, b) -> named_struct('start', a, 'end', b)), "
          "g -> CAST(g.end - g.start AS DOUBLE) > threshold)").alias("file_gaps"))
    segment_row = e(
        "named_struct('recording', recording, 'file', file, 'segment', segment, "
        "'count', count, 'first_mono_ns', first_mono_ns, 'last_mono_ns', last_mono_ns, "
        "'invalid', invalid, 'size_sum', size_sum, 'intervals', count - 1, "
        "'dt_sum_ns', CASE WHEN count > 1 THEN last_mono_ns - first_mono_ns END, "
        "'dt_max_ns', array_max(dts), "
        f"'dt_p50_ns', {_percentile_sql('sorted_dts', 'count - 1', 0.5)}, "
        f"'dt_p99_ns', {_percentile_sql('sorted_dts', 'count - 1', 0.99)}, "
        "'gap_count', size(file_gaps))")
    file_item = e("named_struct('recording', recording, 'first', first_mono_ns, "
                  "'file', file, 'last', last_mono_ns, 'segment', segment, "
                  "'sorted_dts', sorted_dts, 'gaps', file_gaps, 'monos', monos)")
    # 2. per service: its files in (recording, time) order
    services = files.groupBy("service").agg(
        sf.sum("count").alias("count"), sf.count(sf.lit(1)).alias("segments"),
        sf.sum("invalid").alias("invalid"), sf.sum("size_sum").alias("size_sum"),
        sf.min("first_mono_ns").alias("first_mono_ns"),
        sf.max("last_mono_ns").alias("last_mono_ns"),
        sf.sort_array(sf.collect_list(file_item)).alias("files"),
        sf.collect_list(segment_row).alias("segment_list"),
        sf.flatten(sf.collect_list("problem_list")).alias("problem_list"))
    # consecutive files of one recording: in time order when each ends before the next
    # begins (at the same time: the next one's name sorts after it)
    pairs = ("zip_with(slice(files, 1, greatest(size(files) - 1, 0)), slice(files, 2, "
             "size(files)), (a, b) -> CASE WHEN a.recording = b.recording THEN "
             "named_struct('overlap', NOT (a.last < b.first OR (a.last = b.first AND "
             "a.file < b.file)), 'recording', b.recording, 'start_mono_ns', a.last, "
             "'end_mono_ns', b.first, 'file', b.file, 'segment', b.segment) END)")
    services = services.select(
        "*", lookup(thresholds).alias("threshold"),
        e(f"filter({pairs}, x -> x IS NOT NULL)").alias("boundaries"))
    services = services.select("*", e("exists(boundaries, x -> x.overlap)").alias("overlap"))
    # files that overlap: their events sorted together by (recording, time, file)
    merged = ("array_sort(flatten(transform(files, f -> transform(f.monos, m -> "
              "named_struct('recording', f.recording, 'mono', m, 'file', f.file, "
              "'segment', f.segment)))))")
    services = services.select("*", e(f"CASE WHEN overlap THEN {merged} END").alias("merged"))
    merged_pairs = (
        "filter(zip_with(slice(merged, 1, greatest(count - 1, 0)), slice(merged, 2, count), "
        "(a, b) -> CASE WHEN a.recording = b.recording THEN named_struct("
        "'recording', b.recording, 'start_mono_ns', a.mono, 'end_mono_ns', b.mono, "
        "'file', b.file, 'segment', b.segment) END), x -> x IS NOT NULL)")
    in_order_dts = ("concat(flatten(transform(files, f -> f.sorted_dts)), "
                    "transform(boundaries, x -> x.end_mono_ns - x.start_mono_ns))")
    in_order_gaps = (
        "concat(flatten(transform(files, f -> transform(f.gaps, g -> named_struct("
        "'recording', f.recording, 'start_mono_ns', g.start, 'end_mono_ns', g.end, "
        "'file', f.file, 'segment', f.segment)))), "
        "transform(filter(boundaries, x -> "
        "CAST(x.end_mono_ns - x.start_mono_ns AS DOUBLE) > threshold), x -> named_struct("
        "'recording', x.recording, 'start_mono_ns', x.start_mono_ns, "
        "'end_mono_ns', x.end_mono_ns, 'file', x.file, 'segment', x.segment)))")
    services = services.select(
        "*",
        e(f"CASE WHEN overlap THEN transform({merged_pairs}, "
          f"x -> x.end_mono_ns - x.start_mono_ns) ELSE {in_order_dts} END").alias("dts"),
        e(f"CASE WHEN overlap THEN filter({merged_pairs}, x -> CAST(x.end_mono_ns - "
          f"x.start_mono_ns AS DOUBLE) > threshold) ELSE {in_order_gaps} END")
        .alias("gap_list"))
    services = services.select(
        "*", sf.size("dts").cast("long").alias("intervals"),
        e("CASE WHEN size(dts) > 0 THEN aggregate(dts, 0L, (s, x) -> s + x) END")
        .alias("dt_sum_ns"),
        sf.array_max("dts").alias("dt_max_ns"), sf.size("gap_list").alias("gap_count"),
        sf.sort_array("dts").alias("sorted_dts"))
    hz = lookup(hz_of)
    services = services.select(
        "*", hz.alias("expected_hz"),
        e(_percentile_sql("sorted_dts", "intervals", 0.5)).alias("dt_p50_ns"),
        e(_percentile_sql("sorted_dts", "intervals", 0.99)).alias("dt_p99_ns"))
    return services.select(
        "service", *_published_sql(sf, sf.col, hz),
        sf.transform("segment_list", lambda s: sf.struct(
            s["recording"].alias("recording"), s["file"].alias("file"),
            s["segment"].alias("segment"), sf.col("service").alias("service"),
            *_published_sql(sf, lambda name: sf.lit(1).cast("long") if name == "segments"
                            else s[name], hz))).alias("segment_list"),
        sf.transform("gap_list", lambda g: sf.struct(
            g["recording"].alias("recording"), g["file"].alias("file"),
            g["segment"].alias("segment"), sf.col("service").alias("service"),
            g["start_mono_ns"].alias("start_mono_ns"),
            g["end_mono_ns"].alias("end_mono_ns"),
            ((g["end_mono_ns"] - g["start_mono_ns"]).cast("double") / 1e6)
            .alias("duration_ms"),
            (sf.round((g["end_mono_ns"] - g["start_mono_ns"]).cast("double") * hz / 1e9) - 1)
            .cast("long").alias("missed"))).alias("gap_list"),
        "problem_list")


def _published_sql(sf: Any, col: Any, hz: Any) -> list[Any]:
    """The published columns (:data:`_PUBLISHED`, in order) of aggregates ``col(name)``:
    :func:`_published`'s expressions in the same double arithmetic."""
    ns = sf.lit(float(_NS))
    measured = sf.when(col("dt_sum_ns") > 0, col("intervals").cast("double") * ns
                       / col("dt_sum_ns").cast("double"))
    return [
        col("count").alias("count"), col("segments").alias("segments"),
        hz.alias("expected_hz"), measured.alias("measured_hz"),
        sf.when(hz != 0, measured / hz).alias("rate_ratio"),
        (col("dt_p50_ns") / 1e6).alias("dt_p50_ms"),
        (col("dt_p99_ns") / 1e6).alias("dt_p99_ms"),
        (col("dt_max_ns").cast("double") / 1e6).alias("dt_max_ms"),
        sf.when(hz.isNotNull(), col("gap_count")).alias("gaps"),
        col("invalid").alias("invalid"),
        (col("invalid").cast("double") / col("count").cast("double")).alias("invalid_fraction"),
        (col("size_sum").cast("double") / col("count").cast("double")).alias("mean_size"),
        col("first_mono_ns").alias("first_mono_ns"), col("last_mono_ns").alias("last_mono_ns"),
        ((col("last_mono_ns") - col("first_mono_ns")).cast("double") / 1e9)
        .alias("duration_s"),
        col("intervals").alias("intervals"),
    ]


class _SqlLogStats(LogStats):
    """The LogStats of :func:`_sql_stats`: ``partials`` holds a row per service (and one
    for the problems) with every frame's rows."""

    def to_dict(self) -> dict[str, Any]:
        """Everything collected as plain lists of dicts (JSON-ready), sorted: one small
        job (the cached aggregates)."""
        services, segments, gaps, problems = [], [], [], []
        for row in self.partials.collect():
            r = row.asDict(recursive=True)
            if r["service"] is None:
                problems += r["problem_list"]
                continue
            services.append({k: r[k] for k in _SERVICE_COLUMNS})
            segments += r["segment_list"]
            gaps += r["gap_list"]
        return _document(self.gap_factor, _frame_table(services, "services"),
                         _frame_table(segments, "segments"), _frame_table(gaps, "gaps"),
                         _frame_table(problems, "problems"))


def _sql_stats(df: Any, rates: Mapping[str, float | None], gap_factor: float,
               cache: bool) -> LogStats:
    """log_stats of a frame of event rows as SQL aggregates (see above)."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark import StorageLevel

    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import functions as sf

    narrow = df.select("file", "segment", "offset", "logMonoTime", "service", "valid", "size",
                       "problem")
    cached = []
    if cache:
        narrow = narrow.persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(narrow)
    partials = _sql_partials(narrow, rates, gap_factor).persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(partials)
    per_service = partials.where(sf.col("service").isNotNull())
    services = per_service.select(*_SERVICE_COLUMNS)
    segments = per_service.select(sf.inline("segment_list")) \
        .select("recording", "file", "segment", "service", *_PUBLISHED_COLUMNS)
    starts = segments.groupBy("recording") \
        .agg(sf.min("first_mono_ns").alias("recording_start"))
    gaps = per_service.select(sf.inline("gap_list")).join(starts, "recording") \
        .select("recording", "file", "segment", "service", "start_mono_ns", "end_mono_ns",
                ((sf.col("start_mono_ns") - sf.col("recording_start")) / 1e9)
                .alias("start_s"), "duration_ms", "missed")
    problems = partials.where(sf.col("service").isNull()).select(sf.inline("problem_list"))
    events = narrow.where(sf.col("service").isNotNull() & sf.col("logMonoTime").isNotNull()) \
        .drop("problem").withColumn("recording", _recording(sf))
    return _SqlLogStats(services, segments, gaps, problems, events, gap_factor, partials,
                        tuple(cached))

def log_stats(
    df: Any,
    rates: Mapping[str, float | None] | None = None,
    gap_factor: float = GAP_FACTOR,
    approx_percentiles: bool = False,
    cache: bool = False,
    engine: str = "python",
) -> LogStats:
    """The analyses of a msgqlog DataFrame (see the module docstring), in one pass over
    its rows.

    ``rates``: service -> expected Hz (None: event-driven); default the registry in
    force's (:func:`expected_rates`).
    ``approx_percentiles``: p50 and p99 from a logarithmic histogram, within
    :data:`APPROX_RELATIVE_ERROR` (0.5 %) of the exact values, in memory bounded per
    (recording, service); exact percentiles (the default) hold every timestamp and
    interval of a service in one Python worker: 16 bytes per event, and a few times 8
    more per event of the recording being sorted (a service of 100 M events in one
    recording: a few GB). What the driver holds is small either way: a row per segment
    file and service, per gap and per problem, never a row per event.
    ``cache``: also keep the narrow event rows (memory and disk) for
    :meth:`LogStats.timeline`; the statistics never read the rows twice.
    :meth:`LogStats.unpersist` drops what was cached.

    ``df`` may also be a compact read (``read_logs(..., compact=True)``: the rows
    already packed per segment file and service by the source, the cheapest input);
    its LogStats has no ``events`` (no :meth:`LogStats.timeline`) and ``cache`` must be
    false.

    ``engine``: ``"python"`` (the default: the stages above, numpy in the executors'
    Python workers) or ``"sql"`` (Spark SQL aggregates and array functions only, no
    Python worker: for executors without msgq and numpy; event rows only, exact
    percentiles only; the same numbers). On the benchmark's lake of 1 M events the SQL
    engine took 3x the Python engine's time on a compact read of it, 1.7x its CPU time
    on event rows (docs/spark.md, "The lake's benchmark").
    """

    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark import StorageLevel

    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import functions as sf

    if not gap_factor > 0:
        raise ValueError(f"gap_factor must be positive, not {gap_factor}")
    if engine not in ("python", "sql"):
        raise ValueError(f"engine is 'python' or 'sql', not {engine!r}")
    rates = dict(expected_rates() if rates is None else rates)
    cached = []
    if isinstance(df, GroupableRead) or tuple(df.columns) == COMPACT_COLUMNS:  # packed
        if cache:
            raise ValueError("cache=True keeps the event rows for timeline(); a compact "
                             "read has none: read with compact=False")
        if engine == "sql":
            raise ValueError("engine='sql' takes event rows, not a compact read (packed "
                             "for the Python engine): read with compact=False")
        narrow, compact = None, df
    elif engine == "sql":
        if approx_percentiles:
            raise ValueError("engine='sql' computes exact percentiles: leave out "
                             "approx_percentiles")
        return _sql_stats(df, rates, float(gap_factor), cache)
    else:
        narrow = df.select("file", "segment", "offset", "logMonoTime", "service", "valid",
                           "size", "problem")
        if cache:
            narrow = narrow.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(narrow)
        compact = narrow.mapInArrow(compact_batches, COMPACT_SCHEMA)
    approx = bool(approx_percentiles)
    params = (rates, float(gap_factor), approx)
    # one job: stage 2 in the executors, its rows (a few per segment file and service,
    # per gap, per problem; exact intervals stay in the workers) to the driver
    keys = ("kind", "recording", "service") if approx else ("kind", "service")
    schema = spark_schema(_PARTIAL_SCHEMA if approx else _EXACT_PARTIAL_SCHEMA)
    if isinstance(compact, GroupableRead):  # a lake's compact table: no shuffle
        stage = compact.group_in_tasks(keys, partial(_partials, params), schema)
    else:
        stage = compact.groupBy(*keys).applyInArrow(partial(_partials, params), schema)
    collected = _finish(stage.toArrow(), gap_factor, approx)
    events = None if narrow is None else \
        narrow.where(sf.col("service").isNotNull() & sf.col("logMonoTime").isNotNull()) \
        .drop("problem").withColumn("recording", _recording(sf))
    return LogStats(None, None, None, None, events, gap_factor, None, tuple(cached),
                    collected=collected, spark=df.sparkSession)


def rate_timeline(events: Any, bin_seconds: float = 1.0) -> Any:
    """Rate of each service over time, in bins of ``bin_seconds`` from the start of its
    recording (its first event): rows (recording, service, bin, start_s, seconds,
    rate_hz), where ``seconds`` is the part of the bin the recording covers (less than
    ``bin_seconds`` for the last bin, which ends with the recording's last event) and
    rate_hz = messages / seconds. Bins without a message of the service are left out; a
    last bin covering less than a quarter of ``bin_seconds`` is left out too (too short
    for a rate). ``events`` is :attr:`LogStats.events` (or any frame with recording,
    service, logMonoTime)."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import Window

    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import functions as sf

    if not (bin_seconds > 0 and math.isfinite(bin_seconds)):
        raise ValueError(f"bin_seconds must be a positive number, not {bin_seconds}")
    bin_ns = int(bin_seconds * _NS)
    recording = Window.partitionBy("recording")
    start = sf.min("logMonoTime").over(recording)
    end = sf.max("logMonoTime").over(recording)
    binned = events.select(
        "recording", "service",
        sf.floor((sf.col("logMonoTime") - start) / bin_ns).cast("long").alias("bin"),
        ((end - start) / 1e9).alias("span_s"),
    )
    counts = binned.groupBy("recording", "service", "bin").agg(
        sf.count(sf.lit(1)).alias("messages"), sf.first("span_s").alias("span_s"))
    start_s = sf.col("bin") * bin_seconds
    seconds = sf.least(sf.lit(float(bin_seconds)), sf.col("span_s") - start_s)
    return counts.select(
        "recording", "service", "bin", start_s.alias("start_s"), seconds.alias("seconds"),
        (sf.col("messages") / seconds).alias("rate_hz"),
    ).where(sf.col("seconds") >= bin_seconds / 4)
