"""Replayer: publishes the events of a log on their services, in their original timing.

Events are sent as the bytes in the log (``logMonoTime`` and everything else unchanged),
each on the service its union names, through ``msgq.pub_sock`` (registry queue sizes).
msgq's ``logStart`` events are never sent: they describe the log, not the system. The
logs are checked against the schema first (:func:`msgq.logs.check_schema`): a log of
another schema raises :class:`~msgq.logs.SchemaMismatchError` before anything is sent.

Timing: an event logged at ``t`` is sent at ``start + (t - origin) / speed``, where
``origin`` is the first event of the recording plus ``start_s`` and ``start`` is the
moment the pass began. Every send is scheduled against that absolute start, so errors do
not add up over a long log; the replayer sleeps until shortly before an event is due
and spins the rest of the way (``SPIN_S``). An event that is already late is sent at once
(so events logged out of order go out back to back). ``fast=True`` sends as fast as
possible. Subscribers that read slower than a fast replay sends lose messages as they
would with any fast publisher (on shared memory they count it in their ``resets``).

Skipping to ``start_s`` uses the recording's index: segments that end before it are not
read at all (only where the index's seal matches the segment files, see
:mod:`msgq.logs.index`; otherwise the segments are read).

Damage: truncated segments give every complete event (listed in ``stats.truncated``);
corruption stops the replay with :class:`LogCorruptionError` after every event before it
was sent, or, with ``skip_corrupt=True``, is skipped (listed in ``stats.corrupt``). An
event larger than its service's queue takes (a damaged length, or a log recorded with
larger queues) is not sent: it is counted in ``stats.too_large``. An event whose time is
absurdly far ahead (a damaged logMonoTime: more than a day past the log's end, or, when
the index does not give the end, about that far past the events before it) is not
waited for: it is counted in ``stats.bad_time`` and not sent.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import msgq
from msgq.logs.index import IndexCache, read_index
from msgq.logs.reader import LogReader, segment_paths
from msgq.logs.schema_check import check_paths
from msgq.logs.segment import LogProblem
from msgq.logs.writer import writes_log_start
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.services import unknown_service_error

__all__ = ["ReplayStats", "Replayer"]

#: How long before an event is due the replayer stops sleeping and spins.
SPIN_S = 0.0005
#: An event this far past the last time known of the log (or past the previous event,
#: when the end is unknown) has a damaged logMonoTime: it is not waited for.
ABSURD_GAP_NS = 24 * 3600 * 10**9


@dataclass
class ReplayStats:
    """What a replay sent."""

    counts: dict[str, int] = field(default_factory=dict)  # events sent per service
    passes: int = 0  # complete passes over the log
    seconds: float = 0.0  # wall time of the replay
    log_seconds: float = 0.0  # log time covered (one pass)
    late_mean_ms: float = 0.0  # how late sends were against their schedule (timed mode)
    late_max_ms: float = 0.0
    interrupted: bool = False  # stopped before the end
    stop_signal: int | None = None  # the signal that stopped it (handle_signals)
    truncated: list[LogProblem] = field(default_factory=list)  # damage read past: the
    corrupt: list[LogProblem] = field(default_factory=list)  # end of a file / skipped bytes
    too_large: dict[str, int] = field(default_factory=dict)  # not sent: over the queue's max
    bad_time: dict[str, int] = field(default_factory=dict)  # not sent: absurd logMonoTime

    @property
    def events(self) -> int:
        """Events sent, all services together."""
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``msgq replay --json``)."""
        return {
            "events": self.events,
            "passes": self.passes,
            "seconds": round(self.seconds, 3),
            "log_seconds": round(self.log_seconds, 3),
            "late_mean_ms": round(self.late_mean_ms, 3),
            "late_max_ms": round(self.late_max_ms, 3),
            "interrupted": self.interrupted,
            "counts": dict(self.counts),
            "truncated": [_problem_dict(p) for p in self.truncated],
            "corrupt": [_problem_dict(p) for p in self.corrupt],
            "too_large": dict(self.too_large),
            "bad_time": dict(self.bad_time),
        }


