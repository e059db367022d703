"""Old/new A/B of msgq's own benchmark rows in one window (``scripts/bench-ab.sh REF``).

Both sides are built trees of this repository (``REF`` and, by default, ``HEAD``, each
exported and built in place under ``build/ab/``; ``--new-tree ""`` takes the checkout's
own build instead). Every process of a side runs the checkout's Python with that tree
first on ``PYTHONPATH``, so that each side measures its own library with its own
benchmark programs. The rows run alternating, ``--rounds`` times, in ABBA order (REF first
in rounds 1, 3, ..., NEW first in rounds 2, 4, ...: the side that runs first in a round,
on a CPU that may just have been idle, is REF as often as NEW), so that the machine's load
hits both alike; each row prints how many runs each side had, each side's median and
spread (the lowest and highest run), the ratio of the medians and whether the spreads
separate the sides (they do not overlap).

Row groups (``--rows``, comma-separated):

* ``core``: the paced throughput rows of ``python -m msgq.bench`` (msgq only: 8 B, 1 KiB,
  64 KiB x 1 and 4 subscribers, msgs/s; one run of every row per side and round), placed
  by the OS on every CPU this process may use: on a 2-core machine that others load, the
  publisher and a subscriber share one CPU in some runs and not in others.
* ``onecpu``: the 8 B and 1 KiB x 1 and x 4 rows with every process of the run pinned to
  one CPU (``--pin-cpu``, default the last CPU this process may use): the publisher and
  its subscribers always share it, so the rows measure the waiting path (yield, futex
  sleep and wake) that no instruction count sees, the same way in every run whatever
  the other core does.
* ``large``: 1 MiB x 1 and x 4, ``receive()``, ``receive_into`` and view rows (MB/s)
  with the one-copy, two-copy and x 4 fan-out bounds measured in the same runs
  (``msgq.bench._bound``).
* ``count``: instructions per message counted by callgrind (valgrind), which do not
  depend on the load: the C core alone (``tests/c/count_pair.c`` built against each
  side's ``msgq/src``) and the same loop in Python through the binding; send + receive
  by every subscriber in one process, none waiting. Run once (the counts repeat).
* ``submaster``: NEW's SubMaster against cereal's own over upstream msgq, CPU µs per
  tick of :mod:`msgq.bench.submaster_tick`'s workload, ``--pairs`` alternating pairs
  (default: the rounds, at least 6; spread over the rounds, ours first in one pair and
  cereal's first in the next) (``scripts/cereal-bench.sh``'s comparison; needs
  ``--cereal`` and ``--cereal-python``); REF's side when its tree has
  ``msgq.compat.cereal``.
* ``logs``: ``python -m msgq.bench.logs``'s read rows (zstd, raw and decoded; events/s
  of the process's CPU time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

ROW_GROUPS = ("core", "onecpu", "large", "count", "submaster", "logs")
DEFAULT_ROWS = ("core", "onecpu", "count", "submaster", "logs")
#: (payload bytes, subscribers) of the core and count rows.
CORE_ROWS: tuple[tuple[int, int], ...] = (
    (8, 1), (8, 4), (1024, 1), (1024, 4), (65536, 1), (65536, 4))
#: The SubMaster comparison's pairs at least (issue 46: a median of >= 6 pairs).
MIN_PAIRS = 6
#: Messages of the shorter counted run (the longer has three times as many), at most:
#: fewer for large payloads (their copies dominate, and valgrind copies slowly).
COUNT_C = 20000
COUNT_PY = 2000
COUNT_BYTES = 1 << 26
#: SubMaster ticks of the shorter counted run.
COUNT_TICKS = 300


def count_of(size: int, subs: int, most: int) -> int:
    """Messages of the shorter counted run of a row."""
    return max(100, min(most, COUNT_BYTES // (size * (subs + 1))))


@dataclass
class Side:
    """One side of the A/B: a label and the tree first on its PYTHONPATH ("" = none)."""

    label: str
    tree: str
    count_bin: str = ""

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of this side's processes."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MSGQ_")}
        if self.tree:
            env["PYTHONPATH"] = self.tree
        else:
            env.pop("PYTHONPATH", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.update(extra or {})
        return env

    @property
    def cwd(self) -> str:
        return self.tree or os.getcwd()


@dataclass
class Row:
    """The samples of one row, per side."""

    name: str
    unit: str
    higher_is_better: bool = True
    samples: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""

    def add(self, side: str, value: float) -> None:
        self.samples.setdefault(side, []).append(value)


def round_order(round_: int, ref: Side, new: Side) -> tuple[Side, Side]:
    """The order of the sides in round ``round_`` (from 0): ABBA, REF first in even
    rounds and NEW first in odd ones."""
    return (ref, new) if round_ % 2 == 0 else (new, ref)


def submaster_pairs(rounds: int, asked: int = 0) -> int:
    """The SubMaster pairs of a run: ``asked`` when given (> 0), else the rounds but at
    least MIN_PAIRS, whatever the rounds of the other rows."""
    return asked if asked > 0 else max(MIN_PAIRS, rounds)


def pairs_in_round(pairs: int, rounds: int, round_: int) -> int:
    """The SubMaster pairs run in round ``round_`` (from 0): ``pairs`` spread over the
    rounds, the earlier rounds taking one more when they do not divide evenly."""
    return pairs // rounds + (1 if round_ < pairs % rounds else 0)


def fmt(value: float) -> str:
    """A number with three significant digits and a k/M suffix."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def summary(row: Row, ref: str, new: str) -> list[str]:
    """The table cells of one row: medians with spreads, ratio, separated?"""
    a, b = row.samples.get(ref, []), row.samples.get(new, [])

    def side(values: list[float]) -> str:
        if not values:
            return "n/a"
        med = statistics.median(values)
        if len(values) == 1:
            return fmt(med)
        return f"{fmt(med)} [{fmt(min(values))}-{fmt(max(values))}]"

    runs = f"{len(a)}/{len(b)}"
    if not a or not b:
        return [row.name, row.unit, runs, side(a), side(b), "-", "-", row.note]
    ratio = statistics.median(b) / statistics.median(a) if statistics.median(a) else 0.0
    if len(a) < 2 or len(b) < 2:
        verdict = "exact" if row.unit.startswith("instr") else "-"
    elif max(b) < min(a) or max(a) < min(b):
        better = (statistics.median(b) > statistics.median(a)) == row.higher_is_better
        verdict = "yes: NEW " + ("better" if better else "worse")
    else:
        verdict = "no"
    return [row.name, row.unit, runs, side(a), side(b), f"{ratio:.3f}", verdict, row.note]


