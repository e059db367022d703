"""The bridge's wire format: ZMQ multipart messages on two PUB sockets.

Services (port P)::

    frame 0  b"s" + service name (UTF-8)        the topic subscribers filter on
    frame 1  the Event bytes, exactly as published locally

VisionIPC frames (port P + 1, a separate socket with a small high-water mark, so a slow
link drops frames instead of queueing seconds of video)::

    frame 0  b"v" + VisionIPC name + b"/" + stream id (decimal)
    frame 1  header, little-endian: magic u32 "MQVF", version u16, compression u16
             (0 none, 1 zstd), frame_id u32, width u32, height u32, stride u32,
             uv_offset u32, size u32 (bytes of the frame), timestamp_sof u64,
             timestamp_eof u64, valid u8 (0 or 1), 7 bytes padding (zero)
    frame 2  the frame: ``size`` bytes, or their zstd compression

Everything received is checked (topic, header fields, sizes, decompressed length, that
service bytes are an Event); anything else is counted and dropped. Each service and
stream has exactly one topic and each header one encoding: a stream id with leading
zeros, a nonzero padding byte or a ``valid`` other than 0/1 is refused, not taken for
the canonical form (so a field that may mean something to a later version is never
silently dropped).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "COMPRESSION_NONE",
    "COMPRESSION_ZSTD",
    "DEFAULT_PORT",
    "FRAME_PARTS",
    "VISION_HWM",
    "FrameHeader",
    "WireError",
    "parse_service_topic",
    "parse_vision_topic",
    "service_topic",
    "vision_topic",
]

#: Port of the services socket; VisionIPC frames use the next one.
DEFAULT_PORT = 8010
#: Frames queued per remote subscriber, on each side (a slow link drops frames, it does
#: not lag).
VISION_HWM = 4
#: Parts of a frame message (topic, header, frame): ZMQ counts high-water marks in parts.
FRAME_PARTS = 3
COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 1
_MAGIC = 0x4656514D  # "MQVF" little-endian
_VERSION = 1
_HEADER = struct.Struct("<IHHIIIIIIQQB7s")
_PADDING = bytes(7)
_MAX_NAME = 100


class WireError(ValueError):
    """A bridge message that does not follow the wire format."""


def service_topic(service: str) -> bytes:
    return b"s" + service.encode("utf-8")


def parse_service_topic(topic: bytes) -> str:
    if not topic.startswith(b"s") or not 1 < len(topic) <= _MAX_NAME + 1:
        raise WireError("not a service topic")
    try:
        return topic[1:].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("service name is not UTF-8") from None


def vision_topic(name: str, stream: int) -> bytes:
    return b"v" + name.encode("utf-8") + b"/" + str(stream).encode("ascii")


def parse_vision_topic(topic: bytes) -> tuple[str, int]:
    if not topic.startswith(b"v") or len(topic) > _MAX_NAME + 12:
        raise WireError("not a VisionIPC topic")
    name, sep, stream = topic[1:].rpartition(b"/")
    if not sep or not name or not stream.isdigit() or len(stream) > 10:
        raise WireError("malformed VisionIPC topic")
    if stream.startswith(b"0") and stream != b"0":
        raise WireError("stream id with leading zeros")
    value = int(stream)
    if value >= 2**32:
        raise WireError("stream id out of range")
    try:
        return name.decode("utf-8"), value
    except UnicodeDecodeError:
        raise WireError("VisionIPC name is not UTF-8") from None


@dataclass(frozen=True)
class FrameHeader:
    """What travels with a frame: its geometry and metadata."""

    compression: int
    frame_id: int
    width: int
    height: int
    stride: int
    uv_offset: int
    size: int
    timestamp_sof: int
    timestamp_eof: int
    valid: bool

    def pack(self) -> bytes:
        return _HEADER.pack(_MAGIC, _VERSION, self.compression, self.frame_id, self.width,
                            self.height, self.stride, self.uv_offset, self.size,
                            self.timestamp_sof, self.timestamp_eof, int(self.valid), _PADDING)

    @classmethod
    def unpack(cls, data: bytes, max_size: int) -> FrameHeader:
        if len(data) != _HEADER.size:
            raise WireError(f"frame header of {len(data)} bytes (expected {_HEADER.size})")
        (magic, version, compression, frame_id, width, height, stride, uv_offset, size,
         sof, eof, valid, padding) = _HEADER.unpack(data)
        if magic != _MAGIC or version != _VERSION:
            raise WireError("frame header magic/version mismatch")
        if valid > 1 or padding != _PADDING:
            raise WireError("frame header with nonzero reserved bits")
        if compression not in (COMPRESSION_NONE, COMPRESSION_ZSTD):
            raise WireError(f"unknown compression {compression}")
        if not 0 < size <= max_size:
            raise WireError(f"frame size {size} out of range")
        return cls(compression, frame_id, width, height, stride, uv_offset, size, sof, eof,
                   bool(valid))
