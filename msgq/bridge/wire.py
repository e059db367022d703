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

The schema, on the services port, at the start and every :data:`HELLO_INTERVAL_S`::

    frame 0  b"h"
    frame 1  JSON: {"root": the root struct's name, "members": the union members by
             discriminant, "layout": [logMonoTime byte, valid byte, valid bit,
             discriminant byte, logMonoTime default, valid default], "fingerprint"}

With keys (``--keys DIR``: CurveZMQ, docs/security.md) every service and VisionIPC
topic ends in a zero byte (:data:`TOPIC_END`): the sending side grants each client the
exact topics its permissions allow, and ZMQ matches subscriptions as prefixes, so
without the end ``gpsLocation`` would also match ``gpsLocationExternal``.

Cap'n Proto bytes carry no schema: read with another one, an Event often still "decodes"
(another member's name, a time read from the wrong bits). So the receiving side compares
the announced schema with its own (:func:`schema_difference`: the same root, layout and
members, one side perhaps grown by members at the end) and drops every service message
of another schema, saying why, instead of re-publishing it mislabeled. A sender that
announces nothing (an older msgq) is not checked.

Everything received is checked (topic, header fields, sizes, decompressed length, that
service bytes are an Event of their topic's service); anything else is counted and
dropped. Each service and
stream has exactly one topic and each header one encoding: a stream id with leading
zeros, a nonzero padding byte or a ``valid`` other than 0/1 is refused, not taken for
the canonical form (so a field that may mean something to a later version is never
silently dropped).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMPRESSION_NONE",
    "COMPRESSION_ZSTD",
    "DEFAULT_PORT",
    "FRAME_PARTS",
    "HELLO_INTERVAL_S",
    "HELLO_TOPIC",
    "TOPIC_END",
    "VISION_HWM",
    "FrameHeader",
    "WireError",
    "parse_hello",
    "parse_service_topic",
    "parse_vision_topic",
    "schema_difference",
    "schema_hello",
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
#: Topic of the schema announcement on the services socket.
HELLO_TOPIC = b"h"
#: Seconds between two schema announcements.
HELLO_INTERVAL_S = 0.5
#: What ends every topic of a bridge with keys, so that the subscription a client is
#: granted (a topic, which ZMQ matches as a prefix) covers that service or stream only.
TOPIC_END = b"\x00"
COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 1
_MAGIC = 0x4656514D  # "MQVF" little-endian
_VERSION = 1
_HEADER = struct.Struct("<IHHIIIIIIQQB7s")
_PADDING = bytes(7)
_MAX_NAME = 100


class WireError(ValueError):
    """A bridge message that does not follow the wire format."""


def service_topic(service: str, terminated: bool = False) -> bytes:
    """The topic of ``service``; ``terminated`` (with keys): ending in TOPIC_END."""
    return b"s" + service.encode("utf-8") + (TOPIC_END if terminated else b"")


def parse_service_topic(topic: bytes) -> str:
    topic = topic.removesuffix(TOPIC_END)
    if not topic.startswith(b"s") or not 1 < len(topic) <= _MAX_NAME + 1:
        raise WireError("not a service topic")
    if TOPIC_END in topic:  # a name never holds it: a terminated topic has one reading
        raise WireError("service name holds a NUL byte")
    try:
        return topic[1:].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("service name is not UTF-8") from None


def schema_hello(schema: Any) -> bytes:
    """The announcement of ``schema`` (a :class:`msgq.schemas.Schema`; see the module
    docstring)."""
    layout = schema.layout
    return json.dumps({
        "root": schema.root_name,
        "members": list(layout.services),
        "layout": [layout.mono_byte, layout.valid_byte, layout.valid_bit,
                   layout.discriminant_byte, layout.mono_default, layout.valid_default],
        "fingerprint": schema.fingerprint,
    }, separators=(",", ":")).encode()


def parse_hello(data: bytes) -> dict[str, Any]:
    """An announcement's fields; WireError when it is not one."""
    try:
        hello = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise WireError("a schema announcement that is not JSON") from None
    if not isinstance(hello, dict) or not isinstance(hello.get("root"), str) \
            or not isinstance(hello.get("members"), list) \
            or not all(isinstance(m, str) for m in hello["members"]) \
            or not isinstance(hello.get("layout"), list):
        raise WireError("a schema announcement without root, members and layout")
    return hello


def schema_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """None when messages of the schema announced as ``theirs`` read right with ``ours``
    (the same root struct, the same places for logMonoTime, valid and the discriminant,
    the same union members, either side perhaps grown by members at the end); else
    what differs, in a few words."""
    if ours["root"] != theirs["root"]:
        return f"its root struct is {theirs['root']!r}, this side's {ours['root']!r}"
    if list(ours["layout"]) != list(theirs["layout"]):
        return ("its root struct keeps logMonoTime, valid or the union in other places "
                "than this side's")
    for ordinal, (mine, other) in enumerate(zip(ours["members"], theirs["members"],
                                                strict=False)):
        if mine != other:
            return f"its union member #{ordinal} is {other!r}, this side's {mine!r}"
    return None


def vision_topic(name: str, stream: int, terminated: bool = False) -> bytes:
    """The topic of VisionIPC stream ``name/stream``; ``terminated``: ending in TOPIC_END."""
    return (b"v" + name.encode("utf-8") + b"/" + str(stream).encode("ascii")
            + (TOPIC_END if terminated else b""))


def parse_vision_topic(topic: bytes) -> tuple[str, int]:
    topic = topic.removesuffix(TOPIC_END)
    if not topic.startswith(b"v") or len(topic) > _MAX_NAME + 12:
        raise WireError("not a VisionIPC topic")
    if TOPIC_END in topic:
        raise WireError("VisionIPC name holds a NUL byte")
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
