"""The figures the pages quote, generated, never typed: ``python -m msgq.bench.figures``
runs the benchmark suites behind them and rewrites the marked blocks of README.md and
docs/*.md.

A block is the text between two markers, written by this program::

    <!-- bench:NAME begin rows="ROW;ROW;..." -->
    ... (a table, with the date, machine, load and commit it was measured on)
    <!-- bench:NAME end CHECKSUM -->

``rows`` names every benchmark row the block cites; CHECKSUM is the first 12 hex digits
of the SHA-256 of the marker's attributes and the text. ``tests/test_docs.py`` fails
when a block's text was edited by hand (its checksum no longer matches) or cites a row
the benchmark no longer defines (:meth:`Block.current_rows`), and when a block named in
:data:`BLOCKS` is missing from its page. Prose near a block quotes no number of its own.

    python -m msgq.bench.figures                 every block (the suites' default runs)
    python -m msgq.bench.figures --quick core    one block, from the suite's short run
    python -m msgq.bench.figures --check         only verify the blocks (what the test does)

A suite becomes a block by adding a :class:`Block` to :data:`BLOCKS`: the command that
runs it (writing JSON), the rows it cites, and how its text is rendered from that JSON.
The lake's rows (:mod:`msgq.bench.lake`) come in that way, into docs/spark.md.

Layer: programs (a benchmark driver); imports the suites' constants, runs them as
subprocesses.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgq.bench import lake_rows

__all__ = ["BLOCKS", "Block", "FoundBlock", "checksum", "find_blocks", "main", "problems"]

#: The repository (or unpacked sdist) whose pages the blocks live in.
ROOT = Path(__file__).resolve().parent.parent.parent

#: One marked block: group "name", "attrs" (the begin marker's attributes), "body", "sum".
MARKED = re.compile(
    r"<!-- bench:(?P<name>[\w-]+) begin(?P<attrs>[^>]*?)-->\n(?P<body>.*?)"
    r"<!-- bench:(?P=name) end (?P<sum>[0-9a-f]{12}) -->", re.S)
ROWS_ATTR = re.compile(r'rows="([^"]*)"')


def checksum(attrs: str, body: str) -> str:
    """The end marker's checksum of a block's attributes and text."""
    return hashlib.sha256((attrs.strip() + "\n" + body).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class FoundBlock:
    """A marked block as it stands in a page."""

    page: str
    name: str
    rows: tuple[str, ...]
    body: str
    edited: bool  # its checksum does not match its text


def find_blocks(text: str, page: str = "") -> list[FoundBlock]:
    """The marked blocks of a page's ``text``."""
    found = []
    for m in MARKED.finditer(text):
        rows = ROWS_ATTR.search(m["attrs"])
        found.append(FoundBlock(page, m["name"], tuple(filter(None, (rows[1] if rows else "")
                                                              .split(";"))),
                                m["body"], checksum(m["attrs"], m["body"]) != m["sum"]))
    return found


# --------------------------------------------------------------------------- the blocks


@dataclass(frozen=True)
class Block:
    """A generated block: where it goes, the suite run that feeds it, what it cites."""

    name: str
    page: str  # relative to ROOT
    command: Callable[[str, bool], list[str]]  # (json path, quick) -> argv
    rows: tuple[str, ...]  # the benchmark rows the block cites
    current_rows: Callable[[], set[str]]  # every row the benchmark defines today
    render: Callable[[dict[str, Any]], str]  # the suite's JSON -> the block's table


def _core_rows() -> set[str]:
    # start-up cost: each suite is imported when its rows are asked for (--check loads
    # only its own)
    from msgq.bench.peers import DEFAULT_SIZES, DEFAULT_SUBS, INTO_SIZES, RTT_SIZES

    rows = {f"throughput/{s}/{n}" for s in DEFAULT_SIZES for n in DEFAULT_SUBS}
    rows |= {f"{t}/{s}/{n}" for t in ("recv_into", "view") for s in INTO_SIZES
             for n in DEFAULT_SUBS}
    rows |= {f"rtt/{s}/{cpus}" for s in RTT_SIZES for cpus in (1, 2)}
    return rows


