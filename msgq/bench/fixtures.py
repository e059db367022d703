"""What several suites measure with: the services a controller-style process subscribes
to and realistic messages of them (the messaging suite's SubMaster load, the Spark suite's
recording), and the best-of-N timing of a run that counts events.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from msgq.schemas.events import new_message

__all__ = ["SERVICES", "best_time", "filled_message"]

# 20 services of the registry a controller-style process subscribes to.
SERVICES = (
    "gyroscope", "accelerometer", "magnetometer", "temperatureSensor", "gpsLocation",
    "can", "vehicleState", "controlCommand", "controllerState", "plan", "modelOutput",
    "radarState", "localization", "calibration", "driverMonitoring", "roadCameraState",
    "deviceState", "powerState", "managerState", "clocks",
)


def filled_message(service: str) -> Any:
    """A realistic message of ``service`` (lists filled the way a live system fills them)."""
    if service == "can":
        msg = new_message("can", 24, valid=True)
        for i, frame in enumerate(msg.can):
            frame.address = 0x100 + i
            frame.dat = bytes(range(8))
            frame.bus = i % 3
        return msg
    msg = new_message(service, valid=True)
    if service == "modelOutput":
        m = msg.modelOutput
        for name in ("x", "y", "z", "std"):
            setattr(m.path, name, [0.5 * i for i in range(33)])
        lanes = m.init("laneLines", 4)
        for lane in lanes:
            lane.x = [float(i) for i in range(33)]
            lane.y = [0.1 * i for i in range(33)]
        m.init("leads", 3)
        m.init("objects", 16)
    elif service == "plan":
        for name in ("t", "x", "y", "speeds", "accels", "curvatures"):
            setattr(msg.plan, name, [0.1 * i for i in range(33)])
    elif service == "managerState":
        procs = msg.managerState.init("processes", 24)
        for i, p in enumerate(procs):
            p.name = f"process{i}"
            p.pid = 1000 + i
            p.running = True
    return msg


def best_time(run: Callable[[], int], repeat: int) -> tuple[int, float]:
    """(events, best seconds) of ``run`` (which returns the events it handled) run
    ``repeat`` times."""
    best = float("inf")
    events = 0
    for _ in range(repeat):
        start = time.perf_counter()
        events = run()
        best = min(best, time.perf_counter() - start)
    return events, best
