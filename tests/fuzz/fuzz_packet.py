"""Fuzzes the VisionIPC frame packet parser (``visionipc/packet.py``).

Properties: ``parse_frame_packet`` never raises; a packet it accepts packs back to
exactly the bytes it was given, with a nonzero server id and sequence."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import main, sabotaged  # noqa: E402

from msgq.visionipc import packet  # noqa: E402

parse = packet.parse_frame_packet
if sabotaged():
    def parse(data: bytes) -> packet.FramePacket | None:  # no magic/version/flag checks
        if len(data) != packet.PACKET.size:
            return None
        fields = packet.PACKET.unpack(data)
        return packet.FramePacket(*fields[3:], bool(fields[2] & 1))


def test_one_input(data: bytes) -> None:
    parsed = parse(data)
    if parsed is None:
        return
    assert parsed.server_id != 0 and parsed.sequence != 0, parsed
    assert packet.pack_frame_packet(*parsed) == data, (parsed, data)


SEEDS = [
    packet.pack_frame_packet(1, 1, 0, 0, 0, 0, True),
    packet.pack_frame_packet(2**64 - 1, 7, 3, 2**32 - 1, 123, 456, False),
    b"VIPF" + bytes(44),
]

if __name__ == "__main__":
    main(test_one_input, SEEDS, [packet])
