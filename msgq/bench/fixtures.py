"""What several suites measure with: the services a controller-style process subscribes
to and realistic messages of them (the messaging suite's SubMaster load, the Spark suite's
recording), and the best-of-N timing of a run that counts events.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from msgq.logs.sources import segment_paths
from msgq.schemas import default_schema
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


def decompressed_segment(path: str) -> bytes:
    """A segment's bytes, decompressed the way a user's loop does it (zstd, bz2 or none)."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(b"\x28\xb5\x2f\xfd"):
        import zstandard  # only for zstd segments

        # the fastest whole-segment call zstandard has (every frame, one output buffer)
        return zstandard.ZstdDecompressor().decompressobj(read_across_frames=True) \
            .decompress(data)
    if data.startswith(b"BZh"):
        import bz2  # only for bz2 segments (loggerd's older format)

        return bz2.decompress(data)
    return data


def pycapnp_loop(folder: str, counted: bool = True) -> int:
    """The loop an openpilot user writes over a recording, the bar of the log and Spark
    rows: each segment decompressed, ``read_multiple_bytes``, ``which()`` per event and,
    ``counted``, events and valid ones counted per service. Returns the events read."""
    event = default_schema().event
    n = valid = 0
    counts: dict[str, int] = {}
    for path in segment_paths(folder):
        for msg in event.read_multiple_bytes(decompressed_segment(path)):
            service = msg.which()
            n += 1
            if counted:
                counts[service] = counts.get(service, 0) + 1
                if msg.valid:
                    valid += 1
    return n