CORE_ROWS = ("throughput/8/1", "throughput/8/4", "throughput/1024/1", "throughput/1024/4",
             "throughput/65536/1", "throughput/65536/4", "throughput/1048576/1",
             "throughput/1048576/4", "rtt/8/1", "rtt/8/2", "rtt/65536/1")
CORE_PEERS = ("msgq", "kickmsg", "iceoryx2")


def _size(n: int) -> str:
    return f"{n // 1048576} MiB" if n >= 1048576 else f"{n // 1024} KiB" if n >= 1024 \
        else f"{n} B"


def _render_core(doc: dict[str, Any]) -> str:
    cells: dict[tuple[str, int, int], dict[str, dict[str, Any]]] = {}
    for result in doc["results"]:
        m = result["median"]
        cells.setdefault((m["kind"], m["size"], m["n"]), {})[m["backend"]] = m
    skipped = doc["meta"].get("skipped", {})
    lines = ["| row | " + " | ".join(CORE_PEERS) + " | pyzmq |", "|---" * (len(CORE_PEERS) + 2)
             + "|"]
    for row in CORE_ROWS:
        test, size, n = row.split("/")
        by = cells.get((test, int(size), int(n)), {})
        ref = by.get("pyzmq", {})
        rtt = test == "rtt"
        label = (f"round trip p50, {_size(int(size))}, {'one CPU' if n == '1' else 'two CPUs'}"
                 if rtt else f"{_size(int(size))}, {n} subscriber{'s' if n != '1' else ''}")
        cols = []
        for peer in [*CORE_PEERS, "pyzmq"]:
            m = by.get(peer)
            if peer in skipped or m is None:
                cols.append("not installed" if peer in skipped else "")
            elif rtt:
                cols.append(f"{m['p50_us']:.1f} µs" if m.get("p50_us") else "error")
            elif peer == "pyzmq":
                cols.append(f"{m['msgs_per_s']:,.0f}/s" if m.get("msgs_per_s") else "error")
            elif m.get("msgs_per_s") and ref.get("msgs_per_s"):
                cols.append(f"{m['msgs_per_s'] / ref['msgs_per_s']:.1f}×")
            else:
                cols.append("error")
        lines.append(f"| {label} | " + " | ".join(cols) + " |")
    return ("Throughput rows: messages/s per subscriber as a multiple of raw pyzmq over "
            "`ipc://` in the same run (pyzmq's own rate in its column); round trips: p50.\n\n"
            + "\n".join(lines) + "\n")


LOG_ROWS = ("pycapnp counted/controller/zstd", "raw counted/controller/zstd",
            "pycapnp which/controller/zstd", "decoded which/controller/zstd",
            "pycapnp counted/mixed/zstd", "raw counted/mixed/zstd")


def _log_modes() -> tuple[Any, Any]:
    """msgq.bench.logs' (COMPRESSIONS, READ_MODES)."""
    # start-up cost: imported when its rows are asked for or rendered, as above
    from msgq.bench.logs import COMPRESSIONS, READ_MODES

    return COMPRESSIONS, READ_MODES


def _log_rows() -> set[str]:
    compressions, read_modes = _log_modes()
    return {f"{mode}/{recording}/{c}" for mode in read_modes
            for recording in ("controller", "mixed") for c in compressions}


def _render_logs(doc: dict[str, Any]) -> str:
    reads = {f"{r['mode']}/{r['recording']}/{r['compression']}": r
             for r in doc["read"] + doc["read_loops"]}
    _, read_modes = _log_modes()
    lines = ["| loop | recording | events/s | × the pycapnp loop |", "|---|---|---|---|"]
    for row in LOG_ROWS:
        mode, recording, compression = row.split("/")
        r = reads.get(row)
        if r is None:
            lines.append(f"| {read_modes[mode]} | {recording}, {compression} | not run | |")
            continue
        base = "pycapnp counted" if "counted" in mode else "pycapnp which"
        ref = reads.get(f"{base}/{recording}/{compression}")
        ratio = (f"{r['events_per_s'] / ref['events_per_s']:.2f}"
                 if ref and ref["events_per_s"] and not mode.startswith("pycapnp") else "")
        lines.append(f"| {read_modes[mode]} | {recording}, {compression} | "
                     f"{r['events_per_s']:,.0f} | {ratio} |")
    return ("Log reading, best of the repeats in CPU time of the process; the ratio is to "
            "the pycapnp loop doing the same work (counted or `which()`) on the same "
            "file.\n\n" + "\n".join(lines) + "\n")


