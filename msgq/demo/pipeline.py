"""The main job: msgq end to end on its embedded defaults (``./run.sh``).

1. **A simulated robot** (:mod:`msgq.demo.robot`): three processes publish 13 registry
   services at their rates and a road camera through VisionIPC.
2. **Health view**: a SubMaster over those services (alive, at frequency, valid) and a
   VisionIpcClient that checks every camera frame id arrives, in this process.
3. **Recording**: a Recorder process writes every should_log service to a log folder.
4. **Lockstep replay**: the recording drives the example controller
   (:mod:`msgq.lockstep.example_controller`) twice; the outputs must be byte-identical.
5. **Statistics on Spark**: ``msgq logstats`` on a local Spark session over the recording
   (rates, jitter, gaps, validity) and a PNG of the rates over time. Its process
   (:mod:`msgq.demo.spark_step`) starts with the demo, at a lower priority: Spark starts
   while the robot runs, and the statistics run beside the lockstep replay.

It ends with a short report. Everything runs in a namespace of its own, and the outputs
go to ``--out`` (default ``demo-output/``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from msgq.demo.robot import CAMERA_NAME, CAMERA_SIZE, PROCESSES, start_robot
from msgq.demo.robot import SERVICES as ROBOT_SERVICES
from msgq.demo.setup_wait import wait_for_setup
from msgq.lockstep import example_controller, run_lockstep
from msgq.lockstep.diff import diff_outputs
from msgq.logs import Recorder
from msgq.messaging import SubMaster
from msgq.queues import queue_dir
from msgq.tables import plural
from msgq.visionipc import VisionIpcClient

__all__ = ["main"]

CONTROLLER_OUTPUTS = ("controlCommand", "controllerState")


def _say(text: str) -> None:
    print(text, flush=True)


def _record(folder: str, seconds: float, ready: Any, results: Any) -> None:
    """Child process: records every should_log service for ``seconds``."""
    recorder = Recorder(folder, rotate_seconds=max(2.0, seconds / 4))
    stats = recorder.run(duration=seconds, handle_signals=False, on_ready=ready.set)
    results.put({"messages": stats.messages, "drops": stats.drops, "bad": stats.bad,
                 "segments": stats.segments, "file_bytes": stats.file_bytes,
                 "services": {s: c.messages for s, c in stats.services.items() if c.messages}})


def health_master() -> SubMaster:
    """The health view's SubMaster. It polls no service: one polled at 100 Hz would cap
    what it expects (and can measure) of the 104 Hz IMU services at 100, where the
    registry, ``msgq top`` and ``msgq logstats`` say 104."""
    return SubMaster(list(ROBOT_SERVICES))


def _watch(seconds: float, live: bool) -> dict[str, Any]:
    """The health view: SubMaster and camera client until the robot stops."""
    sm = health_master()
    camera = VisionIpcClient(CAMERA_NAME, 0, conflate=False)
    frames: list[int] = []
    checks = ok = 0
    start = time.monotonic()
    next_print = start + 5.0
    warm_up = 3.0  # rates need a few seconds of history
    while time.monotonic() - start < seconds:
        sm.update(20)
        while (buf := camera.recv(0)) is not None:
            if buf.is_current():
                frames.append(camera.frame_id)
        now = time.monotonic()
        if now - start > warm_up:
            checks += 1
            ok += sm.all_checks()
        if now >= next_print:
            next_print += 5.0
            alive = sum(sm.alive.values())
            at_rate = sum(sm.freq_ok.values())
            line = (f"  t={now - start:4.1f}s  alive {alive}/{len(ROBOT_SERVICES)}  at rate "
                    f"{at_rate}/{len(ROBOT_SERVICES)}  camera frames {len(frames)}")
            _say(line if not live else "\x1b[2K" + line)
    summary = sm.summary()
    gaps = sum(1 for a, b in zip(frames, frames[1:], strict=False) if b != a + 1)
    camera.close()
    sm.close()
    return {"summary": summary, "checks": checks, "ok": ok, "frames": len(frames),
            "frame_gaps": gaps}


def _lockstep(recording: str) -> dict[str, Any]:
    def replay() -> Any:
        return run_lockstep(example_controller.main, recording, "vehicleState",
                            CONTROLLER_OUTPUTS,
                            input_services=["vehicleState", "gyroscope", "accelerometer"])

    t0 = time.monotonic()
    first = replay()
    elapsed = time.monotonic() - t0
    second = replay()
    diff = diff_outputs(first, second, mode="bytes")
    commands = [e.event.controlCommand for e in first.by_service("controlCommand")]
    accel = [c.accel for c in commands]
    return {"steps": len(first.steps), "events": len(first.events),
            "identical": diff.equal,
            "seconds": elapsed,
            "accel_range": (min(accel), max(accel)) if accel else (0.0, 0.0)}


def _logstats_env() -> dict[str, str]:
    """The environment of the demo's ``msgq logstats``: it maps the Spark driver's class
    archive when there is one but never writes it (unless MSGQ_SPARK_CLASS_CACHE says
    otherwise). On a fresh machine the first run would write it as its JVM exits, and
    the demo, which reads the command's output to its end, would wait for that: over a
    minute on a loaded 2-core machine, more than a start without the archive costs."""
    env = dict(os.environ)
    env.setdefault("MSGQ_SPARK_CLASS_CACHE", "read")
    return env


class _Statistics:
    """Step 5 in a process of its own (:mod:`msgq.demo.spark_step`), started with the demo:
    Spark starts while the robot runs, and the statistics run beside the lockstep replay
    once the recording is closed."""

    def __init__(self, recording: str, out: str) -> None:
        self._output = tempfile.TemporaryFile("w+")
        self._errors = tempfile.TemporaryFile("w+")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "msgq.demo.spark_step", recording,
             os.path.join(out, "rates.png")],
            stdin=subprocess.PIPE, stdout=self._output, stderr=self._errors, text=True,
            env=_logstats_env())

    def start(self) -> None:
        """The recording is closed: the statistics may run."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write("go\n")
            self._proc.stdin.close()
        except OSError:  # it ended already (its exit status tells)
            pass

    def result(self, timeout: float = 600.0) -> tuple[int, str]:
        """``msgq logstats``' exit status and what it printed (its errors too, when it
        failed)."""
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return 1, f"msgq logstats did not finish in {timeout:.0f} s"
        text = ""
        for stream in (self._output, self._errors) if code else (self._output,):
            stream.seek(0)
            text += stream.read()
        return code, text.rstrip()

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._output.close()
        self._errors.close()


