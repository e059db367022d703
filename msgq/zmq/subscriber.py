"""The ZMQ subscriber: a SUB socket connected to the publisher's port, dropping what no
publisher of its endpoint sent, and acknowledging what it has read."""

from __future__ import annotations

import asyncio
import os
import time
from functools import partial
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from msgq.aio import await_until, next_message, wait_for_result
from msgq.zmq.context import (
    _close_monitor,
    _new_socket,
    _OneThreadAtATime,
    _open_monitor,
    _wait_monitor,
)
from msgq.zmq.options import (
    _RECONNECT_IVL_MAX_MS,
    _RECONNECT_IVL_MS,
    _RELINK_S,
    DEFAULT_CONNECT_WAIT_MS,
    DEFAULT_LINGER_MS,
    DEFAULT_RCVHWM,
    _option,
    _slice_ms,
    log,
)
from msgq.zmq.ports import ENDPOINT_PROPERTY, _endpoint_tag, _tcp_host
from msgq.zmq.reads import ACK_TOPIC, BYE_TOPIC, READER_PROPERTY, READER_TOPIC, fingerprint
from msgq.zmq.security import (
    _HANDSHAKE_FAILED,
    handshake_problem,
    keys_setting,
    load_keys,
    make_curve_client,
)


class SubSocket(_OneThreadAtATime):
    """One subscriber of an endpoint: a SUB socket connected to the publisher's port.

    Options: ``rcvhwm`` (messages queued before newer ones are dropped), ``linger`` (ms),
    ``connect_wait_ms`` (how long ``connect`` waits for a running publisher to answer),
    ``keys`` (a key directory, ``MSGQ_ZMQ_KEYS``: the subscriber is then a CURVE client
    that accepts only the publisher key there; ``""``: none) and ``client`` (its client
    key, ``MSGQ_ZMQ_CLIENT``).
    """

    def __init__(
        self,
        *,
        rcvhwm: int | None = None,
        linger: int | None = None,
        connect_wait_ms: int | None = None,
        keys: str | os.PathLike[str] | None = None,
        client: str | None = None,
    ) -> None:
        self.rcvhwm = _option(rcvhwm, "MSGQ_ZMQ_RCVHWM", DEFAULT_RCVHWM)
        self.linger = _option(linger, "MSGQ_ZMQ_LINGER", DEFAULT_LINGER_MS)
        self.connect_wait_ms = _option(
            connect_wait_ms, "MSGQ_ZMQ_CONNECT_WAIT_MS", DEFAULT_CONNECT_WAIT_MS)
        #: The key directory in force (None: no keys, upstream's open socket).
        self.keys_dir = keys_setting(keys)
        self.client = client
        self.endpoint: str | None = None
        self.address: str | None = None
        self.port: int | None = None
        #: Messages dropped because they did not come from a publisher of this endpoint.
        self.dropped_messages = 0
        #: Failed handshakes with the publisher (refused keys, a publisher without or with
        #: other keys); the first is logged with its reason.
        self.failed_handshakes = 0
        self._monitor: zmq.Socket | None = None
        self._handshake_said = False
        self._keyed = False
        self._conflate = False
        self._sock: zmq.Socket | None = None
        self._tag = ""
        self._timeout_ms = -1
        self._stash: bytes | zmq.Frame | None = None  # taken ahead (Poller, receive_into)
        self._lent: bytes | zmq.Frame | None = None  # see FrameView.keep_readable
        # Read acknowledgements: this subscriber's reader id, the last message read and
        # not yet acknowledged, and the fingerprint last acknowledged.
        self._reader_id = b""
        self._unacked: bytes | zmq.Frame | None = None
        self._acked: int | None = None
        self._pid = 0
        self._warned = False
        self._url = ""
        # Set when a peer that is not a ZMQ 4 publisher spoke on the port: libzmq ends such
        # a connection for good after a protocol error, so while nothing valid arrives the
        # socket connects again (at most every _RELINK_S) to reach a publisher that binds
        # the port later.
        self._foreign_link = False
        self._next_relink = 0.0
        # Held by the one thread inside a receive, a Poller's poll, connect or close.
        self._init_guard()

    def connect(
        self,
        context: Any,
        endpoint: str,
        address: bytes | str = b"127.0.0.1",
        conflate: bool = False,
        segment_size: int = 0,
    ) -> None:
        """Connects to the publisher of ``endpoint`` at ``address`` (a host name or IP of
        the publisher's machine). Returns once a running publisher answered, or at once
        when none listens yet (ZMQ keeps retrying in the background)."""
        if isinstance(address, bytes):
            address = address.decode("utf-8")
        if not isinstance(address, str):
            raise TypeError(f"address must be str or bytes, not {type(address).__name__}")
        if not address or any(c.isspace() for c in address) or "/" in address:
            raise ValueError(f"address {address!r} is not a host name or IP address")
        keys = load_keys(self.keys_dir, self.client) if self.keys_dir else None
        if keys is not None:
            keys.client_keys_or_raise()
        self._claim()
        try:
            self._connect(context, endpoint, address, conflate, segment_size, keys)
        finally:
            self._turn.append(True)

    def _connect(self, context: Any, endpoint: str, address: str, conflate: bool,
                 segment_size: int, keys: Any) -> None:
        name, port, sock = _new_socket(context, endpoint, segment_size, zmq.SUB, self.linger)
        self._close_socket()
        monitor = None
        self.failed_handshakes = 0
        self._handshake_said = False
        try:
            if keys is not None:
                make_curve_client(sock, keys)
            sock.setsockopt(zmq.RCVHWM, self.rcvhwm)
            sock.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_IVL_MS)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, _RECONNECT_IVL_MAX_MS)
            if conflate:
                sock.setsockopt(zmq.CONFLATE, 1)
            if ":" in address:
                sock.setsockopt(zmq.IPV6, 1)
            reader_id = os.urandom(8).hex().encode("ascii")
            sock.setsockopt(zmq.METADATA, READER_PROPERTY.encode("ascii") + b":" + reader_id)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            if not conflate:
                sock.setsockopt(zmq.SUBSCRIBE, READER_TOPIC + reader_id)
            # The monitor stays: a failed handshake is read from it (and said once) when
            # nothing arrives.
            monitor = _open_monitor(
                sock, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED | _HANDSHAKE_FAILED)
            try:
                url = f"tcp://{_tcp_host(address)}:{port}"
                sock.connect(url)
            except zmq.ZMQError as e:
                raise ValueError(f"endpoint {name!r}: cannot connect to {address!r} port "
                                 f"{port}: {e.strerror}; check the address") from None
            self.endpoint, self.address, self.port = name, address, port
            self._monitor, self._keyed = monitor, keys is not None
            if self.connect_wait_ms > 0:
                deadline = time.monotonic() + self.connect_wait_ms / 1000
                event = _wait_monitor(
                    monitor, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED
                    | _HANDSHAKE_FAILED, deadline, self._handshake_failed)
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    sock.getsockopt(zmq.EVENTS)  # let the socket attach the new connection
        except BaseException:
            self._monitor = None
            _close_monitor(sock, monitor)
            sock.close(0)
            raise
        self._sock = sock
        self._pid = os.getpid()
        self._conflate = bool(conflate)
        self._tag = _endpoint_tag(name)
        self._url = url
        self._reader_id, self._unacked, self._acked = reader_id, None, None
        self._foreign_link = False
        self.endpoint, self.address, self.port = name, address, port

    @property
    def conflate(self) -> bool:
        """True when only the newest message is kept."""
        return self._conflate

    def setTimeout(self, timeout: int | None) -> None:  # noqa: N802 (upstream name)
        """Timeout of a blocking ``receive`` in milliseconds; negative or None: forever."""
        self._timeout_ms = -1 if timeout is None or timeout < 0 else int(timeout)

    _role = "subscriber"
    _busy_doing = "receiving or polling"

    def _forget_parent(self) -> None:
        super()._forget_parent()
        self._stash = self._unacked = None  # (_lent stays: a decoder may point into it)

    def _handshake_failed(self, event: int, value: int) -> None:
        self.failed_handshakes += 1
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            # libzmq gives up on a peer that broke the protocol (a forged or keyless
            # publisher): connect again (at most every _RELINK_S) to reach the real one.
            self._foreign_link = True
        if not self._handshake_said:
            self._handshake_said = True
            log.warning("endpoint %r at %s:%s: %s (further failures are counted in "
                        "failed_handshakes, not logged)", self.endpoint, self.address,
                        self.port, handshake_problem(event, value, self._keyed, "subscriber"))

    def _check_handshakes(self) -> None:
        """Reads the connection events that came; says the first failed handshake."""
        monitor = self._monitor
        if monitor is None:
            return
        while monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            message = parse_monitor_message(monitor.recv_multipart())
            if message["event"] & _HANDSHAKE_FAILED:
                self._handshake_failed(int(message["event"]), int(message["value"]))

    def _drop(self, why: str) -> None:
        self.dropped_messages += 1
        if not self._warned:
            self._warned = True
            log.warning("endpoint %r: dropped a message from %s:%s: %s (counted in "
                        "dropped_messages; further drops are not logged)",
                        self.endpoint, self.address, self.port, why)

    def _recv_one(self, sock: zmq.Socket) -> zmq.Frame | None:
        """One valid message (its frame, not copied) if one is queued, else None."""
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            if frame.more:
                while sock.getsockopt(zmq.RCVMORE):
                    sock.recv(zmq.NOBLOCK, copy=False)
                self._drop("a multi-part message (msgq messages are one frame)")
                continue
            # One metadata lookup per message from a msgq publisher: its endpoint tag (a
            # tag implies ZMTP 3 metadata). Only untagged messages ask for more.
            try:
                origin = frame.get(ENDPOINT_PROPERTY)
            except zmq.ZMQError:
                try:
                    frame.get("Socket-Type")
                except zmq.ZMQError:
                    # No ZMTP 3 metadata: a legacy ZMTP 1.0 peer, or a byte stream that
                    # libzmq parsed as one (anything listening on the port that is not ZMQ).
                    self._drop("a peer that is not a ZMQ 4 publisher")
                    self._foreign_link = True
                    continue
                return frame  # a foreign ZMQ 4 publisher: no tag, delivered as is
            if origin != self._tag:
                self._drop(f"a publisher of endpoint {origin!r} (names hashed to one port)")
                continue
            return frame

    def _relink(self, sock: zmq.Socket) -> None:
        """Connects again after a peer that is not a ZMQ publisher spoke on the port (see
        ``_foreign_link``); at most once per _RELINK_S."""
        now = time.monotonic()
        if now < self._next_relink:
            return
        self._next_relink = now + _RELINK_S
        self._foreign_link = False
        try:
            sock.disconnect(self._url)
        except zmq.ZMQError:
            pass  # libzmq already dropped the endpoint
        sock.connect(self._url)

    def _wait(self, sock: zmq.Socket, deadline: float | None) -> bool:
        """Waits for input until ``deadline`` (None: no limit); False when it passed."""
        while True:
            slice_ms = _slice_ms(deadline)
            if not slice_ms:  # (input that came during the last fraction counts)
                return bool(sock.poll(0, zmq.POLLIN))
            if sock.poll(slice_ms, zmq.POLLIN):
                return True
            self._check_handshakes()
            if self._foreign_link:
                self._relink(sock)

    def _next(self, sock: zmq.Socket, non_blocking: bool) -> bytes | zmq.Frame | None:
        """The next message: a stashed one (bytes) or a received frame; None when there
        is none (non-blocking) or the timeout passed. (Callers hold the turn.)"""
        if self._stash is not None:
            msg, self._stash = self._stash, None
            if self._conflate:  # a newer message may have come after the stashed one
                newer = self._recv_one(sock)
                return msg if newer is None else newer
            return msg
        # One deadline for the whole call: input that is dropped (foreign or malformed)
        # must not extend the timeout.
        deadline = None if self._timeout_ms < 0 else time.monotonic() + self._timeout_ms / 1000
        while True:
            frame = self._recv_one(sock)
            if frame is not None:
                return frame
            if self._unacked is not None:  # everything that arrived has been read
                self._acknowledge(sock)
            self._check_handshakes()
            if self._foreign_link:
                self._relink(sock)
            if non_blocking or self._timeout_ms == 0 or not self._wait(sock, deadline):
                return None

    def _read(self, sock: zmq.Socket, msg: bytes | zmq.Frame) -> None:
        """Notes ``msg`` as read by the caller; once nothing more is queued the
        publisher is told (a read acknowledgement: see ``ACK_TOPIC``). Whether more is
        queued is learnt by taking the next message ahead into the stash: free while
        messages stream (the next receive takes it from there), one look at an empty
        queue otherwise."""
        self._unacked = msg
        if self._stash is not None:
            return
        ahead = self._recv_one(sock)
        if ahead is None:
            self._acknowledge(sock)
        else:
            self._stash = ahead

    def _acknowledge(self, sock: zmq.Socket) -> None:
        msg, self._unacked = self._unacked, None
        assert msg is not None
        read = fingerprint(msg if isinstance(msg, bytes) else msg.buffer)
        if read == self._acked:
            return
        self._acked = read
        # Subscribing and unsubscribing at once filters nothing; a conflating socket
        # keeps only the last message it sends upstream, the unsubscription, which
        # carries the same acknowledgement.
        topic = ACK_TOPIC + self._reader_id + read.to_bytes(8, "little")
        sock.setsockopt(zmq.SUBSCRIBE, topic)
        sock.setsockopt(zmq.UNSUBSCRIBE, topic)

    def receive(self, non_blocking: bool = False) -> bytes | None:
        """Returns the next message as ``bytes``, or None when there is none
        (non-blocking) or the timeout passed. A ZMQ socket serves one thread at a time:
        IpcError while another thread is inside a call on it."""
        turn = self._turn  # (_enter inline: the hot path)
        try:
            turn.pop()
        except IndexError:
            self._refuse()
        try:
            sock = self._check_connected()
            msg = self._next(sock, non_blocking)
            if msg is None:
                return None
            self._read(sock, msg)
        finally:
            turn.append(True)
        return msg if isinstance(msg, bytes) else msg.bytes

    async def receive_async(self) -> bytes | None:
        """``await sub.receive_async()``: the next message, or None when the socket's
        timeout (ms) passes first. The task sleeps on the socket's descriptor in the
        event loop meanwhile; cancelling it loses no message."""
        msg = self.receive(non_blocking=True)
        if msg is not None:
            return msg
        loop = asyncio.get_running_loop()
        deadline = None if self._timeout_ms < 0 else loop.time() + self._timeout_ms / 1000
        return await wait_for_result(
            loop, partial(self.receive, non_blocking=True),
            partial(wait_readable_async, loop, [self]), deadline)

    def __aiter__(self) -> SubSocket:
        return self

    async def __anext__(self) -> bytes:
        """``async for msg in sub``: every message (timeouts do not end the loop; closing
        the socket does)."""
        return await next_message(self, lambda: self._sock is not None)

    def receive_view(self, non_blocking: bool = False) -> FrameView:
        """The next message without a copy: ``with sub.receive_view() as view:`` gives a
        read-only memoryview of the received frame (None as ``receive``). The frame is
        this process's own, so it is never overwritten (no MessageOverwritten here)."""
        self._check_connected()
        return FrameView(self, non_blocking)

    def receive_into(self, buffer: Any, non_blocking: bool = False) -> int | None:
        """Copies the next message into ``buffer`` (a writable bytes-like object) and
        returns its size, or None as ``receive``. A buffer too small raises ValueError and
        keeps the message for the next receive."""
        try:
            view = memoryview(buffer)
        except TypeError:
            raise TypeError("receive_into() needs a writable contiguous buffer") from None
        if view.readonly or not view.contiguous:
            raise TypeError("receive_into() needs a writable contiguous buffer")
        view = view.cast("B")
        sock = self._enter()
        try:
            frame = self._next(sock, non_blocking)
            if frame is None:
                return None
            msg = frame if isinstance(frame, bytes) else frame.bytes
            if len(msg) > len(view):
                self._stash = msg
                raise ValueError(f"message of {len(msg)} bytes does not fit a buffer of "
                                 f"{len(view)} bytes; the message stays queued")
            view[: len(msg)] = msg
            self._read(sock, msg)
        finally:
            self._turn.append(True)
        return len(msg)

    def has_data(self) -> bool:
        """True when a message is waiting (it may still be dropped as invalid)."""
        sock = self._enter()
        try:
            return self._stash is not None or bool(sock.poll(0, zmq.POLLIN))
        finally:
            self._turn.append(True)

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        monitor, self._monitor = self._monitor, None
        self._stash = None
        if sock is not None and self._pid == os.getpid():
            if self._conflate:  # nothing else tells the publisher which reader left
                try:
                    sock.setsockopt(zmq.SUBSCRIBE, BYE_TOPIC + self._reader_id)
                except zmq.ZMQError:
                    pass
            _close_monitor(sock, monitor)
            sock.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


