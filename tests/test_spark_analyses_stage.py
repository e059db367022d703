"""``log_stats``'s grouped stage (``msgq.spark.analyses._partials``) on compact rows made
by hand, against the definitions computed event by event in plain Python: the corners
its vectorised per-file work must keep (a file's events split over several rows and the
rows out of order, events out of time order in a file, files that overlap in time, ties
within and across files, one-event files, timestamps so far apart that one sort key per
file cannot hold them, a column that is a slice or in chunks). No Spark: the stage is a
function of an Arrow table."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
np = pytest.importorskip("numpy")

from msgq.spark.analyses import (  # noqa: E402
    _approx_percentiles,
    _histogram,
    _partials,
)
from msgq.spark.compact import COMPACT_SCHEMA, arrow_schema  # noqa: E402

NS = 1_000_000_000
SERVICE = "can"


def _spark_percentile(ordered: list[float], p: float) -> float:
    """Spark's ``percentile``: linear interpolation between the two nearest ranks."""
    position = (len(ordered) - 1) * p
    lower, higher = math.floor(position), math.ceil(position)
    low, high = ordered[lower], ordered[higher]
    if lower == higher or high == low:
        return float(low)
    return float(low) + (position - lower) * (float(high) - float(low))


def _files(rng: random.Random, regime: str) -> dict[str, list[int]]:
    """A recording's segment files and their events' logMonoTimes (in the order logged)."""
    files: dict[str, list[int]] = {}
    at = rng.randrange(10**12)
    for n in range(rng.randint(1, 6)):
        count = rng.choice([1, 1, 2, 3, rng.randint(4, 60)])
        if regime == "far":  # spans that no (file, time) key of int64 can hold
            times = [rng.randrange(-(1 << 61), 1 << 61) for _ in range(count)]
        elif regime == "overlapping":
            times = [rng.randrange(10**9) for _ in range(count)]
        else:
            times = []
            for _ in range(count):
                at += rng.choice([0, 10_000_000, 10_000_000, 9_000_000, 11_000_000, 80_000_000])
                times.append(at)
            if regime == "unsorted":
                rng.shuffle(times)
        files[f"rec/segment-{n:05d}.log.zst"] = times
    return files


def _rows(rng: random.Random, files: dict[str, list[int]]) -> Any:
    """Compact rows of the files: each file's events in one to three rows, the rows
    shuffled, some invalid events and sizes; the table sliced or chunked at random."""
    rows = []
    for segment, (name, times) in enumerate(files.items()):
        cuts = sorted(rng.sample(range(1, len(times)), k=min(len(times) - 1,
                                                            rng.randint(0, 2))))
        for part in np.split(np.array(times, dtype="<i8"), cuts):
            rows.append({"kind": "events", "recording": "rec", "file": name,
                         "segment": segment, "service": SERVICE, "offset": None,
                         "problem": None, "count": len(part),
                         "invalid": rng.randint(0, len(part)),
                         "size_sum": rng.randint(0, 1000 * len(part)),
                         "monos": part.tobytes()})
    rng.shuffle(rows)
    schema = arrow_schema(COMPACT_SCHEMA)
    if rng.random() < 0.3:  # a slice: the binary column's offsets do not start at 0
        head = dict(rows[0], file="rec/other")
        return pa.Table.from_pylist([head, *rows], schema=schema).slice(1)
    if rng.random() < 0.3 and len(rows) > 1:  # in chunks
        return pa.concat_tables([pa.Table.from_pylist(rows[:1], schema=schema),
                                 pa.Table.from_pylist(rows[1:], schema=schema)])
    return pa.Table.from_pylist(rows, schema=schema)


