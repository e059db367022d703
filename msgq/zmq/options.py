"""The ZMQ backend's options and timing: the defaults, the environment variables that
change them (listed in :mod:`msgq.zmq`), the pieces a blocking call waits in, and the
backend's logger."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("msgq.zmq")

DEFAULT_SNDHWM = 1000
DEFAULT_RCVHWM = 1000
DEFAULT_LINGER_MS = 1000
DEFAULT_CONNECT_WAIT_MS = 500
DEFAULT_JOIN_WAIT_MS = 200
DEFAULT_BIND_ADDRESS = "*"

#: Shortest time between two reads of a publisher's peer events (seconds).
PEER_CHECK_INTERVAL_S = 0.001

# Longest single wait inside a blocking call, so Ctrl-C is answered promptly.
_SLICE_MS = 50
_HEARTBEAT_IVL_MS = 1000
_HEARTBEAT_TIMEOUT_MS = 5000
_RECONNECT_IVL_MS = 50
_RECONNECT_IVL_MAX_MS = 500
# Shortest time between two reconnects after a non-ZMQ peer spoke on a subscriber's port.
_RELINK_S = 0.1


def _env_int(name: str, default: int, minimum: int, maximum: int = 2**31 - 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; unset it or give a number") from None
    if not minimum <= value <= maximum:
        raise ValueError(f"{name}={value} is out of range; use {minimum}..{maximum}")
    return value


def _option(value: int | None, env: str, default: int, minimum: int = 0) -> int:
    if value is None:
        return _env_int(env, default, minimum)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{env.removeprefix('MSGQ_ZMQ_').lower()} must be int, not "
                        f"{type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{env.removeprefix('MSGQ_ZMQ_').lower()} must be >= {minimum}")
    return value


def _slice_ms(deadline: float | None) -> int:
    """The next wait of a blocking call in ms: at most ``_SLICE_MS`` (so Ctrl-C is
    answered), else the whole milliseconds left until ``deadline`` (None: none); 0 once
    the deadline is reached.

    ZMQ waits count whole milliseconds, so the last fraction of one is slept here, by
    the clock: rounding it up to a whole millisecond made every timed wait end up to
    1 ms late, the whole margin of a 199 ms receive timeout checked against 200 ms
    (cereal's test_receive_timeout)."""
    if deadline is None:
        return _SLICE_MS
    remaining = deadline - time.monotonic()
    if remaining >= 0.001:
        return min(_SLICE_MS, int(remaining * 1000))
    if remaining > 0:
        time.sleep(remaining)
    return 0
