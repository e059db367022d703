"""The ZMQ publisher: an XPUB socket bound on the endpoint's port, counting its
connections and subscriptions and its readers' read acknowledgements."""

from __future__ import annotations

import errno
import os
import re
import time
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

import msgq.zmq.context as _context
from msgq._reservation import Reservation
from msgq.errors import IpcError, MultiplePublishersError, readers_timeout
from msgq.zmq.context import (
    _close_monitor,
    _live_publishers,
    _new_socket,
    _OneThreadAtATime,
    _open_monitor,
)
from msgq.zmq.options import (
    DEFAULT_BIND_ADDRESS,
    DEFAULT_JOIN_WAIT_MS,
    DEFAULT_LINGER_MS,
    DEFAULT_SNDHWM,
    PEER_CHECK_INTERVAL_S,
    _option,
    _slice_ms,
    log,
)
from msgq.zmq.ports import (
    _RELEASE_WAIT_S,
    ENDPOINT_PROPERTY,
    _bind,
    _endpoint_tag,
    _port_holder,
    _released_ports,
    _tcp_host,
)
from msgq.zmq.reads import (
    ACK_TOPIC,
    BYE_TOPIC,
    READER_PROPERTY,
    READER_TOPIC,
    _ReaderState,
    fingerprint,
)
from msgq.zmq.security import (
    _HANDSHAKE_FAILED,
    _unregister_zap,
    handshake_problem,
    keys_setting,
    load_keys,
    make_curve_server,
    service_policy,
)


class BufferReservation(Reservation):
    """A :class:`~msgq._reservation.Reservation` (the commit/abort protocol of every
    backend) whose room is a buffer of this process, sent when committed: ZMQ sends it
    without another copy (``copy=False``). :meth:`PubSocket.reserve` makes it: the
    base's constructor takes the view, ``_pub`` and ``_buffer`` are set after (no
    Python ``__init__``: a quarter less time per reservation)."""

    __slots__ = ("_pub", "_buffer")
    _pub: PubSocket
    _buffer: bytearray

    def _publish(self) -> None:
        self._pub._reservation = None
        self._pub._send(self._buffer, copy=False)

    def _drop(self) -> None:
        self._pub._reservation = None