UPSTREAM_ROWS = ("inproc/8", "inproc/1024", "inproc/65536", "inproc/1048576", "rtt/8")


def _upstream_rows() -> set[str]:
    from msgq.bench.upstream import RTT_SIZE, SIZES  # start-up cost: imported when asked

    return {f"inproc/{s}" for s in SIZES} | {f"rtt/{RTT_SIZE}"}


def _render_upstream(doc: dict[str, Any]) -> str:
    theirs, ours = doc["upstream"]["results"], doc["msgq"]["results"]
    lines = [f"| | upstream (`msgq-ipc` {doc['upstream_version']}) | msgq | msgq ÷ upstream |",
             "|---|---|---|---|"]
    for row in UPSTREAM_ROWS:
        kind, size = row.split("/")
        a, b = theirs[row], ours[row]
        if kind == "rtt":
            lines.append(f"| round trip between two processes, {_size(int(size))}, p50 | "
                         f"{a:.1f} µs | **{b:.1f} µs** | {a / b:.1f}× faster |")
        else:
            lines.append(f"| send + receive in one process, {_size(int(size))} | {a:,.0f}/s | "
                         f"**{b:,.0f}/s** | {b / a:.1f}× |")
    return ("The same measuring code in each one's environment (`msgq.bench.upstream`), "
            "32 MiB queues, medians of the repeats.\n\n" + "\n".join(lines) + "\n")


LAKE_ROWS = ("window/bytes", "window/time", "window/beyond-job", "job",
             "window/parquet-floor", "window/beyond-floor", "log_stats", "log_stats/sql",
             "log_stats/floor", "build", "build/floor-cpu", "build/floor-wall",
             "build/over-floor", "size")


def _lake_rows() -> set[str]:
    return set(lake_rows.ROWS)


def _render_lake(doc: dict[str, Any]) -> str:
    cells = lake_rows.measured(doc)
    lines = ["| row | measured | issue 42's target |", "|---|---|---|"]
    for row in LAKE_ROWS:
        label, target = lake_rows.ROWS[row]
        lines.append(f"| {label.strip()} | {cells[row]} | {target} |")
    return ("The lake against the raw logs in one local Spark session "
            f"({lake_rows.headline(doc)}); query times are the best of the repeats, "
            "alternating.\n\n"
            + "\n".join(lines) + "\n")


BLOCKS: tuple[Block, ...] = (
    Block("upstream", "README.md",
          lambda out, quick: [sys.executable, "-m", "msgq.bench.upstream", "--json", out,
                              *(["--quick"] if quick else [])],
          UPSTREAM_ROWS, _upstream_rows, _render_upstream),
    Block("core", "README.md",
          lambda out, quick: [sys.executable, "-m", "msgq.bench", "--json", out,
                              *(["--quick"] if quick else [])],
          CORE_ROWS, _core_rows, _render_core),
    Block("logs", "README.md",
          lambda out, quick: [sys.executable, "-m", "msgq.bench.logs", "--rates", "",
                              "--json", out, *(["--quick"] if quick else [])],
          LOG_ROWS, _log_rows, _render_logs),
    Block("lake", "docs/spark.md",
          lambda out, quick: [sys.executable, "-m", "msgq.bench.lake", "--json", out,
                              *(["--seconds", "130", "--repeat", "1"] if quick else [])],
          LAKE_ROWS, _lake_rows, _render_lake),
)


# --------------------------------------------------------------------------- checks


