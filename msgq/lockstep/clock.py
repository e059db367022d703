"""The clock a service reads so that it replays deterministically under the lockstep
harness: :mod:`msgq.clock` (replayed time under the harness, the real clock otherwise)
and :func:`new_message`, whose ``logMonoTime`` comes from that clock::

    from msgq.lockstep import clock

    now = clock.monotonic()
    msg = clock.new_message("controllerState")

Both names are the lower layers' own objects (no copies), so there is one clock per
process whichever module a caller imports it from; ``clock.monotonic`` and the other
clock functions are looked up in :mod:`msgq.clock` at each access (it binds them to
:mod:`time`'s own once the process is known to run on the real clock).
"""

from __future__ import annotations

from typing import Any

from msgq import clock as _clock
from msgq.clock import CLOCK_ENV, ClockFile, is_simulated, reload
from msgq.schemas.events import new_message

__all__ = [
    "CLOCK_ENV",
    "ClockFile",
    "is_simulated",
    "monotonic",  # noqa: F822 (module __getattr__)
    "monotonic_ns",  # noqa: F822
    "new_message",
    "reload",
    "time_ns",  # noqa: F822
    "wall_time",  # noqa: F822
]


def __getattr__(name: str) -> Any:
    # the clock functions of msgq.clock as bound now (see the module docstring)
    if name in ("monotonic", "monotonic_ns", "time_ns", "wall_time"):
        return getattr(_clock, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