def _expected(files: dict[str, list[int]], table: Any, hz: float | None,
              gap_factor: float, approx: bool) -> dict[str, Any]:
    """The stage's numbers by their definitions, event by event."""
    threshold = None if hz is None else gap_factor * NS / hz

    def interval_stats(dts: list[int]) -> dict[str, Any]:
        ordered = sorted(dts)
        if approx and dts:
            p50, p99 = _approx_percentiles(*_histogram(np.array(dts, dtype=np.int64)))
        elif dts:
            p50, p99 = _spark_percentile(ordered, 0.5), _spark_percentile(ordered, 0.99)
        else:
            p50 = p99 = None
        return {"intervals": len(dts), "dt_sum_ns": sum(dts) if dts else None,
                "dt_max_ns": max(dts) if dts else None,
                "dt_p50_ms": None if p50 is None else p50 / 1e6,
                "dt_p99_ms": None if p99 is None else p99 / 1e6,
                "gap_count": 0 if threshold is None else sum(1 for d in dts if d > threshold)}

    rows = table.to_pylist()
    segments = {}
    for name, times in files.items():
        mine = sorted(times)
        segments[name] = {
            "count": len(mine), "first_mono_ns": mine[0], "last_mono_ns": mine[-1],
            "invalid": sum(r["invalid"] for r in rows if r["file"] == name),
            "size_sum": sum(r["size_sum"] for r in rows if r["file"] == name),
            **interval_stats([b - a for a, b in itertools.pairwise(mine)])}
    rank = {name: i for i, name in enumerate(sorted(files))}
    # the recording: time order, ties by the file's name (the event that ends a gap)
    events = sorted((t, rank[name], name) for name, times in files.items() for t in times)
    dts = [b[0] - a[0] for a, b in itertools.pairwise(events)]
    gaps = [] if threshold is None else \
        [(a[0], b[0], b[2]) for a, b in itertools.pairwise(events)
         if b[0] - a[0] > threshold]
    recording = {"count": len(events), "first_mono_ns": events[0][0],
                 "last_mono_ns": events[-1][0], **interval_stats(dts)}
    return {"segments": segments, "gaps": sorted(gaps), "recording": recording}


@pytest.mark.parametrize("approx", [False, True])
@pytest.mark.parametrize("regime", ["sorted", "unsorted", "overlapping", "far"])
def test_the_stage_gives_the_definitions_numbers(regime: str, approx: bool) -> None:
    rng = random.Random(f"{regime}-{approx}")
    keys = ("count", "first_mono_ns", "last_mono_ns", "intervals", "dt_sum_ns",
            "dt_max_ns", "dt_p50_ms", "dt_p99_ms")
    for case in range(60):
        files = _files(rng, regime)
        table = _rows(rng, files)
        hz = rng.choice([None, 100.0, 20.0])
        gap_factor = rng.choice([1.5, 2.5])
        want = _expected(files, table, hz, gap_factor, approx)
        got = _partials(({SERVICE: hz}, gap_factor, approx), table).to_pylist()
        where = f"case {case}: {files}"

        segments = {r["file"]: r for r in got if r["kind"] == "segment"}
        assert segments.keys() == want["segments"].keys(), where
        for name, row in segments.items():
            expected = want["segments"][name]
            assert {k: row[k] for k in (*keys, "invalid", "size_sum", "gap_count")} == \
                {k: expected[k] for k in (*keys, "invalid", "size_sum", "gap_count")}, \
                f"{where}: {name}"
            assert row["gaps"] == (None if hz is None else expected["gap_count"]), where

        assert sorted((r["start_mono_ns"], r["end_mono_ns"], r["file"])
                      for r in got if r["kind"] == "gap") == want["gaps"], where
        [partial] = [r for r in got if r["kind"] == "partial"]
        assert {k: partial[k] for k in (*keys, "gap_count")} == \
            {k: want["recording"][k] for k in (*keys, "gap_count")}, where
        services = [r for r in got if r["kind"] == "service"]
        if approx:
            assert services == [], where
        else:
            assert {k: services[0][k] for k in ("count", "dt_p50_ms", "dt_p99_ms")} == \
                {k: want["recording"][k] for k in ("count", "dt_p50_ms", "dt_p99_ms")}, where