def _problem_dict(problem: LogProblem) -> dict[str, Any]:
    return {"path": problem.path, "offset": problem.offset,
            "file_offset": problem.file_offset, "detail": problem.detail}


class Replayer:
    """Replays ``source`` (a segment, a recording folder, a glob or a list of those;
    segments are merged in time order).

    ``speed``: 2.0 plays twice as fast. ``fast``: no timing at all. ``loop``: True repeats
    until ``stop()``; an int n plays n passes. ``services`` / ``exclude``: which services
    to send (unknown names raise KeyError with close matches). ``start_s``: seconds after
    the first event of the recording to start at. ``progress``: a tqdm bar (on stderr;
    default: when stdout is a terminal). ``skip_corrupt``: go on past corrupt data (see
    the module docstring). ``schema``: default the schema in force; the logs are checked
    against it here (:class:`~msgq.logs.SchemaMismatchError`). While ``run()`` goes,
    ``stats`` is what was sent so far.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        speed: float = 1.0,
        fast: bool = False,
        loop: bool | int = False,
        services: Iterable[str] | None = None,
        exclude: Iterable[str] | None = None,
        start_s: float = 0.0,
        *,
        progress: bool | None = None,
        schema: Schema | None = None,
        skip_corrupt: bool = False,
    ) -> None:
        if not (speed > 0 and math.isfinite(speed)):
            raise ValueError(f"speed must be a positive number, not {speed!r}")
        if not (start_s >= 0 and math.isfinite(start_s)):
            raise ValueError(f"start_s must be 0 or more seconds, not {start_s!r}")
        if isinstance(loop, int) and not isinstance(loop, bool) and loop < 1:
            raise ValueError(f"loop must be True, False or a number of passes >= 1, not {loop}")
        self.schema = schema_in_force(schema)
        self.skip_corrupt = skip_corrupt
        self._problems: dict[tuple[str, str, int, int], LogProblem] = {}
        self._indexes = IndexCache()  # seals checked once, not at every pass
        self.stats = ReplayStats()
        self.paths = segment_paths(source)
        if not self.paths:
            raise FileNotFoundError(f"no log segments in {source!r}")
        check_paths(self.paths, self.schema)  # before anything is read under wrong names
        self.speed = float(speed)
        self.fast = fast
        self.passes: int | None = None if loop is True else (1 if loop is False else int(loop))
        self.start_s = float(start_s)
        self.progress = sys.stdout.isatty() if progress is None else progress
        known = self.schema.union_fields
        if isinstance(services, str):
            services = [services]
        if isinstance(exclude, str):
            exclude = [exclude]
        for name in [*(services or ()), *(exclude or ())]:
            if name not in known:
                raise unknown_service_error(name, known)
        wanted = set(known if services is None else services)
        wanted -= set(exclude or ())
        if writes_log_start(self.schema):
            wanted.discard("logStart")
        if not wanted:
            raise ValueError("no services left to replay (logStart is never replayed)")
        #: The services that will be sent (when the log has them).
        self.services = frozenset(wanted)
        first, last = self._time_span()
        self.first_mono_ns = first
        self.origin_ns = first + round(self.start_s * 1e9)
        self.end_mono_ns = last
        self._pubs: dict[str, Any] = {}
        # per service: its publisher's send and the largest message its queue takes
        self._senders: dict[str, tuple[Callable[[bytes], Any], int]] = {}
        self._stop = threading.Event()

    @property
    def log_seconds(self) -> float:
        """Log time one pass covers (from ``start_s`` to the last event); 0 when the
        end is unknown (segments without an index)."""
        if self.end_mono_ns is None:
            return 0.0
        return max(0, self.end_mono_ns - self.origin_ns) / 1e9

    # -- the log ------------------------------------------------------------------------

    def _time_span(self) -> tuple[int, int | None]:
        """First and last logMonoTime of the source, from the indexes where they list a
        segment; otherwise the segment's first event is read and the end stays unknown
        (None)."""
        first: int | None = None
        last: int | None = 0
        indexes = self._indexes
        for path in self.paths:
            entry = indexes.entry(path)
            if entry is not None and entry.events:
                lo: int | None = entry.first_mono_ns
                if last is not None:
                    last = max(last, entry.last_mono_ns)
            else:
                reader = self._reader(path)
                try:
                    lo = next((e.mono_ns for e in reader.raw()), None)
                finally:
                    self._note_problems(reader)
                if lo is None:
                    continue  # an empty segment
                last = None
            first = lo if first is None or lo < first else first
        if first is None:
            raise ValueError(f"no events of {self.schema.path} in {', '.join(self.paths)}")
        return first, last

    def _reader(self, paths: Any, **kwargs: Any) -> LogReader:
        return LogReader(paths, schema=self.schema, skip_corrupt=self.skip_corrupt,
                         warn=False, indexes=self._indexes, check_schema=False, **kwargs)

    def _note_problems(self, reader: LogReader) -> None:
        for problem in [*reader.truncated, *reader.corrupt]:
            key = (problem.path, problem.kind, problem.offset, problem.file_offset)
            self._problems.setdefault(key, problem)

    def _services_in_log(self) -> set[str]:
        """Services of the wanted set the indexes list (empty when there is no index)."""
        found: set[str] = set()
        for folder in {os.path.dirname(p) for p in self.paths}:
            for entry in read_index(folder) or []:
                found |= set(entry.counts) & self.services
        return found

    # -- publishing -------------------------------------------------------------------------

    def _publisher(self, service: str) -> Any:
        pub = self._pubs.get(service)
        if pub is None:
            pub = self._pubs[service] = msgq.pub_sock(service)
            limit = getattr(pub, "max_message_size", None)  # ZMQ: none
            self._senders[service] = (pub.send, limit if isinstance(limit, int)
                                      else sys.maxsize)
        return pub

    def _sender(self, service: str) -> tuple[Callable[[bytes], Any], int]:
        self._publisher(service)
        return self._senders[service]

    def stop(self) -> None:
        """Asks ``run()`` to finish (safe from another thread or a signal handler)."""
        self._stop.set()

    def close(self) -> None:
        """Closes the publishers."""
        for pub in self._pubs.values():
            close = getattr(pub, "close", None)
            if close is not None:
                close()
        self._pubs.clear()
        self._senders.clear()

    def run(self, handle_signals: bool | None = None) -> ReplayStats:
        """Replays the log (every pass) and returns what was sent. ``handle_signals``
        (default: in the main thread) turns SIGINT, SIGTERM and SIGHUP into ``stop()``
        while it runs."""
        if handle_signals is None:
            handle_signals = threading.current_thread() is threading.main_thread()
        previous: dict[int, Any] = {}
        stats = self.stats = ReplayStats(log_seconds=self.log_seconds)
        if handle_signals:
            def on_signal(signum: int, frame: FrameType | None) -> None:
                if stats.stop_signal is None:
                    stats.stop_signal = signum
                self._stop.set()

            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                previous[signum] = signal.signal(signum, on_signal)
        began = time.monotonic()
        try:
            for service in sorted(self._services_in_log()):
                self._publisher(service)  # made before timing starts, not at the first event
            late = _Lateness()
            while self.passes is None or stats.passes < self.passes:
                before = stats.events
                if not self._play_once(stats, late):
                    stats.interrupted = True
                    break
                stats.passes += 1
                if stats.events == before:
                    break  # nothing to send (filtered out): looping would only spin
            stats.late_mean_ms, stats.late_max_ms = late.mean_ms, late.max_ms
        finally:
            stats.seconds = time.monotonic() - began
            problems = list(self._problems.values())
            stats.truncated = [p for p in problems if p.kind == "truncated"]
            stats.corrupt = [p for p in problems if p.kind != "truncated"]
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.close()
        return stats

    def _play_once(self, stats: ReplayStats, late: _Lateness) -> bool:
        """One pass; False when stopped."""
        bar = self._progress_bar(stats)
        counts = stats.counts
        stop = self._stop
        origin = self.origin_ns
        scale = 1.0 / self.speed
        shown = origin
        reader = self._reader(self.paths, services=self.services, sort=True,
                              start_mono_ns=self.origin_ns if self.start_s else None)
        senders = self._senders
        known_end = self.end_mono_ns is not None
        # later than this is a damaged logMonoTime; without a known end it moves on with
        # the events (an event up to two gaps past the last move is a log going on)
        horizon = (self.end_mono_ns if known_end else origin) + ABSURD_GAP_NS
        try:
            events = iter(reader.raw())
            first = next(events, None)  # opening the log is not part of the timing
            if first is None:
                return not stop.is_set()
            start = time.monotonic_ns()
            for event in itertools.chain((first,), events):
                if stop.is_set():
                    return False
                service = event.service
                if event.mono_ns > horizon:
                    if known_end or event.mono_ns > horizon + ABSURD_GAP_NS:
                        stats.bad_time[service] = stats.bad_time.get(service, 0) + 1
                        continue
                    horizon = event.mono_ns + ABSURD_GAP_NS
                sender = senders.get(service)
                if sender is None:
                    sender = self._sender(service)
                send, limit = sender
                if len(event.data) > limit:
                    stats.too_large[service] = stats.too_large.get(service, 0) + 1
                    continue
                if not self.fast:
                    due = start + int((event.mono_ns - origin) * scale)
                    if not _wait_until(due, stop):
                        return False
                    late.add(time.monotonic_ns() - due)
                send(event.data)
                counts[service] = counts.get(service, 0) + 1
                if bar is not None and event.mono_ns - shown >= 100_000_000:
                    bar.update((event.mono_ns - shown) / 1e9)
                    shown = event.mono_ns
            return not stop.is_set()
        finally:
            self._note_problems(reader)
            if bar is not None:
                bar.close()

    def _progress_bar(self, stats: ReplayStats) -> Any:
        if not self.progress:
            return None
        from tqdm import tqdm  # start-up cost: only a replay that shows a bar needs it

        desc = "replay" if self.passes == 1 else f"replay, pass {stats.passes + 1}"
        total = round(stats.log_seconds, 1)
        if not total:  # the end is unknown: elapsed log time only
            return tqdm(unit="s", desc=desc, leave=False, bar_format="{desc}: {n:.1f} s")
        return tqdm(total=total, unit="s", desc=desc, leave=False,
                    bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s "
                               "[{elapsed}<{remaining}]")


def _wait_until(due_ns: int, stop: threading.Event) -> bool:
    """Sleeps, then spins, until CLOCK_MONOTONIC reaches ``due_ns``; False when stopped
    meanwhile."""
    left = (due_ns - time.monotonic_ns()) / 1e9
    if left > SPIN_S:
        if stop.wait(min(left - SPIN_S, threading.TIMEOUT_MAX)):
            return False
    while time.monotonic_ns() < due_ns:
        pass
    return True


class _Lateness:
    """Running mean and maximum of how late sends were (ns in, ms out)."""

    def __init__(self) -> None:
        self.n = 0
        self.total = 0
        self.max = 0

    def add(self, late_ns: int) -> None:
        late_ns = max(0, late_ns)
        self.n += 1
        self.total += late_ns
        self.max = max(self.max, late_ns)

    @property
    def mean_ms(self) -> float:
        return self.total / self.n / 1e6 if self.n else 0.0

    @property
    def max_ms(self) -> float:
        return self.max / 1e6
