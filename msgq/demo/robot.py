"""A simulated robot: a car driving a smooth speed and curvature profile, published the way
a real stack publishes it — sensors, vehicle and device state at their registry rates, and
a camera through VisionIPC with its frame metadata — from separate processes.

Everything derives from the time since the start (and a seeded noise generator), so runs
are reproducible in content; only the timing is real. Each publisher schedules against an
absolute start time, so rates hold on average even when a period runs late.

``python -m msgq.demo.robot`` (``./run.sh robot``) runs it alone, in the current namespace
(the default one unless ``MSGQ_PREFIX`` says otherwise), until Ctrl-C or ``--seconds``:
``msgq top``, ``dump``, ``record``, ``export`` and ``foxglove`` in another terminal see
it.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from msgq.messaging import PubMaster, new_message
from msgq.visionipc import VisionIpcServer

__all__ = ["CAMERA_NAME", "CAMERA_SIZE", "PROCESSES", "SERVICES", "VehicleModel", "main",
           "start_robot"]

#: VisionIPC name and (width, height) of the simulated road camera.
CAMERA_NAME = "camerad"
CAMERA_SIZE = (640, 480)
#: Services (and their rates, Hz) of the sensors and vehicle processes.
SENSOR_RATES = {"gyroscope": 104.0, "accelerometer": 104.0, "magnetometer": 25.0,
                "temperatureSensor": 2.0, "gpsLocation": 10.0}
VEHICLE_RATES = {"vehicleState": 100.0, "can": 100.0, "deviceState": 2.0, "powerState": 2.0,
                 "managerState": 2.0, "clocks": 1.0}
#: Services the camera process publishes with each frame.
CAMERA_SERVICES = ("roadCameraState", "roadEncodeIdx")
#: Every service the robot publishes.
SERVICES = (*SENSOR_RATES, *VEHICLE_RATES, *CAMERA_SERVICES)


#: Step of the heading integration (s).
HEADING_STEP = 0.1


class VehicleModel:
    """Kinematics of the simulated car as a function of time (seconds)."""

    def __init__(self) -> None:
        # heading at k * HEADING_STEP, extended as time goes on
        self._heading_grid = [0.0]

    def speed(self, t: float) -> float:
        """m/s: cruising around 15 m/s with slow swells and a stop-and-go every 40 s."""
        base = 15.0 + 3.0 * math.sin(t / 7.0)
        stop = max(0.0, math.cos(2 * math.pi * t / 40.0)) ** 8
        return max(0.0, base * (1.0 - stop))

    def accel(self, t: float) -> float:
        return (self.speed(t + 0.01) - self.speed(t - 0.01)) / 0.02

    def curvature(self, t: float) -> float:
        """1/m: gentle left and right bends."""
        return 0.01 * math.sin(t / 5.0)

    def yaw_rate(self, t: float) -> float:
        return self.speed(t) * self.curvature(t)

    def heading(self, t: float) -> float:
        """rad: the integral of the yaw rate from 0 to ``t`` (midpoint rule on a fixed
        HEADING_STEP grid, so the value depends on ``t`` alone). The grid is kept and
        extended, so a call costs O(1) amortised instead of O(t)."""
        if t <= 0:
            return 0.0
        grid = self._heading_grid
        k = int(t / HEADING_STEP)
        while len(grid) <= k:
            i = len(grid) - 1
            grid.append(grid[i] + self.yaw_rate((i + 0.5) * HEADING_STEP) * HEADING_STEP)
        rest = t - k * HEADING_STEP
        return grid[k] + self.yaw_rate(k * HEADING_STEP + rest / 2) * rest


def _run_loop(rates: dict[str, float], publish: Callable[[str, float, int], None],
              seconds: float) -> None:
    """Calls ``publish(service, t, n)`` for each service at its rate for ``seconds``."""
    start = time.monotonic()
    sent = dict.fromkeys(rates, 0)
    while True:
        now = time.monotonic() - start
        if now >= seconds:
            return
        next_due = seconds
        for service, hz in rates.items():
            due = sent[service] / hz
            if due <= now:
                publish(service, now, sent[service])
                sent[service] += 1
                due = sent[service] / hz
            next_due = min(next_due, due)
        delay = next_due - (time.monotonic() - start)
        if delay > 0:
            time.sleep(delay)


def run_sensors(seconds: float) -> None:
    """IMU, magnetometer, temperature and GNSS."""
    pm = PubMaster(list(SENSOR_RATES))
    car = VehicleModel()
    rng = np.random.default_rng(1)

    def publish(service: str, t: float, n: int) -> None:
        msg = new_message(service, valid=True)
        if service in ("gyroscope", "accelerometer", "magnetometer"):
            sample = getattr(msg, service)
            sample.timestampNs = time.monotonic_ns()
            sample.source = "magnetometer0" if service == "magnetometer" else "imu0"
            noise = rng.normal(0, 0.01, 3)
            if service == "gyroscope":
                v = (noise[0], noise[1], car.yaw_rate(t) + noise[2])
            elif service == "accelerometer":
                v = (car.accel(t) + noise[0], car.speed(t) * car.yaw_rate(t) + noise[1],
                     9.81 + noise[2])
            else:
                h = car.heading(t)
                v = (2e-5 * math.cos(h), -2e-5 * math.sin(h), -4e-5)
            sample.value.x, sample.value.y, sample.value.z = (float(x) for x in v)
            sample.dieTemperatureCelsius = 41.5
        elif service == "temperatureSensor":
            msg.temperatureSensor.temperatureCelsius = 35.0 + t / 60.0
            msg.temperatureSensor.sensorName = "board"
        else:
            gps = msg.gpsLocation
            h = car.heading(t)
            gps.latitudeDeg = 37.0 + 1e-5 * t * math.cos(h)
            gps.longitudeDeg = -122.0 + 1e-5 * t * math.sin(h)
            gps.altitude = 30.0
            gps.speed = float(car.speed(t))
            gps.bearingDeg = math.degrees(h) % 360
            gps.horizontalAccuracy = 1.5
            gps.fixType = "fix3d"
            gps.satelliteCount = 11
            gps.unixTimestampMs = int(time.time() * 1000)
        pm.send(service, msg)

    _run_loop(SENSOR_RATES, publish, seconds)


def run_vehicle(seconds: float) -> None:
    """Vehicle state, CAN, device, power, processes and clocks."""
    pm = PubMaster(list(VEHICLE_RATES))
    car = VehicleModel()

    def publish(service: str, t: float, n: int) -> None:
        if service == "can":
            msg = new_message("can", 3, valid=True)
            speed_raw = int(car.speed(t) * 100)
            for i, frame in enumerate(msg.can):
                frame.address = 0x1D0 + i
                frame.bus = 0
                frame.dat = speed_raw.to_bytes(2, "little") + bytes([n % 256, i, 0, 0, 0, 0])
        else:
            msg = new_message(service, valid=True)
        if service == "vehicleState":
            vs = msg.vehicleState
            vs.speed = float(car.speed(t))
            vs.acceleration = float(car.accel(t))
            vs.yawRate = float(car.yaw_rate(t))
            vs.steeringAngleDeg = float(math.degrees(math.atan(2.7 * car.curvature(t))) * 15)
            vs.gear = "drive"
            vs.standstill = vs.speed < 0.1
            vs.cruiseState.enabled = True
            vs.cruiseState.setSpeed = 20.0
        elif service == "deviceState":
            ds = msg.deviceState
            ds.cpuUsagePercent = [20, 35]
            ds.cpuTempCelsius = [48.0, 50.5]
            ds.memoryUsagePercent = 40
            ds.freeSpacePercent = 71.0
            ds.thermalStatus = "green"
            ds.started = True
        elif service == "powerState":
            msg.powerState.voltage = 12.6
            msg.powerState.current = 1.2
            msg.powerState.ignitionLine = True
        elif service == "managerState":
            procs = msg.managerState.init("processes", 3)
            for p, name in zip(procs, ("sensors", "vehicle", "camera"), strict=True):
                p.name = name
                p.running = True
                p.shouldBeRunning = True
        elif service == "clocks":
            msg.clocks.wallTimeNs = time.time_ns()
            msg.clocks.monotonicNs = time.monotonic_ns()
        pm.send(service, msg)

    _run_loop(VEHICLE_RATES, publish, seconds)


def run_camera(seconds: float, fps: float = 20.0) -> None:
    """The road camera: NV12 frames through VisionIPC (written in place, zero copy) and
    their metadata and encoder index on roadCameraState / roadEncodeIdx."""
    width, height = CAMERA_SIZE
    server = VisionIpcServer(CAMERA_NAME)
    server.create_buffers(0, 4, width, height)
    server.start_listener()
    pm = PubMaster(list(CAMERA_SERVICES))
    car = VehicleModel()
    rows = np.arange(height, dtype=np.int32)[:, None]
    cols = np.arange(width, dtype=np.int32)[None, :]

    def publish(service: str, t: float, frame_id: int) -> None:
        sof = time.monotonic_ns()
        buf = server.get_buffer(0)
        # a road that bends with the curvature: a bright band moving across the image
        shift = int(car.curvature(t) * 20000) + frame_id % 7
        y = buf.y
        y[:] = ((rows + cols + shift) % 64 * 3).astype(np.uint8)
        buf.uv[:] = 128
        eof = time.monotonic_ns()
        server.send(0, buf, frame_id=frame_id, timestamp_sof=sof, timestamp_eof=eof)
        meta = new_message("roadCameraState", valid=True)
        fd = meta.roadCameraState
        fd.frameId = frame_id
        fd.timestampSof = sof
        fd.timestampEof = eof
        fd.exposureTimeMs = 10.0
        fd.gain = 1.5
        fd.sensor = "ar0231"
        pm.send("roadCameraState", meta)
        idx = new_message("roadEncodeIdx", valid=True)
        idx.roadEncodeIdx.frameId = frame_id
        idx.roadEncodeIdx.encodeId = frame_id
        idx.roadEncodeIdx.type = "fullHevc"
        idx.roadEncodeIdx.timestampSof = sof
        idx.roadEncodeIdx.timestampEof = eof
        pm.send("roadEncodeIdx", idx)

    try:
        _run_loop({"camera": fps}, publish, seconds)
    finally:
        server.close()


#: name -> entry point of each robot process.
PROCESSES: dict[str, Callable[[float], None]] = {
    "sensors": run_sensors,
    "vehicle": run_vehicle,
    "camera": run_camera,
}


#: prctl option: the signal a process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def _run_process(name: str, seconds: float, parent: int) -> None:
    """A robot process: its publisher loop, leaving Ctrl-C to the parent (which a
    terminal sends to the whole process group), ending cleanly on SIGTERM (so the
    VisionIPC server closes) and getting one when the parent dies, however it dies: a
    robot run until Ctrl-C never outlives its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl took effect
        return
    PROCESSES[name](seconds)


