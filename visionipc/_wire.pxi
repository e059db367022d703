# Included by _native.pyx (the extension msgq.visionipc._native): the binding of
# VisionIPC's wire formats in C (visionipc/src/vipc_packet.c, vipc_handshake.c,
# vipc_layout.c), the one implementation of encoding and validating the per-frame packet
# and the handshake messages. ``packet.py``, ``handshake.py`` and ``buffer.py`` build
# their Python values and exceptions from what these functions return.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize


cdef extern from "src/vipc_packet.h":
    ctypedef struct vipc_frame_packet:
        uint64_t server_id
        uint64_t sequence
        uint32_t buffer_index
        uint32_t frame_id
        uint64_t timestamp_sof
        uint64_t timestamp_eof
        int valid
    void vipc_packet_encode(const vipc_frame_packet *p, uint8_t *out)
    int vipc_packet_parse(const void *data, size_t len, vipc_frame_packet *out)

cdef extern from "src/vipc_handshake.h":
    enum:
        VIPC_REQUEST_SIZE
        VIPC_REPLY_HEADER_SIZE
        VIPC_BUFFERS_REPLY_SIZE
        VIPC_MAX_REPLY_SIZE
        VIPC_MAX_STREAMS
    ctypedef struct vipc_request:
        uint16_t kind
        uint32_t stream
    ctypedef struct vipc_reply:
        uint64_t server_id
        uint32_t stream
        uint32_t num_buffers
        vipc_geometry geometry
        uint64_t map_size
        uint32_t count
    void vipc_request_encode(uint16_t kind, uint32_t stream, uint8_t *out)
    int vipc_request_parse(const void *data, size_t len, vipc_request *out, const char **why)
    size_t vipc_status_reply_encode(uint64_t server_id, uint16_t status, uint8_t *out)
    size_t vipc_list_reply_encode(uint64_t server_id, const uint32_t *streams, uint32_t count,
                                  uint8_t *out)
    size_t vipc_buffers_reply_encode(uint64_t server_id, uint32_t stream, uint32_t num_buffers,
                                     const vipc_geometry *g, uint64_t map_size, uint8_t *out)
    int vipc_reply_parse(const void *data, size_t len, size_t num_fds, uint16_t kind,
                         uint32_t stream, uint64_t page_size, vipc_reply *out,
                         uint32_t *streams, const char **why)

PACKET_SIZE = VIPC_PACKET_SIZE


def pack_packet(uint64_t server_id, uint64_t sequence, uint32_t buffer_index,
                uint32_t frame_id, uint64_t timestamp_sof, uint64_t timestamp_eof,
                bint valid) -> bytes:
    """The 48 bytes of a frame packet."""
    cdef vipc_frame_packet p
    p.server_id = server_id
    p.sequence = sequence
    p.buffer_index = buffer_index
    p.frame_id = frame_id
    p.timestamp_sof = timestamp_sof
    p.timestamp_eof = timestamp_eof
    p.valid = valid
    out = PyBytes_FromStringAndSize(NULL, VIPC_PACKET_SIZE)
    vipc_packet_encode(&p, <uint8_t *>PyBytes_AS_STRING(out))
    return out


def parse_packet(const uint8_t[::1] data):
    """(server_id, sequence, buffer_index, frame_id, sof, eof, valid) of a well-formed
    packet, else None."""
    cdef vipc_frame_packet p
    cdef const void *ptr = &data[0] if data.shape[0] else NULL
    if vipc_packet_parse(ptr, <size_t>data.shape[0], &p) != 0:
        return None
    return (p.server_id, p.sequence, p.buffer_index, p.frame_id, p.timestamp_sof,
            p.timestamp_eof, bool(p.valid))


def encode_request(uint16_t kind, uint32_t stream) -> bytes:
    out = PyBytes_FromStringAndSize(NULL, VIPC_REQUEST_SIZE)
    vipc_request_encode(kind, stream, <uint8_t *>PyBytes_AS_STRING(out))
    return out


