"""Recorder: subscribes to services and writes every message they carry to a recording.

One subscriber per service (never conflating), all on one :class:`msgq.Poller`; every
message is written as the bytes that arrived, in arrival order, to a :class:`LogWriter`.
The recorder counts, per service, what it wrote, what it refused and what it lost:

* **written** — messages (and their bytes) in the log.
* **bad** — messages not written because they are not an Event of the socket's service:
  the Cap'n Proto framing does not add up to exactly the bytes received, the root cannot
  be read, or the union names another service. Keeping them out keeps the log readable
  by every tool without ``skip_corrupt``. Damage deeper inside an otherwise well-framed
  message is not looked for (that would cost a full decode per message). On the ZMQ
  backend, messages the socket itself dropped as foreign (``dropped_messages``) are
  counted here too.
* **drops** — messages the recorder could not keep up with. On the shared-memory backend
  this is the subscriber's ``resets``: how often the publisher overtook the recorder's
  reader by a whole ring and the reader jumped to the newest message (resets forced by a
  damaged queue, ``corrupt_resets``, are among them). Each reset loses at least one
  message, usually many (up to a ring's worth); the ring does not know how many. The ZMQ
  backend cannot see its losses: past ``rcvhwm`` (``MSGQ_ZMQ_RCVHWM``) libzmq discards
  messages silently, so drops are reported as unknown (``None``) there.

``run()`` records until ``stop()`` is called (from a thread or a signal handler), a
duration has passed, or — in the main thread — SIGINT, SIGTERM or SIGHUP arrives; then it
reads what is already queued, closes the log (finished frame, fsync, index) and returns
the counts. On the shared-memory backend a message is queued when ``send`` returns. On
the ZMQ backend a message sent just before the stop may still be on its way (libzmq's
I/O threads, TCP), so the recorder goes on reading until its sockets have been quiet for
:data:`TRANSIT_QUIET_S` (at most :data:`TRANSIT_MAX_S`): a sender that stops the recorder
after its last ``send`` finds every message in the log, as on shared memory.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any

import msgq
from msgq.logs.writer import LogWriter, writes_log_start
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.services import unknown_service_error
from msgq.sockets import queued_on_send

__all__ = ["RecordStats", "Recorder", "ServiceCount", "default_services"]

#: Messages read from one socket before the others get their turn.
BATCH = 256
#: Longest wait in one poll: how soon a stop or a duration's end is noticed.
POLL_MS = 50
#: While the services are quiet, buffered messages are written out after this long (the
#: writer itself flushes only when it is given a message).
IDLE_FLUSH_S = 1.0
#: After a stop on a backend whose messages travel after ``send`` returns (ZMQ): read on
#: until no message arrived for this long ...
TRANSIT_QUIET_S = 0.25
#: ... or this long has passed since the stop.
TRANSIT_MAX_S = 2.0


def default_services(registry: Any = None, schema: Schema | None = None) -> list[str]:
    """The services ``Recorder`` subscribes to when none are named: every ``should_log``
    service of ``registry`` (default: the registry of ``schema``, itself by default the
    schema in force) except msgq's ``logStart``, which the log writes itself at the start
    of every segment."""
    schema = schema_in_force(schema)
    if registry is None:
        registry = schema.services
    own = "logStart" if writes_log_start(schema) else None
    return [name for name, s in registry.items() if s.should_log and name != own]


@dataclass
class ServiceCount:
    """What the recorder did with one service's messages."""

    service: str
    messages: int = 0  # written to the log
    bytes: int = 0  # bytes of those messages
    bad: int = 0  # not written: not an Event of this service
    drops: int | None = 0  # reader resets (shm); None where the backend cannot tell