async def wait_readable_async(loop: asyncio.AbstractEventLoop, socks: list[SubSocket],
                              deadline: float | None = None) -> None:
    """Returns once any of ``socks`` may have input, or at ``deadline`` (the loop's clock;
    None: no limit): the loop watches their ZMQ descriptors (edge-triggered, so their
    events are read before sleeping). Cancellable."""
    zsocks = []
    for sock in socks:
        zsock = sock._check_connected()
        if sock._stash is not None or zsock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return
        zsocks.append(zsock)
    woken = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    fds = [zsock.getsockopt(zmq.FD) for zsock in zsocks]
    for fd in fds:
        loop.add_reader(fd, wake)
    try:
        # Input that came between the check above and add_reader left the descriptor
        # readable, so the loop sees it; looking again costs little and is certain.
        if any(zsock.getsockopt(zmq.EVENTS) & zmq.POLLIN for zsock in zsocks):
            return
        await await_until(loop, woken, deadline)
    finally:
        for fd in fds:
            loop.remove_reader(fd)


def _address(buffer: memoryview) -> int:
    """Where ``buffer``'s bytes start in memory."""
    # Imported here: numpy costs 0.15 s at start-up and only views need an address.
    import numpy as np

    return int(np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0])


class FrameView:
    """The context manager of :meth:`SubSocket.receive_view` on ZMQ: the frame is
    received when the block is entered, its read-only memoryview released at the end."""

    def __init__(self, sock: SubSocket, non_blocking: bool) -> None:
        self._sock = sock
        self._non_blocking = non_blocking
        self._msg: bytes | zmq.Frame | None = None
        self._view: memoryview | None = None

    def __enter__(self) -> memoryview | None:
        owner = self._sock
        sock = owner._enter()
        try:
            self._msg = owner._next(sock, self._non_blocking)
            if self._msg is None:
                return None
            owner._read(sock, self._msg)
        finally:
            owner._turn.append(True)
        msg = self._msg
        if not isinstance(msg, bytes) and _address(msg.buffer) % 8:
            # Cap'n Proto readers need word-aligned bytes, libzmq frames need not be: an
            # unaligned frame is copied once (bytes objects are aligned).
            msg = self._msg = msg.bytes
        self._view = memoryview(msg if isinstance(msg, bytes) else msg.buffer).toreadonly()
        return self._view

    def keep_readable(self) -> None:
        """Keeps the frame alive until the socket's next view, for a decoder that keeps
        raw pointers into it without holding a buffer (pycapnp's readers)."""
        self._sock._lent = self._msg

    def __exit__(self, *exc: object) -> bool:
        if self._view is not None:
            try:
                self._view.release()
            except BufferError:
                pass  # something holds a buffer of it: the frame lives on with it
            self._view = None
        return False
