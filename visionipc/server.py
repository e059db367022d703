"""VisionIpcServer: owns a name's frame buffers, hands them to clients, announces frames.

For each stream the server allocates ``num_buffers`` memfd buffers (mapped once, see
:mod:`msgq.visionipc.buffer`) and a msgq publisher on ``get_endpoint_name(name, stream)``.
Sending a frame fills the next buffer in turn (round robin), records frame_id and sequence
in the buffer's trailer and publishes a 48-byte packet (:mod:`msgq.visionipc.packet`).
Clients get the buffers' fds from the listener thread (:mod:`msgq.visionipc.listener`)
over the Unix socket at :func:`msgq.visionipc.names.socket_path`.

A buffer is refilled ``num_buffers`` sends after it was last sent: readers that keep a
frame longer than that must check :meth:`VisionBuf.is_current`.

One thread at a time may call a server's methods (the listener thread is internal).
"""

from __future__ import annotations

import secrets
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import numpy as np

import msgq
from msgq.errors import IpcError
from msgq.queues import queue_file_mode

from .buffer import MAX_DIMENSION, BufferGeometry, VisionBuf, allocate_buffer
from .frame_copy import copy_into
from .handshake import MAX_BUFFERS, MAX_STREAMS, close_fds
from .listener import Listener, StreamExport
from .names import get_endpoint_name, socket_path, validate_name, validate_stream
from .packet import PACKET_SEGMENT_SIZE, pack_frame_packet
from .peers import PeerPolicy

__all__ = ["VisionIpcServer"]

_U32 = 2**32
_U64 = 2**64


class _ServerStream:
    """A stream's buffers, publisher and counters."""

    __slots__ = ("stream", "geometry", "buffers", "fds", "pub", "next_index", "sequence")

    def __init__(
        self,
        stream: int,
        geometry: BufferGeometry,
        buffers: list[VisionBuf],
        fds: tuple[int, ...],
        pub: Any,
    ) -> None:
        self.stream = stream
        self.geometry = geometry
        self.buffers = buffers
        self.fds = fds
        self.pub = pub
        self.next_index = 0
        self.sequence = 0

    def close(self) -> None:
        try:
            self.pub.close()
        except Exception:  # noqa: BLE001 - closing must go on with the buffers
            pass
        for buf in self.buffers:
            buf._release()
        close_fds(self.fds)


class _Resources:
    """Everything a server must give back, kept apart from the server object so that a
    finalizer (and the listener thread) can hold it without keeping the server alive."""

    def __init__(self) -> None:
        self.streams: dict[int, _ServerStream] = {}
        self.exports: dict[int, StreamExport] = {}
        self.listener: Listener | None = None

    def close(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.close()
        self.exports.clear()
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
        #: Random per instance: clients see a new id in the packets after a restart.
        self.server_id = secrets.randbits(64) or 1
        self.policy = PeerPolicy.for_server(allowed_uids)
        if not handshake_timeout_s > 0:
            raise ValueError("handshake_timeout_s must be positive")
        self.handshake_timeout_s = float(handshake_timeout_s)
        self._res = _Resources()
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
        fds: list[int] = []
        buffers: list[VisionBuf] = []
        try:
            for idx in range(num_buffers):
                fd, mapping = allocate_buffer(geometry, f"visionipc:{self.name}:{stream}:{idx}")
                fds.append(fd)
                buffers.append(VisionBuf(idx, fd, mapping, geometry))
            pub = msgq.pub_sock(get_endpoint_name(self.name, stream), PACKET_SEGMENT_SIZE)
        except BaseException:
            for buf in buffers:
                buf._release()
            close_fds(fds)
            raise
        entry = _ServerStream(stream, geometry, buffers, tuple(fds), pub)
        self._res.streams[stream] = entry
        # Published to the listener last: a client served this stream can get its packets.
        export = StreamExport(geometry, entry.fds)
        self._res.exports[stream] = export
        if self._res.listener is not None:
            self._res.listener.add_stream(stream, export)

    def start_listener(self) -> None:
        """Starts serving clients on the Unix socket (idempotent). A stale socket left
        by a crashed server of the same name is replaced; so is a live one (the newer
        server takes the name over, as a newer msgq publisher takes an endpoint over)."""
        self._check_open()
        if self._res.listener is not None:
            return
        listener = Listener(
            socket_path(self.name, create_dir=True),
            self.server_id,
            self._res.exports,
            self.policy,
            socket_mode=queue_file_mode(),
            handshake_timeout_s=self.handshake_timeout_s,
        )
        listener.start()
        self._res.listener = listener

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
        buf = entry.buffers[entry.next_index]
        entry.next_index = (entry.next_index + 1) % len(entry.buffers)
        buf._begin_write()
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
        sequence = entry.sequence + 1
        buf._finish_write(frame_id, sequence)
        entry.pub.send(
            pack_frame_packet(
                self.server_id, sequence, buf.idx, frame_id, timestamp_sof, timestamp_eof, valid
            )
        )
        entry.sequence = sequence

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
        listener = self._res.listener
        return dict(listener.stats) if listener is not None else {}

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
