"""Export benchmark: how fast ``msgq export`` turns a recording into MCAP, beside a plain
LogReader loop that only decodes the same recording. One table.

Run ``python -m msgq.bench.export`` (``--help`` for the options). A recording of realistic
mixed traffic (msgq's schema: every logged service with a rate at its registry rate,
filled with random values, as ``python -m msgq.bench.logs`` makes it) is written once;
then ``--repeat`` rounds of every mode, alternating (the machine's load falls on all
alike), the best round of each:

* **decode** — ``for event in LogReader(rec): pass`` (a pycapnp Event reader per event,
  lazy: nothing under the root is read; the baseline the issue's goal is stated against);
* **convert** — decode, and each event to its JSON value through pycapnp
  (:mod:`msgq.viz.json_schema`);
* **convert + JSON** — and to its JSON text;
* **JSON writer (compiled)** — the same texts from each batch's bytes
  (:mod:`msgq.viz.json_writer`), no pycapnp;
* **export** — :func:`msgq.viz.mcap_export.export_mcap` to an MCAP file (the JSON writer,
  plus the MCAP writer: chunks, zstd, indexes), in this process (``jobs=1``);
* **export through pycapnp** — the same file the way it was made before the JSON writer
  (``compiled=False``);
* **export, N processes** — the same with ``jobs=N`` (``--jobs``, default one per core, at
  most 8): segments converted in worker processes, written in order by this one. The
  recording is cut into 1-second segments so that there are segments to share.

Each row gives events/s, MB/s of event bytes and its rate as a share of the decode row; a
line under the table gives export / decode and the compiled writer's speed-up.

``--live SECONDS`` measures the live server instead, on the demo robot
(:mod:`msgq.demo.robot`: sensors, vehicle and a 640x480 camera in their own processes):
``msgq foxglove --cameras camerad:0`` in a process of its own, a viewer
(:class:`msgq.viz.ws_client.FoxgloveClient`) subscribed to every channel. It prints the
server's CPU time per second of wall time (its share of one core), and per service the
rate the robot publishes at as the server's SubMaster measured it (health channel), the
expected rate and the rate the viewer received (decimated to ``--max-rate``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence

import numpy as np

from msgq.bench.logs import mixed_events
from msgq.logs import LogReader, LogWriter, MessageBatch
from msgq.schemas import schema_in_force
from msgq.tables import format_table
from msgq.viz import MissingExtraError, require
from msgq.viz.json_schema import event_converter
from msgq.viz.json_writer import batch_json, json_program
from msgq.viz.live import HEALTH_TOPIC
from msgq.viz.mcap_export import export_mcap
from msgq.viz.ws_client import FoxgloveClient

__all__ = ["main", "measure"]

MB = 1e6
DECODE = "decode (LogReader loop)"
EXPORT = "export to MCAP"
EXPORT_PYCAPNP = "export through pycapnp"


# The demo robot (msgq.demo.robot, a peer program: run, not imported) for --live.
_ROBOT = ("import sys\nfrom msgq.demo.robot import start_robot\n"
          "for process in start_robot(float(sys.argv[1])):\n    process.join()\n")


def measure(folder: str, out: str, repeat: int, jobs: int = 1
            ) -> list[dict[str, float | int | str]]:
    """The rows of the table for the recording in ``folder`` (``out``: a scratch MCAP
    path): every mode run once per round, ``repeat`` rounds (alternating, so that the
    machine's load falls on every mode alike), the best round of each counts."""
    schema = schema_in_force()
    converter = event_converter(schema)
    program = json_program(schema)
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

    def json_writer() -> int:
        n = 0
        reader = LogReader(folder)
        for path in reader.paths:
            for batch in reader.segment_batches(path):
                if isinstance(batch, MessageBatch):
                    n += len(batch_json(program, batch, np.arange(len(batch))))
        return n

    def export() -> int:
        return export_mcap(folder, out, jobs=1).messages

    def export_pycapnp() -> int:
        return export_mcap(folder, out, jobs=1, compiled=False).messages

    def export_parallel() -> int:
        return export_mcap(folder, out, jobs=jobs).messages

    modes = [(DECODE, decode), ("convert", convert), ("convert + JSON", convert_json),
             ("JSON writer (compiled)", json_writer), (EXPORT, export),
             (EXPORT_PYCAPNP, export_pycapnp),
             *([(f"export, {jobs} processes", export_parallel)] if jobs > 1 else [])]
    best: dict[str, float] = {}
    events: dict[str, int] = {}
    for _ in range(repeat):
        for name, run in modes:
            start = time.perf_counter()
            events[name] = run()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    base = events[DECODE] / best[DECODE]
    rows: list[dict[str, float | int | str]] = []
    for name, _ in modes:
        seconds = best[name]
        rate = events[name] / seconds
        rows.append({"mode": name, "events": events[name], "seconds": round(seconds, 4),
                     "events_per_s": round(rate),
                     "mb_per_s": round(event_bytes / MB / seconds, 1),
                     "of_decode": round(rate / base, 4)})
    return rows


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_live(seconds: float, max_rate: float) -> dict[str, object]:
    """The live server on the demo robot (see the module docstring): its CPU share and,
    per service, expected / measured / viewer rates."""
    prefix = f"bench_live_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    os.environ["MSGQ_PREFIX"] = prefix  # the robot and the server: a namespace of their own
    robot = subprocess.Popen([sys.executable, "-c", _ROBOT, f"{seconds + 8:g}"])
    server = subprocess.Popen(
        [sys.executable, "-m", "msgq", "foxglove", "--port", "0", "--cameras", "camerad:0",
         "--max-rate", f"{max_rate:g}", "--duration", f"{seconds + 6:g}"],
        stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        if "ws://" not in line:
            raise RuntimeError(f"msgq foxglove did not start: {line.strip()}")
        port = int(line.rsplit(":", 1)[1].split()[0])
        client = FoxgloveClient(port)
        client.channel(HEALTH_TOPIC)  # every channel is advertised with it
        client.subscribe(*(c["topic"] for c in client.channels.values()))
        client.messages(2.0)  # warm-up: the SubMaster's rate windows fill
        cpu0, wall0 = _cpu_seconds(server.pid), time.monotonic()
        messages = client.messages(seconds)
        cpu1, wall1 = _cpu_seconds(server.pid), time.monotonic()
        client.close()
    finally:
        server.kill()
        server.wait()
        robot.kill()
        robot.wait()
        shutil.rmtree(os.path.join(os.environ.get("MSGQ_SHM_DIR", "/dev/shm"), prefix),
                      ignore_errors=True)
    wall = wall1 - wall0
    health = [json.loads(p) for t, _, p in messages if t == HEALTH_TOPIC]
    counts: dict[str, int] = {}
    for topic, _, _ in messages:
        counts[topic] = counts.get(topic, 0) + 1
    last = health[-1]["services"] if health else {}
    # the robot's services: those that arrived (the server serves the whole registry)
    services = {s: {"expected_hz": h["expected_hz"], "measured_hz": h["freq_hz"],
                    "freq_ok": h["freq_ok"],
                    "viewer_hz": round(counts.get(f"/{s}", 0) / wall, 1)}
                for s, h in last.items() if h["received"]}
    return {"seconds": round(wall, 2), "server_cpu_share": round((cpu1 - cpu0) / wall, 3),
            "served_services": len(last),
            "camera_viewer_hz": round(counts.get("/camera/camerad/0", 0) / wall, 1),
            "all_freq_ok": bool(health and health[-1]["all_freq_ok"]),
            "services": services}


def print_live(result: dict[str, object], max_rate: float) -> None:
    """The live measurement as a table."""
    services = result["services"]
    assert isinstance(services, dict)
    print(f"live server on the demo robot ({result['served_services']} services served, "
          f"{len(services)} publishing): {result['seconds']} s, server CPU "
          f"{100 * float(result['server_cpu_share']):.1f} % of one core (JSON channels at "
          f"most {max_rate:g} Hz each, camera JPEG at 5 Hz: "
          f"{result['camera_viewer_hz']} frames/s received); all_freq_ok "
          f"{result['all_freq_ok']}")
    rows = [["service", "expected Hz", "measured Hz", "freq_ok", "viewer Hz"]]
    for name, s in services.items():
        rows.append([name, f"{s['expected_hz']:g}" if s["expected_hz"] is not None else "-",
                     f"{s['measured_hz']:.1f}" if s["measured_hz"] is not None else "-",
                     str(s["freq_ok"]), f"{s['viewer_hz']:.1f}"])
    print(format_table(rows))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m msgq.bench.export",
        description="MCAP export speed beside a decode-only LogReader loop.")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="seconds of mixed traffic in the recording (default 10)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the best "
                                                              "counts (default 3)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="processes of the parallel export row (default: one per "
                             "core, at most 8; 1: no such row)")
    parser.add_argument("--live", type=float, metavar="SECONDS", default=None,
                        help="measure the live server on the demo robot for SECONDS "
                             "instead")
    parser.add_argument("--max-rate", type=float, default=30.0,
                        help="the live server's --max-rate (default 30)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the table; returns 0, or 1 without the viz extra."""
    args = parse_args(argv)
    try:
        require("mcap")
    except MissingExtraError as e:
        print(f"msgq.bench.export: {e}", file=sys.stderr)
        return 1
    if args.live is not None:
        result = measure_live(args.live, args.max_rate)
        print_live(result, args.max_rate)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    workdir = tempfile.mkdtemp(prefix="msgq-bench-export-")
    try:
        folder = os.path.join(workdir, "rec")
        events = size = 0
        with LogWriter(folder, rotate_seconds=1.0) as writer:
            for data in mixed_events(args.seconds):
                writer.write(data)
                events += 1
                size += len(data)
        rows = measure(folder, os.path.join(workdir, "out.mcap"), args.repeat, args.jobs)
        mcap_bytes = os.path.getsize(os.path.join(workdir, "out.mcap"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    try:
        import orjson  # noqa: F401

        encoder = "orjson"
    except ImportError:
        encoder = "json (standard library)"
    print(f"export benchmark: {events} events, {size / MB:.1f} MB of events "
          f"({args.seconds:g} s of mixed traffic, msgq's schema, 1 s segments); MCAP "
          f"{mcap_bytes / MB:.1f} MB; JSON encoder {encoder}; {os.cpu_count()} cores; best "
          f"of {args.repeat}")
    print(format_table(
        [["mode", "events/s", "MB/s", "of decode"]] +
        [[r["mode"], f"{r['events_per_s']:,}", f"{r['mb_per_s']}",
          f"{100 * float(r['of_decode']):.1f} %"] for r in rows]))
    rate = {str(r["mode"]): float(r["events_per_s"]) for r in rows}
    print(f"export / decode: {rate[EXPORT] / rate[DECODE]:.3f}; export with the compiled "
          f"writer / through pycapnp: {rate[EXPORT] / rate[EXPORT_PYCAPNP]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"events": events, "event_bytes": size, "encoder": encoder,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
