"""The clock a service reads so that it replays deterministically under the lockstep
harness: :mod:`msgq.clock` (replayed time under the harness, the real clock otherwise)
and :func:`new_message`, whose ``logMonoTime`` comes from that clock::

    from msgq.lockstep import clock

    now = clock.monotonic()
    msg = clock.new_message("controllerState")

Both names are the lower layers' own objects (no copies), so there is one clock per
process whichever module a caller imports it from.
"""

from __future__ import annotations

from msgq.clock import (
    CLOCK_ENV,
    ClockFile,
    is_simulated,
    monotonic,
    monotonic_ns,
    reload,
    time_ns,
    wall_time,
)
from msgq.schemas.events import new_message

__all__ = [
    "CLOCK_ENV",
    "ClockFile",
    "is_simulated",
    "monotonic",
    "monotonic_ns",
    "new_message",
    "reload",
    "time_ns",
    "wall_time",
]
