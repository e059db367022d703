"""Typing stub of the extension ``msgq.visionipc._wire`` (visionipc/_wire.pyx): VisionIPC's
wire formats (frame packet, handshake, buffer layout), implemented in C."""

from collections.abc import Iterable

Buffer = bytes | bytearray | memoryview

PROTOCOL_ERROR: int
NOT_ALLOWED: int
UNKNOWN_STREAM: int
PACKET_SIZE: int

def pack_packet(server_id: int, sequence: int, buffer_index: int, frame_id: int,
                timestamp_sof: int, timestamp_eof: int, valid: bool) -> bytes:
    """The 48 bytes of a frame packet."""

def parse_packet(data: Buffer) -> tuple[int, int, int, int, int, int, bool] | None:
    """(server_id, sequence, buffer_index, frame_id, sof, eof, valid) of a well-formed
    packet, else None."""

def encode_request(kind: int, stream: int) -> bytes: ...
def decode_request(data: Buffer) -> tuple[int, int] | tuple[None, str]:
    """(kind, stream), or (None, why) for a malformed request."""

def encode_status_reply(server_id: int, status: int) -> bytes: ...
def encode_list_reply(server_id: int, streams: Iterable[int]) -> bytes:
    """The ok reply to a list request (ids sorted; at most VIPC_MAX_STREAMS)."""

def encode_buffers_reply(server_id: int, stream: int, num_buffers: int, width: int,
                         height: int, stride: int, uv_offset: int, size: int,
                         map_size: int) -> bytes: ...
def decode_reply(data: Buffer, num_fds: int, kind: int, stream: int, page_size: int
                 ) -> tuple[int, str | None, int, tuple[int, ...] | None]:
    """(code, why, server_id, fields): code 0 with the buffers reply's fields or the list
    reply's stream ids; else the error code, why, and server_id."""

def geometry_layout(width: int, height: int, stride: int, uv_offset: int, size: int,
                    page_size: int) -> tuple[str | None, int, int, bool]:
    """(why the geometry describes no buffer, or None; trailer offset; map size; whether
    an NV12 UV plane fits)."""