@dataclass
class RecordStats:
    """The result of a recording: counts per service and where the log went."""

    folder: str
    backend: str
    seconds: float
    services: dict[str, ServiceCount] = field(default_factory=dict)
    segments: int = 0
    file_bytes: int = 0  # size of the segment files on disk
    stop_signal: int | None = None  # the signal that stopped the recording, if one did

    @property
    def messages(self) -> int:
        """Messages written, all services together."""
        return sum(c.messages for c in self.services.values())

    @property
    def bad(self) -> int:
        """Messages refused, all services together."""
        return sum(c.bad for c in self.services.values())

    @property
    def drops(self) -> int | None:
        """Reader resets, all services together; None where the backend cannot tell."""
        if any(c.drops is None for c in self.services.values()):
            return None
        return sum(c.drops or 0 for c in self.services.values())

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``msgq record --json``)."""
        return {
            "folder": self.folder,
            "backend": self.backend,
            "seconds": round(self.seconds, 3),
            "messages": self.messages,
            "bad": self.bad,
            "drops": self.drops,
            "segments": self.segments,
            "file_bytes": self.file_bytes,
            "services": {name: asdict(c) for name, c in self.services.items()},
        }


class _Channel:
    """One subscribed service: its socket and counts."""

    __slots__ = ("service", "sock", "count", "refused", "resets_at_start", "foreign_at_start")

    def __init__(self, service: str, sock: Any) -> None:
        self.service = service
        self.sock = sock
        self.count = ServiceCount(service)
        self.refused = 0  # read by the recorder and found not to be an Event of service
        self.resets_at_start = getattr(sock, "resets", None)
        self.foreign_at_start = getattr(sock, "dropped_messages", 0)

    def update_counts(self) -> None:
        """Brings ``bad`` and ``drops`` up to date with the socket's own counters."""
        resets = getattr(self.sock, "resets", None)
        if resets is None or self.resets_at_start is None:
            self.count.drops = None
        else:
            self.count.drops = resets - self.resets_at_start
        foreign = getattr(self.sock, "dropped_messages", 0) - self.foreign_at_start
        self.count.bad = self.refused + foreign


