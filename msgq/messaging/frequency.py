"""Receive-rate tracking for SubMaster: is a service arriving as often as it should?

A subscriber sees a service at most at the rate it looks for messages: a SubMaster that
updates at 20 Hz on conflating sockets sees a 100 Hz service 20 times a second. The
acceptable band therefore follows from three rates: the service's own, the rate of
updates (the polled service's, or the ``frequency`` argument), and whether this service
is the one polled. See :class:`FrequencyTracker`.
"""

from __future__ import annotations

from collections import deque

__all__ = ["LONG_WINDOW_S", "RECENT_WINDOW_S", "TOLERANCE_HIGH", "TOLERANCE_LOW",
           "FrequencyTracker", "RateWindow"]

#: Length of the long averaging window (seconds).
LONG_WINDOW_S = 10.0
#: Length of the recent averaging window (seconds).
RECENT_WINDOW_S = 1.0
#: The band is [TOLERANCE_LOW * min_rate, TOLERANCE_HIGH * max_rate].
TOLERANCE_LOW = 0.8
TOLERANCE_HIGH = 1.2


class RateWindow:
    """Receive intervals whose later end lies in the last ``length_s`` seconds, with their
    running sum: the average rate is ``count / sum`` in O(1) per update."""

    __slots__ = ("_intervals", "_length_s", "_total")

    def __init__(self, length_s: float) -> None:
        self._length_s = length_s
        self._intervals: deque[tuple[float, float]] = deque()  # (end time, interval)
        self._total = 0.0

    def add(self, end_time: float, interval: float) -> None:
        """One receive interval of ``interval`` seconds that ended at ``end_time`` (s)."""
        self._intervals.append((end_time, interval))
        self._total += interval

    def expire(self, now: float) -> bool:
        """Drops intervals that ended more than the window length before ``now``; returns
        whether any was dropped."""
        cutoff = now - self._length_s
        intervals = self._intervals
        if not intervals or intervals[0][0] >= cutoff:
            return False
        while intervals and intervals[0][0] < cutoff:
            self._total -= intervals.popleft()[1]
        if not intervals:
            self._total = 0.0  # no drift from repeated float subtraction
        return True

    @property
    def rate(self) -> float:
        """Average receive rate over the window (Hz); 0.0 when it holds no interval."""
        if not self._intervals or self._total <= 0.0:
            return 0.0
        return len(self._intervals) / self._total


class FrequencyTracker:
    """Tracks the receive rate of one service and whether it is within its band.

    ``service_hz`` is the service's expected rate, ``update_hz`` the rate at which the
    SubMaster updates (0 or None: unknown, take the service's), ``polled`` whether this is
    the service the SubMaster waits on (then every update sees exactly one message).

    The band: a polled service must arrive at its own rate. Otherwise the subscriber sees
    at most ``min(service, update)``; at least the update rate when the service is more
    than twice as fast as updates, the service's rate when updates are more than twice as
    fast as the service, and half of the slower one in between (beats between the two
    clocks can skip one update in two). ``ok`` when the average over the long window or
    over the recent one lies in ``[0.8 * min, 1.2 * max]``.
    """

    __slots__ = ("expected_hz", "max_hz", "min_hz", "_last_time", "_long", "_ok", "_recent")

    def __init__(self, service_hz: float, update_hz: float | None, polled: bool) -> None:
        if service_hz <= 0:
            raise ValueError("an event-driven service (0 Hz) has no rate to track")
        update_hz = update_hz if update_hz and update_hz > 0 else service_hz
        if polled:
            low = high = service_hz
        else:
            high = min(service_hz, update_hz)
            if service_hz >= 2 * update_hz:
                low = update_hz
            elif update_hz >= 2 * service_hz:
                low = service_hz
            else:
                low = high / 2
        #: The rate this subscriber should see (Hz).
        self.expected_hz = high
        self.min_hz = TOLERANCE_LOW * low
        self.max_hz = TOLERANCE_HIGH * high
        self._long = RateWindow(LONG_WINDOW_S)
        self._recent = RateWindow(RECENT_WINDOW_S)
        self._last_time: float | None = None
        self._ok: bool | None = None  # cached verdict; None: the windows changed

    def record(self, recv_time: float) -> None:
        """Counts one message received at ``recv_time`` (seconds, monotonic)."""
        last = self._last_time
        self._last_time = recv_time
        if last is not None and recv_time > last:
            interval = recv_time - last
            self._long.add(recv_time, interval)
            self._recent.add(recv_time, interval)
            self._ok = None

    def expire(self, now: float) -> None:
        """Forgets intervals older than the windows, as of ``now``."""
        if self._long.expire(now) | self._recent.expire(now):
            self._ok = None

    @property
    def rate(self) -> float:
        """Average receive rate over the long window (Hz)."""
        return self._long.rate

    @property
    def recent_rate(self) -> float:
        """Average receive rate over the recent window (Hz)."""
        return self._recent.rate

    @property
    def ok(self) -> bool:
        """Whether the long or the recent average rate lies within the band."""
        ok = self._ok
        if ok is None:
            ok = self._ok = (self.min_hz <= self._long.rate <= self.max_hz
                             or self.min_hz <= self._recent.rate <= self.max_hz)
        return ok
