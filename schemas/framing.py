"""Cap'n Proto stream framing, read without pycapnp: where each message of a log stream
ends, and the three fields every tool needs (logMonoTime, valid, which service) peeked
straight from the bytes. :meth:`EventLayout.identify` is the one check, for every tool
that takes bytes from elsewhere, that they are an Event and of which service and time.

A log stream is Cap'n Proto messages back to back in the standard (unpacked) encoding:

    u32 segment_count - 1, u32 size of each segment (words), padding to 8 bytes,
    then the segments.

Everything here treats the bytes as untrusted: a length field that points past the data
or is implausibly large is reported, never followed. These are the rules for one message
at a time (what a subscriber or the recorder is handed); a log stream is split, and its
damage judged, by the C log scanner (``msgq/logs/src/log_scan.c``), whose rules are these.

Layer: the Event layer; imports the standard library and :mod:`msgq.errors` only (the
schema an :class:`EventLayout` was made from decodes what peeking cannot).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from msgq.errors import MessageDecodeError

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_SEGMENTS",
    "EventLayout",
    "FramingError",
    "message_length",
    "root_data_section",
]

#: Largest message a log may hold (a sanity bound on untrusted length fields).
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
#: Largest segment count of one message (Cap'n Proto's own reader limit is 512).
MAX_SEGMENTS = 512

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U16 = struct.Struct("<H")


class FramingError(ValueError):
    """The bytes at an offset cannot be the start of a message."""


def message_length(buf: Any, offset: int) -> int | None:
    """Length in bytes of the message starting at ``offset`` of ``buf``; None when
    ``buf`` ends before the header or the message does (more bytes may complete it).
    Raises FramingError when the header is impossible."""
    end = len(buf)
    if end - offset < 4:
        return None
    count = _U32.unpack_from(buf, offset)[0] + 1
    if count > MAX_SEGMENTS:
        raise FramingError(f"segment count {count} is over {MAX_SEGMENTS}")
    header = (4 + 4 * count + 7) & ~7
    if end - offset < header:
        return None
    words = 0
    for i in range(count):
        words += _U32.unpack_from(buf, offset + 4 + 4 * i)[0]
    if words == 0:
        raise FramingError("message with no data")
    total = header + 8 * words
    if total > MAX_MESSAGE_BYTES:
        raise FramingError(f"message of {total} bytes is over the {MAX_MESSAGE_BYTES} limit")
    if end - offset < total:
        return None
    return total


def root_data_section(message: Any) -> tuple[int, int] | None:
    """``(byte offset, words)`` of the data section of a one-message buffer's root struct,
    inside its first segment; None when the root pointer is not a struct pointer into that
    segment (a far pointer, garbage). Bounds-checked: the section lies inside ``message``."""
    if len(message) < 16:
        return None
    count = _U32.unpack_from(message, 0)[0] + 1
    base = (4 + 4 * count + 7) & ~7  # first word of segment 0
    if count > MAX_SEGMENTS or base + 8 > len(message):
        return None
    seg0_end = base + 8 * _U32.unpack_from(message, 4)[0]
    if seg0_end > len(message):
        return None
    pointer = _U64.unpack_from(message, base)[0]
    if pointer & 3 != 0:  # not a struct pointer (far pointer or garbage)
        return None
    offset_words = (pointer >> 2) & 0x3FFFFFFF
    if offset_words & 0x20000000:
        offset_words -= 0x40000000
    data_words = (pointer >> 32) & 0xFFFF
    data = base + 8 * (1 + offset_words)
    if data < base + 8 or data + 8 * data_words > seg0_end:
        return None
    return data, data_words


@dataclass(frozen=True)
class EventLayout:
    """Where the root struct of a schema keeps ``logMonoTime``, ``valid`` and its union
    discriminant, so they can be read from a message's bytes without pycapnp, and the
    defaults the schema declares for them: Cap'n Proto stores a field XOR its default
    (openpilot declares ``valid @67 :Bool = true``), and a field beyond the end of an
    older writer's data section reads as its default. Union discriminants have no
    default (zero)."""

    mono_byte: int
    valid_byte: int
    valid_bit: int
    discriminant_byte: int
    services: tuple[str, ...]  # union members by discriminant value
    mono_default: int = 0
    valid_default: bool = False
    schema: Any = field(default=None, repr=False, compare=False)  # decodes what peek cannot

    @classmethod
    def of(cls, schema: Any) -> EventLayout:
        """The layout of ``schema``'s root struct (a :class:`msgq.schemas.Schema`)."""
        node = schema.event.schema.node
        fields = schema.event.schema.fields
        mono = fields["logMonoTime"].proto.slot
        valid = fields["valid"].proto.slot
        if mono.type.which() != "uint64" or valid.type.which() != "bool":
            raise ValueError("logMonoTime must be UInt64 and valid Bool")
        by_value = {fields[name].proto.discriminantValue: name for name in schema.union_fields}
        return cls(
            mono_byte=8 * mono.offset,
            valid_byte=valid.offset // 8,
            valid_bit=valid.offset % 8,
            discriminant_byte=2 * node.struct.discriminantOffset,
            services=tuple(by_value[i] for i in range(len(by_value))),
            mono_default=int(mono.defaultValue.uint64),
            valid_default=bool(valid.defaultValue.bool),
            schema=schema,
        )

    def identify(self, message: Any, framed: bool = False) -> tuple[int, bool, str] | None:
        """``(logMonoTime, valid, service)`` when ``message`` is exactly one well-framed
        Event (no bytes missing, none left over), else None. Peeked from the bytes, or —
        when laid out in a way :meth:`peek` does not follow — decoded with the bounded
        decoder (:meth:`msgq.schemas.Schema.decode`). ``framed``: the caller knows
        the framing adds up already (a log reader that split ``message`` off a stream)."""
        if not framed:
            try:
                if message_length(message, 0) != len(message):
                    return None
            except FramingError:
                return None
        peeked = self.peek(message)
        if peeked is not None:
            return peeked
        try:
            msg = self.schema.decode(message)
        except MessageDecodeError:
            return None
        return int(msg.logMonoTime), bool(msg.valid), str(msg.which())

    def peek(self, message: Any) -> tuple[int, bool, str] | None:
        """``(logMonoTime, valid, service)`` of one whole message, read from its root
        struct; None when the message is laid out in a way this shortcut does not follow
        (a far root pointer, for instance) — decode it with pycapnp then."""
        section = root_data_section(message)
        if section is None:
            return None
        data, data_words = section
        size = 8 * data_words  # bytes of the data section
        # stored XOR the declared default; a field past the data section is its default
        mono = _U64.unpack_from(message, data + self.mono_byte)[0] ^ self.mono_default \
            if self.mono_byte + 8 <= size else self.mono_default
        valid = bool(message[data + self.valid_byte] >> self.valid_bit & 1) \
            ^ self.valid_default if self.valid_byte < size else self.valid_default
        which = _U16.unpack_from(message, data + self.discriminant_byte)[0] \
            if self.discriminant_byte + 2 <= size else 0
        if which >= len(self.services):
            return None  # a service of a newer schema: let pycapnp say what it is
        return mono, valid, self.services[which]