def render(rows: list[Row], ref: Side, new: Side) -> str:
    """The A/B table."""
    header = ["row", "unit", "runs", f"REF {ref.label} median [min-max]",
              f"NEW {new.label} median [min-max]", "NEW/REF", "separated?", "note"]
    body = [summary(r, ref.label, new.label) for r in rows]
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
    out = []
    for i, line in enumerate([header, *body]):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True))
                   .rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def run(cmd: list[str], side: Side, timeout: float, extra: dict[str, str] | None = None,
        cpus: set[int] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` as ``side`` (with ``cpus``: it and every process it starts only on
    those CPUs); raises with its stderr's end when it fails."""
    done = subprocess.run(cmd, env=side.env(extra), cwd=side.cwd, capture_output=True,
                          text=True, timeout=timeout,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    if done.returncode != 0:
        raise RuntimeError(f"{side.label}: {' '.join(cmd[:4])} ... failed "
                           f"({done.returncode}):\n{done.stderr[-1500:]}")
    return done


def _size_name(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


# --------------------------------------------------------------------------- row groups


def _core_document(side: Side, python: str, duration: float, selection: list[str],
                   timeout: float, cpus: set[int] | None = None) -> dict:
    """The JSON document of one ``python -m msgq.bench`` run of msgq's rows in
    ``selection`` (its --sizes/--subs/--tests options) on ``side`` (on ``cpus``)."""
    with tempfile.TemporaryDirectory(prefix="msgq-ab-") as tmp:
        out = os.path.join(tmp, "core.json")
        run([python, "-m", "msgq.bench", "--backends", "msgq", *selection, "--repeat", "1",
             "--duration", str(duration), "--json", out], side, timeout=timeout, cpus=cpus)
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def core_round(side: Side, rows: dict[str, Row], duration: float, python: str,
               cpu: int | None = None) -> None:
    """One run of every core row on ``side``; with ``cpu``, the 8 B and 1 KiB rows
    (the onecpu group) with every process of the run on that CPU."""
    sizes, suffix = ("8,1K,64K", "") if cpu is None else ("8,1K", ", one CPU")
    document = _core_document(side, python, duration, ["--sizes", sizes, "--subs", "1,4",
                                                       "--tests", "throughput"],
                              timeout=120 + 12 * duration,
                              cpus=None if cpu is None else {cpu})
    for result in document["results"]:
        m = result["median"]
        if m["error"] is not None or m["drops"] or m["bad"]:
            raise RuntimeError(f"{side.label}: core row {m['size']} x{m['n']}{suffix}: "
                               f"{m['error'] or 'drops/bad messages'}")
        name = f"throughput {_size_name(m['size'])} x{m['n']}{suffix}"
        rows.setdefault(name, Row(name, "msgs/s")).add(side.label, m["msgs_per_s"])


def large_round(side: Side, rows: dict[str, Row], duration: float, python: str) -> None:
    """One run of the 1 MiB x 1 and x 4 copying and view rows on ``side``, with the
    bounds."""
    document = _core_document(side, python, duration,
                              ["--sizes", "1M", "--subs", "1,4", "--tests",
                               "throughput,recv_into,view"],
                              timeout=120 + 12 * duration)
    for result in document["results"]:
        m = result["median"]
        if m["error"] is not None:
            raise RuntimeError(f"{side.label}: 1 MiB {m['kind']} x{m['n']}: {m['error']}")
        name = f"{m['kind']} 1 MiB x{m['n']}"
        rows.setdefault(name, Row(name, "MB/s")).add(side.label, m["mb_per_s"])
    meta = document["meta"]
    for key, label in (("cache_bound_mb_s", "two-copy bound 1 MiB"),
                       ("fanout_bound_mb_s", "fan-out bound 1 MiB x4"),
                       ("view_bound_mb_s", "one-copy bound 1 MiB")):
        bound = meta.get(key) or {}
        if bound:
            rows.setdefault(label, Row(label, "MB/s")).add(side.label,
                                                           float(next(iter(bound.values()))))


def _callgrind_total(cmd: list[str], side: Side, env: dict[str, str] | None = None,
                     cwd: str | None = None) -> int:
    prefix = f"abcount_{os.getpid()}"
    # one hash seed: the runs' start-ups (dict and set layouts) then cancel out exactly
    fixed = {"PYTHONHASHSEED": "0"}
    try:
        if env is None:
            done = run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                        *cmd], side, timeout=1800, extra={"MSGQ_PREFIX": prefix, **fixed})
        else:
            done = subprocess.run(["valgrind", "--tool=callgrind",
                                   "--callgrind-out-file=/dev/null", *cmd],
                                  env={**env, **fixed}, cwd=cwd, capture_output=True,
                                  text=True, timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"{side.label}: {' '.join(cmd[:4])} ... failed:\n"
                                   f"{done.stderr[-1500:]}")
    finally:
        shutil.rmtree(os.path.join("/dev/shm", prefix), ignore_errors=True)
    found = re.findall(r"Collected : (\d+)", done.stderr)
    if not found:
        raise RuntimeError(f"{side.label}: no callgrind total in:\n{done.stderr[-800:]}")
    return int(found[-1])


def per_message(cmd: Callable[[int], list[str]], side: Side, count: int,
                env: dict[str, str] | None = None, cwd: str | None = None) -> float:
    """Instructions per message: (total of 3 x count - total of count) / (2 x count)."""
    return (_callgrind_total(cmd(3 * count), side, env, cwd)
            - _callgrind_total(cmd(count), side, env, cwd)) / (2 * count)


def count_rows(side: Side, rows: dict[str, Row], python: str) -> None:
    """Instructions per message of the C core and of the Python loop on ``side``."""
    from msgq.bench.messaging import script_command  # another msgq: as in _submaster_sides

    for size, subs in CORE_ROWS:
        if side.count_bin:
            name = f"C core {_size_name(size)} x{subs}"
            row = rows.setdefault(name, Row(name, "instr/msg", higher_is_better=False))
            row.add(side.label, per_message(
                lambda n, s=size, k=subs: [side.count_bin, str(s), str(k), str(n)], side,
                count_of(size, subs, COUNT_C)))
        name = f"Python {_size_name(size)} x{subs}"
        row = rows.setdefault(name, Row(name, "instr/msg", higher_is_better=False))
        row.add(side.label, per_message(
            lambda n, s=size, k=subs: script_command(python, os.path.abspath(__file__),
                                                     "--count", str(s), str(k), str(n)), side,
            count_of(size, subs, COUNT_PY)))


def _submaster_sides(sides: list[Side], row: Row, cereal: str, cereal_python: str,
                     python: str, scratch: str,
                     round_: int) -> list[tuple[str, str, dict[str, str]]]:
    """(label, Python, environment) of each SubMaster side that can run the tick: ours
    through msgq.compat.cereal's shim over each side's tree, then cereal's."""
    # another msgq: this file also runs as a script under the other side's tree (--count),
    # which may lack these modules (write_shim: msgq.compat.cereal's, as messaging has it)
    from msgq.bench.messaging import _side_env, cereal_over_upstream, write_shim

    theirs = os.path.join(scratch, "cereal")
    if not os.path.isdir(theirs):
        cereal_over_upstream(cereal, theirs)
    runs: list[tuple[str, str, dict[str, str]]] = []
    for side in sides:
        if side.tree and not os.path.isfile(os.path.join(side.tree, "msgq", "compat",
                                                         "cereal.py")):
            row.note = f"{side.label}: no msgq.compat.cereal"
            continue
        shim = os.path.join(scratch, f"shim-{side.label}")
        if not os.path.isdir(shim):
            write_shim(cereal, shim)
        path = shim + (os.pathsep + side.tree if side.tree else "")
        runs.append((side.label, python,
                     _side_env("ours", path, f"ab_{side.label}_{os.getpid()}_{round_}")))
    runs.append(("cereal", cereal_python,
                 _side_env("cereal", theirs, f"ab_cereal_{os.getpid()}_{round_}")))
    return runs


def _drop_prefix(env: dict[str, str]) -> None:
    prefix = env.get("MSGQ_PREFIX") or env.get("OPENPILOT_PREFIX", "")
    if prefix:
        shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
        shutil.rmtree(f"/dev/shm/{prefix}", ignore_errors=True)


def submaster_count(sides: list[Side], rows: dict[str, Row], cereal: str, cereal_python: str,
                    python: str, scratch: str) -> None:
    """Instructions per SubMaster tick (submaster_tick.py --role count) of each side."""
    # another msgq: as in _submaster_sides
    from msgq.bench.messaging import TICK_PROGRAM, script_command

    name = "SubMaster tick (count)"
    row = rows.setdefault(name, Row(name, "instr/tick", higher_is_better=False))
    for label, exe, env in _submaster_sides(sides, row, cereal, cereal_python, python,
                                            scratch, 0):
        try:
            row.add(label, per_message(
                lambda n, exe=exe: script_command(exe, TICK_PROGRAM, "--role", "count",
                                                  "--ticks", str(n)),
                Side(label, ""), COUNT_TICKS, env, scratch))
        finally:
            _drop_prefix(env)


def submaster_round(sides: list[Side], rows: dict[str, Row], cereal: str, cereal_python: str,
                    seconds: float, python: str, scratch: str, pair: int) -> None:
    """One pair (``pair`` counts from 0): a run of the SubMaster tick on each side that
    can run it and one of cereal's, ours first in even pairs, cereal's in odd ones."""
    from msgq.bench.messaging import _tick_run  # another msgq: as in _submaster_sides

    name = "SubMaster CPU per tick"
    row = rows.setdefault(name, Row(name, "µs/tick", higher_is_better=False))
    runs = _submaster_sides(sides, row, cereal, cereal_python, python, scratch, pair)
    if pair % 2:
        runs.reverse()
    for label, exe, env in runs:
        try:
            record = _tick_run(exe, env, scratch, seconds)
        finally:
            _drop_prefix(env)
        if not record["all_alive"]:
            raise RuntimeError(f"SubMaster {label}: not every service was alive: {record}")
        row.add(label, record["cpu_s"] / record["ticks"] * 1e6)


def logs_round(side: Side, rows: dict[str, Row], python: str) -> None:
    """One run of the log reader's zstd read rows on ``side``."""
    help_text = run([python, "-m", "msgq.bench.logs", "--help"], side, timeout=120).stdout
    extra = ["--controller-seconds", "0"] if "--controller-seconds" in help_text else []
    with tempfile.TemporaryDirectory(prefix="msgq-ab-") as tmp:
        out = os.path.join(tmp, "logs.json")
        run([python, "-m", "msgq.bench.logs", "--read-seconds", "10", *extra,
             "--compressions", "zstd", "--repeat", "1", "--rates", "", "--json", out], side,
            timeout=600)
        with open(out, encoding="utf-8") as f:
            document = json.load(f)
    for r in document["read"]:
        name = f"log read {r['compression']} {r['mode']}"
        rows.setdefault(name, Row(name, "events/s")).add(side.label, r["events_per_s"])


def pair_ratio(theirs: list[float], ours: list[float]) -> float | None:
    """The median of ours / theirs over the pairs (sample i of each list is pair i): each
    pair ran back to back, so a load that changes between pairs cancels out of it."""
    ratios = [b / a for a, b in zip(theirs, ours, strict=False) if a > 0]
    return statistics.median(ratios) if ratios and len(theirs) == len(ours) else None


def placement_line(groups: list[str], allowed: list[int], pin_cpu: int, pairs: int) -> str:
    """The table's line on where the processes ran and how many SubMaster pairs."""
    cpus = ",".join(map(str, allowed))
    parts = []
    if "core" in groups or "large" in groups:
        parts.append(f"throughput rows placed by the OS on CPUs {cpus} (publisher and "
                     "subscribers share a CPU when other work holds the rest)")
    if "onecpu" in groups:
        parts.append(f"'one CPU' rows: every process of a run on CPU {pin_cpu}")
    if "submaster" in groups:
        parts.append(f"SubMaster: {pairs} pairs, ours first in every other pair")
    return "placement: " + ("; ".join(parts) if parts else "-")


# --------------------------------------------------------------------------- the count loop


def count_loop(size: int, subs: int, n: int) -> None:
    """The counted Python loop: one publisher and ``subs`` subscribers in this process,
    ``n`` messages of ``size`` bytes, each sent, then received by every subscriber."""
    import msgq  # another msgq: the side's tree, first on PYTHONPATH of this --count run

    backend = msgq.select_backend("msgq")
    context = backend.Context()
    pub = backend.PubSocket()
    pub.connect(context, "ab_count", 10 * 1024 * 1024)
    subscribers = []
    for _ in range(subs):
        sub = backend.SubSocket()
        sub.connect(context, "ab_count", b"127.0.0.1", False, 10 * 1024 * 1024)
        subscribers.append(sub)
    data = bytearray(size)
    for i in range(n):
        data[0] = i & 255
        pub.send(data)
        for sub in subscribers:
            if sub.receive() is None:
                raise SystemExit(f"message {i} not received")
    for sock in [pub, *subscribers]:
        close = getattr(sock, "close", None)
        if close is not None:
            close()


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (``scripts/bench-ab.sh`` prepares the trees and calls this)."""
    parser = argparse.ArgumentParser(prog="python -m msgq.bench.ab",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", nargs=3, type=int, metavar=("SIZE", "SUBS", "N"),
                        help=argparse.SUPPRESS)  # the counted loop, run by path
    parser.add_argument("--ref-tree", default="")
    parser.add_argument("--ref-label", default="REF")
    parser.add_argument("--new-tree", default="")
    parser.add_argument("--new-label", default="NEW")
    parser.add_argument("--ref-count-bin", default="")
    parser.add_argument("--new-count-bin", default="")
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                        help=f"comma-separated groups of {','.join(ROW_GROUPS)} (default "
                        f"{','.join(DEFAULT_ROWS)})")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating runs of each side per row, in ABBA order "
                        "(default 5)")
    parser.add_argument("--pairs", type=int, default=0,
                        help=f"SubMaster pairs, ours and cereal's (default: the rounds, at "
                        f"least {MIN_PAIRS})")
    parser.add_argument("--pin-cpu", type=int, default=None, metavar="K",
                        help="the CPU of the onecpu rows (default: the last this process "
                        "may use)")
    parser.add_argument("--duration", type=float, default=2.0,
                        help="seconds per core/large run (default 2)")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="measured seconds per SubMaster run (default 5)")
    parser.add_argument("--cereal", default="", help="a cereal checkout (submaster rows)")
    parser.add_argument("--cereal-python", default="",
                        help="the Python with upstream msgq and pycapnp (submaster rows)")
    parser.add_argument("--json", metavar="PATH", help="also write every sample as JSON")
    args = parser.parse_args(argv)
    if args.count:
        count_loop(*args.count)
        return 0
    groups = [g.strip() for g in args.rows.split(",") if g.strip()]
    for group in groups:
        if group not in ROW_GROUPS:
            parser.error(f"unknown row group {group!r}; choose from {','.join(ROW_GROUPS)}")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.pairs < 0:
        parser.error("--pairs must be >= 1 (0: the default)")
    pairs = submaster_pairs(args.rounds, args.pairs)
    allowed = sorted(os.sched_getaffinity(0))
    pin_cpu = allowed[-1] if args.pin_cpu is None else args.pin_cpu
    if pin_cpu not in allowed:
        parser.error(f"--pin-cpu {pin_cpu}: this process may run only on CPUs "
                     f"{','.join(map(str, allowed))}")
    if "submaster" in groups and not (args.cereal and args.cereal_python):
        parser.error("the submaster rows need --cereal and --cereal-python")
    python = sys.executable
    args.cereal = os.path.abspath(args.cereal) if args.cereal else ""
    ref = Side(args.ref_label, os.path.abspath(args.ref_tree) if args.ref_tree else "",
               args.ref_count_bin)
    new = Side(args.new_label, os.path.abspath(args.new_tree) if args.new_tree else "",
               args.new_count_bin)
    rows: dict[str, Row] = {}
    began = time.monotonic()
    load_before = os.getloadavg()
    scratch = tempfile.mkdtemp(prefix="msgq-ab-sm-")
    try:
        if "count" in groups:
            for side in (ref, new):
                print(f"counting instructions ({side.label})", file=sys.stderr, flush=True)
                count_rows(side, rows, python)
            if "submaster" in groups:
                submaster_count([ref, new], rows, args.cereal, args.cereal_python, python,
                                scratch)
        pair = 0
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
            for side in round_order(round_, ref, new):
                if "core" in groups:
                    core_round(side, rows, args.duration, python)
                if "onecpu" in groups:
                    core_round(side, rows, args.duration, python, cpu=pin_cpu)
                if "large" in groups:
                    large_round(side, rows, args.duration, python)
                if "logs" in groups:
                    logs_round(side, rows, python)
            if "submaster" in groups:
                for _ in range(pairs_in_round(pairs, args.rounds, round_)):
                    submaster_round([ref, new], rows, args.cereal, args.cereal_python,
                                    args.seconds, python, scratch, pair)
                    pair += 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ordered = list(rows.values())
    for name in ("SubMaster tick (count)", "SubMaster CPU per tick"):
        sm = rows.get(name)
        if sm is not None and sm.samples.get("cereal"):
            # the comparison the goal is about: NEW's column against cereal's
            theirs = Row(f"{name}: NEW vs cereal", sm.unit, higher_is_better=False)
            theirs.samples = {ref.label: sm.samples["cereal"],
                              new.label: sm.samples.get(new.label, [])}
            theirs.note = "REF column: cereal over upstream msgq; NEW/REF: ours / cereal"
            if name == "SubMaster CPU per tick":
                ratio = pair_ratio(sm.samples["cereal"], sm.samples.get(new.label, []))
                theirs.note += f"; {len(sm.samples['cereal'])} alternating pairs"
                if ratio is not None:
                    theirs.note += f", median of the pairs' ratios {ratio:.3f}"
            ordered.append(theirs)
    load_after = os.getloadavg()
    print(f"A/B: REF {ref.label} vs NEW {new.label}, {args.rounds} round(s) in ABBA order "
          f"(REF first in odd rounds, NEW in even), {time.monotonic() - began:.0f} s; load "
          f"average (1/5/15 min) before "
          f"{load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, after "
          f"{load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}")
    print(placement_line(groups, allowed, pin_cpu, pairs))
    print("separated: every NEW run beyond every REF run (or the reverse); runs: REF/NEW "
          "samples; instr/msg rows are callgrind counts (exact, load-independent)")
    print(render(ordered, ref, new))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"ref": ref.label, "new": new.label, "rounds": args.rounds,
                       "order": "ABBA", "cpus": allowed, "pin_cpu": pin_cpu,
                       "pairs": pairs if "submaster" in groups else 0,
                       "load_before": load_before, "load_after": load_after,
                       "rows": [{"name": r.name, "unit": r.unit, "samples": r.samples}
                                for r in ordered]}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