def problems(root: Path = ROOT) -> list[str]:
    """What is wrong with the marked blocks of ``root``'s pages: hand edits, rows the
    benchmarks no longer define, blocks of BLOCKS missing or unknown. Empty when none."""
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    known = {b.name: b for b in BLOCKS}
    seen: set[str] = set()
    out = []
    for page in pages:
        for found in find_blocks(page.read_text(), str(page.relative_to(root))):
            seen.add(found.name)
            block = known.get(found.name)
            if block is None:
                out.append(f"{found.page}: block {found.name!r} is not one of BLOCKS")
                continue
            if found.edited:
                out.append(f"{found.page}: block {found.name!r} was edited by hand "
                           "(regenerate it: python -m msgq.bench.figures "
                           f"{found.name})")
            stale = sorted(set(found.rows) - block.current_rows())
            if stale:
                out.append(f"{found.page}: block {found.name!r} cites rows the benchmark "
                           f"no longer has: {', '.join(stale)}")
    out += [f"{b.page}: block {b.name!r} is missing" for b in BLOCKS if b.name not in seen]
    return out


# --------------------------------------------------------------------------- generation


def _machine() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), platform.machine())
    except OSError:
        model = platform.machine()
    return f"{os.cpu_count()} CPUs ({model}), load average {load}"


def _commit() -> str:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        return done.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def generate(block: Block, quick: bool, note: str = "") -> str:
    """Runs ``block``'s suite and returns the block's new text (markers included)."""
    with tempfile.TemporaryDirectory(prefix="msgq-figures-") as tmp:
        out = os.path.join(tmp, f"{block.name}.json")
        argv = block.command(out, quick)
        before = _machine()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
        if not os.path.exists(out):
            raise SystemExit(f"{done.stderr[-3000:]}\nfigures: {' '.join(argv)} exited "
                             f"{done.returncode} without results: block {block.name} left "
                             "as it was")
        if done.returncode != 0:  # results written, some of them failed: said in the block
            note = (note + " " if note else "") + (
                f"The suite exited {done.returncode}: a cell failed or dropped messages "
                "(its entry says error, or the full table shows it).")
        with open(out) as f:
            doc = json.load(f)
    shown = shlex.join(["python", *argv[1:]]).replace(out, "FILE")
    stamp = (f"*Generated by `python -m msgq.bench.figures{' --quick' if quick else ''}` on "
             f"{datetime.date.today().isoformat()}: `{shown}` on {before}, commit {_commit()},"
             f" Python {platform.python_version()}.{(' ' + note) if note else ''}*\n\n")
    body = stamp + block.render(doc)
    attrs = f' rows="{";".join(block.rows)}" '
    return (f"<!-- bench:{block.name} begin{attrs}-->\n{body}"
            f"<!-- bench:{block.name} end {checksum(attrs, body)} -->")


def write(block: Block, text: str, root: Path = ROOT) -> None:
    """Puts ``text`` in place of ``block``'s marked block in its page."""
    page = root / block.page
    old = page.read_text()
    spans = [m for m in MARKED.finditer(old) if m["name"] == block.name]
    if len(spans) != 1:
        raise SystemExit(f"{block.page}: expected one block {block.name!r}, found "
                         f"{len(spans)}; add its two markers where it goes")
    page.write_text(old[:spans[0].start()] + text + old[spans[0].end():])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m msgq.bench.figures",
        description="Run the benchmarks behind the pages' figures and rewrite their "
                    "marked blocks (README.md, docs/*.md), or --check them.")
    parser.add_argument("names", nargs="*", metavar="BLOCK",
                        help=f"blocks to regenerate (default: all: "
                             f"{', '.join(b.name for b in BLOCKS)})")
    parser.add_argument("--quick", action="store_true", help="the suites' short runs")
    parser.add_argument("--note", default="",
                        help="a sentence for the blocks' stamp (e.g. what loaded the machine)")
    parser.add_argument("--check", action="store_true",
                        help="only check the blocks; exit 1 when one is wrong")
    args = parser.parse_args(argv)
    if args.check:
        found = problems()
        for line in found:
            print(line, file=sys.stderr)
        return 1 if found else 0
    chosen = [b for b in BLOCKS if not args.names or b.name in args.names]
    unknown = set(args.names) - {b.name for b in BLOCKS}
    if unknown:
        parser.error(f"unknown block(s): {', '.join(sorted(unknown))}")
    for block in chosen:
        print(f"figures: running {block.name} for {block.page}", file=sys.stderr, flush=True)
        write(block, generate(block, args.quick, args.note))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
