"""Reading one log segment file: decompression, message splitting, and what to do about
damage.

Compression is recognised by its magic: zstd (``28 b5 2f fd``), bz2 (``BZh``), else
uncompressed. The stream is read in chunks (bounded memory whatever the file size).

Damage is reported as :class:`LogProblem` values with the file and byte offset:

* **truncated**: the file ends inside a message (or inside a zstd frame). Every complete
  message before it is returned.
* **corrupt**: a zstd frame fails its checksum, or bytes that cannot start a message turn
  up in the middle. With ``skip_corrupt`` the reader resynchronises — at the next zstd
  frame (msgq's writer starts every frame on a message boundary) or, within a frame or an
  uncompressed/bz2 stream, at the next 8-byte-aligned offset where a whole, decodable
  message starts — and goes on; without it reading stops there.

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

from msgq.logs.framing import FramingError, message_length

__all__ = ["LogProblem", "RawMessage", "compression_of", "read_messages"]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BZ2_MAGIC = b"BZh"
_CHUNK = 1 << 20


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
    dctx = zstandard.ZstdDecompressor()
    pending = b""
    consumed = 0  # file offset of pending[0]
    frame_start = 0
    obj = None
    at_eof = False
    while True:
        if not pending:
            if at_eof:
                break
            pending = f.read(_CHUNK)
            if not pending:
                at_eof = True
                break
        if obj is None:
            frame_start = consumed
            if not pending.startswith(ZSTD_MAGIC[: len(pending)]):
                # garbage between frames: corrupt; find the next frame
                yield _Chunk(b"", consumed, ("corrupt", "bytes that are not a zstd frame"),
                             breaks_after=True)
                pending, consumed, at_eof = _skip_to_magic(f, pending, consumed, 0)
                continue
            obj = dctx.decompressobj()
        try:
            out = obj.decompress(pending)
        except zstandard.ZstdError as e:
            yield _Chunk(b"", frame_start, ("corrupt", f"zstd frame does not decode ({e})"),
                         breaks_after=True)
            obj = None
            # restart the search one byte after the bad frame's magic
            f.seek(frame_start + 1)
            consumed = frame_start + 1
            pending, consumed, at_eof = _skip_to_magic(f, b"", consumed, 0)
            continue
        if out:
            yield _Chunk(out, frame_start)
        if obj.eof:
            rest = obj.unused_data
            consumed += len(pending) - len(rest)
            pending = rest
            obj = None
        else:
            consumed += len(pending)
            pending = b""
    if obj is not None:
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


def _plain_chunks(f: BinaryIO, compression: str, path: str) -> Iterator[_Chunk]:
    if compression == "bz2":
        decompressor = bz2.BZ2Decompressor()
        while True:
            data = f.read(_CHUNK)
            if not data:
                if not decompressor.eof:
                    yield _Chunk(b"", 0, ("truncated", "the file ends inside the bz2 stream"))
                return
            try:
                out = decompressor.decompress(data)
            except OSError as e:
                yield _Chunk(b"", 0, ("corrupt", f"bz2 stream does not decode ({e})"))
                return
            if out:
                yield _Chunk(out, 0)
            if decompressor.eof:
                return
    else:
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


def _read_open(f: BinaryIO, path: str, on_problem: Callable[[LogProblem], None],
               skip_corrupt: bool, identify: Callable[[bytes], Any]) -> Iterator[RawMessage]:
    f.seek(0)
    compression = compression_of(f.read(4))
    f.seek(0)
    chunks = _zstd_chunks(f) if compression == "zstd" else _plain_chunks(f, compression, path)
    yield from _split(path, chunks, compression, on_problem, skip_corrupt, identify)


def _split(path: str, chunks: Iterator[_Chunk], compression: str,
           on_problem: Callable[[LogProblem], None], skip_corrupt: bool,
           identify: Callable[[bytes], Any]) -> Iterator[RawMessage]:
    buf = bytearray()
    buf_offset = 0  # uncompressed-stream offset of buf[0]
    stream_offset = 0  # uncompressed bytes seen so far
    file_offset = 0
    resyncing = False

    def report(kind: str, offset: int, detail: str) -> None:
        fo = offset if compression == "none" else file_offset
        on_problem(LogProblem(path, kind, offset, fo, detail))

    for chunk in chunks:
        if chunk.data:
            if not buf:
                file_offset = chunk.file_offset
            buf += chunk.data
            stream_offset += len(chunk.data)
        pos = 0
        while True:
            try:
                length = message_length(buf, pos)
                bad = None
            except FramingError as e:
                length, bad = None, str(e)
            if length is not None:
                data = bytes(buf[pos:pos + length])
                identity = identify(data)
                if identity is not None:
                    resyncing = False
                    yield RawMessage(data, buf_offset + pos,
                                     buf_offset + pos if compression == "none" else file_offset,
                                     identity)
                    pos += length
                    continue
                bad = "bytes that do not decode as a message"
            if bad is None:
                break  # need more data
            if not resyncing:
                report("corrupt", buf_offset + pos, bad)
                if not skip_corrupt:
                    return
                resyncing = True
            pos += 8
            if pos > len(buf):
                pos = len(buf)
                break
        del buf[:pos]
        buf_offset += pos
        if chunk.problem is not None:
            kind, detail = chunk.problem
            if kind == "truncated" and not resyncing:
                if buf:
                    detail = f"{detail}; {len(buf)} bytes of an unfinished message dropped"
                report(kind, buf_offset, detail)
                buf_offset += len(buf)
                buf.clear()
            elif kind == "corrupt":
                file_offset = chunk.file_offset
                report(kind, stream_offset, detail)
                if not skip_corrupt:
                    return
            if chunk.breaks_after:
                buf_offset += len(buf)
                buf.clear()
                resyncing = False
        elif chunk.data:
            file_offset = chunk.file_offset if not buf else file_offset
    if buf and not resyncing:
        report("truncated", buf_offset,
               f"the file ends inside a message ({len(buf)} bytes of it dropped)")
