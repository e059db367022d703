"""VisionIpcClient: receives the frames of one stream of a VisionIPC server.

``connect`` subscribes to the stream's msgq endpoint first (so no packet sent after it is
missed), then asks the server for the stream's buffers over its Unix socket and maps them
read-only. ``recv`` reads the next packet and returns the buffer it names.

Restarts: every packet carries the id of the server instance that sent it. A packet with
an id other than the connected server's makes the client handshake again; if the server
now answering has that id, the client swaps its buffers for the new server's (the old ones
are released) and goes on. Packets of an instance known to be gone are skipped. So a
client outlives any number of server restarts without being told, and ``recv`` keeps
returning frames; a geometry change on restart shows in the client's properties.

Recycled buffers: as upstream, ``recv`` returns the buffer a packet names and sets
``frame_id`` (and the timestamps) to what that packet announced, even when the server has
already refilled the buffer with a later frame (a client that fell behind a small pool).
``VisionBuf.is_current()`` is the way to tell: False when the buffer no longer holds the
frame this receive announced (counted in ``recycled_frames``). ``skip_recycled=True``
makes ``recv`` skip such frames instead (counted in ``skipped_frames``).

Bad input never raises from ``recv``: a packet that is not well formed, names a buffer that
does not exist or a frame its buffer never held, or comes from a server instance that is
gone is skipped and counted
(``bad_packets``, ``stale_packets``); a failed handshake after a restart is kept in
``last_error`` and retried on a later packet.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from types import TracebackType
from typing import Any

import msgq

from .buffer import BufferGeometry, BufferImportError, VisionBuf, map_received_buffer
from .handshake import (
    KIND_BUFFERS,
    KIND_LIST,
    BuffersReply,
    HandshakeError,
    ListReply,
    ServerUnavailableError,
    close_fds,
    exchange,
)
from .names import get_endpoint_name, socket_path, validate_name, validate_stream
from .packet import PACKET_SEGMENT_SIZE, parse_frame_packet

__all__ = ["VisionIpcClient", "available_streams"]

#: Pause between connection attempts while waiting for a server (s).
CONNECT_RETRY_S = 0.02
#: Default limit of one handshake (s).
HANDSHAKE_TIMEOUT_S = 2.0
#: After a failed handshake with a restarted server, wait this long before the next try.
FOLLOW_RETRY_S = 0.05
#: Server ids remembered as gone.
DEAD_SERVERS_KEPT = 16


class _ClientResources:
    """What a client must give back, apart from the client (for its finalizer)."""

    def __init__(self) -> None:
        self.sock: Any = None
        self.buffers: list[VisionBuf] = []
        self.fds: tuple[int, ...] = ()

    def drop_buffers(self) -> None:
        buffers, self.buffers = self.buffers, []
        fds, self.fds = self.fds, ()
        for buf in buffers:
            buf._release()
        close_fds(fds)

    def close(self) -> None:
        self.drop_buffers()
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except Exception:  # noqa: BLE001 - closing a socket must not stop the cleanup
                pass


def _import_buffers(reply: BuffersReply) -> list[VisionBuf]:
    """Maps the buffers of a reply; closes its fds on failure (HandshakeError)."""
    buffers: list[VisionBuf] = []
    try:
        for idx, fd in enumerate(reply.fds):
            buffers.append(
                VisionBuf(idx, fd, map_received_buffer(fd, reply.geometry), reply.geometry)
            )
    except BaseException as e:
        for buf in buffers:
            buf._release()
        close_fds(reply.fds)
        if isinstance(e, BufferImportError):
            raise HandshakeError(str(e)) from None
        raise
    return buffers


class VisionIpcClient:
    """A client of stream ``stream`` of VisionIPC server ``name``; ``conflate`` keeps only
    the newest frame.

    Properties: the geometry (``width``, ``height``, ``stride``, ``uv_offset``,
    ``buffer_len``, ``num_buffers``; None until connected) and the last received frame's
    ``frame_id``, ``timestamp_sof``, ``timestamp_eof`` and ``valid`` (as announced for that
    receive; ``VisionBuf.is_current()`` tells whether the buffer still holds that frame).
    ``skip_recycled``: skip frames whose buffer was refilled before they were received
    instead of returning them. ``handshake_timeout_s``: seconds one handshake may take.
    """

    def __init__(
        self,
        name: str,
        stream: int,
        conflate: bool = False,
        *,
        skip_recycled: bool = False,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self.name = validate_name(name)
        self.stream = validate_stream(stream)
        self.conflate = bool(conflate)
        self.skip_recycled = bool(skip_recycled)
        self.handshake_timeout_s = float(handshake_timeout_s)
        self._res = _ClientResources()
        self._finalizer = weakref.finalize(self, self._res.close)
        self._closed = False
        self._server_id = 0
        self._geometry: BufferGeometry | None = None
        self._dead_servers: deque[int] = deque(maxlen=DEAD_SERVERS_KEPT)
        self._follow_retry_at = 0.0
        self.frame_id = 0
        self.timestamp_sof = 0
        self.timestamp_eof = 0
        self.valid = False
        #: Packets on the endpoint that were not well formed, or named no buffer.
        self.bad_packets = 0
        #: Packets of a server instance that is gone (or not reachable yet).
        self.stale_packets = 0
        #: Frames returned whose buffer the server had already refilled (is_current False).
        self.recycled_frames = 0
        #: Frames skipped (``skip_recycled``) because their buffer had been refilled.
        self.skipped_frames = 0
        #: Handshakes with a new server instance after the first connect.
        self.reconnects = 0
        #: The last handshake failure recv() swallowed (None if none).
        self.last_error: Exception | None = None

    # --- connection --------------------------------------------------------------------

    def connect(self, blocking: bool = True) -> bool:
        """Connects to the server: waits for it when ``blocking`` (Ctrl-C interrupts),
        else returns False at once when it is not there (or has no such stream yet).
        Raises HandshakeError (NotAllowedError: permission) when a server answers but
        the exchange breaks the protocol."""
        self._check_open()
        if self._res.sock is None:
            self._res.sock = msgq.sub_sock(
                get_endpoint_name(self.name, self.stream),
                conflate=self.conflate,
                segment_size=PACKET_SEGMENT_SIZE,
            )
        while True:
            try:
                self._handshake(self.handshake_timeout_s)
                return True
            except ServerUnavailableError:
                if not blocking:
                    return False
            time.sleep(CONNECT_RETRY_S)

    def _handshake(self, timeout_s: float) -> None:
        reply = exchange(socket_path(self.name), KIND_BUFFERS, self.stream, timeout_s)
        if not isinstance(reply, BuffersReply):  # exchange() answers the kind asked for
            raise HandshakeError("the server answered another request")
        buffers = _import_buffers(reply)
        old_id = self._server_id
        self._res.drop_buffers()
        self._res.buffers = buffers
        self._res.fds = reply.fds
        self._geometry = reply.geometry
        self._server_id = reply.server_id
        if old_id and old_id != reply.server_id:
            self.reconnects += 1
            self._dead_servers.append(old_id)

    @staticmethod
    def available_streams(name: str, block: bool = False) -> set[int]:
        """The stream ids server ``name`` has buffers for (upstream's static method; the
        module function :func:`available_streams` is the same)."""
        return available_streams(name, block)

    def is_connected(self) -> bool:
        """True once the client holds a server's buffers."""
        return self._server_id != 0 and not self._closed

    @property
    def server_id(self) -> int:
        """The id of the server instance whose buffers the client holds (0: none)."""
        return self._server_id

    def _follow_restart(self, server_id: int, deadline: float | None) -> bool:
        """Handshakes again after a packet of server instance ``server_id`` arrived; True
        when the client now holds that instance's buffers."""
        if server_id in self._dead_servers:
            return False
        now = time.monotonic()
        if now < self._follow_retry_at:
            return False
        timeout = self.handshake_timeout_s
        if deadline is not None:
            timeout = min(timeout, max(deadline - now, FOLLOW_RETRY_S))
        try:
            self._handshake(timeout)
        except HandshakeError as e:
            self.last_error = e
            self._follow_retry_at = time.monotonic() + FOLLOW_RETRY_S
            return False
        if self._server_id != server_id:
            self._dead_servers.append(server_id)  # an instance older than the one serving
            return False
        return True

    # --- receiving ---------------------------------------------------------------------

    def recv(self, timeout_ms: float | None = 100) -> VisionBuf | None:
        """The buffer of the next frame (the newest, when conflating), or None when none
        arrived within ``timeout_ms`` (None or negative: wait as long as it takes). Sets
        ``frame_id``, ``timestamp_sof``, ``timestamp_eof`` and ``valid``. Connects first
        (within the same time limit) when not connected."""
        self._check_open()
        deadline = None
        if timeout_ms is not None and timeout_ms >= 0:
            deadline = time.monotonic() + timeout_ms / 1000.0
        if not self._server_id and not self._connect_until(deadline):
            return None
        sock = self._res.sock
        while True:
            if deadline is None:
                sock.setTimeout(-1)
            else:
                sock.setTimeout(max(0, int((deadline - time.monotonic()) * 1000.0 + 0.999)))
            msg = sock.receive()
            if msg is None:
                return None
            packet = parse_frame_packet(msg)
            if packet is None:
                self.bad_packets += 1
                continue
            if packet.server_id != self._server_id and not self._follow_restart(
                packet.server_id, deadline
            ):
                self.stale_packets += 1
                continue
            buffers = self._res.buffers
            if packet.buffer_index >= len(buffers):
                self.bad_packets += 1
                continue
            buf = buffers[packet.buffer_index]
            held = buf.sequence  # 0 while the server refills the buffer
            if held != packet.sequence:
                if held != 0 and held < packet.sequence:
                    # a frame the buffer never held: the server fills before it announces
                    self.bad_packets += 1
                    continue
                if self.skip_recycled:
                    self.skipped_frames += 1
                    continue
                self.recycled_frames += 1
            buf._recv_sequence = packet.sequence
            self.frame_id = packet.frame_id
            self.timestamp_sof = packet.timestamp_sof
            self.timestamp_eof = packet.timestamp_eof
            self.valid = packet.valid
            return buf

    def _connect_until(self, deadline: float | None) -> bool:
        while True:
            try:
                if self.connect(blocking=False):
                    return True
            except HandshakeError as e:
                self.last_error = e
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                time.sleep(min(CONNECT_RETRY_S, remaining))
            else:
                time.sleep(CONNECT_RETRY_S)

    # --- geometry ----------------------------------------------------------------------

    @property
    def width(self) -> int | None:
        """Width of the stream's frames (None until connected)."""
        return self._geometry.width if self._geometry else None

    @property
    def height(self) -> int | None:
        """Height of the stream's frames (None until connected)."""
        return self._geometry.height if self._geometry else None

    @property
    def stride(self) -> int | None:
        """Bytes from one row to the next (None until connected)."""
        return self._geometry.stride if self._geometry else None

    @property
    def uv_offset(self) -> int | None:
        """Offset of the UV plane (None until connected)."""
        return self._geometry.uv_offset if self._geometry else None

    @property
    def buffer_len(self) -> int | None:
        """Bytes of a frame (None until connected)."""
        return self._geometry.size if self._geometry else None

    @property
    def num_buffers(self) -> int:
        """How many buffers the server has for the stream (0 until connected)."""
        return len(self._res.buffers)

    @property
    def buffers(self) -> list[VisionBuf]:
        """The stream's buffers, in index order (empty until connected)."""
        return list(self._res.buffers)

    # --- life cycle --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise msgq.IpcError(f"VisionIPC client of {self.name!r} stream {self.stream} is closed")

    def close(self) -> None:
        """Unsubscribes and releases the buffers (idempotent)."""
        self._closed = True
        self._server_id = 0
        self._geometry = None
        self._finalizer()

    def __enter__(self) -> VisionIpcClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "connected" if self.is_connected() else "not connected"
        return f"<VisionIpcClient {self.name!r} stream {self.stream} {state}>"


def available_streams(name: str, block: bool = False) -> set[int]:
    """The stream ids server ``name`` has buffers for. Waits for the server to come up
    when ``block``, else returns an empty set when it is not there."""
    validate_name(name)
    while True:
        try:
            reply = exchange(socket_path(name), KIND_LIST, 0, HANDSHAKE_TIMEOUT_S)
        except ServerUnavailableError:
            if not block:
                return set()
        else:
            if not isinstance(reply, ListReply):  # exchange() answers the kind asked for
                raise HandshakeError("the server answered another request")
            return set(reply.streams)
        time.sleep(CONNECT_RETRY_S)
