"""SubMaster: the latest message of each of several services, and whether every one of
them is alive, valid and arriving at its expected rate.

Rules (cereal's; the rate band and averages are in :mod:`msgq.messaging.frequency`):

* ``alive[s]``: a message of ``s`` arrived within the last 10 expected periods (the period
  of the rate this subscriber can see: the slower of the service and the updates). With
  ``SIMULATION=1`` alive means "seen at least once", as simulated time has no periods.
* ``freq_ok[s]``: the average receive rate over about the last 10 s, or over about the
  last 1 s, of intervals is within the service's band, and the service is alive.
* ``all_freq_ok()`` counts only services faster than about 1 Hz that are in neither
  ``ignore_alive`` nor ``ignore_avg_freq`` (cereal's ``_check_avg_freq``).
* Event-driven services (frequency 0) are always alive (once seen, under SIMULATION) and
  always freq_ok.
* ``valid[s]``: the ``valid`` flag of the last message (False before the first one).
* Bytes that are not an Event of the socket's service are counted in ``bad_messages[s]``
  and skipped; ``update`` never raises because of what arrives.

Sockets conflate: each update sees the newest message of each service.

Payload views, no decoding: ``update`` reads ``logMonoTime``, ``valid`` and the service of
each new message straight from its bytes (:meth:`msgq.schemas.payload_views.PayloadViews.
identify`, EventLayout.identify's answer in one C call, which also checks the framing).
The update itself is compiled (:class:`msgq.messaging._update.Updater`: the receives, the
identification, the dict stores and the health verdicts in one call, no Python frame per
message), because a 100 Hz loop runs it cold and every frame and module it touches costs.
``sm[s]`` of a struct service is then a view over the message's bytes
(:class:`msgq.schemas._typed_reader.StructView`; ``StructListView`` for a list of
structs): each field is read from the bytes when asked, with pycapnp's value; what the
view does not read itself (``which()``, ``to_dict()``, union members, ...) it asks of a
pycapnp reader decoded once, on first need. Other payloads (lists of numbers, text,
data) and messages the typed reader does not follow (several segments, far pointers)
are decoded with pycapnp when first read, as before: bytes that frame correctly but fail
pycapnp's own checks then are counted in ``bad_messages[s]``, and ``sm[s]`` keeps the
previous payload.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import msgq
from msgq.messaging._update import Updater, payload
from msgq.messaging.frequency import (
    TOLERANCE_HIGH,
    TOLERANCE_LOW,
    FrequencyTracker,
    rate_band,
)
from msgq.schemas import Schema, schema_in_force
from msgq.schemas._typed_reader import view_member
from msgq.schemas.events import MessageDecodeError
from msgq.schemas.payload_views import FALLBACK
from msgq.tables import format_table

__all__ = ["ALIVE_PERIODS", "AsyncSubMaster", "SubMaster"]

#: A service is alive while its last message is younger than this many expected periods.
ALIVE_PERIODS = 10.0

#: One message an update took: (service, logMonoTime, valid, payload bytes or reader).
_Received = tuple[str, int, bool, Any]


class _Payloads(dict):  # type: ignore[type-arg]
    """``SubMaster.data``: service -> payload reader, where a payload received as bytes is
    decoded at its first read. Every dict read path (``[]``, ``get``, ``values``,
    ``items``) sees decoded payloads."""

    def __init__(self, decode: Callable[[str, bytes], Any]) -> None:
        super().__init__()
        self.pending: dict[str, bytes] = {}
        self._decode = decode

    def __getitem__(self, service: str) -> Any:
        data = self.pending.pop(service, None)
        if data is not None:
            payload = self._decode(service, data)
            if payload is not None:
                super().__setitem__(service, payload)
        return super().__getitem__(service)

    def __setitem__(self, service: str, value: Any) -> None:
        self.pending.pop(service, None)
        super().__setitem__(service, value)

    def get(self, service: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[service] if service in self else default

    def values(self) -> Any:
        return [self[s] for s in self]

    def items(self) -> Any:
        return [(s, self[s]) for s in self]


def _pycapnp_payload(schema: Schema, service: str, data: bytes) -> Any:
    """pycapnp's reader of the payload a view was made of (what the view does not read
    itself). The view checked the root and the payload's pointer, so pycapnp takes the
    message; MessageDecodeError if it does not."""
    return getattr(schema.decode(data), service)


def _decode_payload(schema: Schema, members: dict[str, Any], bad_messages: dict[str, int],
                    service: str, data: bytes) -> Any:
    """The payload of a message SubMaster took as bytes: a view over them (``members``:
    the compiled layouts, None for a service without views), or, where the typed reader
    does not follow them, pycapnp's reader; None (counted in ``bad_messages``) when
    pycapnp refuses them."""
    member = members[service]
    if member is not None:
        view = view_member(data, member, partial(_pycapnp_payload, schema, service, data))
        if view is not FALLBACK:
            return view
    try:
        return getattr(schema.decode(data), service)
    except (MessageDecodeError, AttributeError):
        bad_messages[service] += 1
        return None


def _default_payload(schema: Schema, service: str) -> Any:
    """An all-default (zero) reader of ``service``'s payload type."""
    msg = schema.event.new_message()
    schema.init_payload(msg, service)
    return getattr(msg.as_reader(), service)


