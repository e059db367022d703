"""The parent side of the core benchmark: starts the worker processes of one
measurement, collects what they report, and keeps the median of repeated runs.
"""

from __future__ import annotations

import os
import queue
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from typing import Any

from msgq.bench.peers import JOB_SLACK_S, Geometry
from msgq.bench.workers import (
    STOP,
    Board,
    Job,
    ping_main,
    pong_main,
    publisher_main,
    subscriber_main,
)

# --------------------------------------------------------------------------- parent side


@dataclass
class Measurement:
    """The outcome of one run of one (test, payload, subs/cpus, backend) cell."""

    kind: str
    backend: str
    size: int
    n: int  # subscribers (throughput, recv_into) or CPUs (rtt)
    msgs_per_s: float | None = None
    mb_per_s: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    drops: int = 0
    bad: int = 0
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


#: Set to 1 to pin the processes of every throughput run (every backend alike, see
#: :func:`throughput_cpus`); unset or 0, the OS places them.
PIN_ENV = "MSGQ_BENCH_PIN"


def throughput_cpus(subs: int, cpus: list[int]) -> list[int]:
    """The CPU of each process of a pinned throughput run, subscribers first and the
    publisher last (the order :meth:`Runner.throughput` starts them in): the publisher on
    the first CPU, subscriber 0 on the second and the next ones alternating from there,
    the placement of the fan-out bound's model (``msgq.bench._bound``). Without two CPUs
    every process goes on the one there is."""
    if not cpus:
        raise ValueError("no CPU to pin to")
    if len(cpus) < 2:
        return [cpus[0]] * (subs + 1)
    return [cpus[(i + 1) % 2] for i in range(subs)] + [cpus[0]]