class PubSocket(_OneThreadAtATime):
    """The publisher of one endpoint: an XPUB socket bound on the endpoint's port.

    Options (keyword arguments, else the environment, else the default): ``sndhwm``
    (messages queued per subscriber), ``linger`` (ms), ``bind_address``, ``join_wait_ms``,
    ``keys`` (a key directory, ``MSGQ_ZMQ_KEYS``: the publisher is then a CURVE server
    that admits the client keys its permissions let read this endpoint; ``""``: none).
    ``close()`` lets messages already sent go out for at most ``linger`` ms.
    """

    def __init__(
        self,
        *,
        sndhwm: int | None = None,
        linger: int | None = None,
        bind_address: str | None = None,
        join_wait_ms: int | None = None,
        keys: str | os.PathLike[str] | None = None,
    ) -> None:
        self.sndhwm = _option(sndhwm, "MSGQ_ZMQ_SNDHWM", DEFAULT_SNDHWM)
        self.linger = _option(linger, "MSGQ_ZMQ_LINGER", DEFAULT_LINGER_MS)
        self.join_wait_ms = _option(join_wait_ms, "MSGQ_ZMQ_JOIN_WAIT_MS", DEFAULT_JOIN_WAIT_MS)
        self.bind_address = bind_address or os.environ.get("MSGQ_ZMQ_BIND") or DEFAULT_BIND_ADDRESS
        #: The key directory in force (None: no keys, upstream's open socket).
        self.keys_dir = keys_setting(keys)
        self.endpoint: str | None = None
        self.port: int | None = None
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._refused = 0
        self._refusal_said = False
        self._decide: Any = None
        self._pid = 0
        self._connections = 0
        self._subscriptions = 0
        self._readers = 0
        self._last_accept = float("-inf")
        self._next_peer_check = 0.0
        self._reservation: BufferReservation | None = None
        # Read acknowledgements: messages sent, the fingerprint of the last one (kept
        # while a reader acknowledges), and the readers by id.
        self._sent = 0
        self._last_sent: int | None = None
        self._last_data: Any = None  # the last message, while its fingerprint is not made
        self._ack_readers: dict[str, _ReaderState] = {}
        self._named_ends = 0
        # Held by the one thread inside a send, a wait for readers, connect or close.
        self._init_guard()

    _role = "publisher"
    _busy_doing = "sending or waiting for readers"

    def connect(self, context: Any, endpoint: str, segment_size: int = 0) -> None:
        """Binds the endpoint's port and becomes its publisher.

        Raises MultiplePublishersError when the port is taken (another publisher of this
        endpoint, or of an endpoint hashed to the same port), IpcError when an unrelated
        program holds it or the bind address is not usable.
        """
        keys = load_keys(self.keys_dir) if self.keys_dir else None
        if keys is not None:
            keys.server_secret_or_raise()
        self._claim()
        try:
            self._connect(context, endpoint, segment_size, keys)
        finally:
            self._turn.append(True)

    def _connect(self, context: Any, endpoint: str, segment_size: int, keys: Any) -> None:
        name, port, sock = _new_socket(context, endpoint, segment_size, zmq.XPUB, self.linger)
        self._close_socket()
        monitor = None
        decide = None
        try:
            if keys is not None:
                decide = service_policy(keys, name)
                make_curve_server(sock, keys, name, decide)
            sock.setsockopt(zmq.SNDHWM, self.sndhwm)
            # What comes upstream (subscriptions, read acknowledgements) is small and read
            # at every send: no limit, for a full inbound queue stops libzmq reading that
            # connection and then ends it, unsent messages and all.
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription, for counting
            # Subscriptions take effect when _update_peers applies them, so the publisher
            # knows which messages each reader was sent (its read acknowledgements).
            sock.setsockopt(zmq.XPUB_MANUAL, 1)
            sock.setsockopt(zmq.METADATA, f"{ENDPOINT_PROPERTY}:{_endpoint_tag(name)}".encode())
            if ":" in self.bind_address or self.bind_address == "*":
                # "*" then means both IPv4 and IPv6 (libzmq falls back to IPv4 alone where
                # the machine has no IPv6).
                sock.setsockopt(zmq.IPV6, 1)
            monitor = _open_monitor(
                sock, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | _HANDSHAKE_FAILED)
            host = _tcp_host(self.bind_address)
            try:
                _bind(sock, f"tcp://{host}:{port}", port)
            except zmq.ZMQError as e:
                raise self._bind_error(e, name, host, port) from None
        except BaseException:
            _close_monitor(sock, monitor)
            if decide is not None:
                _unregister_zap(sock.context, name, decide)
            sock.close(0)
            raise
        self._sock, self._monitor = sock, monitor
        self._pid = os.getpid()
        self.endpoint, self.port = name, port
        _live_publishers.add(self)
        self._decide = decide
        self._connections = self._subscriptions = self._readers = 0
        self._sent = 0
        self._last_sent = self._last_data = None
        self._ack_readers = {}
        self._refused = 0
        self._refusal_said = False
        self._last_accept = float("-inf")

    def _bind_error(self, e: zmq.ZMQError, name: str, host: str, port: int) -> Exception:
        where = f"endpoint {name!r} (TCP port {port} on {host})"
        if e.errno == errno.EADDRINUSE:
            hint = ("move this run's ports with MSGQ_PREFIX, MSGQ_ZMQ_BASE_PORT or "
                    "MSGQ_ZMQ_PORT_SPAN")
            if _port_holder(host, port) == "zmq":
                return MultiplePublishersError(
                    f"{where}: the port is in use by another ZMQ publisher: another "
                    "publisher of this endpoint, or of an endpoint whose name maps to the "
                    f"same port; close the other publisher, or {hint}")
            return IpcError(
                f"{where}: the port is in use by a program that is not a ZMQ publisher; "
                f"stop that program, or {hint}")
        if e.errno in (errno.EADDRNOTAVAIL, errno.ENODEV, errno.EINVAL):
            return IpcError(f"{where}: cannot bind: {e.strerror}; check bind_address / "
                            "MSGQ_ZMQ_BIND (an address of this machine, or *)")
        return IpcError(f"{where}: cannot bind: {e.strerror}")

    def _update_peers(self) -> None:
        """Reads accepted/closed connections and (un)subscriptions that have arrived."""
        sock, monitor = self._sock, self._monitor
        assert sock is not None and monitor is not None
        while monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            message = parse_monitor_message(monitor.recv_multipart())
            event = message["event"]
            if event == zmq.EVENT_ACCEPTED:
                self._connections += 1
                self._last_accept = time.monotonic()
            elif event == zmq.EVENT_DISCONNECTED:
                self._connections = max(0, self._connections - 1)
            elif event & _HANDSHAKE_FAILED:
                self._refused += 1
                # A ZAP refusal is told (once) by the ZAP handler, with the client's name.
                if not self._refusal_said and event != zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    self._refusal_said = True
                    log.warning("endpoint %r: %s (refusals are counted in "
                                "refused_connections, not logged again)", self.endpoint,
                                handshake_problem(event, int(message["value"]),
                                                  self.keys_dir is not None, "publisher"))
        ended = self._named_ends = 0  # connections that ended; those a reader named
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frame = sock.recv(zmq.NOBLOCK, copy=False)
            if frame.more:  # anything multi-part is a foreign client's noise
                while sock.getsockopt(zmq.RCVMORE):
                    sock.recv(zmq.NOBLOCK, copy=False)
                continue
            data = frame.bytes
            if not data or data[0] > 1:
                continue  # anything but a (un)subscription: a foreign client's noise
            subscribe = data[0] == 1
            topic = data[1:]
            if topic.startswith((ACK_TOPIC, BYE_TOPIC, READER_TOPIC)):
                self._reader_said(subscribe, topic)
                continue  # never applied: they are messages, not filters
            # XPUB_MANUAL: apply it to the connection it came from (the last one read);
            # libzmq's own unsubscriptions of an ended connection apply to none.
            sock.setsockopt(zmq.SUBSCRIBE if subscribe else zmq.UNSUBSCRIBE, topic)
            delta = 1 if subscribe else -1
            self._subscriptions = max(0, self._subscriptions + delta)
            if not topic:
                self._readers = max(0, self._readers + delta)
                if subscribe:
                    self._reader_joined(frame)
                else:
                    ended += 1
        if ended > self._named_ends:
            # A connection ended that no READER_TOPIC names: another ZMQ program, or a
            # conflating msgq subscriber that vanished without saying goodbye. Forget
            # the conflating ones; each comes back with its next acknowledgement.
            for reader in [r for r, state in self._ack_readers.items() if not state.named]:
                del self._ack_readers[reader]

    def _reader_joined(self, frame: zmq.Frame) -> None:
        """A connection subscribed to everything (``frame``): if its subscriber
        acknowledges reads (its metadata names its reader id), everything sent from now
        on is for it to read."""
        try:
            reader = frame.get(READER_PROPERTY)
        except zmq.ZMQError:
            return  # not a msgq subscriber: counted, but it tells nothing of its reads
        if re.fullmatch(r"[0-9a-f]{16}", reader):
            state = self._ack_readers.setdefault(reader, _ReaderState(self._sent))
            state.base, state.read = self._sent, None

    def _reader_said(self, subscribe: bool, topic: bytes) -> None:
        """A subscriber's message: it read something (ACK_TOPIC + id + fingerprint), it
        is closing (BYE_TOPIC + id), it names its connection (READER_TOPIC + id,
        subscribed) or that connection ended (unsubscribed)."""
        if topic.startswith(ACK_TOPIC):
            payload = topic[len(ACK_TOPIC):]
            if len(payload) == 24:
                reader = payload[:16].decode("ascii", "replace")
                state = self._ack_readers.setdefault(reader, _ReaderState(self._sent))
                state.read = int.from_bytes(payload[16:], "little")
            return
        if topic.startswith(BYE_TOPIC):
            self._ack_readers.pop(topic[len(BYE_TOPIC):].decode("ascii", "replace"), None)
            return
        reader = topic[len(READER_TOPIC):].decode("ascii", "replace")
        if subscribe:
            state = self._ack_readers.setdefault(reader, _ReaderState(self._sent))
            state.named = True
        else:
            self._named_ends += 1
            self._ack_readers.pop(reader, None)

    def _joining(self) -> bool:
        return self._connections > self._subscriptions

    def _wait_for_joins(self, deadline: float | None, at_least_one: bool = False,
                        condition: Any = None) -> bool:
        """Waits until every accepted connection subscribed (and, with ``at_least_one``,
        one did; or until ``condition()``), or the deadline."""
        sock, monitor = self._sock, self._monitor
        assert sock is not None and monitor is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while True:
            self._update_peers()
            if condition is not None:
                if condition():
                    return True
            elif self._ready() if at_least_one else not self._joining():
                return True
            slice_ms = _slice_ms(deadline)
            if not slice_ms:
                return False
            poller.poll(slice_ms)

    def send(self, data: Any) -> int:
        """Publishes ``data`` (bytes or any contiguous bytes-like object). Returns the
        number of bytes sent. Never blocks on slow subscribers (past ``sndhwm`` their
        copy is dropped); may wait up to ``join_wait_ms`` for a just-accepted subscriber's
        subscription."""
        self._check_connected()
        if self._reservation is not None:
            raise RuntimeError("a reservation is open on this socket; commit it first")
        if isinstance(data, str):
            raise TypeError("send() takes bytes-like data, not str; encode it first")
        if type(data) is bytes:
            n = len(data)
        else:
            try:
                view = memoryview(data)
            except TypeError:
                raise TypeError(
                    f"send() takes a bytes-like object, not {type(data).__name__}") from None
            if not view.contiguous:
                raise TypeError("send() needs a contiguous bytes-like object")
            n = view.nbytes
        self._send(data)
        return n

    def reserve(self, size: int) -> Reservation:
        """Room for a message of ``size`` bytes, written in place and sent at commit:
        ``with pub.reserve(n) as buf: buf[:n] = ...`` (as on the shared-memory backend)."""
        self._check_connected()
        if self._reservation is not None:
            raise RuntimeError("a reservation is already open on this socket")
        if not isinstance(size, int):
            raise TypeError(f"size must be an int, not {type(size).__name__}")
        if size < 0:
            raise ValueError("size must be >= 0")
        buffer = bytearray(size)
        reservation = BufferReservation(memoryview(buffer))
        reservation._pub, reservation._buffer = self, buffer
        self._reservation = reservation
        return reservation

    def _send(self, data: Any, copy: bool = True) -> None:
        turn = self._turn  # (_enter inline: a send is 0.7 us, each call counts)
        try:
            turn.pop()
        except IndexError:
            self._refuse()
        try:
            sock = self._check_connected()
            # Reading peer events costs ~2 us per getsockopt(EVENTS), 5x a small send: do it
            # at most once per PEER_CHECK_INTERVAL_S. libzmq itself only processes incoming
            # subscriptions about once a millisecond while sending, so a subscriber joining a
            # publisher that is streaming may miss up to that much, as with plain pyzmq; a
            # publisher that was idle always checks, and waits for just-accepted joiners.
            now = time.monotonic()
            if now >= self._next_peer_check:
                self._next_peer_check = now + PEER_CHECK_INTERVAL_S
                self._update_peers()
                if self._joining() and self.join_wait_ms > 0:
                    deadline = self._last_accept + self.join_wait_ms / 1000
                    if now < deadline:
                        self._wait_for_joins(deadline)
            try:
                sock.send(data, zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                pass  # XPUB drops at the high-water mark instead of blocking; so do we
            except zmq.ZMQError as e:
                raise IpcError(f"endpoint {self.endpoint!r}: send failed: {e.strerror}") from None
            self._sent += 1
            if self._ack_readers:  # what a reader's acknowledgement is compared with:
                if type(data) is bytes or not copy:  # unchanging: fingerprinted when asked
                    self._last_data, self._last_sent = data, None
                else:  # the caller may change it once send returns
                    self._last_data, self._last_sent = None, fingerprint(data)
        finally:
            turn.append(True)

    def all_readers_updated(self) -> bool:
        """True when at least one subscriber is connected and every connection this
        publisher accepted has subscribed (a message sent now reaches every connected
        subscriber). ZMQ cannot report what subscribers have read."""
        self._enter()
        try:
            self._update_peers()
            return self._ready()
        finally:
            self._turn.append(True)

    def _ready(self) -> bool:
        if self._subscriptions == 0 or self._joining():
            return False
        return self._all_read()

    def _all_read(self) -> bool:
        # A reader is up to date when nothing was sent since it joined, or the last
        # message it read is the last one sent.
        if self._last_data is not None:
            self._last_sent, self._last_data = fingerprint(self._last_data), None
        sent, last = self._sent, self._last_sent
        return all(r.base == sent or r.read == last for r in self._ack_readers.values())

    def wait_until_read(self, timeout: float | None = None,
                        poll_interval: float = 0.001) -> bool:
        """Blocks until ``all_readers_updated()`` (True) or ``timeout`` seconds (False;
        None waits forever). ``poll_interval`` is accepted for the protocol's sake: this
        wait sleeps on the socket's events, not in steps."""
        self._enter()
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            return self._wait_for_joins(deadline, at_least_one=True)
        finally:
            self._turn.append(True)

    def wait_for_readers(self, timeout: float = 1.0, interval: float = 0.001) -> None:
        """Upstream's wait (seconds): returns once ``all_readers_updated()``, raises
        TimeoutError after ``timeout``."""
        if not self.wait_until_read(timeout, interval):
            raise readers_timeout(self.endpoint, timeout, self._readers)

    @property
    def num_readers(self) -> int:
        """Connected subscribers (connections subscribed to every message)."""
        self._enter()
        try:
            self._update_peers()
            return self._readers
        finally:
            self._turn.append(True)

    @property
    def refused_connections(self) -> int:
        """Connections refused since ``connect``: failed CURVE handshakes (no keys, another
        server key, not ZMQ) and clients its permissions refuse."""
        if self._sock is not None and self._pid == _context._process_id and self._turn:
            try:  # (while another thread has the turn: the count as it stands)
                self._turn.pop()
            except IndexError:
                return self._refused
            try:
                if self._sock is not None:
                    self._update_peers()
            finally:
                self._turn.append(True)
        return self._refused

    def _close_socket(self) -> None:
        # A new publisher of the endpoint in this process can bind at once after close():
        # this waits for ZMQ to release the port.
        if self._reservation is not None:
            self._reservation.abort()
        sock, monitor = self._sock, self._monitor
        self._sock = self._monitor = None
        if sock is None or self._pid != os.getpid():
            return  # a forked child must not touch the parent's ZMQ state
        if self._decide is not None and self.endpoint is not None:
            _unregister_zap(sock.context, self.endpoint, self._decide)
            self._decide = None
        # No unbind(): it drops messages still queued for subscribers. The listener goes
        # away in ZMQ's I/O thread shortly after close(); connect() of a new publisher
        # retries for that long (see _released_ports).
        if self.linger and self._ack_readers:
            # A subscriber's read acknowledgement that reaches a closed publisher makes
            # libzmq end that connection before what is still queued for it went out
            # (its input stops, then the whole connection). So first wait, within the
            # linger, for the readers to have read everything (their last acknowledgement
            # then came while the socket was open), reading their acknowledgements.
            self._sock, self._monitor = sock, monitor
            try:
                deadline = time.monotonic() + self.linger / 1000
                if _context.exit_deadline is not None:  # exiting: one linger for all
                    deadline = min(deadline, _context.exit_deadline)
                self._wait_for_joins(deadline, condition=self._all_read)
            except zmq.ZMQError:
                pass
            finally:
                self._sock = self._monitor = None
        _close_monitor(sock, monitor)
        sock.close()
        if self.port is not None:
            _released_ports[self.port] = time.monotonic() + _RELEASE_WAIT_S + self.linger / 1000

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
