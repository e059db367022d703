"""The core benchmark's table: one row per (test, payload, subscribers or CPUs,
backend), ratios to the reference backend, and numbered footnotes.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from msgq.bench import _bound as bound
from msgq.bench.peers import (
    BACKENDS,
    KIB,
    MIB,
    PACE_SLEEP_S,
    PACE_YIELDS,
    REFERENCE,
    RTT_WARMUP,
    WARM_FRACTION,
    WARM_MAX_S,
    WARM_MIN_S,
    WARM_RING_FROM,
)
from msgq.bench.runner import Measurement

# --------------------------------------------------------------------------- table


def fmt_size(size: int) -> str:
    if size >= MIB and size % MIB == 0:
        return f"{size // MIB} MiB"
    if size >= KIB and size % KIB == 0:
        return f"{size // KIB} KiB"
    return f"{size} B"


def _fmt_num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return ""
    return f"{value:,.{digits}f}"


class Notes:
    """Numbered footnotes, one number per distinct text."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"


TEST_LABEL = {"throughput": "throughput", "recv_into": "recv_into", "view": "view",
              "rtt": "round trip", "rtt_async": "async trip"}


def render_table(
    cells: dict[tuple[str, int, int], dict[str, Measurement]],
    backends: Sequence[str],
    skipped: dict[str, str],
    geometry_note: str,
    memcpy_mb_s: dict[int, float] | None = None,
    bound_mb_s: dict[int, float] | None = None,
    view_bound_mb_s: dict[int, float] | None = None,
    fanout_bound_mb_s: dict[tuple[int, int], float] | None = None,
    pinned: bool = False,
) -> str:
    """The one table: a row per (test, payload, subs/CPUs, backend), then footnotes.

    ``memcpy_mb_s`` (payload size -> MB/s of one warm ``memcpy`` of that size on this
    machine) adds the ``× memcpy`` column to the throughput rows of those sizes;
    ``bound_mb_s`` (payload size -> MB/s of the copy model, :mod:`msgq.bench._bound`)
    the ``× bound`` column of the copying rows, ``view_bound_mb_s`` (of the one-copy
    model) that of the view rows, ``fanout_bound_mb_s`` ((payload size, subscribers) ->
    MB/s of the fan-out model) that of the copying rows of several subscribers.
    ``pinned``: the throughput runs' processes were pinned (``MSGQ_BENCH_PIN=1``); a
    footnote says so.
    """
    memcpy_mb_s = memcpy_mb_s or {}
    bound_mb_s = bound_mb_s or {}
    view_bound_mb_s = view_bound_mb_s or {}
    fanout_bound_mb_s = fanout_bound_mb_s or {}
    notes = Notes()
    header = [
        "test",
        "payload",
        "subs/cpus",
        "backend",
        "msgs/s",
        "MB/s",
        "p50 µs",
        "p99 µs",
        "drops",
        "× pyzmq",
        "× memcpy",
        "× bound",
    ]
    rows: list[list[str] | None] = []
    last_kind = None
    for (kind, size, n), by_backend in cells.items():
        if last_kind is not None:
            rows.append(None)  # separator
        last_kind = kind
        ref = by_backend.get(REFERENCE)
        for name in backends:
            m = by_backend.get(name)
            if m is None:
                continue
            rtt = kind.startswith("rtt")
            n_label = f"{n} cpu" if rtt else f"{n} sub{'s' if n > 1 else ''}"
            row = [TEST_LABEL[kind], fmt_size(size), n_label, name, *[""] * 8]
            if m.error is not None and m.msgs_per_s is None and m.p50_us is None:
                reason = m.error.splitlines()[0] if m.error else "failed"
                label = "n/a" if m.detail.get("not_applicable") else "error"
                row[4] = f"{label} {notes.ref(f'{name}: {reason}')}"
                rows.append(row)
                continue
            if rtt:
                row[6] = _fmt_num(m.p50_us, 1)
                row[7] = _fmt_num(m.p99_us, 1)
                row[8] = "-"
                if ref is not None and ref.p50_us and m.p50_us:
                    row[9] = f"{ref.p50_us / m.p50_us:.2f}"
            else:
                row[4] = _fmt_num(m.msgs_per_s)
                row[5] = _fmt_num(m.mb_per_s, 1)
                row[8] = str(m.drops)
                if m.bad:
                    bad = f"{name}: {m.bad} torn, wrong-size or repeated messages"
                    row[8] += f" {notes.ref(bad)}"
                if ref is not None and ref.msgs_per_s and m.msgs_per_s is not None:
                    row[9] = f"{m.msgs_per_s / ref.msgs_per_s:.2f}"
                if memcpy_mb_s.get(size) and m.mb_per_s is not None:
                    row[10] = f"{m.mb_per_s / memcpy_mb_s[size]:.2f}"
                if n == 1:
                    limit = (view_bound_mb_s if kind == "view" else bound_mb_s).get(size)
                else:  # copying rows only: a view row's N readers copy nothing out
                    limit = None if kind == "view" else fanout_bound_mb_s.get((size, n))
                if limit and m.mb_per_s is not None:
                    row[11] = f"{m.mb_per_s / limit:.2f}"
            for key, what in (
                ("resets", "reader resets (overtaken by the writer)"),
                ("lost", "messages its subscribers report lost"),
            ):
                if m.detail.get(key):
                    row[3] += " " + notes.ref(f"{name}: {m.detail[key]} {what}")
            if "failed_runs" in m.detail:
                row[3] += " " + notes.ref(
                    f"{name}: {m.detail['failed_runs']} run(s) failed: {m.detail['first_error']}"
                )
            rows.append(row)
    widths = [len(h) for h in header]
    for row in rows:
        if row is not None:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    right = {4, 5, 6, 7, 8, 9, 10, 11}

    def line(cols: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cols, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    out = [line(header), rule]
    for row in rows:
        out.append("" if row is None else line(row))
    paragraphs = [
        "msgs/s, MB/s: received per subscriber per second (mean over the subscribers; "
        "MB = 10^6 payload bytes), median of the repeats.",
        "drops: sequence gaps seen by the subscribers, summed over subscribers and repeats "
        "(must be 0).",
        "p50/p99 µs: round trip (A publishes ping, B receives it and publishes it back as "
        "pong); 1 cpu: A and B pinned to the same CPU, 2 cpu: one CPU each.",
        "× pyzmq: msgs/s ÷ pyzmq's msgs/s; round trips: pyzmq's p50 ÷ this p50. Same row, "
        "same run; > 1 means faster than pyzmq.",
        "Pacing (every backend alike): each subscriber stores its count of messages in a "
        "shared array; the publisher stays at most W messages ahead of the slowest one "
        f"(sched_yield() {PACE_YIELDS} times, then {PACE_SLEEP_S * 1e6:.0f} µs sleeps while "
        "it waits). " + geometry_note,
        f"Untimed warm-up first: throughput runs {WARM_FRACTION:.0%} of the run (at least "
        f"{WARM_MIN_S} s), round trips {RTT_WARMUP} round trips; for payloads from "
        f"{fmt_size(WARM_RING_FROM)} also at least one msgq segment's worth of payload (a "
        f"fresh ring's pages fault in on first use; throughput: at most {WARM_MAX_S:g} s).",
    ]
    paragraphs.append(
        "Placement: throughput, recv_into and view runs pinned (MSGQ_BENCH_PIN=1), every "
        "backend alike: the publisher on the first CPU, the subscribers alternating from "
        "the second." if pinned else
        "Placement: throughput, recv_into and view runs unpinned (the OS places the "
        "processes; MSGQ_BENCH_PIN=1 pins them, every backend alike).")
    if memcpy_mb_s:
        paragraphs.append(
            "× memcpy: MB/s ÷ the bandwidth of one memcpy of the payload between two warm "
            "buffers on one CPU of this machine, measured in this run (best of 5): "
            + "; ".join(f"{fmt_size(k)}: {v:,.0f} MB/s" for k, v in sorted(memcpy_mb_s.items()))
            + ". A copying row moves each payload twice (publisher in, subscriber out, on "
            "two CPUs at once): the bound below, not this line, is what such a pair can "
            "reach.")
    if bound_mb_s:
        paragraphs.append(
            "× bound: MB/s ÷ the cache bound of this machine, measured in this run (best "
            "of 5): a model publisher and subscriber in C on two CPUs, each copying every "
            "message once (the subscriber into a freshly allocated buffer, as receive() "
            f"does), over {bound.SLOTS} warm slots with a window of {bound.WINDOW} and no "
            "protocol: "
            + "; ".join(f"{fmt_size(k)}: {v:,.0f} MB/s" for k, v in sorted(bound_mb_s.items()))
            + ". No transport that makes those two copies can exceed 1.0. Shown for one "
            "subscriber, the model's case.")
    if fanout_bound_mb_s:
        paragraphs.append(
            "× bound of copying rows with N subscribers: MB/s ÷ the fan-out bound, measured "
            "in this run (best of 5): the same model with N subscriber threads, each copying "
            "every message out, so N + 1 copies of each message on the same two CPUs (the "
            "publisher on one, the subscribers alternating from the other; waits yield the "
            "CPU, as a waiting process must): "
            + "; ".join(f"{fmt_size(k)} × {n}: {v:,.0f} MB/s"
                        for (k, n), v in sorted(fanout_bound_mb_s.items()))
            + ". No transport that makes those copies on these CPUs can exceed 1.0.")
    if view_bound_mb_s:
        paragraphs.append(
            "× bound of view rows: MB/s ÷ the one-copy bound, measured in this run (best of "
            f"5): the same model with {bound.VIEW_SLOTS} warm slots and a window of "
            f"{bound.VIEW_WINDOW}, the publisher copying "
            "each message into the slot it did not just publish (a reader may still hold "
            "that one), the subscriber reading each message's first and last bytes in "
            "place, as the view rows do: "
            + "; ".join(f"{fmt_size(k)}: {v:,.0f} MB/s"
                        for k, v in sorted(view_bound_mb_s.items()))
            + ". A transport whose publisher copies each message once exceeds 1.0 only "
            "when its readers release each message before the next send, so that the "
            "publisher may write into the buffer it has just published.")
    paragraphs += [
        f"{name}: waits: {BACKENDS[name].wait_note}; I/O: {BACKENDS[name].io_note}"
        + (f"; asyncio: {BACKENDS[name].async_note}." if BACKENDS[name].async_note else ".")
        for name in backends
    ]
    paragraphs += [f"skipped {name}: {why}" for name, why in skipped.items()]
    paragraphs += [f"[{i}] {text}" for i, text in enumerate(notes.texts, 1)]
    out.append("")
    out += [textwrap.fill(p, width=100, subsequent_indent="    ") for p in paragraphs]
    return "\n".join(out)