class Recorder:
    """Records services to a recording folder (see the module docstring).

    ``services``: the names to record (default: :func:`default_services`); unknown names
    raise KeyError with close matches, and msgq's ``logStart`` is refused (the log writes
    its own). ``schema``: default the schema in force; ``registry``: default its own.
    ``rotate_seconds``, ``rotate_bytes``, ``compression`` and ``metadata`` go to
    :class:`LogWriter`. Use ``start()`` then ``run()``, or just ``run()``; ``close()``
    (also at the end of ``run``) finishes the log.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        services: Iterable[str] | None = None,
        *,
        rotate_seconds: float | None = 60.0,
        rotate_bytes: int | None = None,
        compression: str = "zstd",
        metadata: dict[str, str] | None = None,
        schema: Schema | None = None,
        registry: Any = None,
    ) -> None:
        self.schema = schema_in_force(schema)
        names = default_services(registry, self.schema) if services is None \
            else list(services)
        self.services: list[str] = list(dict.fromkeys(names))  # unique, in order
        own_start = writes_log_start(self.schema)
        for name in self.services:
            if name not in self.schema.union_fields:
                raise unknown_service_error(name, self.schema.union_fields)
            if name == "logStart" and own_start:
                raise ValueError("logStart is not recorded: the log writes its own at the "
                                 "start of every segment")
        if not self.services:
            raise ValueError("no services to record")
        self.folder = os.path.abspath(os.fspath(folder))
        self._writer_args: dict[str, Any] = {
            "rotate_seconds": rotate_seconds,
            "rotate_bytes": rotate_bytes,
            "compression": compression,
            "metadata": {"recorder": "msgq", "services": ",".join(self.services),
                         **(metadata or {})},
            "schema": self.schema,
        }
        self._writer: LogWriter | None = None
        self._channels: list[_Channel] = []
        self._by_socket: dict[int, _Channel] = {}
        self._poller: Any = None
        self._stop = threading.Event()
        #: The signal that stopped ``run()`` (None: stopped otherwise, or still running).
        self.stop_signal: int | None = None
        self._started_at = 0.0
        self._stopped_at: float | None = None
        self._unflushed_since: float | None = None
        self.backend = msgq.backend_name()
        self.closed = False

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        """Creates the log folder and subscribes to every service. Messages sent after
        this returns are recorded. Safe to call twice."""
        if self._writer is not None:
            return
        if self.closed:
            raise ValueError("this Recorder was closed; make a new one")
        writer = LogWriter(self.folder, **self._writer_args)  # FileExistsError if in use
        poller = msgq.Poller()
        channels = []
        try:
            for name in self.services:
                sock = msgq.sub_sock(name, poller=poller, conflate=False)
                channels.append(_Channel(name, sock))
        except BaseException:
            for channel in channels:
                channel.sock.close()
            writer.close()
            raise
        self._writer, self._poller, self._channels = writer, poller, channels
        self._by_socket = {id(c.sock): c for c in channels}
        self._started_at = time.monotonic()

    def stop(self) -> None:
        """Asks ``run()`` to finish (safe from another thread or a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stop.is_set()

    def run(
        self,
        duration: float | None = None,
        handle_signals: bool | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> RecordStats:
        """Records until ``stop()``, ``duration`` seconds, or a stop signal; then closes
        the log and returns the counts.

        ``handle_signals`` (default: when called in the main thread) turns SIGINT,
        SIGTERM and SIGHUP into ``stop()`` while it runs (a second SIGINT raises
        KeyboardInterrupt); the previous handlers come back after. ``on_ready`` is called
        once the sockets are subscribed and the handlers installed: from then on every
        message sent is recorded and a signal stops the recording cleanly.
        """
        if handle_signals is None:
            handle_signals = threading.current_thread() is threading.main_thread()
        previous = self._install_signal_handlers() if handle_signals else {}
        try:
            self.start()
            if on_ready is not None:
                on_ready()
            deadline = None if duration is None else time.monotonic() + duration
            while not self._stop.is_set():
                timeout = POLL_MS
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    timeout = min(timeout, max(1, int(left * 1000)))
                self._step(timeout)
            self._drain()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.close()
        return self.stats()

    def _install_signal_handlers(self) -> dict[int, Any]:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGINT and self._stop.is_set():
                raise KeyboardInterrupt  # a second Ctrl-C: stop reading the queues now
            if self.stop_signal is None:
                self.stop_signal = signum
            self._stop.set()

        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, on_signal)
        return previous

    def close(self) -> None:
        """Closes the sockets and finishes the log. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        self._stopped_at = time.monotonic()
        for channel in self._channels:
            channel.update_counts()
            channel.sock.close()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recording -----------------------------------------------------------------------

    def _step(self, timeout_ms: int) -> None:
        """One poll and a batch from every ready socket."""
        ready = self._poller.poll(timeout_ms)
        if not ready:
            self._flush_if_idle()
            return
        for sock in ready:
            self._read(self._by_socket[id(sock)], BATCH)

    def _drain(self) -> None:
        """Reads everything already queued (at stop: nothing sent before it is lost), and
        on a backend where messages travel after ``send`` returns, what is still on its
        way (see the module docstring)."""
        self._read_queued()
        if queued_on_send(self.backend):
            return
        give_up = time.monotonic() + TRANSIT_MAX_S
        while True:
            left = give_up - time.monotonic()
            if left <= 0:
                return
            ready = self._poller.poll(max(1, int(min(TRANSIT_QUIET_S, left) * 1000)))
            if not ready:
                return  # quiet for TRANSIT_QUIET_S: nothing more is coming
            self._read_queued()

    def _read_queued(self) -> None:
        busy = True
        while busy:
            busy = False
            for channel in self._channels:
                if self._read(channel, BATCH) == BATCH:
                    busy = True

    def _read(self, channel: _Channel, limit: int) -> int:
        """Up to ``limit`` messages of one socket, written or counted as bad."""
        receive = channel.sock.receive
        write = self._writer.write_checked  # type: ignore[union-attr]
        identify = self.schema.layout.identify
        count = channel.count
        service = channel.service
        n = 0
        while n < limit:
            data = receive(True)
            if data is None:
                break
            n += 1
            identity = identify(data)
            if identity is not None and identity[2] == service:
                write(data, identity[0], service)
                count.messages += 1
                count.bytes += len(data)
            else:
                channel.refused += 1
        if n and self._unflushed_since is None:
            self._unflushed_since = time.monotonic()
        return n

    def _flush_if_idle(self) -> None:
        """Nothing arrived for a poll: write out what has been buffered for a while, so
        the log on disk lags by about IDLE_FLUSH_S at most while the services are quiet
        (and a SIGKILL loses no more)."""
        since = self._unflushed_since
        if since is not None and time.monotonic() - since >= IDLE_FLUSH_S:
            if self._writer is not None:
                self._writer.flush()
            self._unflushed_since = None

    # -- results ---------------------------------------------------------------------------

    def stats(self) -> RecordStats:
        """Counts so far (final after ``run``/``close``)."""
        if not self.closed:  # after close the counts were taken from the last look
            for channel in self._channels:
                channel.update_counts()
        end = self._stopped_at if self._stopped_at is not None else time.monotonic()
        segments = self._writer.segments if self._writer is not None else []
        file_bytes = 0
        for segment in segments:
            try:
                file_bytes += os.path.getsize(os.path.join(self.folder, segment.file))
            except OSError:
                pass
        return RecordStats(
            folder=self.folder,
            backend=self.backend,
            seconds=max(0.0, end - self._started_at) if self._started_at else 0.0,
            services={c.service: c.count for c in self._channels},
            segments=len(segments),
            file_bytes=file_bytes,
            stop_signal=self.stop_signal,
        )
