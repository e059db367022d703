"""The handshake on a server's Unix socket: wire format, validation, and the exceptions a
failed exchange raises.

The socket is ``SOCK_SEQPACKET``: every request and reply is one whole message, so there is
no framing to get wrong and no partial message to wait for. One connection carries one
exchange: the client sends a request, the server answers and closes.

Request, client to server, exactly 16 bytes (little-endian)::

    0  4  magic     b"VIPQ"
    4  2  version   1
    6  2  kind      1: list streams, 2: buffers of a stream
    8  4  stream    the stream id (kind 2); 0 for kind 1
   12  4  reserved  0

Reply, server to client, a 16-byte header and a body::

    0  4  magic      b"VIPR"
    4  2  version    1
    6  2  status     0 ok, 1 bad request, 2 unknown stream, 3 not allowed (peer uid)
    8  8  server_id  the server instance (nonzero; the frame packets carry the same)

Body of an ok reply to "list streams": ``count`` (uint32, at most MAX_STREAMS) and that
many uint32 stream ids. Body of an ok reply to "buffers" (40 bytes, so 56 in all)::

   16  4  stream        (must be the one asked for)
   20  4  num_buffers   1 .. MAX_BUFFERS
   24  4  width
   28  4  height
   32  4  stride
   36  4  uv_offset
   40  8  size          bytes of a frame
   48  8  map_size      bytes of each buffer's memfd (frame, trailer, padding; see buffer.py)

and one file descriptor per buffer (SCM_RIGHTS, in buffer order) in the same
message. Error replies have no body.

Every message is encoded and validated by the C code in ``src/vipc_handshake.c`` (through
``_native``), the one implementation that C servers (``visionipc.h``) and this module share;
this module turns its results into Python values and exceptions. The exchange itself
(connect, check the server's uid with ``SO_PEERCRED``, request, reply with the fds, and
the checks of every fd) is the C client's (``src/vipc_client.c``); :func:`handshake_error`
turns its error codes into the exceptions below.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

from msgq.errors import IpcError

from . import _native
from .buffer import BufferGeometry

__all__ = [
    "KIND_BUFFERS",
    "KIND_LIST",
    "MAX_BUFFERS",
    "MAX_STREAMS",
    "REQUEST",
    "BuffersReply",
    "HandshakeError",
    "NotAllowedError",
    "Request",
    "ServerUnavailableError",
    "decode_reply",
    "decode_request",
    "encode_buffers_reply",
    "encode_list_reply",
    "encode_request",
    "encode_status_reply",
    "handshake_error",
]

REQUEST = struct.Struct("<4sHHII")
REPLY_HEADER = struct.Struct("<4sHHQ")
BUFFERS_BODY = struct.Struct("<IIIIIIQQ")
COUNT = struct.Struct("<I")

REQUEST_MAGIC = b"VIPQ"
REPLY_MAGIC = b"VIPR"
VERSION = 1

KIND_LIST = 1
KIND_BUFFERS = 2

STATUS_OK = 0
STATUS_BAD_REQUEST = 1
STATUS_UNKNOWN_STREAM = 2
STATUS_NOT_ALLOWED = 3
STATUS_NAMES = {
    STATUS_OK: "ok",
    STATUS_BAD_REQUEST: "bad request",
    STATUS_UNKNOWN_STREAM: "unknown stream",
    STATUS_NOT_ALLOWED: "not allowed",
}

#: Limits: buffers per stream (one fd each, well below the kernel's 253 fds per message)
#: and streams per server (bounds the list reply).
MAX_BUFFERS = 128
MAX_STREAMS = 1024
MAX_REPLY_SIZE = REPLY_HEADER.size + COUNT.size + 4 * MAX_STREAMS


class HandshakeError(IpcError):
    """The other side of a handshake broke the protocol (or the exchange failed)."""


class ServerUnavailableError(HandshakeError):
    """No server answers on the socket (yet): missing, refused, closed or too slow."""


class NotAllowedError(HandshakeError, PermissionError):
    """The server refused this process (peer uid not allowed), or the server runs as a
    uid this client does not trust."""


@dataclass(frozen=True)
class Request:
    """A decoded request."""

    kind: int
    stream: int


@dataclass(frozen=True)
class BuffersReply:
    """An ok reply to a buffers request, with the fds that came with it (owned by the
    receiver: close them)."""

    server_id: int
    stream: int
    num_buffers: int
    geometry: BufferGeometry
    map_size: int
    fds: tuple[int, ...]


@dataclass(frozen=True)
class ListReply:
    """An ok reply to a list request."""

    server_id: int
    streams: frozenset[int]


def encode_request(kind: int, stream: int = 0) -> bytes:
    """The 16-byte request message."""
    return _native.encode_request(kind, stream)  # type: ignore[no-any-return]


def decode_request(data: bytes) -> Request:
    """The request in ``data``; HandshakeError naming what is wrong with it."""
    kind, stream_or_why = _native.decode_request(data)
    if kind is None:
        raise HandshakeError(f"{stream_or_why} ({len(data)} bytes)")
    return Request(kind, stream_or_why)


def encode_status_reply(server_id: int, status: int) -> bytes:
    """A reply without body (errors)."""
    return _native.encode_status_reply(server_id, status)  # type: ignore[no-any-return]


def encode_list_reply(server_id: int, streams: list[int]) -> bytes:
    """The ok reply to a list request."""
    return _native.encode_list_reply(  # type: ignore[no-any-return]
        server_id, sorted(streams)[:MAX_STREAMS]
    )


def encode_buffers_reply(
    server_id: int, stream: int, num_buffers: int, geometry: BufferGeometry
) -> bytes:
    """The ok reply to a buffers request (the fds travel with it)."""
    g = geometry
    return _native.encode_buffers_reply(  # type: ignore[no-any-return]
        server_id, stream, num_buffers, g.width, g.height, g.stride, g.uv_offset, g.size,
        g.map_size
    )


def decode_reply(data: bytes, fds: list[int], kind: int, stream: int) -> BuffersReply | ListReply:
    """The reply to a request of ``kind`` (for ``stream``); HandshakeError (or a subclass)
    when it is an error reply or malformed. Never closes ``fds``."""
    code, why, server_id, fields = _native.decode_reply(
        data, len(fds), kind, stream, mmap.PAGESIZE
    )
    if code == _native.NOT_ALLOWED:
        raise NotAllowedError(
            "the server does not serve this process's uid; start it with allowed_uids=... "
            "or MSGQ_VISIONIPC_ALLOW_UIDS listing this uid"
        )
    if code == _native.UNKNOWN_STREAM:
        raise ServerUnavailableError(f"the server has no stream {stream} (yet)")
    if code != 0:
        raise HandshakeError(f"{why} (reply of {len(data)} bytes, {len(fds)} descriptors)")
    if kind == KIND_LIST:
        return ListReply(server_id, frozenset(fields))
    r_stream, n, width, height, stride, uv_offset, size, map_size = fields
    geometry = BufferGeometry(width, height, stride, uv_offset, size)
    return BuffersReply(server_id, r_stream, n, geometry, map_size, tuple(fds))


def handshake_error(code: int, detail: str | None, path: str) -> HandshakeError:
    """The exception for the C client's error ``code`` in an exchange with the server at
    ``path`` (``detail``: what was wrong with a reply that broke the protocol)."""
    if code in _native.UNAVAILABLE:
        return ServerUnavailableError(
            f"no VisionIPC server (with that stream) answers at {path}: "
            f"{_native.error_text(code)}"
        )
    if code == _native.NOT_ALLOWED:
        return NotAllowedError(
            "the server does not serve this process's uid; start it with allowed_uids=... "
            "or MSGQ_VISIONIPC_ALLOW_UIDS listing this uid"
        )
    if code == _native.NOT_TRUSTED:
        return NotAllowedError(
            f"the VisionIPC server at {path} runs as a uid which this process does not "
            "trust; list it in MSGQ_VISIONIPC_ALLOW_UIDS to accept it"
        )
    if code == _native.SOCKET_DENIED:
        return NotAllowedError(
            f"cannot connect to {path}: permission denied (the socket file's mode follows "
            "MSGQ_SHM_MODE)"
        )
    if code == _native.PROTOCOL_ERROR and detail:
        return HandshakeError(f"the VisionIPC server at {path} broke the protocol: {detail}")
    return HandshakeError(f"handshake with {path} failed: {_native.error_text(code)}")
