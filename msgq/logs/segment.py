"""Reading one log segment file: decompression here; message splitting and every decision
about damage in the C log scanner (``msgq/logs/src/log_scan.c``, ``log_split_*``, driven by
:class:`msgq.logs._scan.Splitter`), one walk that yields the messages and the problems.

Compression is recognised by its magic: zstd (``28 b5 2f fd``), bz2 (``BZh``), else
uncompressed; when the first bytes are damaged, by a magic one byte off or the file's
suffix. The stream is read in chunks (bounded memory whatever the file size), and a
zstd frame's output is held until its checksum verifies (damaged bytes never come out).

Damage is reported as :class:`LogProblem` values with the file and byte offset:

* **truncated**: the file ends inside a message (or inside a zstd frame). Every complete
  message before it is returned.
* **corrupt**: a zstd frame fails to decode or its checksum, bytes that cannot start a
  message turn up in the middle, a length runs past the end of the data while whole
  messages follow, or bytes follow the end of a bz2 stream. With ``skip_corrupt`` the
  reader resynchronises — at the next zstd frame (msgq's writer starts every frame on a
  message boundary) or, within a frame or an uncompressed/bz2 stream, at the next
  8-byte-aligned offset where a whole, decodable message starts and another message (or
  the end) follows it; when the damage comes right after a message, the search starts
  inside that message, whose length field may be what was hit — and goes on; without it
  reading stops there.

Offsets: ``offset`` is the position in the uncompressed stream (the file offset for an
uncompressed file); ``file_offset`` is where in the file the damaged data is (the start of
the zstd frame, for zstd).
"""

from __future__ import annotations

import bz2
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import zstandard

from msgq.logs import _scan
from msgq.logs._scan import ROOT_WHOLE, VALID
from msgq.schemas.framing import EventLayout

__all__ = ["ROOT_WHOLE", "VALID", "LogProblem", "MessageBatch", "RawMessage", "compression_of",
           "read_batches", "read_messages"]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BZ2_MAGIC = b"BZh"
_CHUNK = 1 << 20
#: Compressed bytes handed to a decompressor at a time: what one call can return stays
#: bounded (a few hundred MiB at zstd's most extreme ratio), whatever a file holds.
_ZSTD_FEED = 4096
_BZ2_FEED = 64 * 1024
#: Output of one zstd frame held back until its checksum verifies; a larger frame (a
#: foreign file compressed as one frame) streams past this.
HOLD_BYTES = 16 << 20


@dataclass(frozen=True)
class LogProblem:
    """Damage found in a log file."""

    path: str
    kind: str  # "truncated" or "corrupt"
    offset: int  # in the uncompressed stream
    file_offset: int  # in the file
    detail: str

    def __str__(self) -> str:
        where = f"byte {self.offset}"
        if self.file_offset != self.offset:
            where += f" of the decompressed stream (file byte {self.file_offset})"
        return f"{self.path}: {self.kind} at {where}: {self.detail}"


@dataclass(frozen=True, eq=False)
class MessageBatch:
    """A run of whole messages back to back, split and peeked by the C scanner: the
    bytes they lie in (``data``, the decompressed piece of the stream, shared, not
    copied: it may hold bytes before and after the run) and, per message, its offset in
    ``data``, its length, the index of its service in ``services``, its flags
    (:data:`VALID`, :data:`ROOT_WHOLE`) and its logMonoTime, as numpy arrays."""

    data: bytes
    stream_offset: int  # of data[0], in the uncompressed stream
    file_offset: int | None  # the file offset of every message (its zstd frame); None:
    # uncompressed, where a message's file offset is its stream offset
    offset: Any  # numpy int64
    length: Any  # numpy uint32
    service: Any  # numpy uint16, an index into services
    flags: Any  # numpy uint8
    mono_ns: Any  # numpy uint64
    services: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.offset)

    def messages(self) -> Iterator[RawMessage]:
        """One :class:`RawMessage` per message (identity: logMonoTime, valid, service)."""
        for at, length, service, flags, mono in zip(
                self.offset.tolist(), self.length.tolist(), self.service.tolist(),
                self.flags.tolist(), self.mono_ns.tolist(), strict=True):
            offset = self.stream_offset + at
            yield RawMessage(self.data[at:at + length], offset,
                             offset if self.file_offset is None else self.file_offset,
                             (mono, bool(flags & VALID), self.services[service]))


@dataclass(frozen=True)
class RawMessage:
    """One whole message of a segment, where it starts, and what ``identify`` said of it."""

    data: bytes
    offset: int  # in the uncompressed stream
    file_offset: int  # in the file (start of its zstd frame, for zstd)
    identity: Any = None  # the value identify() returned for it


def compression_of(head: bytes) -> str:
    """``"zstd"``, ``"bz2"`` or ``"none"`` from the first bytes of a file."""
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(BZ2_MAGIC):
        return "bz2"
    return "none"


