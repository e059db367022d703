"""Rate over time per service as a PNG (matplotlib, Agg backend: no display needed).

One small panel per service: the measured rate per time bin (a bin without a message is
drawn at 0, so a gap shows as a drop), the registry's expected rate dashed, and the gaps
the analyses found shaded. Several recordings share a panel, one line each. Works on
collected rows (:meth:`msgq.spark.analyses.LogStats.timeline` ``.collect()``), so it needs
no Spark.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["default_size", "plot_rates"]

_DPI = 100


def _columns(count: int) -> int:
    return 1 if count <= 4 else 2


def default_size(services: int) -> tuple[int, int]:
    """Pixel size (width, height) of the plot of ``services`` panels."""
    rows = math.ceil(max(services, 1) / _columns(services))
    return 1200, 130 + 170 * rows


def _field(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, Mapping) else getattr(row, name)


def plot_rates(
    timeline: Iterable[Any],
    path: str,
    expected: Mapping[str, float | None] | None = None,
    gaps: Iterable[Any] = (),
    bin_seconds: float = 1.0,
    title: str = "msgq log: message rate per service",
    size: tuple[int, int] | None = None,
) -> tuple[int, int]:
    """Writes the PNG to ``path`` and returns its (width, height) in pixels.

    ``timeline``: rows with recording, service, bin, start_s, seconds, rate_hz (dicts or
    Spark Rows; :func:`msgq.spark.analyses.rate_timeline`);
    ``expected``: service -> Hz; ``gaps``: rows with recording, service, start_s,
    duration_ms (from the analyses).
    """
    # matplotlib: the optional spark extra, only for plots
    import matplotlib

    matplotlib.use("Agg", force=False)
    # matplotlib: the optional spark extra, only for plots
    from matplotlib.figure import Figure

    series: dict[str, dict[str, dict[int, float]]] = {}
    ends: dict[str, tuple[int, float]] = {}  # recording -> (last bin, where it ends)
    for row in timeline:
        recording, index = _field(row, "recording"), int(_field(row, "bin"))
        by_recording = series.setdefault(_field(row, "service"), {})
        by_recording.setdefault(recording, {})[index] = float(_field(row, "rate_hz"))
        end = float(_field(row, "start_s")) + float(_field(row, "seconds"))
        ends[recording] = max(ends.get(recording, (index, end)), (index, end))
    gap_spans: dict[str, list[tuple[float, float]]] = {}
    for gap in gaps:
        start = float(_field(gap, "start_s"))
        gap_spans.setdefault(_field(gap, "service"), []).append(
            (start, start + float(_field(gap, "duration_ms")) / 1000))
    expected = expected or {}
    services = sorted(series)
    width, height = size or default_size(len(services))

    fig = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI, layout="constrained")
    fig.suptitle(title)
    if not services:
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "no events", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        fig.savefig(path, dpi=_DPI)
        return width, height
    cols = _columns(len(services))
    rows = math.ceil(len(services) / cols)
    axes = fig.subplots(rows, cols, sharex=True, squeeze=False)
    recordings = sorted({r for by in series.values() for r in by})
    for index, service in enumerate(services):
        ax = axes[index // cols][index % cols]
        peak = 0.0
        for recording in recordings:
            bins = series[service].get(recording)
            if not bins:
                continue
            # every bin of the recording, 0 where the service sent nothing
            last, end = ends[recording]
            xs = [b * bin_seconds for b in range(last + 1)] + [end]
            ys = [bins.get(b, 0.0) for b in range(last + 1)]
            ys.append(ys[-1])
            peak = max(peak, *ys)
            label = recording.rsplit("/", 1)[-1] if len(recordings) > 1 else None
            ax.step(xs, ys, where="post", linewidth=1.2, label=label)
        hz = expected.get(service)
        if hz:
            ax.axhline(hz, color="0.35", linestyle="--", linewidth=1,
                       label=f"expected {hz:g} Hz")
            peak = max(peak, hz)
        for start, end in gap_spans.get(service, []):
            ax.axvspan(start, end, color="tab:red", alpha=0.25, linewidth=0)
        ax.set_ylim(0, peak * 1.25 if peak > 0 else 1)
        suffix = f" (expected {hz:g} Hz)" if hz else " (event-driven)"
        ax.set_title(service + suffix, fontsize=9, loc="left")
        ax.set_ylabel("Hz", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
        if len(recordings) > 1:
            ax.legend(fontsize=7, loc="lower right")
    for index in range(len(services), rows * cols):
        axes[index // cols][index % cols].set_axis_off()
        axes[index // cols - 1][index % cols].tick_params(labelbottom=True)
    for ax in axes[-1]:
        ax.set_xlabel(f"time since the recording started (s), bins of {bin_seconds:g} s",
                      fontsize=8)
    fig.savefig(path, dpi=_DPI)
    return width, height
