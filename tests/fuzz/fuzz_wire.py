"""Fuzzes the bridge's wire parsers (``msgq/bridge/wire.py``): service topics, VisionIPC
topics and frame headers, as the laptop side reads them off the network.

Properties: only ``WireError`` escapes; an accepted topic is exactly the topic the robot
side makes for what was parsed (one byte string per service or stream: nothing else is
taken for it); an accepted header packs back to exactly its bytes, with a known
compression and 0 < size <= the limit."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import main, sabotaged  # noqa: E402

from msgq.bridge import wire  # noqa: E402

MAX_SIZE = 1 << 24
parse_vision_topic = wire.parse_vision_topic
if sabotaged():
    def parse_vision_topic(topic: bytes) -> tuple[str, int]:  # no shape checks
        name, _, stream = topic[1:].rpartition(b"/")
        try:
            return name.decode("utf-8", "replace"), int(stream or b"0") % 2**32
        except ValueError:
            raise wire.WireError("not a number") from None


def test_one_input(data: bytes) -> None:
    try:
        service = wire.parse_service_topic(data)
    except wire.WireError:
        pass
    else:
        # a topic parses back to what it was made of, plain or terminated (with keys)
        assert data in (wire.service_topic(service), wire.service_topic(service, True)), \
            (service, data)
    try:
        name, stream = parse_vision_topic(data)
    except wire.WireError:
        pass
    else:
        assert 0 <= stream < 2**32
        assert data in (wire.vision_topic(name, stream), wire.vision_topic(name, stream, True)), \
            (name, stream, data)
    try:
        header = wire.FrameHeader.unpack(data, MAX_SIZE)
    except wire.WireError:
        pass
    else:
        assert header.compression in (wire.COMPRESSION_NONE, wire.COMPRESSION_ZSTD)
        assert 0 < header.size <= MAX_SIZE
        assert header.pack() == data, (header, data)


SEEDS = [
    wire.service_topic("vehicleState"),
    wire.vision_topic("camerad", 0),
    wire.vision_topic("camerad/left", 4294967295),
    wire.FrameHeader(wire.COMPRESSION_ZSTD, 7, 1928, 1208, 2048, 2048 * 1216, 3_000_000,
                     1, 2, True).pack(),
    wire.FrameHeader(wire.COMPRESSION_NONE, 0, 16, 8, 64, 512, 768, 0, 0, False).pack(),
]

if __name__ == "__main__":
    main(test_one_input, SEEDS, [wire])