def pin_process(pid: int, cpu: int) -> None:
    """Pins every thread process ``pid`` has now to ``cpu`` (threads it starts later
    inherit the main thread's mask). A thread that ended meanwhile is skipped."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, {cpu})
        except ProcessLookupError:
            pass


class Runner:
    """Starts the processes of each measurement and turns their reports into results.

    ``pin`` (default: ``$MSGQ_BENCH_PIN`` set to 1) pins each process of a throughput
    run to a CPU of its own as :func:`throughput_cpus` says, the same for every backend;
    otherwise the OS places them (on two CPUs it sometimes puts a publisher and its
    subscriber on one for a whole run, docs/benchmarks.md)."""

    def __init__(
        self, ctx: BaseContext, run_dir: str, prefix: str, duration: float,
        pin: bool | None = None,
    ) -> None:
        self.ctx = ctx
        self.run_dir = run_dir
        self.prefix = prefix
        self.duration = duration
        self.counter = 0
        if pin is None:
            value = os.environ.get(PIN_ENV, "")
            if value not in ("", "0", "1"):
                raise ValueError(f"${PIN_ENV} must be 0 or 1, not {value!r}")
            pin = value == "1"
        self.allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.pin = pin and bool(self.allowed)

    def _job(self, kind: str, backend: str, geo: Geometry, cpus: tuple[int, ...] = ()) -> Job:
        self.counter += 1
        topic = f"b{self.counter}"
        return Job(kind, backend, geo, self.duration, topic, self.run_dir, self.prefix, cpus)

    def _run(
        self,
        job: Job,
        targets: list[tuple[Callable[..., None], tuple[Any, ...]]],
        board: Board,
        results: Any,
        cpus: list[int] | None = None,
    ) -> list[dict[str, Any]]:
        procs = [
            self.ctx.Process(target=target, args=(job, board, *extra, results), daemon=True)
            for target, extra in targets
        ]
        for i, proc in enumerate(procs):
            proc.start()
            if cpus and proc.pid is not None:
                # before the run's hellos, so the timed part never runs unpinned
                pin_process(proc.pid, cpus[i])
        reports: list[dict[str, Any]] = []
        deadline = time.monotonic() + job.duration + JOB_SLACK_S
        while len(reports) < len(procs):
            try:
                report = results.get(timeout=0.2)
            except queue.Empty:
                pass
            else:
                reports.append(report)
                if "error" in report:
                    board.cells[STOP] = 1  # the others give up instead of waiting
                continue
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() >= deadline:
                why = f"a process died (exit code {dead[0].exitcode})" if dead else "timed out"
                board.cells[STOP] = 1
                reports.append({"role": "parent", "error": why})
                break
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        results.close()
        return reports

    def throughput(self, kind: str, backend: str, size: int, subs: int) -> Measurement:
        """One paced throughput (or recv_into) measurement."""
        job = self._job(kind, backend, Geometry.for_payload(size, subs))
        board = Board(self.ctx, subs + 1)
        results = self.ctx.Queue()
        targets: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            (subscriber_main, (i,)) for i in range(subs)
        ]
        targets.append((publisher_main, ()))
        cpus = throughput_cpus(subs, self.allowed) if self.pin else None
        reports = self._run(job, targets, board, results, cpus)
        m = Measurement(kind, backend, size, subs)
        errors = [r for r in reports if "error" in r]
        if errors:
            return _failed(m, errors)
        sub_reports = [r for r in reports if r["role"] == "sub"]
        pub = next(r for r in reports if r["role"] == "pub")
        m.drops = sum(r["drops"] for r in sub_reports)
        m.bad = sum(r["bad"] for r in sub_reports)
        rates = [r["received"] / (r["elapsed_ns"] / 1e9) for r in sub_reports if r["elapsed_ns"]]
        m.msgs_per_s = statistics.fmean(rates) if rates else 0.0
        m.mb_per_s = m.msgs_per_s * size / 1e6
        m.detail = {
            "sent": pub["sent"],
            "timed": pub["timed"],
            "publisher_msgs_per_s": pub["timed"] / (pub["elapsed_ns"] / 1e9),
            "received": [r["received"] for r in sub_reports],
            "window": job.geo.window,
            "hellos": pub["hellos"],
            "max_gap_ms": max(r["max_gap_ns"] for r in sub_reports) / 1e6,
        }
        if cpus:
            m.detail["cpus"] = cpus  # subscribers', then the publisher's
        for key in ("resets", "lost"):
            values = [r[key] for r in sub_reports if key in r]
            if values:
                m.detail[key] = sum(values)
        return m

    def round_trip(self, backend: str, size: int, cpus: tuple[int, int],
                   kind: str = "rtt") -> Measurement:
        """One ping-pong measurement with A on ``cpus[0]`` and B on ``cpus[1]``
        (``kind`` "rtt_async": both sides asyncio tasks)."""
        job = self._job(kind, backend, Geometry.for_payload(size, 1), cpus)
        board = Board(self.ctx, 2)
        results = self.ctx.Queue()
        reports = self._run(job, [(ping_main, ()), (pong_main, ())], board, results)
        m = Measurement(kind, backend, size, len(set(cpus)))
        errors = [r for r in reports if "error" in r]
        if errors:
            return _failed(m, errors)
        ping = next(r for r in reports if r["role"] == "ping")
        m.p50_us = ping["p50_ns"] / 1000
        m.p99_us = ping["p99_ns"] / 1000
        m.detail = {"samples": ping["samples"], "min_us": ping["min_ns"] / 1000, "cpus": cpus}
        return m


def _failed(m: Measurement, errors: list[dict[str, Any]]) -> Measurement:
    """``m`` marked with the first error reported (an n/a setup failure wins)."""
    first = next((e for e in errors if e.get("not_applicable")), errors[0])
    m.error = first["error"]
    m.detail["not_applicable"] = bool(first.get("not_applicable"))
    m.detail["trace"] = first.get("trace", "")
    return m


def median_of(runs: list[Measurement]) -> Measurement:
    """The run that stands for a cell: the median run (by msgs/s or p50), drops summed."""
    good = [r for r in runs if r.error is None]
    if not good:
        return runs[0]
    if good[0].kind.startswith("rtt"):
        out = Measurement(good[0].kind, good[0].backend, good[0].size, good[0].n)
        out.p50_us = statistics.median(r.p50_us or 0.0 for r in good)
        out.p99_us = statistics.median(r.p99_us or 0.0 for r in good)
        out.detail = {"samples": sum(r.detail.get("samples", 0) for r in good)}
    else:
        ordered = sorted(good, key=lambda r: r.msgs_per_s or 0.0)
        pick = ordered[(len(ordered) - 1) // 2]
        out = Measurement(
            pick.kind,
            pick.backend,
            pick.size,
            pick.n,
            pick.msgs_per_s,
            pick.mb_per_s,
            detail=dict(pick.detail),
        )
    out.drops = sum(r.drops for r in good)
    out.bad = sum(r.bad for r in good)
    for key in ("resets", "lost"):
        if any(key in r.detail for r in good):
            out.detail[key] = sum(r.detail.get(key, 0) for r in good)
    failed = [r for r in runs if r.error is not None]
    if failed:
        out.detail["failed_runs"] = len(failed)
        out.detail["first_error"] = failed[0].error
    return out