def _damaged_magic(head: bytes, path: str) -> str:
    """The compression of a file by its magic, or, when that was damaged, by a magic one
    byte off or the file's suffix: a zstd file whose first bytes are hit is then read as
    zstd (the damaged first frame is skipped), not as garbage of an uncompressed log."""
    found = compression_of(head)
    if found != "none":
        return found
    near_zstd = len(head) == 4 and sum(a == b for a, b in zip(head, ZSTD_MAGIC, strict=True)) == 3
    if near_zstd or path.endswith((".zst", ".zstd")):
        return "zstd"
    near_bz2 = len(head) == 4 and head[3:4].isdigit() and \
        sum(a == b for a, b in zip(head[:3], BZ2_MAGIC, strict=True)) == 2
    if near_bz2 or path.endswith(".bz2"):
        return "bz2"
    return "none"


@dataclass
class _Chunk:
    data: bytes
    file_offset: int
    # Set on the last chunk of a damaged or unfinished stream piece.
    problem: tuple[str, str] | None = None  # (kind, detail)
    # True when the bytes after this chunk do not continue it (a new zstd frame after a
    # corrupt one): a partial message before the break is dropped.
    breaks_after: bool = False


def _zstd_chunks(f: BinaryIO) -> Iterator[_Chunk]:
    """The decompressed output of a file of zstd frames. A frame's output is held back
    until the frame ends and its checksum verifies (up to HOLD_BYTES of it: a larger,
    foreign frame streams), so no byte of a damaged frame reaches the caller; a frame the
    file ends inside gives what it decoded (a crash or a copy cut it short)."""
    dctx = zstandard.ZstdDecompressor()
    pending = b""
    at = 0  # pending[at:] is still to decompress
    consumed = 0  # file offset of pending[at]
    frame_start = 0
    obj = None
    at_eof = False
    held: list[bytes] = []
    held_bytes = 0
    while True:
        if at >= len(pending):
            if at_eof:
                break
            pending, at = f.read(_CHUNK), 0
            if not pending:
                at_eof = True
                break
        if obj is None:
            frame_start = consumed
            rest = pending[at:at + 4]
            if not ZSTD_MAGIC.startswith(rest):
                # garbage between frames: corrupt; find the next frame
                yield _Chunk(b"", consumed, ("corrupt", "bytes that are not a zstd frame"),
                             breaks_after=True)
                pending, consumed, at_eof = _skip_to_magic(f, pending[at:], consumed, 0)
                at = 0
                continue
            obj = dctx.decompressobj()
        # Small pieces bound what one call returns (a highly compressed frame).
        piece = pending[at:at + _ZSTD_FEED]
        try:
            out = obj.decompress(piece)
        except zstandard.ZstdError as e:
            dropped = f"; {held_bytes} bytes it decoded dropped" if held_bytes else ""
            held, held_bytes = [], 0
            yield _Chunk(b"", frame_start,
                         ("corrupt", f"zstd frame does not decode ({e}){dropped}"),
                         breaks_after=True)
            obj = None
            # restart the search one byte after the bad frame's magic
            f.seek(frame_start + 1)
            pending, consumed, at_eof = _skip_to_magic(f, b"", frame_start + 1, 0)
            at = 0
            continue
        if out:
            held.append(out)
            held_bytes += len(out)
        if obj.eof:
            used = len(piece) - len(obj.unused_data)
            at += used
            consumed += used
            obj = None
            if held:
                yield _Chunk(b"".join(held), frame_start)
                held, held_bytes = [], 0
        else:
            at += len(piece)
            consumed += len(piece)
            if held_bytes >= HOLD_BYTES:
                yield _Chunk(b"".join(held), frame_start)
                held, held_bytes = [], 0
    if obj is not None:
        if held:
            yield _Chunk(b"".join(held), frame_start)
        yield _Chunk(b"", frame_start, ("truncated", "the file ends inside a zstd frame"))


def _skip_to_magic(f: BinaryIO, pending: bytes, consumed: int,
                   start: int) -> tuple[bytes, int, bool]:
    """Reads on until the next zstd frame magic; returns (pending from the magic, its file
    offset, whether the file ended)."""
    while True:
        at = pending.find(ZSTD_MAGIC, start)
        if at >= 0:
            return pending[at:], consumed + at, False
        keep = pending[-3:]
        consumed += len(pending) - len(keep)
        more = f.read(_CHUNK)
        if not more:
            return b"", consumed + len(keep), True
        pending = keep + more
        start = 0


