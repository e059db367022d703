"""VisionIpcServer: owns a name's frame buffers, hands them to clients, announces frames.

The server is the C library's (``src/vipc_server.c``, ``visionipc.h``, bound in
``_native.pyx``): it allocates each stream's ``num_buffers`` sealed memfd buffers, hands
them out round robin, keeps the trailer protocol and the stream's sequence numbers, and
runs the listener thread that hands the buffers' fds to clients over the Unix socket at
:func:`msgq.visionipc.names.socket_path` (``src/vipc_listener.c``: one poll loop, one
request per connection within ``handshake_timeout_s``, at most 256 connections waiting,
peer uids checked with ``SO_PEERCRED``). This module adds the Python API: argument
checks, numpy views of the buffers (this process's own mappings of the fds, so a view
kept after ``close`` stays valid), and the packets, published on a msgq socket of the
selected backend (``get_endpoint_name(name, stream)``).

A buffer is refilled ``num_buffers`` sends after it was last sent: readers that keep a
frame longer than that must check :meth:`VisionBuf.is_current`.

One thread at a time may call a server's methods (the listener thread is internal).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import numpy as np

import msgq
from msgq.errors import IpcError

from ._native import Server as _NativeServer
from .buffer import MAX_DIMENSION, BufferGeometry, VisionBuf, map_buffer
from .frame_copy import copy_into
from .handshake import MAX_BUFFERS, MAX_STREAMS
from .names import get_endpoint_name, socket_path, validate_name, validate_stream
from .packet import PACKET_SEGMENT_SIZE
from .peers import PeerPolicy

__all__ = ["VisionIpcServer"]

_U32 = 2**32
_U64 = 2**64


class _ServerStream:
    """A stream's geometry, buffer views and packet publisher."""

    __slots__ = ("geometry", "buffers", "pub")

    def __init__(self, geometry: BufferGeometry, buffers: list[VisionBuf], pub: Any) -> None:
        self.geometry = geometry
        self.buffers = buffers
        self.pub = pub

    def close(self) -> None:
        try:
            self.pub.close()
        except Exception:  # noqa: BLE001 - closing must go on with the buffers
            pass
        for buf in self.buffers:
            buf._release()


class _Resources:
    """Everything a server must give back, kept apart from the server object so that a
    finalizer can hold it without keeping the server alive."""

    def __init__(self, native: _NativeServer) -> None:
        self.native = native
        self.streams: dict[int, _ServerStream] = {}
        self.listening = False

    def close(self) -> None:
        self.native.close()  # first: the listener stops handing out the fds
        streams = list(self.streams.values())
        self.streams.clear()
        for stream in streams:
            stream.close()


