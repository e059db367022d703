"""The per-frame packet a server publishes on a stream's msgq endpoint.

One fixed 48-byte little-endian record per published frame::

    offset  size  field
         0     4  magic          b"VIPF"
         4     2  version        1
         6     2  flags          bit 0: valid; other bits must be 0
         8     8  server_id      random, nonzero, per server instance (restart detection)
        16     8  sequence       the stream's publish counter: 1, 2, 3, ...
        24     4  buffer_index   which of the stream's buffers holds the frame
        28     4  frame_id       uint32, as given to send()
        32     8  timestamp_sof  uint64, as given to send()
        40     8  timestamp_eof  uint64, as given to send()

Anything else on the endpoint (other sizes, magic, versions or flags) is not a packet:
:func:`parse_frame_packet` returns None for it and the client skips and counts it.

The bytes are written and checked by the C code in ``src/vipc_packet.c`` (through
``_native``), the one implementation that C servers and clients share.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from . import _native

__all__ = [
    "FLAG_VALID",
    "PACKET",
    "PACKET_MAGIC",
    "PACKET_SEGMENT_SIZE",
    "PACKET_VERSION",
    "FramePacket",
    "pack_frame_packet",
    "parse_frame_packet",
]

#: Layout of the packet (documentation and size; src/vipc_packet.c reads and writes it).
PACKET = struct.Struct("<4sHHQQIIQQ")
PACKET_MAGIC = b"VIPF"
PACKET_VERSION = 1
FLAG_VALID = 1
KNOWN_FLAGS = FLAG_VALID
#: Ring size of a stream's msgq endpoint (publisher and subscribers ask for the same): room
#: for thousands of packets, far more than any number of buffers a client could lag by.
PACKET_SEGMENT_SIZE = 256 * 1024


class FramePacket(NamedTuple):
    """A parsed per-frame packet."""

    server_id: int
    sequence: int
    buffer_index: int
    frame_id: int
    timestamp_sof: int
    timestamp_eof: int
    valid: bool


def pack_frame_packet(
    server_id: int,
    sequence: int,
    buffer_index: int,
    frame_id: int,
    timestamp_sof: int,
    timestamp_eof: int,
    valid: bool,
) -> bytes:
    """The 48 bytes announcing one frame."""
    return _native.pack_packet(  # type: ignore[no-any-return]
        server_id, sequence, buffer_index, frame_id, timestamp_sof, timestamp_eof, valid
    )


def parse_frame_packet(data: bytes) -> FramePacket | None:
    """The packet in ``data``, or None when ``data`` is not a well-formed packet."""
    fields = _native.parse_packet(data)
    return None if fields is None else FramePacket(*fields)
