"""Small-segment benchmark: how fast a recording of many tiny segments is written, with
the index rewritten at every closed segment (as the writer did before) and as the writer
does now (when due: every quarter more segments, and at close). One table.

Run ``python -m msgq.bench.log_segments`` (``--segments``, ``--events-per-segment``,
``--repeat``). Each segment holds a few small events (``rotate_seconds`` makes it rotate);
the two ways alternate, the best of ``--repeat`` runs is shown, with the index writes and
the bytes they wrote (the index grows by one entry, about 430 bytes, a segment: rewritten
each time, the bytes grow with the square of the segment count).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from msgq.logs import LogWriter
from msgq.logs.index import INDEX_NAME
from msgq.messaging import new_message

__all__ = ["Result", "main", "write_recording"]


class _EveryTimeWriter(LogWriter):
    """The writer as it was: the index rewritten whenever a segment closes."""

    def _index_due(self) -> bool:
        return True


@dataclass
class Result:
    way: str
    segments: int
    seconds: float
    index_writes: int
    index_bytes: int


def write_recording(folder: str, segments: int, per_segment: int, every_time: bool
                    ) -> Result:
    """Writes ``segments`` segments of ``per_segment`` gyroscope events each; the time
    and the index bytes written."""
    events = []
    for i in range(segments * per_segment):
        msg = new_message("gyroscope", logMonoTime=10**9 + i * 1000)
        msg.gyroscope.status = i
        events.append(msg.to_bytes())
    cls = _EveryTimeWriter if every_time else LogWriter
    index_bytes = 0
    path = os.path.join(folder, INDEX_NAME)
    began = time.perf_counter()
    # events 1 us apart: a segment per ``per_segment`` of them (and its logStart)
    writer = cls(folder, rotate_seconds=per_segment * 1e-6)
    write_file = writer._write_index_file

    def measured() -> None:
        nonlocal index_bytes
        write_file()
        index_bytes += os.path.getsize(path)

    writer._write_index_file = measured  # type: ignore[method-assign]
    with writer:
        for data in events:
            writer.write(data)
    seconds = time.perf_counter() - began
    return Result("every segment (before)" if every_time else "when due (now)",
                  len(writer.segments), seconds, writer.index_writes, index_bytes)


def table(results: list[Result]) -> str:
    rows = [f"{'index written':<24}{'segments':>9}{'seconds':>9}{'segments/s':>12}"
            f"{'index writes':>14}{'index MB':>10}"]
    for r in results:
        rows.append(f"{r.way:<24}{r.segments:>9}{r.seconds:>9.2f}"
                    f"{r.segments / r.seconds:>12.0f}{r.index_writes:>14}"
                    f"{r.index_bytes / 1e6:>10.2f}")
    before, now = results
    rows.append(f"now / before: {before.seconds / now.seconds:.1f}x the segments a second, "
                f"{now.index_bytes / before.index_bytes:.3f} of the index bytes")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m msgq.bench.log_segments",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=1000,
                        help="segments per recording (default 1000)")
    parser.add_argument("--events-per-segment", type=int, default=2,
                        help="small events in each segment (default 2)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each way (best)")
    args = parser.parse_args(argv)
    best: dict[bool, Result] = {}
    workdir = tempfile.mkdtemp(prefix="msgq-bench-segments-")
    try:
        for run in range(args.repeat):
            for every_time in (True, False):
                folder = os.path.join(workdir, f"rec-{run}-{every_time}")
                result = write_recording(folder, args.segments, args.events_per_segment,
                                         every_time)
                shutil.rmtree(folder)
                if every_time not in best or result.seconds < best[every_time].seconds:
                    best[every_time] = result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(table([best[True], best[False]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
