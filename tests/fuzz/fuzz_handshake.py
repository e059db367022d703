"""Fuzzes the VisionIPC handshake parsers (``visionipc/handshake.py``): requests as a
server reads them, and both kinds of reply as a client reads them.

Properties: only ``HandshakeError`` (and its subclasses) escapes; an accepted request
encodes back to exactly its bytes; an accepted buffers reply encodes back to exactly its
bytes, with 1..MAX_BUFFERS buffers, one descriptor each, a geometry VisionIPC accepts and
the map size this client's layout needs; an accepted list reply holds at most
MAX_STREAMS ids and survives encoding and decoding again unchanged."""

from __future__ import annotations

import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import main, sabotaged  # noqa: E402

from msgq.visionipc import handshake as hs  # noqa: E402
from msgq.visionipc.buffer import MAX_BUFFER_SIZE, BufferGeometry  # noqa: E402

decode_request = hs.decode_request
if sabotaged():
    def decode_request(data: bytes) -> hs.Request:  # checks the size only
        if len(data) != hs.REQUEST.size:
            raise hs.HandshakeError("size")
        _, _, kind, stream, _ = hs.REQUEST.unpack(data)
        return hs.Request(kind, stream)

FAKE_FD = 1000  # descriptors are never used: decode_reply only counts them


def test_one_input(data: bytes) -> None:
    try:
        request = decode_request(data)
    except hs.HandshakeError:
        pass
    else:
        assert request.kind in (hs.KIND_LIST, hs.KIND_BUFFERS), request
        assert hs.encode_request(request.kind, request.stream) == data, (request, data)

    # a client asks for the stream the reply names, and gets as many fds as it announces
    stream = struct.unpack_from("<I", data, 16)[0] if len(data) >= 20 else 0
    count = struct.unpack_from("<I", data, 20)[0] if len(data) >= 24 else 0
    fds = list(range(FAKE_FD, FAKE_FD + min(count, hs.MAX_BUFFERS + 1)))
    for kind, asked in ((hs.KIND_LIST, 0), (hs.KIND_BUFFERS, stream)):
        try:
            reply = hs.decode_reply(data, fds, kind, asked)
        except hs.HandshakeError:
            continue
        assert reply.server_id != 0
        if isinstance(reply, hs.ListReply):
            assert kind == hs.KIND_LIST and len(reply.streams) <= hs.MAX_STREAMS
            again = hs.encode_list_reply(reply.server_id, list(reply.streams))
            assert hs.decode_reply(again, [], hs.KIND_LIST, 0) == reply
        else:
            assert kind == hs.KIND_BUFFERS and reply.stream == asked
            assert 1 <= reply.num_buffers <= hs.MAX_BUFFERS
            assert reply.fds == tuple(fds) and len(reply.fds) == reply.num_buffers
            g = reply.geometry
            g.validate()
            assert 1 <= g.size <= MAX_BUFFER_SIZE and reply.map_size == g.map_size
            assert hs.encode_buffers_reply(reply.server_id, reply.stream, reply.num_buffers,
                                           g) == data, (reply, data)


SEEDS = [
    hs.encode_request(hs.KIND_LIST),
    hs.encode_request(hs.KIND_BUFFERS, 3),
    hs.encode_list_reply(9, [0, 1, 2**32 - 1]),
    hs.encode_list_reply(9, []),
    hs.encode_buffers_reply(9, 3, 2, BufferGeometry.nv12(16, 8)),
    hs.encode_buffers_reply(1, 0, 128, BufferGeometry.nv12(1928, 1208)),
    hs.encode_status_reply(9, hs.STATUS_UNKNOWN_STREAM),
    hs.encode_status_reply(9, hs.STATUS_NOT_ALLOWED),
]

if __name__ == "__main__":
    main(test_one_input, SEEDS, [hs])
