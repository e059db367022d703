"""Export benchmark: how fast ``msgq export`` turns a recording into MCAP, beside a plain
LogReader loop that only decodes the same recording. One table.

Run ``python -m msgq.bench.export`` (``--help`` for the options). A recording of realistic
mixed traffic (msgq's schema: every logged service with a rate at its registry rate,
filled with random values, as ``python -m msgq.bench.logs`` makes it) is written once;
then, best of ``--repeat`` runs each:

* **decode** — ``for event in LogReader(rec): pass`` (a pycapnp Event reader per event:
  the baseline the issue's goal is stated against);
* **convert** — decode, and each event to its JSON value (:mod:`msgq.viz.json_schema`);
* **convert + JSON** — and to its JSON text;
* **export** — :func:`msgq.viz.mcap_export.export_mcap` to an MCAP file (all of the above,
  plus the MCAP writer: chunks, zstd, indexes).

Each row gives events/s, MB/s of event bytes and its rate as a share of the decode row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from msgq.tables import format_table

__all__ = ["main", "measure"]

MB = 1e6


def _best(run: Callable[[], int], repeat: int) -> tuple[int, float]:
    best = float("inf")
    events = 0
    for _ in range(repeat):
        start = time.perf_counter()
        events = run()
        best = min(best, time.perf_counter() - start)
    return events, best


def measure(folder: str, out: str, repeat: int) -> list[dict[str, float | int | str]]:
    """The rows of the table for the recording in ``folder`` (``out``: a scratch MCAP
    path)."""
    from msgq.logs import LogReader
    from msgq.schemas import schema_in_force
    from msgq.viz.json_schema import event_converter
    from msgq.viz.mcap_export import export_mcap

    schema = schema_in_force()
    converter = event_converter(schema)
    event_bytes = sum(len(e.data) for e in LogReader(folder).raw())

    def decode() -> int:
        n = 0
        for _ in LogReader(folder):
            n += 1
        return n

    def convert() -> int:
        n = 0
        to_json = converter.to_json
        for event in LogReader(folder):
            to_json(event)
            n += 1
        return n

    def convert_json() -> int:
        n = 0
        to_json, dumps = converter.to_json, converter.dumps
        for event in LogReader(folder):
            dumps(event.which(), to_json(event))
            n += 1
        return n

    def export() -> int:
        return export_mcap(folder, out).messages

    rows: list[dict[str, float | int | str]] = []
    base = None
    for name, run in (("decode (LogReader loop)", decode), ("convert", convert),
                      ("convert + JSON", convert_json), ("export to MCAP", export)):
        events, seconds = _best(run, repeat)
        rate = events / seconds
        base = base or rate
        rows.append({"mode": name, "events": events, "seconds": round(seconds, 4),
                     "events_per_s": round(rate), "mb_per_s": round(event_bytes / MB / seconds,
                                                                    1),
                     "of_decode": round(rate / base, 3)})
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m msgq.bench.export",
        description="MCAP export speed beside a decode-only LogReader loop.")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="seconds of mixed traffic in the recording (default 10)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the best "
                                                              "counts (default 3)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the table; returns 0, or 1 without the viz extra."""
    args = parse_args(argv)
    from msgq.viz import MissingExtraError, require

    try:
        require("mcap")
    except MissingExtraError as e:
        print(f"msgq.bench.export: {e}", file=sys.stderr)
        return 1
    from msgq.bench.logs import write_mixed_recording

    workdir = tempfile.mkdtemp(prefix="msgq-bench-export-")
    try:
        folder = os.path.join(workdir, "rec")
        events, size = write_mixed_recording(folder, args.seconds)
        rows = measure(folder, os.path.join(workdir, "out.mcap"), args.repeat)
        mcap_bytes = os.path.getsize(os.path.join(workdir, "out.mcap"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    try:
        import orjson  # noqa: F401

        encoder = "orjson"
    except ImportError:
        encoder = "json (standard library)"
    print(f"export benchmark: {events} events, {size / MB:.1f} MB of events "
          f"({args.seconds:g} s of mixed traffic, msgq's schema); MCAP {mcap_bytes / MB:.1f} "
          f"MB; JSON encoder {encoder}; best of {args.repeat}")
    print(format_table(
        [["mode", "events/s", "MB/s", "of decode"]] +
        [[r["mode"], f"{r['events_per_s']:,}", f"{r['mb_per_s']}",
          f"{100 * float(r['of_decode']):.0f} %"] for r in rows]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"events": events, "event_bytes": size, "encoder": encoder,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
