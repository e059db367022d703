"""VisionBuf: one frame buffer in shared memory, and the layout every buffer has.

A buffer is a memfd of its own, mapped once by the server (read-write) and once by each
client (read-only). Layout of the mapping::

    0                  size               trailer_offset = size rounded up to 64
    | frame (size bytes) | padding (0..63) | trailer (64 bytes) | padding to a page |

The trailer is the buffer's own record of what it holds (little-endian uint64s):

    trailer_offset + 0   frame_id  the frame id of the frame in the buffer, or
                                   FRAME_ID_WRITING (2**64 - 1) while the server fills it
    trailer_offset + 8   sequence  the stream's publish counter (1, 2, ...) of that frame,
                                   0 while the server fills it
    trailer_offset + 16  reserved (48 bytes, zero)

The server (the C library, ``src/vipc_server.c``) sets ``sequence`` to 0 and
``frame_id`` to FRAME_ID_WRITING before it hands a buffer out to be filled, and
``frame_id`` then ``sequence`` (a release store) after, before it announces the frame. A
reader that finds the sequence of its packet in the trailer after it has read the frame
read a frame the server had not started to recycle (:meth:`VisionBuf.is_current`).

The memfds are made and checked by the C library too; this module maps the fds it is
given (:func:`map_buffer`) so that numpy views keep the memory alive on their own.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from . import _native

__all__ = [
    "FRAME_ID_WRITING",
    "MAX_BUFFER_SIZE",
    "MAX_DIMENSION",
    "TRAILER_SIZE",
    "BufferGeometry",
    "VisionBuf",
    "map_buffer",
]

#: Value of the trailer's frame_id while the server is writing a new frame into a buffer
#: (outside the 32-bit range of frame ids a server publishes).
FRAME_ID_WRITING = 2**64 - 1
TRAILER_ALIGN = 64
TRAILER_SIZE = 64
#: Largest frame a buffer may hold (bytes), and the largest width/height/stride.
MAX_BUFFER_SIZE = 1 << 30
MAX_DIMENSION = 1 << 16
PAGE_SIZE = mmap.PAGESIZE



@dataclass(frozen=True)
class BufferGeometry:
    """Size and image layout shared by every buffer of a stream.

    ``size`` bytes hold the frame; for an NV12 image the Y plane is ``height`` rows of
    ``width`` bytes, ``stride`` bytes apart, from offset 0, and the interleaved UV plane
    ``height // 2`` rows from ``uv_offset``.
    """

    width: int
    height: int
    stride: int
    uv_offset: int
    size: int

    @classmethod
    def nv12(cls, width: int, height: int) -> BufferGeometry:
        """Tightly packed NV12, laid out as upstream VisionIPC does: stride = width,
        uv_offset = width * height, size = width * height * 3 // 2."""
        return cls(width, height, width, width * height, width * height * 3 // 2)

    def validate(self) -> BufferGeometry:
        """Self, after checking that the numbers describe a buffer (ValueError if not; the
        rules are the C library's, ``vipc_geometry_validate``): width and height 1 ..
        65536, width <= stride <= 65536, size 1 .. 2**30 bytes, the Y plane inside the
        buffer, uv_offset inside the buffer."""
        for field in ("width", "height", "stride", "uv_offset", "size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{field} must be an int, not {type(value).__name__}")
        fields = (self.width, self.height, self.stride, self.uv_offset)
        problem = (
            "a number is out of range"
            if not all(0 <= v < 2**32 for v in fields) or not 0 <= self.size < 2**64
            else self._layout[0]
        )
        if problem is not None:
            raise ValueError(
                f"{self.width}x{self.height}, stride {self.stride}, uv_offset "
                f"{self.uv_offset}, {self.size} bytes: {problem}"
            )
        return self

    @cached_property
    def _layout(self) -> tuple[str | None, int, int, bool]:
        return _native.geometry_layout(  # type: ignore[no-any-return]
            self.width, self.height, self.stride, self.uv_offset, self.size, PAGE_SIZE
        )

    @property
    def trailer_offset(self) -> int:
        """Offset of the trailer (frame_id, sequence) in the mapping."""
        return self._layout[1]

    @property
    def map_size(self) -> int:
        """Bytes of each buffer's memfd and mapping (frame, trailer, page padding)."""
        return self._layout[2]

    @property
    def has_uv_plane(self) -> bool:
        """True when an NV12 UV plane (``height // 2`` rows of ``width`` bytes from
        ``uv_offset``) lies inside the buffer, after the Y plane."""
        return self._layout[3]


class VisionBuf:
    """One shared frame buffer.

    ``data`` is a memoryview over the frame (``size`` bytes, no copy), ``y`` and ``uv``
    numpy views of the NV12 planes. Buffers a client received are read-only. ``frame_id``
    and ``sequence`` are read from the buffer itself each time (see the module docs), so
    ``buf.frame_id == client.frame_id`` after reading tells that the server has not started
    to overwrite the frame; :meth:`is_current` checks the same with the sequence number,
    which also works when frame ids repeat.

    A client's buffers are released when it reconnects to a new server or closes; using a
    released buffer raises ValueError (the memory is unmapped once no view of it is left).
    """

    __slots__ = (
        "idx",
        "fd",
        "width",
        "height",
        "stride",
        "uv_offset",
        "size",
        "_mapping",
        "_data",
        "_flat",
        "_y",
        "_uv",
        "_trailer",
        "_recv_sequence",
    )

    def __init__(self, idx: int, fd: int, mapping: mmap.mmap, geometry: BufferGeometry) -> None:
        self.idx = idx
        self.fd = fd
        self.width = geometry.width
        self.height = geometry.height
        self.stride = geometry.stride
        self.uv_offset = geometry.uv_offset
        self.size = geometry.size
        self._mapping: mmap.mmap | None = mapping
        self._data: memoryview | None = memoryview(mapping)[: geometry.size]
        flat = np.frombuffer(mapping, dtype=np.uint8, count=geometry.size)
        self._flat: npt.NDArray[np.uint8] | None = flat
        self._y: npt.NDArray[np.uint8] | None = np.lib.stride_tricks.as_strided(
            flat,
            shape=(geometry.height, geometry.width),
            strides=(geometry.stride, 1),
            writeable=flat.flags.writeable,
        )
        self._uv: npt.NDArray[np.uint8] | None = None
        if geometry.has_uv_plane:
            self._uv = np.lib.stride_tricks.as_strided(
                flat[geometry.uv_offset :],
                shape=(geometry.height // 2, geometry.width),
                strides=(geometry.stride, 1),
                writeable=flat.flags.writeable,
            )
        self._trailer: npt.NDArray[np.uint64] | None = np.frombuffer(
            mapping, dtype="<u8", count=2, offset=geometry.trailer_offset
        )
        self._recv_sequence = 0

    def _released(self) -> ValueError:
        return ValueError(
            f"VisionBuf {self.idx} was released (its client reconnected or closed); "
            "use the buffers of the latest recv()"
        )

    @property
    def data(self) -> memoryview:
        """The frame's bytes (``size`` of them), a view of the shared buffer."""
        if self._data is None:
            raise self._released()
        return self._data

    @property
    def array(self) -> npt.NDArray[np.uint8]:
        """The frame's bytes as a 1-D uint8 numpy view."""
        if self._flat is None:
            raise self._released()
        return self._flat

    @property
    def y(self) -> npt.NDArray[np.uint8]:
        """The Y plane: a ``(height, width)`` uint8 view, rows ``stride`` bytes apart."""
        if self._y is None:
            raise self._released()
        return self._y

    @property
    def uv(self) -> npt.NDArray[np.uint8]:
        """The interleaved UV plane of NV12: a ``(height // 2, width)`` uint8 view from
        ``uv_offset``. ValueError when the buffer's geometry has no UV plane."""
        if self._flat is None:
            raise self._released()
        if self._uv is None:
            raise ValueError(
                f"this buffer's geometry ({self.width}x{self.height}, stride {self.stride}, "
                f"uv_offset {self.uv_offset}, {self.size} bytes) has no NV12 UV plane"
            )
        return self._uv

    @property
    def frame_id(self) -> int:
        """The frame id recorded in the buffer (FRAME_ID_WRITING while being refilled)."""
        if self._trailer is None:
            raise self._released()
        return int(self._trailer[0])

    @property
    def sequence(self) -> int:
        """The stream's publish counter recorded in the buffer (0 while being refilled)."""
        if self._trailer is None:
            raise self._released()
        return int(self._trailer[1])

    def is_current(self) -> bool:
        """True while the buffer still holds the frame it held when it was received (or,
        on the server, last published): check it after reading to know the read was not
        torn by the server recycling the buffer."""
        if self._trailer is None:
            return False
        return self._recv_sequence != 0 and int(self._trailer[1]) == self._recv_sequence

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        state = "released" if self._data is None else f"fd {self.fd}"
        return (
            f"<VisionBuf {self.idx} {self.width}x{self.height} stride {self.stride} "
            f"uv_offset {self.uv_offset} {self.size} B {state}>"
        )

    # --- life cycle ------------------------------------------------------------------

    def _release(self) -> None:
        """Drops this object's views and unmaps the buffer when nothing else still views
        it (otherwise the mapping goes when the last outside view does)."""
        self._y = self._uv = self._flat = self._trailer = None
        data, self._data = self._data, None
        if data is not None:
            try:
                data.release()
            except BufferError:
                pass  # someone holds a view made from .data; it keeps the mapping alive
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # exported arrays still use it; unmapped when they are collected


def map_buffer(fd: int, map_size: int, writable: bool) -> mmap.mmap:
    """This process's own mapping of a buffer fd the C library made (the server's) or
    checked (a client's: a sealed memfd of at least ``map_size`` bytes, so the mapping
    can never fault). Read-write for the server, read-only for clients."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    return mmap.mmap(fd, map_size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=prot)
