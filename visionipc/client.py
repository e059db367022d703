"""VisionIpcClient: receives the frames of one stream of a VisionIPC server.

``connect`` subscribes to the stream's msgq endpoint first (so no packet sent after it is
missed), then asks the server for the stream's buffers over its Unix socket and maps them
read-only. ``recv`` reads the next packet and returns the buffer it names.

The client is the C library's (``src/vipc_client.c``, ``visionipc.h``, bound in
``_native.pyx``): the exchange, the checks of the server's uid, of the reply and of every
fd, the packet checks, following restarts and telling recycled frames. This module adds
the Python API: the packets come from a msgq socket of the selected backend and go to the
C client one by one, and numpy views of the buffers are this process's own mappings of
the fds the C client holds.

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
from types import TracebackType
from typing import Any

import msgq

from . import _native
from .buffer import BufferGeometry, VisionBuf, map_buffer
from .handshake import HandshakeError, handshake_error
from .names import get_endpoint_name, socket_path, validate_name, validate_stream
from .packet import PACKET_SEGMENT_SIZE

__all__ = ["VisionIpcClient", "available_streams"]

#: Pause between connection attempts while waiting for a server (s).
CONNECT_RETRY_S = 0.02
#: Default limit of one handshake (s).
HANDSHAKE_TIMEOUT_S = 2.0


class _ClientResources:
    """What a client must give back, apart from the client (for its finalizer)."""

    def __init__(self, native: _native.Client) -> None:
        self.native = native
        self.sock: Any = None
        self.buffers: list[VisionBuf] = []
        self.geometry: BufferGeometry | None = None  # of the buffers held
        self.generation = 0  # the native client's, when the buffers were mapped

    def drop_buffers(self) -> None:
        buffers, self.buffers = self.buffers, []
        self.geometry = None
        for buf in buffers:
            buf._release()

    def adopt_buffers(self) -> None:
        """Maps the buffers the C client holds now, when they changed (a connect, a
        restart followed)."""
        generation = self.native.generation
        if generation == self.generation:
            return
        fields, fds = self.native.buffers()
        geometry = BufferGeometry(*fields)
        buffers = [
            VisionBuf(idx, fd, map_buffer(fd, geometry.map_size, False), geometry)
            for idx, fd in enumerate(fds)
        ]
        self.drop_buffers()
        self.buffers = buffers
        self.geometry = geometry
        self.generation = generation

    def close(self) -> dict[str, int]:
        counters = self.native.stats
        self.drop_buffers()
        self.native.close()
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except Exception:  # noqa: BLE001 - closing a socket must not stop the cleanup
                pass
        return counters


class _Counter:
    """A read-only counter of the C client (``vipc_client_stats``), by attribute name;
    after ``close`` the last values."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, client: Any, owner: type | None = None) -> Any:
        return self if client is None else client._counter(self.name)