def _recording_line(record: dict[str, Any], recording: str) -> str:
    """The report's line about the recording (``record``: what :func:`_record` sent)."""
    return (f"recording    {plural(record['messages'], 'message')} of "
            f"{plural(len(record['services']), 'service')}, "
            f"{plural(record['segments'], 'segment')}, {record['file_bytes'] / 1e6:.2f} MB "
            f"(zstd), {plural(record['drops'], 'drop')}, {record['bad']} bad -> {recording}")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the end-to-end demo; returns 0 when every stage did what it should."""
    parser = argparse.ArgumentParser(
        prog="python -m msgq.demo",
        description="msgq end to end: a simulated robot, a health view, a recording, a "
                    "lockstep replay and Spark statistics, with a short report.",
        epilog="example: python -m msgq.demo --seconds 30 --out /tmp/demo")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="how long the robot runs (default 20)")
    parser.add_argument("--out", default="demo-output",
                        help="folder for the recording and the plot (default demo-output/)")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark statistics")
    args = parser.parse_args(argv)
    if args.seconds < 5:
        parser.error("--seconds must be at least 5 (rates need a few seconds)")

    prefix = f"demo_{os.getpid()}"
    os.environ["MSGQ_PREFIX"] = prefix
    os.environ.pop("OPENPILOT_PREFIX", None)
    os.environ["MSGQ_BACKEND"] = "msgq"
    os.environ.pop("ZMQ", None)

    run_dir = queue_dir(create=True)
    out = os.path.abspath(os.path.join(args.out, time.strftime("run-%Y%m%d-%H%M%S")))
    os.makedirs(out, exist_ok=True)
    recording = os.path.join(out, "recording")
    live = sys.stdout.isatty()
    failures: list[str] = []
    ctx = mp.get_context("spawn")
    started = time.monotonic()
    statistics = None if args.no_spark else _Statistics(recording, out)
    try:
        _say(f"== msgq end-to-end demo (namespace {prefix}, outputs in {out})")
        _say("-- 1. recorder")
        ready, results = ctx.Event(), ctx.Queue()
        recorder = ctx.Process(target=_record,
                               args=(recording, args.seconds + 2.0, ready, results))
        recorder.start()
        if not ready.wait(60):
            raise RuntimeError("the recorder did not start")
        _say(f"-- 2. robot: {len(ROBOT_SERVICES)} services and a {CAMERA_SIZE[0]}x"
             f"{CAMERA_SIZE[1]} camera ({CAMERA_NAME}) for {args.seconds:g} s, health view:")
        robot = start_robot(args.seconds, ctx)
        health = _watch(args.seconds, live)
        for p in robot:
            p.join(30)
        record = results.get(timeout=60)
        recorder.join(30)
        _say(health["summary"])
        share = health["ok"] / health["checks"] if health["checks"] else 0.0
        if share < 0.9:
            failures.append(f"all checks held in only {share:.0%} of updates")
        if health["frames"] == 0 or health["frame_gaps"]:
            failures.append(f"camera: {health['frames']} frames, {health['frame_gaps']} gaps")
        if record["drops"] or record["bad"]:
            failures.append(f"recording: {record['drops']} drops, {record['bad']} bad")
        if statistics is not None:
            statistics.start()

        _say("-- 3. lockstep replay of the recording through the example controller (x2)")
        lock = _lockstep(recording)
        if not lock["identical"]:
            failures.append("lockstep replays differ")

        spark_text = "skipped (--no-spark)"
        if statistics is not None:
            _say("-- 4. logstats on local Spark")
            problem = wait_for_setup(os.environ.get("MSGQ_PENDING_SETUP"), say=_say)
            if problem is None:
                code, spark_text = statistics.result()
            else:
                code, spark_text = 1, problem
            if code != 0:
                failures.append("logstats failed")
            _say(spark_text)

        _say("\n== report")
        _say(f"robot        {len(ROBOT_SERVICES)} services + camera, {args.seconds:g} s, "
             f"{len(PROCESSES)} processes")
        _say(f"health       all alive, at rate and valid in {share:.0%} of "
             f"{health['checks']} updates after a 3 s warm-up")
        _say(f"camera       {health['frames']} frames received, {health['frame_gaps']} "
             "frame-id gaps")
        _say(_recording_line(record, recording))
        _say(f"lockstep     {plural(lock['steps'], 'step')}, "
             f"{plural(lock['events'], 'output')}, two runs "
             f"{'byte-identical' if lock['identical'] else 'DIFFERENT'} "
             f"({lock['seconds']:.1f} s per run)")
        if not args.no_spark:
            _say(f"spark        {'ok' if code == 0 else 'FAILED'}: per-service rates, jitter, "
                 f"gaps above; plot {os.path.join(out, 'rates.png')}")
        _say(f"total        {time.monotonic() - started:.0f} s")
        for failure in failures:
            _say(f"FAILED: {failure}")
        return 1 if failures else 0
    finally:
        if statistics is not None:
            statistics.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
