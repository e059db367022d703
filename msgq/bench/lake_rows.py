"""The lake benchmark's rows (:mod:`msgq.bench.lake`): their names, labels and targets, and
how each is shown from the benchmark's JSON result. Apart from the benchmark, which needs
Spark, so that :mod:`msgq.bench.figures` renders and checks the lake's block without it.

Layer: programs (a benchmark's table); imports nothing of msgq.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ROWS", "headline", "measured"]

#: The table's rows by name (what :mod:`msgq.bench.figures` cites): label and target.
ROWS: dict[str, tuple[str, str]] = {
    "window/bytes": ("rare service over a 5 % window: bytes read, lake / raw", "<= 2 %"),
    "window/time": ("  time: lake / raw with pushdown", ">= 5x"),
    "window/beyond-job": ("  time beyond a Spark job's own fixed cost: lake / raw", ">= 5x"),
    "job": ("  a Spark job's own fixed cost (apart)", ""),
    "window/parquet-floor": ("  Spark's floor for any Parquet query (apart: a tiny file, "
                             "one column)", ""),
    "window/beyond-floor": ("  time beyond that floor: lake / raw", ">= 5x"),
    "log_stats": ("full log_stats: lake / raw", ">= 3x"),
    "log_stats/sql": ("  the same, SQL engine (engine='sql') / raw", ""),
    "log_stats/floor": ("  one aggregate over the lake's narrow columns (apart)", ""),
    "build": ("building the lake / one raw log_stats pass", "<= 1.5"),
    "build/floor-cpu": ("  the floor (no Spark): read / decode / write, CPU-s per 1 M", ""),
    "build/floor-wall": ("  the floor's wall / raw pass", ""),
    "build/over-floor": ("  build / the floor's wall", ""),
    "size": ("lake size / zstd logs", "<= 1.2"),
}


def _faster(lake_s: float, raw_s: float) -> str:
    if lake_s <= 0:
        return f"{max(lake_s, 0.0):.2f} / {raw_s:.2f} s: the lake's within the job's cost"
    return f"{lake_s:.2f} / {raw_s:.2f} s = {raw_s / lake_s:.1f}x faster"


def measured(r: dict[str, Any]) -> dict[str, str]:
    """Each row of :data:`ROWS` as the table shows it, from :func:`run`'s result."""
    mb = 1 << 20
    return {
        "window/bytes": f"{r['lake_read_bytes'] / mb:.2f} / {r['raw_read_bytes'] / mb:.1f} MiB"
                        f" = {100 * r['lake_read_bytes'] / r['raw_read_bytes']:.2f} %",
        "window/time": _faster(r["lake_query_s"], r["raw_query_s"]),
        "window/beyond-job": _faster(r["lake_query_s"] - r["job_s"],
                                     r["raw_query_s"] - r["job_s"]),
        "job": f"{r['job_s']:.2f} s",
        "log_stats": _faster(r["lake_stats_s"], r["raw_stats_best_s"]),
        "log_stats/sql": _faster(r["lake_stats_sql_s"], r["raw_stats_best_s"]),
        "log_stats/floor": f"{r['lake_floor_s']:.2f} s",
        "build": f"{r['build_s']:.1f} / {r['raw_stats_s']:.1f} s = "
                 f"{r['build_s'] / r['raw_stats_s']:.2f}",
        "size": f"{r['lake_bytes'] / mb:.1f} / {r['zstd_bytes'] / mb:.1f} MiB = "
                f"{r['lake_bytes'] / r['zstd_bytes']:.2f}",
        **_floors(r),
    }


def _floors(r: dict[str, Any]) -> dict[str, str]:
    """The floor rows; "not measured" for a result from before they came."""
    out = dict.fromkeys(("window/parquet-floor", "window/beyond-floor", "build/floor-cpu",
                         "build/floor-wall", "build/over-floor"), "not measured")
    if "parquet_floor_s" in r:
        out["window/parquet-floor"] = f"{r['parquet_floor_s']:.2f} s"
        out["window/beyond-floor"] = _faster(r["lake_query_s"] - r["parquet_floor_s"],
                                             r["raw_query_s"] - r["parquet_floor_s"])
    floor = r.get("build_floor")
    if floor:
        out["build/floor-cpu"] = (f"{floor['read_cpu_per_m']:.2f} / "
                                  f"{floor['decode_cpu_per_m']:.2f} / "
                                  f"{floor['write_cpu_per_m']:.2f}")
        out["build/floor-wall"] = (f"{floor['floor_wall_s']:.1f} / {r['raw_stats_s']:.1f} s "
                                   f"= {floor['floor_wall_s'] / r['raw_stats_s']:.2f} "
                                   f"({floor['cores']} cores)")
        out["build/over-floor"] = (f"{r['build_s']:.1f} / {floor['floor_wall_s']:.1f} s = "
                                   f"{r['build_s'] / floor['floor_wall_s']:.2f}")
    return out


def headline(r: dict[str, Any]) -> str:
    """The line above the table: the recording, the master, the load."""
    repeats = "" if "query_repeat" not in r else \
        f"best of {r['query_repeat']} (query) and {r['repeat']} (log_stats); "
    return (f"{r['events']:,} events in {r['segments']} segments, {r['master']}; "
            f"window: {r['window_events']} events; log_stats equal: {r['stats_equal']}; "
            f"raw bytes from {r['raw_read_from']}; {repeats}load "
            f"{r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after")