class VisionIpcClient:
    """A client of stream ``stream`` of VisionIPC server ``name``; ``conflate`` keeps only
    the newest frame.

    Properties: the geometry (``width``, ``height``, ``stride``, ``uv_offset``,
    ``buffer_len``, ``num_buffers``; None until connected) and the last received frame's
    ``frame_id``, ``timestamp_sof``, ``timestamp_eof`` and ``valid`` (as announced for that
    receive; ``VisionBuf.is_current()`` tells whether the buffer still holds that frame).
    ``skip_recycled``: skip frames whose buffer was refilled before they were received
    instead of returning them. ``handshake_timeout_s``: seconds one handshake may take.

    Counters: ``bad_packets`` (packets on the endpoint that were not well formed, named
    no buffer, or a frame their buffer never held), ``stale_packets`` (of a server
    instance that is gone, or not reachable yet), ``recycled_frames`` (returned although
    their buffer had been refilled: ``is_current()`` False), ``skipped_frames``
    (``skip_recycled``), ``reconnects`` (handshakes with a new server instance).
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
        native = _native.Client(
            self.name, self.stream, self.conflate, self.skip_recycled, self.handshake_timeout_s
        )
        self._res = _ClientResources(native)
        self._finalizer = weakref.finalize(self, self._res.close)
        self._closed = False
        self._final_counters: dict[str, int] = {}
        self.frame_id = 0
        self.timestamp_sof = 0
        self.timestamp_eof = 0
        self.valid = False
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
            # Subscribed before the handshake: no frame announced after it is missed.
            self._res.sock = msgq.sub_sock(
                get_endpoint_name(self.name, self.stream),
                conflate=self.conflate,
                segment_size=PACKET_SEGMENT_SIZE,
            )
        while True:
            code = self._res.native.handshake(self.handshake_timeout_s)
            if code == 0:
                self._res.adopt_buffers()
                return True
            if code not in _native.UNAVAILABLE:
                raise handshake_error(code, self._res.native.last_error()[1], self._path())
            if not blocking:
                return False
            time.sleep(CONNECT_RETRY_S)

    def _path(self) -> str:
        return socket_path(self.name)

    @staticmethod
    def available_streams(name: str, block: bool = False) -> set[int]:
        """The stream ids server ``name`` has buffers for (upstream's static method; the
        module function :func:`available_streams` is the same)."""
        return available_streams(name, block)

    def is_connected(self) -> bool:
        """True once the client holds a server's buffers."""
        return not self._closed and self._res.native.server_id != 0

    @property
    def server_id(self) -> int:
        """The id of the server instance whose buffers the client holds (0: none)."""
        return 0 if self._closed else self._res.native.server_id  # type: ignore[no-any-return]

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
        if not self.is_connected() and not self._connect_until(deadline):
            return None
        res = self._res
        sock = res.sock
        while True:
            if deadline is None:
                sock.setTimeout(-1)
                left = -1.0
            else:
                left = deadline - time.monotonic()
                sock.setTimeout(max(0, int(left * 1000.0 + 0.999)))
            msg = sock.receive()
            if msg is None:
                return None
            frame = res.native.take_packet(msg, left)
            res.adopt_buffers()  # after a restart was followed: the new server's buffers
            if frame is None:
                code, detail = res.native.last_error()
                if code:
                    self.last_error = handshake_error(code, detail, self._path())
                continue
            idx, self.frame_id, sequence, self.timestamp_sof, self.timestamp_eof, self.valid = (
                frame
            )
            buf = res.buffers[idx]
            buf._recv_sequence = sequence
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

    # --- counters ---------------------------------------------------------------------

    def _counter(self, name: str) -> int:
        counters = self._final_counters if self._closed else self._res.native.stats
        return int(counters.get(name, 0))

    bad_packets = _Counter("Packets on the endpoint that were not well formed, named no "
                           "buffer, or announced a frame their buffer never held.")
    stale_packets = _Counter("Packets of a server instance that is gone (or not reachable "
                             "yet).")
    recycled_frames = _Counter("Frames returned whose buffer the server had already "
                               "refilled.")
    skipped_frames = _Counter("Frames skipped (``skip_recycled``) because their buffer had "
                              "been refilled.")
    reconnects = _Counter("Handshakes with a new server instance after the first connect.")

    # --- geometry ----------------------------------------------------------------------

    @property
    def width(self) -> int | None:
        """Width of the stream's frames (None until connected)."""
        return self._res.geometry.width if self._res.geometry else None

    @property
    def height(self) -> int | None:
        """Height of the stream's frames (None until connected)."""
        return self._res.geometry.height if self._res.geometry else None

    @property
    def stride(self) -> int | None:
        """Bytes from one row to the next (None until connected)."""
        return self._res.geometry.stride if self._res.geometry else None

    @property
    def uv_offset(self) -> int | None:
        """Offset of the UV plane (None until connected)."""
        return self._res.geometry.uv_offset if self._res.geometry else None

    @property
    def buffer_len(self) -> int | None:
        """Bytes of a frame (None until connected)."""
        return self._res.geometry.size if self._res.geometry else None

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
        if not self._closed:
            self._final_counters = self._finalizer() or {}
        self._closed = True

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
        code, streams = _native.available_streams(name, HANDSHAKE_TIMEOUT_S)
        if code == 0:
            return set(streams)
        if code not in _native.UNAVAILABLE:
            raise handshake_error(code, None, socket_path(name))
        if not block:
            return set()
        time.sleep(CONNECT_RETRY_S)
