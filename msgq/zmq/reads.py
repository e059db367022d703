"""Read acknowledgements: how a ZMQ publisher learns what its subscribers have read
(ZMQ has none of its own), so that ``all_readers_updated`` means what it means on shared
memory. See :mod:`msgq.zmq` and docs/backends.md."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

#: Connection-level metadata of a subscriber: its reader id (16 hex digits), which the
#: publisher keys the subscriber's read acknowledgements by.
READER_PROPERTY = "X-Msgq-Reader"
#: Topic prefix of a read acknowledgement: a subscriber subscribes to and at once
#: unsubscribes from ``ACK_TOPIC + reader id + fingerprint`` (little-endian, 8 bytes) of
#: the last message it read. The publisher applies subscriptions itself (XPUB_MANUAL) and
#: never applies these, so they filter nothing.
ACK_TOPIC = b"\xfdmsgq-read:"
#: Topic a subscriber that does not conflate subscribes to besides everything
#: (``+ reader id``): the unsubscription libzmq makes when its connection ends then
#: names it. (A conflating socket delivers only the last of its subscriptions, so it
#: keeps to one; its reader id travels in its connection's metadata instead.)
READER_TOPIC = b"\xfemsgq-reader:"
#: Sent like an acknowledgement (``+ reader id``) by a subscriber that closes.
BYE_TOPIC = b"\xfdmsgq-bye:"


def fingerprint(data: Any) -> int:
    """What a read acknowledgement says of a message: its length and a CRC-32 of its
    first and last 32 bytes (a message's own time stamp lies in its first bytes)."""
    if type(data) is not bytes:
        data = memoryview(data)
        if data.format != "B" or data.ndim != 1:
            data = data.cast("B")
    size = len(data)
    crc = zlib.crc32(data[:32])
    if size > 32:
        crc = zlib.crc32(data[-32:], crc)
    return (crc << 32) | (size & 0xFFFFFFFF)


@dataclass
class _ReaderState:
    """What a publisher knows of one subscriber that acknowledges reads."""

    #: Messages the publisher had sent when the reader's subscription took effect.
    base: int
    #: Fingerprint of the last message the reader said it read (None: none yet).
    read: int | None = None
    #: Whether the end of its connection names it (READER_TOPIC): not so for a
    #: conflating subscriber, which is forgotten when an unnamed connection ends.
    named: bool = False