class SubMaster:
    """Subscribes to ``services`` and keeps their latest messages and health.

    ``poll``: the service ``update`` waits for (the others are read without waiting);
    None waits for any. ``frequency``: the rate at which the caller runs ``update`` when
    no ``poll`` service gives it (default: the fastest service's). ``ignore_*``: services
    left out of ``all_alive`` / ``all_freq_ok`` / ``all_valid``. ``addr``: the publishers'
    host (ZMQ backend). ``schema``: default the schema in force (see
    :func:`msgq.schemas.use_schema`).

    cereal's ``max_freq`` / ``min_freq`` (the band of each service, Hz) and
    ``_check_avg_freq(s)`` are there too.
    """

    def __init__(
        self,
        services: Iterable[str],
        poll: str | None = None,
        ignore_alive: Iterable[str] | None = None,
        ignore_avg_freq: Iterable[str] | None = None,
        ignore_valid: Iterable[str] | None = None,
        addr: str = "127.0.0.1",
        frequency: float | None = None,
        schema: Schema | None = None,
    ) -> None:
        self.schema = schema_in_force(schema)
        registry = self.schema.services
        self.services: list[str] = list(dict.fromkeys(services))
        for s in self.services:
            registry[s]  # KeyError naming close matches
        if poll is not None and poll not in self.services:
            raise ValueError(f"poll service {poll!r} is not one of the services {self.services}")
        if poll is not None and frequency is not None:
            raise ValueError("give poll or frequency, not both: updates follow the polled "
                             "service's rate")
        self.poll = poll
        self.non_polled_services = [s for s in self.services if poll is not None and s != poll]
        self.ignore_alive = list(ignore_alive or [])
        self.ignore_average_freq = list(ignore_avg_freq or [])
        self.ignore_valid = list(ignore_valid or [])
        self.simulation = os.environ.get("SIMULATION", "0") not in ("", "0")

        if poll is not None:
            self.update_freq = registry[poll].frequency
        elif frequency is not None:
            self.update_freq = float(frequency)
        else:
            self.update_freq = max((registry[s].frequency for s in self.services), default=0.0)

        self._views = self.schema.views
        self._members = {s: self._views.member(s) for s in self.services}
        # the pycapnp reader of a view's payload, made from the view's message: one
        # callable per service, nothing made per message (view_member's decode_takes_message)
        self._decoders = {s: partial(_pycapnp_payload, self.schema, s) for s in self.services}
        self.bad_messages: dict[str, int] = {}
        # what decodes holds no reference to the SubMaster: no cycle through its payloads
        self.data: _Payloads = _Payloads(
            partial(_decode_payload, self.schema, self._members, self.bad_messages))
        self._pending = self.data.pending
        self.updated: dict[str, bool] = {}
        self.seen: dict[str, bool] = {}
        self.alive: dict[str, bool] = {}
        self.freq_ok: dict[str, bool] = {}
        self.valid: dict[str, bool] = {}
        self.recv_time: dict[str, float] = {}
        self.recv_frame: dict[str, int] = {}
        self.logMonoTime: dict[str, int] = {}  # noqa: N815 (upstream name)
        self.freq_tracker: dict[str, FrequencyTracker] = {}
        self.max_freq: dict[str, float] = {}
        self.min_freq: dict[str, float] = {}
        self.sock: dict[str, Any] = {}
        self.poller = msgq.Poller()

        for s in self.services:
            service = registry[s]
            polled = poll is None or s == poll
            sock = msgq.sub_sock(s, poller=self.poller if polled else None, addr=addr,
                                 conflate=True, segment_size=service.queue_size)
            self.sock[s] = sock
            self.data[s] = _default_payload(self.schema, s)
            self.updated[s] = False
            self.seen[s] = False
            self.alive[s] = False
            self.freq_ok[s] = False
            self.valid[s] = False
            self.recv_time[s] = 0.0
            self.recv_frame[s] = 0
            self.logMonoTime[s] = 0
            self.bad_messages[s] = 0
            _, low, high = rate_band(service.frequency, self.update_freq, s == poll)
            self.min_freq[s] = low * TOLERANCE_LOW
            self.max_freq[s] = high * TOLERANCE_HIGH
            if service.frequency > 0:
                self.freq_tracker[s] = FrequencyTracker(service.frequency, self.update_freq,
                                                        polled=s == poll)
        # the update itself (compiled): it stores into the dicts above
        self._updater = Updater(
            self, self._views,
            [(s, t, ALIVE_PERIODS / t.expected_hz) for s, t in self.freq_tracker.items()])
        # services all_freq_ok() counts: faster than about 1 Hz (cereal's rule)
        self._rate_checked = frozenset(s for s, t in self.freq_tracker.items() if t.checked)

    #: ``sm[service]``: the payload of the service's newest message, a view over its bytes
    #: made at the first read (see the module docstring). Compiled (_update.payload),
    #: since a control loop reads every payload through it, cold.
    __getitem__ = payload

    @property
    def frame(self) -> int:
        """The number of updates so far, minus one (cereal's ``frame``)."""
        return self._updater.frame  # type: ignore[no-any-return]

    @frame.setter
    def frame(self, value: int) -> None:
        self._updater.frame = value

    def update(self, timeout: int = 100) -> None:
        """Waits up to ``timeout`` ms for the polled service (any service when none is
        polled), reads the newest message of every service, and updates the health."""
        self._updater.update(self.poller.poll(timeout))

    def update_msgs(self, cur_time: float, msgs: Sequence[Any]) -> None:
        """Takes ``msgs`` (Event readers, or None entries, which are skipped) as received
        at ``cur_time`` (monotonic seconds) and updates the health of every service. The
        lockstep harness and tests drive SubMaster with this and a simulated clock."""
        received: list[_Received] = []
        for msg in msgs:
            if msg is None:
                continue
            try:
                service = msg.which()
                received.append((service, msg.logMonoTime, msg.valid, getattr(msg, service)))
            except Exception:  # a reader over garbage: nothing to attribute it to
                continue
        self._updater.update_with(cur_time, received)

    def _check_avg_freq(self, service: str) -> bool:
        """Whether ``service`` counts in :meth:`all_freq_ok` (cereal's name): faster than
        about 1 Hz and in neither ignore_alive nor ignore_avg_freq."""
        return (service in self._rate_checked and service not in self.ignore_average_freq
                and service not in self.ignore_alive)

    @property
    def freq(self) -> dict[str, float]:
        """Measured average receive rate per service over its long window (about the last
        10 s of intervals; Hz; 0.0 for event-driven services and before two messages)."""
        return {s: (t.rate if (t := self.freq_tracker.get(s)) else 0.0) for s in self.services}

    def _all(self, flags: dict[str, bool], ignore: Sequence[str],
             service_list: Iterable[str] | None) -> bool:
        names = self.services if service_list is None else service_list
        return all(flags[s] for s in names if s not in ignore)

    def all_alive(self, service_list: Iterable[str] | None = None) -> bool:
        """Whether every service (or those of ``service_list``) not in ignore_alive is alive."""
        return self._all(self.alive, self.ignore_alive, service_list)

    def all_freq_ok(self, service_list: Iterable[str] | None = None) -> bool:
        """Whether every service faster than about 1 Hz arrives at its expected rate,
        leaving out ignore_alive services (a service that need not be alive need not keep
        its rate) and ignore_avg_freq services — cereal's rule."""
        names = self.services if service_list is None else service_list
        freq_ok = self.freq_ok
        return all(freq_ok[s] for s in names if self._check_avg_freq(s))

    def all_valid(self, service_list: Iterable[str] | None = None) -> bool:
        """Whether every service not in ignore_valid sent valid=True last."""
        return self._all(self.valid, self.ignore_valid, service_list)

    def all_checks(self, service_list: Iterable[str] | None = None) -> bool:
        """all_alive() and all_freq_ok() and all_valid()."""
        return (self.all_alive(service_list) and self.all_freq_ok(service_list)
                and self.all_valid(service_list))

    def summary(self) -> str:
        """One line per service: expected Hz, measured Hz, alive, valid, freq ok."""
        rows = [("service", "expected Hz", "measured Hz", "alive", "valid", "freq ok", "bad")]
        registry = self.schema.services
        measured = self.freq
        for s in self.services:
            tracker = self.freq_tracker.get(s)
            expected = f"{tracker.expected_hz:g}" if tracker else f"{registry[s].frequency:g}"
            rows.append((s, expected, f"{measured[s]:.1f}" if tracker else "-",
                         _yes_no(self.alive[s]), _yes_no(self.valid[s]),
                         _yes_no(self.freq_ok[s]), str(self.bad_messages[s])))
        return format_table(rows)

    def __str__(self) -> str:
        return self.summary()

    def close(self) -> None:
        """Closes every subscriber socket."""
        for sock in self.sock.values():
            sock.close()


class AsyncSubMaster(SubMaster):
    """:class:`SubMaster` for asyncio programs: ``await sm.update(timeout)`` lets the
    event loop run other tasks while it waits (the task sleeps; nothing polls). Everything
    else is SubMaster's."""

    async def update(self, timeout: int = 100) -> None:  # type: ignore[override]
        """Waits up to ``timeout`` ms for the polled service (any service when none is
        polled) without blocking the loop, then updates as :meth:`SubMaster.update`."""
        self._updater.update(await self.poller.poll_async(timeout))


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"