def start_robot(seconds: float, ctx: Any = None) -> list[Any]:
    """Starts every robot process (spawned, in this process's namespace) for ``seconds``
    (``math.inf``: until stopped); returns them started."""
    ctx = ctx or mp.get_context("spawn")
    procs = [ctx.Process(target=_run_process, args=(name, seconds, os.getpid()),
                         name=f"robot-{name}", daemon=True)
             for name in PROCESSES]
    for p in procs:
        p.start()
    return procs


def stop_robot(procs: list[Any], timeout: float = 10.0) -> None:
    """Stops the robot's processes (SIGTERM, then SIGKILL after ``timeout``)."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def main(argv: list[str] | None = None) -> int:
    """Runs the simulated robot alone until Ctrl-C (exit 0) or ``--seconds``; 1 when one
    of its processes fails."""
    parser = argparse.ArgumentParser(
        prog="python -m msgq.demo.robot",
        description="The simulated robot alone, in the current namespace (MSGQ_PREFIX; "
                    "the default one when unset), until Ctrl-C: watch it from another "
                    "terminal with msgq top, dump, record, export or foxglove.",
        epilog="example: ./run.sh robot, then in another terminal: "
               ". .venv/bin/activate && msgq top")
    parser.add_argument("--seconds", type=float, default=math.inf,
                        help="stop after this many seconds (default: until Ctrl-C)")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        parser.error("--seconds must be positive")
    prefix = os.environ.get("MSGQ_PREFIX") or os.environ.get("OPENPILOT_PREFIX") or ""
    where = f"namespace {prefix}" if prefix else "the default namespace"
    print(f"simulated robot: {len(SERVICES)} services and a {CAMERA_SIZE[0]}x{CAMERA_SIZE[1]} "
          f"camera ({CAMERA_NAME}) from {len(PROCESSES)} processes, in {where}", flush=True)
    print("in another terminal (. .venv/bin/activate first, from a clone):\n"
          "  msgq top                      live rates\n"
          "  msgq dump vehicleState        messages, decoded\n"
          "  msgq record -o rec            a recording (Ctrl-C ends it), then msgq info rec\n"
          "  msgq export rec rec.mcap      for Foxglove (the viz extra); msgq foxglove: live\n"
          "Ctrl-C stops the robot.", flush=True)
    # Ctrl-C and SIGTERM stop it (also when started from a shell that ignores SIGINT
    # for its background jobs).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    procs = start_robot(args.seconds)
    try:
        while any(p.is_alive() for p in procs):
            for p in procs:
                p.join(0.2)
    except KeyboardInterrupt:
        print("stopping the robot", file=sys.stderr, flush=True)
    finally:
        stop_robot(procs)
    failed = [p.name for p in procs if p.exitcode not in (0, -signal.SIGTERM)]
    if failed:
        print(f"robot process(es) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