def _bz2_chunks(f: BinaryIO) -> Iterator[_Chunk]:
    """The decompressed output of a bz2 file (several streams back to back, as parallel
    compressors write, read as one). Bytes after the last stream that do not start
    another are corrupt (appended garbage); the file ending inside a stream is a
    truncation."""
    decompressor = bz2.BZ2Decompressor()
    fed = 0  # file bytes handed to the decompressor so far
    stream_start = 0  # file offset of the current stream
    while True:
        if decompressor.eof:
            data = decompressor.unused_data
            stream_start = fed - len(data)
            if len(data) < len(BZ2_MAGIC) + 1:
                more = f.read(_BZ2_FEED)
                fed += len(more)
                data += more
            if not data:
                return
            if not (data.startswith(BZ2_MAGIC) and data[3:4].isdigit()):
                yield _Chunk(b"", stream_start,
                             ("corrupt", "bytes after the end of the bz2 stream"))
                return
            decompressor = bz2.BZ2Decompressor()
        elif decompressor.needs_input:
            data = f.read(_BZ2_FEED)
            if not data:
                yield _Chunk(b"", fed, ("truncated", "the file ends inside a bz2 stream"))
                return
            fed += len(data)
        else:
            data = b""
        try:
            # max_length bounds what one call returns (a highly compressed block)
            out = decompressor.decompress(data, _CHUNK)
        except (OSError, EOFError, ValueError) as e:
            yield _Chunk(b"", stream_start, ("corrupt", f"bz2 stream does not decode ({e})"))
            return
        if out:
            yield _Chunk(out, stream_start)


def _raw_chunks(f: BinaryIO) -> Iterator[_Chunk]:
    offset = 0
    while True:
        data = f.read(_CHUNK)
        if not data:
            return
        yield _Chunk(data, offset)
        offset += len(data)


def read_messages(
    source: str | os.PathLike[str] | BinaryIO,
    on_problem: Callable[[LogProblem], None],
    skip_corrupt: bool,
    identify: Callable[[bytes], Any],
) -> Iterator[RawMessage]:
    """Every whole message of one segment, in file order.

    ``source`` is the segment file's path, or a seekable binary file holding the whole
    segment from byte 0 (``io.BytesIO`` of a file's bytes, say; it is left open; its
    ``name``, when it is a string, names it in problems).
    ``identify(data)`` tells whether whole-message bytes are a real message: it returns
    what it learned of it (kept in ``RawMessage.identity``), or None for bytes that are not
    a message;
    ``on_problem`` is told about damage (it may raise to stop reading). After a corrupt
    spot reading goes on only with ``skip_corrupt``.
    """
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            yield from _read_open(f, os.fspath(source), on_problem, skip_corrupt, identify)
    else:
        name = getattr(source, "name", None)
        yield from _read_open(source, name if isinstance(name, str) else "<in-memory segment>",
                              on_problem, skip_corrupt, identify)


def read_batches(
    source: str | os.PathLike[str] | BinaryIO,
    on_problem: Callable[[LogProblem], None],
    skip_corrupt: bool,
    layout: EventLayout,
) -> Iterator[MessageBatch | RawMessage]:
    """Every whole message of one segment, in file order, as :func:`read_messages` finds
    them, in batches: each run of messages the C scanner splits and peeks with
    ``layout`` is one :class:`MessageBatch`; a message it does not peek (a far root
    pointer, a service of a newer schema) comes as a :class:`RawMessage` that
    ``layout.identify`` (pycapnp) vouched for. Damage is reported and skipped as by
    :func:`read_messages`."""
    def identify(data: bytes) -> Any:
        return layout.identify(data, True)

    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            yield from _read_open(f, os.fspath(source), on_problem, skip_corrupt, identify,
                                  layout)
    else:
        name = getattr(source, "name", None)
        yield from _read_open(source, name if isinstance(name, str) else "<in-memory segment>",
                              on_problem, skip_corrupt, identify, layout)


def _read_open(f: BinaryIO, path: str, on_problem: Callable[[LogProblem], None],
               skip_corrupt: bool, identify: Callable[[bytes], Any],
               layout: EventLayout | None = None) -> Iterator[Any]:
    f.seek(0)
    compression = _damaged_magic(f.read(4), path)
    f.seek(0)
    chunks = _zstd_chunks(f) if compression == "zstd" else \
        _bz2_chunks(f) if compression == "bz2" else _raw_chunks(f)
    yield from _split(path, chunks, compression, on_problem, skip_corrupt, identify, layout)


def _split(path: str, chunks: Iterator[_Chunk], compression: str,
           on_problem: Callable[[LogProblem], None], skip_corrupt: bool,
           identify: Callable[[bytes], Any],
           layout: EventLayout | None = None) -> Iterator[RawMessage | MessageBatch]:
    """Splits the decompressed stream into messages with the C scanner, which reports
    damage (see the module docstring) and, with ``skip_corrupt``, resynchronises past it:
    with ``layout``, runs of whole messages it peeks come as one :class:`MessageBatch`
    each; the others, and every message without it, one :class:`RawMessage` each."""
    splitter = _scan.Splitter(identify, None if layout is None else _scan.ScanLayout(layout),
                              compression == "none")
    return splitter.split(chunks, path, on_problem, skip_corrupt, MessageBatch, RawMessage,
                          LogProblem)