def decode_request(const uint8_t[::1] data):
    """(kind, stream), or (None, why) for a malformed request."""
    cdef vipc_request r
    cdef const char *why = NULL
    cdef const void *ptr = &data[0] if data.shape[0] else NULL
    if vipc_request_parse(ptr, <size_t>data.shape[0], &r, &why) != 0:
        return None, why.decode("ascii")
    return r.kind, r.stream


def encode_status_reply(uint64_t server_id, uint16_t status) -> bytes:
    out = PyBytes_FromStringAndSize(NULL, VIPC_REPLY_HEADER_SIZE)
    vipc_status_reply_encode(server_id, status, <uint8_t *>PyBytes_AS_STRING(out))
    return out


def encode_list_reply(uint64_t server_id, streams) -> bytes:
    """The ok reply to a list request (ids sorted; at most VIPC_MAX_STREAMS)."""
    cdef uint32_t ids[VIPC_MAX_STREAMS]
    cdef uint32_t n = 0
    for s in streams:
        if n == VIPC_MAX_STREAMS:
            break
        ids[n] = s
        n += 1
    cdef uint8_t out[VIPC_MAX_REPLY_SIZE]
    cdef size_t length = vipc_list_reply_encode(server_id, ids, n, out)
    return PyBytes_FromStringAndSize(<char *>out, length)


def encode_buffers_reply(uint64_t server_id, uint32_t stream, uint32_t num_buffers,
                         uint32_t width, uint32_t height, uint32_t stride, uint32_t uv_offset,
                         uint64_t size, uint64_t map_size) -> bytes:
    cdef vipc_geometry g = vipc_geometry(width, height, stride, uv_offset, size)
    out = PyBytes_FromStringAndSize(NULL, VIPC_BUFFERS_REPLY_SIZE)
    vipc_buffers_reply_encode(server_id, stream, num_buffers, &g, map_size,
                              <uint8_t *>PyBytes_AS_STRING(out))
    return out


def decode_reply(const uint8_t[::1] data, size_t num_fds, uint16_t kind, uint32_t stream,
                 uint64_t page_size):
    """(code, why, server_id, fields): code 0 with fields (stream, num_buffers, width,
    height, stride, uv_offset, size, map_size) for a buffers reply or the tuple of stream
    ids for a list reply; else the error code (PROTOCOL_ERROR, NOT_ALLOWED,
    UNKNOWN_STREAM), why, and server_id (0 when the header itself was bad)."""
    cdef vipc_reply r
    cdef const char *why = NULL
    cdef uint32_t ids[VIPC_MAX_STREAMS]
    cdef const void *ptr = &data[0] if data.shape[0] else NULL
    cdef int code = vipc_reply_parse(ptr, <size_t>data.shape[0], num_fds, kind, stream,
                                     page_size, &r, ids, &why)
    if code != 0:
        return code, why.decode("ascii"), (r.server_id if code != VIPC_EPROTOCOL else 0), None
    if kind == 1:
        return 0, None, r.server_id, tuple(ids[i] for i in range(r.count))
    g = r.geometry
    return 0, None, r.server_id, (r.stream, r.num_buffers, g.width, g.height, g.stride,
                                  g.uv_offset, g.size, r.map_size)


cdef extern from "src/vipc_layout.h":
    int vipc_geometry_validate(const vipc_geometry *g, const char **why)
    uint64_t vipc_trailer_offset(const vipc_geometry *g)
    uint64_t vipc_map_size(const vipc_geometry *g, uint64_t page_size)
    int vipc_geometry_has_uv_plane(const vipc_geometry *g)


def geometry_layout(uint32_t width, uint32_t height, uint32_t stride, uint32_t uv_offset,
                    uint64_t size, uint64_t page_size):
    """(why the geometry describes no buffer, or None; trailer offset; map size; whether
    an NV12 UV plane fits), by the C rules of vipc_layout.h."""
    cdef vipc_geometry g = vipc_geometry(width, height, stride, uv_offset, size)
    cdef const char *why = NULL
    problem = None
    if vipc_geometry_validate(&g, &why) != 0:
        problem = why.decode("ascii")
    return (problem, vipc_trailer_offset(&g), vipc_map_size(&g, page_size),
            problem is None and vipc_geometry_has_uv_plane(&g) == 1)
