"""Receive-rate tracking for SubMaster: is a service arriving as often as it should?

cereal's rule, so that the same stack gets the same answers on msgq:

* The rate a subscriber can see is ``freq = max(min(service, update), 1)`` Hz: a
  SubMaster that updates at 20 Hz on conflating sockets sees a 100 Hz service 20 times a
  second, and no service is judged against less than 1 Hz.
* The band is ``[0.8 * low, 1.2 * high]``: a polled service must arrive at ``freq``
  (``low = high = freq``); otherwise ``high = min(freq, update)`` and ``low`` is the
  update rate when the service is at least twice as fast as updates, ``freq`` when updates
  are at least twice as fast as the service, and ``freq / 2`` in between (beats between
  the two clocks can skip one update in two).
* Two moving averages of the receive intervals: the last ``int(10 * freq)`` (about 10 s)
  and the most recent tenth of those (about 1 s; all of them when that is 0). ``ok`` when
  either average rate lies in the band — slow to fall, quick to recover. The average of
  the last ``n`` intervals is ``n`` over the time between the receive times at both ends
  of them, so a tracker keeps the last receive times (a bounded deque) and a message
  costs one append.
* Only services faster than :data:`CHECKED_ABOVE_HZ` (0.99 Hz) count in
  ``SubMaster.all_freq_ok()`` (openpilot's carParams at 0.02 Hz and clocks at 0.1 Hz are
  never "at their rate" over a 1 Hz floor).

One deliberate difference from cereal: a service that stopped (not alive) is not at its
rate (``SubMaster`` reports ``freq_ok`` False for it), where cereal keeps the verdict of
its last messages.
"""

from __future__ import annotations

from collections import deque

# Whether a tracker's average rates are in its band: compiled with SubMaster's update,
# which asks it at every message (one copy of the rule).
from msgq.messaging._update import rate_in_band

__all__ = ["CHECKED_ABOVE_HZ", "FLOOR_HZ", "TOLERANCE_HIGH", "TOLERANCE_LOW",
           "FrequencyTracker", "rate_band", "rate_in_band"]

#: No service is judged against a rate below this (Hz).
FLOOR_HZ = 1.0
#: Services at or below this rate (Hz) are left out of ``all_freq_ok()``.
CHECKED_ABOVE_HZ = 0.99
#: The band is [TOLERANCE_LOW * low, TOLERANCE_HIGH * high].
TOLERANCE_LOW = 0.8
TOLERANCE_HIGH = 1.2
#: The long window holds this many seconds' worth of intervals at the seen rate; the
#: recent one a tenth of it.
WINDOW_SECONDS = 10


def rate_band(service_hz: float, update_hz: float, polled: bool) -> tuple[float, float, float]:
    """``(freq, low, high)`` in Hz for a service of ``service_hz`` read by a SubMaster
    updating at ``update_hz`` (see the module docstring); the band is
    ``[TOLERANCE_LOW * low, TOLERANCE_HIGH * high]``."""
    freq = max(min(service_hz, update_hz), FLOOR_HZ)
    if polled:
        return freq, freq, freq
    high = min(freq, update_hz)
    if service_hz >= 2 * update_hz:
        low = update_hz
    elif update_hz >= 2 * service_hz:
        low = freq
    else:
        low = min(freq, freq / 2)
    return freq, low, high


class FrequencyTracker:
    """Tracks the receive rate of one service and whether it is within its band.

    ``service_hz`` is the service's expected rate, ``update_hz`` the rate at which the
    SubMaster updates (0 or None: unknown, take the service's), ``polled`` whether this is
    the service the SubMaster waits on. The band and the averages are cereal's (module
    docstring).
    """

    __slots__ = ("checked", "expected_hz", "max_hz", "min_hz", "recent_intervals", "times")

    def __init__(self, service_hz: float, update_hz: float | None, polled: bool) -> None:
        if service_hz <= 0:
            raise ValueError("an event-driven service (0 Hz) has no rate to track")
        update_hz = update_hz if update_hz and update_hz > 0 else service_hz
        freq, low, high = rate_band(service_hz, update_hz, polled)
        #: The rate this subscriber should see (Hz): the slower of the service and updates.
        self.expected_hz = min(service_hz, update_hz)
        self.min_hz = low * TOLERANCE_LOW
        self.max_hz = high * TOLERANCE_HIGH
        #: Whether the service counts in all_freq_ok() (faster than CHECKED_ABOVE_HZ).
        self.checked = service_hz > CHECKED_ABOVE_HZ
        length = max(1, int(WINDOW_SECONDS * freq))
        #: The receive times of the last ``length`` intervals (SubMaster appends to it).
        self.times: deque[float] = deque(maxlen=length + 1)
        #: How many of the last intervals the recent average takes.
        self.recent_intervals = max(1, int(length / WINDOW_SECONDS) or length)

    def record(self, recv_time: float) -> None:
        """Counts one message received at ``recv_time`` (seconds, monotonic)."""
        self.times.append(recv_time)

    def _rate_over(self, intervals: int) -> float:
        times = self.times
        count = min(intervals, len(times) - 1)
        if count <= 0:
            return 0.0
        span = times[-1] - times[-1 - count]
        return count / span if span > 0.0 else 0.0

    @property
    def rate(self) -> float:
        """Average receive rate over the long window (Hz)."""
        return self._rate_over(len(self.times) - 1)

    @property
    def recent_rate(self) -> float:
        """Average receive rate over the recent window (Hz)."""
        return self._rate_over(self.recent_intervals)

    @property
    def ok(self) -> bool:
        """Whether the long or the recent average rate lies within the band."""
        return rate_in_band(self.times, self.recent_intervals, self.min_hz, self.max_hz)
