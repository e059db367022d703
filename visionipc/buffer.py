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

The server sets ``sequence`` to 0 and ``frame_id`` to FRAME_ID_WRITING before it writes a
frame, and ``frame_id`` then ``sequence`` after (before it announces the frame). A reader
that finds the sequence of its packet in the trailer after it has read the frame read a
frame the server had not started to recycle (:meth:`VisionBuf.is_current`). On x86-64 the
ordering of these plain stores is the CPU's (TSO); on weaker CPUs it is best effort.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from . import _wire

__all__ = [
    "FRAME_ID_WRITING",
    "MAX_BUFFER_SIZE",
    "MAX_DIMENSION",
    "TRAILER_SIZE",
    "BufferGeometry",
    "VisionBuf",
    "BufferImportError",
    "allocate_buffer",
    "map_received_buffer",
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



def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


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
        """Self, after checking that the numbers describe a buffer (ValueError if not):
        positive width, height and size within the limits, stride >= width, the Y plane
        inside the buffer, uv_offset inside the buffer."""
        for field in ("width", "height", "stride", "uv_offset", "size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{field} must be an int, not {type(value).__name__}")
        if not (1 <= self.width <= MAX_DIMENSION and 1 <= self.height <= MAX_DIMENSION):
            raise ValueError(
                f"width and height must be 1 .. {MAX_DIMENSION}, not {self.width}x{self.height}"
            )
        if not self.width <= self.stride <= MAX_DIMENSION:
            raise ValueError(f"stride {self.stride} must be >= width {self.width}")
        if not 1 <= self.size <= MAX_BUFFER_SIZE:
            raise ValueError(f"buffer size {self.size} must be 1 .. {MAX_BUFFER_SIZE} bytes")
        if self.stride * (self.height - 1) + self.width > self.size:
            raise ValueError(
                f"a {self.width}x{self.height} plane with stride {self.stride} does not fit "
                f"in {self.size} bytes"
            )
        if not 0 <= self.uv_offset <= self.size:
            raise ValueError(f"uv_offset {self.uv_offset} is outside the {self.size}-byte buffer")
        return self

    @property
    def trailer_offset(self) -> int:
        """Offset of the trailer (frame_id, sequence) in the mapping."""
        return _align_up(self.size, TRAILER_ALIGN)

    @property
    def map_size(self) -> int:
        """Bytes of each buffer's memfd and mapping (frame, trailer, page padding)."""
        return _align_up(self.trailer_offset + TRAILER_SIZE, PAGE_SIZE)

    @property
    def has_uv_plane(self) -> bool:
        """True when an NV12 UV plane (``height // 2`` rows of ``width`` bytes from
        ``uv_offset``) lies inside the buffer, after the Y plane."""
        rows = self.height // 2
        if rows == 0:
            return False
        return (
            self.uv_offset >= self.stride * (self.height - 1) + self.width
            and self.uv_offset + self.stride * (rows - 1) + self.width <= self.size
        )


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

    # --- server side -----------------------------------------------------------------

    def _begin_write(self) -> None:
        """Marks the buffer as being refilled: sequence first, so a reader that checks the
        sequence after reading sees the change before any byte of the new frame."""
        trailer = self._trailer
        if trailer is None:
            raise self._released()
        trailer[1] = 0
        trailer[0] = FRAME_ID_WRITING

    def _finish_write(self, frame_id: int, sequence: int) -> None:
        """Records the new frame: frame_id first, the sequence (the commit) last."""
        trailer = self._trailer
        if trailer is None:
            raise self._released()
        trailer[0] = frame_id
        trailer[1] = sequence
        self._recv_sequence = sequence

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


def _memfd_name(label: str) -> str:
    # memfd names are for /proc/<pid>/fd and debugging only; the kernel limits them to 249.
    return label[:200]


def allocate_buffer(geometry: BufferGeometry, label: str) -> tuple[int, mmap.mmap]:
    """A new memfd for one buffer (sized, its pages reserved, sealed against shrinking
    and growing so no holder of the fd can make a mapping fault; made by the C code,
    ``src/vipc_buffer.c``) and its read-write mapping. The caller owns both."""
    fd = _wire.buffer_create(_memfd_name(label), geometry.map_size)
    try:
        mapping = mmap.mmap(
            fd,
            geometry.map_size,
            flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
            prot=mmap.PROT_READ | mmap.PROT_WRITE,
        )
    except BaseException:
        os.close(fd)
        raise
    return fd, mapping


class BufferImportError(ValueError):
    """A file descriptor received from a server is not a buffer this client can map safely."""


def map_received_buffer(fd: int, geometry: BufferGeometry) -> mmap.mmap:
    """The read-only mapping of a buffer fd received from a server, after checking that
    it is a regular file of at least ``geometry.map_size`` bytes sealed against
    shrinking (so the mapping can never fault; the check is ``src/vipc_buffer.c``'s).
    BufferImportError otherwise."""
    why = _wire.buffer_check(fd, geometry.map_size)
    if why is not None:
        raise BufferImportError(f"received buffer fd {fd} {why} ({geometry.map_size} bytes)")
    try:
        return mmap.mmap(
            fd, geometry.map_size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ
        )
    except OSError as e:
        raise BufferImportError(f"received buffer fd {fd} cannot be mapped: {e}") from None