def _check_int(value: object, what: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value < limit:
        raise ValueError(f"{what} {value} is out of range 0 .. {limit - 1}")
    return int(value)


class VisionIpcServer:
    """The server of VisionIPC name ``name``.

    ``allowed_uids``: the uids of the processes served (an iterable of ints, or ``"any"``);
    default: ``MSGQ_VISIONIPC_ALLOW_UIDS`` if set, else this process's effective uid.
    ``handshake_timeout_s``: how long a connected client may take to send its request.

    Use it as a context manager, or call :meth:`close`, to remove the socket and free
    the buffers.
    """

    def __init__(
        self,
        name: str,
        *,
        allowed_uids: Iterable[int] | str | None = None,
        handshake_timeout_s: float = 1.0,
    ) -> None:
        self.name = validate_name(name)
        self.policy = PeerPolicy.for_server(allowed_uids)
        if not handshake_timeout_s > 0:
            raise ValueError("handshake_timeout_s must be positive")
        self.handshake_timeout_s = float(handshake_timeout_s)
        native = _NativeServer(self.name)
        native.allow_uids(self.policy.uids, self.policy.any_uid)
        native.set_handshake_timeout(self.handshake_timeout_s)
        #: Random per instance: clients see a new id in the packets after a restart.
        self.server_id: int = native.server_id
        self._res = _Resources(native)
        self._closed = False
        self._finalizer = weakref.finalize(self, self._res.close)

    # --- buffers -------------------------------------------------------------------------

    def create_buffers(self, stream: int, num_buffers: int, width: int, height: int) -> None:
        """``num_buffers`` NV12 buffers of ``width`` x ``height`` for ``stream``, laid out
        as upstream does: stride = width, uv_offset = width * height, size = width *
        height * 3 // 2 (the number of bytes ``send`` then expects)."""
        _check_int(width, "width", MAX_DIMENSION + 1)
        _check_int(height, "height", MAX_DIMENSION + 1)
        g = BufferGeometry.nv12(width, height)
        self.create_buffers_with_sizes(
            stream, num_buffers, width, height, g.size, g.stride, g.uv_offset
        )

    def create_buffers_with_sizes(
        self,
        stream: int,
        num_buffers: int,
        width: int,
        height: int,
        size: int,
        stride: int,
        uv_offset: int,
    ) -> None:
        """``num_buffers`` buffers of ``size`` bytes each for ``stream``, with the given
        image geometry. ValueError for an impossible geometry, a stream that already has
        buffers, or more than 128 buffers."""
        self._check_open()
        stream = validate_stream(stream)
        num_buffers = _check_int(num_buffers, "num_buffers", MAX_BUFFERS + 1)
        if num_buffers < 1:
            raise ValueError("num_buffers must be at least 1")
        geometry = BufferGeometry(width, height, stride, uv_offset, size).validate()
        if stream in self._res.streams:
            raise ValueError(f"stream {stream} of server {self.name!r} already has buffers")
        if len(self._res.streams) >= MAX_STREAMS:
            raise ValueError(f"a server has at most {MAX_STREAMS} streams")
        g = geometry
        pub = msgq.pub_sock(get_endpoint_name(self.name, stream), PACKET_SEGMENT_SIZE)
        buffers: list[VisionBuf] = []
        try:
            # Exported to the listener by the C server: the packets' publisher is up first.
            map_size, fds = self._res.native.create_buffers(
                stream, num_buffers, g.width, g.height, g.stride, g.uv_offset, g.size
            )
            for idx, fd in enumerate(fds):
                buffers.append(VisionBuf(idx, fd, map_buffer(fd, map_size, True), geometry))
        except BaseException:
            for buf in buffers:
                buf._release()
            pub.close()
            raise
        self._res.streams[stream] = _ServerStream(geometry, buffers, pub)

    def start_listener(self) -> None:
        """Starts serving clients on the Unix socket (idempotent). A stale socket left
        by a crashed server of the same name is replaced; so is a live one (the newer
        server takes the name over, as a newer msgq publisher takes an endpoint over)."""
        self._check_open()
        socket_path(self.name)  # a path too long for a Unix socket: ValueError, explained
        self._res.native.start_listener()
        self._res.listening = True

    # --- sending -----------------------------------------------------------------------

    def _stream(self, stream: int) -> _ServerStream:
        self._check_open()
        entry = self._res.streams.get(stream)
        if entry is None:
            validate_stream(stream)
            raise ValueError(
                f"server {self.name!r} has no buffers for stream {stream}; call "
                "create_buffers first"
            )
        return entry

    def get_buffer(self, stream: int) -> VisionBuf:
        """The next buffer of ``stream`` to fill (zero-copy sending): write the frame into
        its ``data`` / ``y`` / ``uv`` / ``array`` views, then pass it to :meth:`send`.
        From this call until that send, readers see the buffer as being refilled."""
        entry = self._stream(stream)
        buf = entry.buffers[self._res.native.get_buffer(stream)]
        buf._recv_sequence = 0
        return buf

    def send(
        self,
        stream: int,
        data: Any,
        frame_id: int = 0,
        timestamp_sof: int = 0,
        timestamp_eof: int = 0,
        *,
        valid: bool = True,
    ) -> None:
        """Publishes a frame of ``stream``.

        ``data`` is either a buffer from :meth:`get_buffer` (sent as it is, no copy) or a
        bytes-like object of exactly the stream's buffer size (copied into the next
        buffer). A wrong size raises ValueError and sends nothing. ``frame_id`` is a
        uint32, the timestamps uint64 (upstream types).
        """
        entry = self._stream(stream)
        frame_id = _check_int(frame_id, "frame_id", _U32)
        timestamp_sof = _check_int(timestamp_sof, "timestamp_sof", _U64)
        timestamp_eof = _check_int(timestamp_eof, "timestamp_eof", _U64)
        if isinstance(data, VisionBuf):
            idx = data.idx
            if not (0 <= idx < len(entry.buffers) and entry.buffers[idx] is data):
                raise ValueError(
                    f"this VisionBuf is not a buffer of stream {stream} of this server; "
                    "send buf.data to copy it"
                )
            buf = data
        else:
            source = _frame_bytes(data, entry.geometry, stream)
            buf = self.get_buffer(stream)
            flat = buf._flat
            if flat is None:  # released: only after close(), which _stream() refuses
                raise IpcError("server buffers were released")
            copy_into(flat, source)
        sequence, packet = self._res.native.commit(
            stream, buf.idx, frame_id, timestamp_sof, timestamp_eof, valid
        )
        buf._recv_sequence = sequence
        entry.pub.send(packet)

    # --- introspection and life cycle --------------------------------------------------

    @property
    def streams(self) -> set[int]:
        """The stream ids that have buffers."""
        return set(self._res.streams)

    def geometry(self, stream: int) -> BufferGeometry:
        """The buffer geometry of ``stream``."""
        return self._stream(stream).geometry

    @property
    def socket_path(self) -> str:
        """Where clients connect (the path the listener binds)."""
        return socket_path(self.name)

    @property
    def listener_stats(self) -> dict[str, int]:
        """Counters of the listener: served, refused, bad_requests, unknown_stream,
        timeouts, evicted, disconnects, errors (empty before start_listener)."""
        return self._res.native.listener_stats if self._res.listening else {}

    def _check_open(self) -> None:
        if self._closed:
            raise IpcError(f"VisionIPC server {self.name!r} is closed")

    def close(self) -> None:
        """Stops the listener, removes the socket (if no newer server has taken it over),
        closes the publishers and frees the buffers. Idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> VisionIpcServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"streams {sorted(self._res.streams)}"
        return f"<VisionIpcServer {self.name!r} {state}>"


def _frame_bytes(data: Any, geometry: BufferGeometry, stream: int) -> np.ndarray:
    """``data`` as a flat uint8 array of exactly ``geometry.size`` bytes (no copy)."""
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(
            f"send() needs a bytes-like object or a VisionBuf, not {type(data).__name__}"
        ) from None
    if view.nbytes != geometry.size:
        raise ValueError(
            f"stream {stream} buffers hold {geometry.size} bytes "
            f"({geometry.width}x{geometry.height}, stride {geometry.stride}); "
            f"send() got {view.nbytes}"
        )
    if not view.c_contiguous:
        raise ValueError("send() needs C-contiguous data")
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return np.frombuffer(view, dtype=np.uint8)
