# cython: language_level=3
"""VisionIPC's C code, bound in one extension module (one module's start-up code and
Cython's utility code compiled once, not three times):

* the wire formats (``_wire.pxi``): the frame packet, the handshake and the buffer
  layout, which ``packet.py``, ``handshake.py`` and ``buffer.py`` use;
* the frame copy (``_frame_copy.pxi``) of the copying send (``frame_copy.py``);
* this file, the binding of visionipc.h: the server (buffers, round robin, trailer
  protocol, sequences, the listener thread) and the client (handshake, checks of the
  reply and the fds, packet validation, restarts, recycled frames) are the C library's;
  ``server.py`` and ``client.py`` add the Python API on top: argument checks, the packet
  transport on the selected msgq backend, and numpy views over their own mappings of the
  buffers.

Both classes run in "caller" mode (VIPC_SERVER_CALLER_PUBLISHES,
VIPC_CLIENT_CALLER_RECEIVES): the packets travel on a Python msgq socket, so VisionIPC
works on every backend."""

import os

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport strerror
from cpython.bytes cimport PyBytes_FromStringAndSize

from msgq.errors import IpcError


include "_vipc_types.pxi"

cdef extern from "src/visionipc.h":
    enum:
        VIPC_SERVER_CALLER_PUBLISHES
        VIPC_SERVER_NO_ENV_UIDS
        VIPC_CLIENT_CONFLATE
        VIPC_CLIENT_SKIP_RECYCLED
        VIPC_CLIENT_CALLER_RECEIVES
        VIPC_MAX_BUFFERS_PER_STREAM

    ctypedef struct vipc_server:
        pass
    ctypedef struct vipc_listener_stats:
        uint64_t served, refused, bad_requests, unknown_stream, timeouts, evicted
        uint64_t disconnects, errors
    ctypedef struct vipc_stream_info:
        vipc_geometry geometry
        uint64_t map_size
        uint32_t num_buffers
        const int *fds
    ctypedef struct vipc_buffer:
        uint8_t *data
        uint64_t size
        uint32_t idx

    int vipc_server_open_flags(const char *name, unsigned flags, vipc_server **out)
    int vipc_server_allow_uids(vipc_server *srv, const uint32_t *uids, size_t n, int any)
    void vipc_server_set_handshake_timeout(vipc_server *srv, int64_t timeout_ns)
    int vipc_server_create_buffers_with_geometry(vipc_server *srv, uint32_t stream,
                                                 uint32_t num_buffers,
                                                 const vipc_geometry *g) nogil
    int vipc_server_stream_info(vipc_server *srv, uint32_t stream, vipc_stream_info *out)
    int vipc_server_start_listener(vipc_server *srv) nogil
    int vipc_server_get_buffer(vipc_server *srv, uint32_t stream, vipc_buffer *out)
    int64_t vipc_server_commit(vipc_server *srv, uint32_t stream, uint32_t idx,
                               uint32_t frame_id, uint64_t timestamp_sof,
                               uint64_t timestamp_eof, int valid, uint8_t *packet)
    uint64_t vipc_server_id(const vipc_server *srv)
    const char *vipc_server_socket_path(const vipc_server *srv)
    void vipc_server_get_listener_stats(vipc_server *srv, vipc_listener_stats *out)
    void vipc_server_close(vipc_server *srv) nogil

    ctypedef struct vipc_client:
        pass
    ctypedef struct vipc_frame:
        uint32_t idx
        uint32_t frame_id
        uint64_t sequence
        uint64_t timestamp_sof
        uint64_t timestamp_eof
        int valid
    ctypedef struct vipc_client_stats:
        uint64_t bad_packets, stale_packets, reconnects, recycled_frames, skipped_frames

    int vipc_client_open_flags(const char *name, uint32_t stream, unsigned flags,
                               vipc_client **out)
    void vipc_client_set_handshake_timeout(vipc_client *c, int64_t timeout_ns)
    int vipc_client_handshake(vipc_client *c, int64_t timeout_ns) nogil
    int vipc_client_take_packet(vipc_client *c, const void *data, size_t len,
                                int64_t timeout_ns, vipc_frame *out) nogil
    int vipc_client_buffer_fd(const vipc_client *c, uint32_t idx)
    uint64_t vipc_client_server_id(const vipc_client *c)
    uint64_t vipc_client_generation(const vipc_client *c)
    uint32_t vipc_client_num_buffers(const vipc_client *c)
    vipc_geometry vipc_client_geometry(const vipc_client *c)
    void vipc_client_get_stats(const vipc_client *c, vipc_client_stats *out)
    int vipc_client_last_error(const vipc_client *c, const char **detail)
    void vipc_client_close(vipc_client *c) nogil
    int vipc_available_streams(const char *name, uint32_t *streams, size_t cap,
                               int64_t timeout_ns) nogil

cdef extern from "<errno.h>":
    enum:
        ECONNREFUSED
        ETIMEDOUT
        EPERM
        EACCES
        ENOTCONN

PROTOCOL_ERROR = VIPC_EPROTOCOL
NOT_ALLOWED = VIPC_ENOTALLOWED
UNKNOWN_STREAM = VIPC_EUNKNOWNSTREAM
#: Codes that mean "no server (with that stream) answers yet": worth another try.
UNAVAILABLE = (-ECONNREFUSED, VIPC_EUNKNOWNSTREAM, -ETIMEDOUT)
NOT_TRUSTED = -EPERM
SOCKET_DENIED = -EACCES

include "_wire.pxi"
include "_frame_copy.pxi"
cdef enum:
    MAX_STREAMS_LISTED_C = 1024

MAX_STREAMS_LISTED = MAX_STREAMS_LISTED_C


def error_text(int code) -> str:
    """The C library's name for an error code (-errno or VIPC_E*)."""
    return vipc_strerror(code).decode()


def _geometry(vipc_geometry g):
    return (g.width, g.height, g.stride, g.uv_offset, g.size)


cdef class Server:
    """A vipc_server whose caller publishes the packets (see the module docs). Methods
    return C error codes as IpcError / ValueError; ``server.py`` checks arguments first."""

    cdef vipc_server *srv
    cdef readonly str name

    def __cinit__(self, str name):
        cdef bytes raw = name.encode()
        cdef int r = vipc_server_open_flags(
            raw, VIPC_SERVER_CALLER_PUBLISHES | VIPC_SERVER_NO_ENV_UIDS, &self.srv)
        if r < 0:
            raise ValueError(f"VisionIPC server {name!r}: {error_text(r)}")
        self.name = name

    def __dealloc__(self):
        self.close()

    cdef vipc_server *_open(self) except NULL:
        if self.srv == NULL:
            raise IpcError(f"VisionIPC server {self.name!r} is closed")
        return self.srv

    @property
    def server_id(self) -> int:
        return vipc_server_id(self._open())

    @property
    def socket_path(self) -> str:
        return os.fsdecode(vipc_server_socket_path(self._open()))

    def allow_uids(self, uids, bint any_uid) -> None:
        """Serves these uids (or every uid)."""
        cdef vipc_server *srv = self._open()
        cdef list ids = sorted(uids)
        cdef size_t n = len(ids)
        cdef uint32_t *arr = <uint32_t *>malloc(max(n, 1) * sizeof(uint32_t))
        if arr == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                arr[i] = ids[i]
            if vipc_server_allow_uids(srv, arr, n, any_uid) < 0:
                raise MemoryError()
        finally:
            free(arr)

    def set_handshake_timeout(self, double seconds) -> None:
        vipc_server_set_handshake_timeout(self._open(), <int64_t>(seconds * 1e9))

    def create_buffers(self, uint32_t stream, uint32_t num_buffers, uint32_t width,
                       uint32_t height, uint32_t stride, uint32_t uv_offset,
                       uint64_t size):
        """Allocates the stream's buffers (sealed memfds): (map_size, fds)."""
        cdef vipc_server *srv = self._open()
        cdef vipc_geometry g = vipc_geometry(width, height, stride, uv_offset, size)
        cdef int r
        with nogil:
            r = vipc_server_create_buffers_with_geometry(srv, stream, num_buffers, &g)
        if r == VIPC_EGEOMETRY or r == -22:  # EINVAL
            raise ValueError(f"stream {stream}: {error_text(r)}")
        if r < 0:
            raise IpcError(f"VisionIPC server {self.name!r}: cannot create the buffers of "
                           f"stream {stream}: {error_text(r)}")
        cdef vipc_stream_info info
        vipc_server_stream_info(srv, stream, &info)
        return info.map_size, tuple(info.fds[i] for i in range(info.num_buffers))

    def start_listener(self) -> None:
        cdef vipc_server *srv = self._open()
        cdef int r
        with nogil:
            r = vipc_server_start_listener(srv)
        if r == -17:  # EEXIST
            raise IpcError(
                f"VisionIPC socket path {self.socket_path} exists and is not a socket; "
                "remove it or use another server name")
        if r < 0:
            raise IpcError(f"VisionIPC socket {self.socket_path}: {strerror(-r).decode()}")

    def get_buffer(self, uint32_t stream) -> int:
        """The index of the stream's next buffer, now marked as being refilled."""
        cdef vipc_buffer buf
        if vipc_server_get_buffer(self._open(), stream, &buf) < 0:
            raise ValueError(f"stream {stream} has no buffers")
        return buf.idx

    def commit(self, uint32_t stream, uint32_t idx, uint32_t frame_id,
               uint64_t timestamp_sof, uint64_t timestamp_eof, bint valid):
        """Records the frame in buffer idx's trailer: (sequence, the packet to publish)."""
        cdef uint8_t packet[VIPC_PACKET_SIZE]
        cdef int64_t sequence = vipc_server_commit(
            self._open(), stream, idx, frame_id, timestamp_sof, timestamp_eof, valid, packet)
        if sequence < 0:
            raise ValueError(f"stream {stream} has no buffer {idx}")
        return sequence, PyBytes_FromStringAndSize(<char *>packet, VIPC_PACKET_SIZE)

    @property
    def listener_stats(self) -> dict:
        cdef vipc_listener_stats s
        vipc_server_get_listener_stats(self._open(), &s)
        return {"served": s.served, "refused": s.refused, "bad_requests": s.bad_requests,
                "unknown_stream": s.unknown_stream, "timeouts": s.timeouts,
                "evicted": s.evicted, "disconnects": s.disconnects, "errors": s.errors}

    def close(self) -> None:
        """Stops the listener, removes the socket if still ours, closes the buffers' fds
        and the C mappings (mappings made from the fds stay valid). Idempotent."""
        cdef vipc_server *srv = self.srv
        self.srv = NULL
        if srv != NULL:
            with nogil:
                vipc_server_close(srv)


cdef class Client:
    """A vipc_client whose caller receives the packets (see the module docs)."""

    cdef vipc_client *c
    cdef vipc_frame frame
    cdef readonly str name

    def __cinit__(self, str name, uint32_t stream, bint conflate, bint skip_recycled,
                  double handshake_timeout_s):
        cdef unsigned flags = VIPC_CLIENT_CALLER_RECEIVES
        if conflate:
            flags |= VIPC_CLIENT_CONFLATE
        if skip_recycled:
            flags |= VIPC_CLIENT_SKIP_RECYCLED
        cdef bytes raw = name.encode()
        cdef int r = vipc_client_open_flags(raw, stream, flags, &self.c)
        if r < 0:
            raise ValueError(f"VisionIPC client of {name!r}: {error_text(r)}")
        vipc_client_set_handshake_timeout(self.c, <int64_t>(handshake_timeout_s * 1e9))
        self.name = name

    def __dealloc__(self):
        self.close()

    cdef vipc_client *_open(self) except NULL:
        if self.c == NULL:
            raise IpcError(f"VisionIPC client of {self.name!r} is closed")
        return self.c

    def handshake(self, double timeout_s) -> int:
        """One handshake (the GIL released): 0, or the C error code."""
        cdef vipc_client *c = self._open()
        cdef int64_t timeout_ns = <int64_t>(timeout_s * 1e9)
        cdef int r
        with nogil:
            r = vipc_client_handshake(c, timeout_ns)
        return r

    def take_packet(self, const uint8_t[::1] data, double timeout_s):
        """The frame a received packet announces: (idx, frame_id, sequence, sof, eof,
        valid), or None when the packet was skipped (and counted)."""
        cdef vipc_client *c = self._open()
        cdef const void *ptr = &data[0] if data.shape[0] else NULL
        cdef size_t n = data.shape[0]
        cdef int64_t timeout_ns = <int64_t>(timeout_s * 1e9) if timeout_s >= 0 else -1
        cdef int r
        with nogil:
            r = vipc_client_take_packet(c, ptr, n, timeout_ns, &self.frame)
        if r < 0:
            raise IpcError(f"VisionIPC client of {self.name!r}: {error_text(r)}")
        if r == 0:
            return None
        f = &self.frame
        return (f.idx, f.frame_id, f.sequence, f.timestamp_sof, f.timestamp_eof,
                f.valid != 0)

    @property
    def server_id(self) -> int:
        return vipc_client_server_id(self.c) if self.c != NULL else 0

    @property
    def generation(self) -> int:
        """Grows each time the mapped buffers are replaced (a connect, a restart)."""
        return vipc_client_generation(self.c) if self.c != NULL else 0

    def buffers(self):
        """(geometry tuple, map_size, fds) of the buffers now held (the fds stay the
        C client's until the next generation)."""
        cdef vipc_client *c = self._open()
        cdef uint32_t n = vipc_client_num_buffers(c)
        fds = tuple(vipc_client_buffer_fd(c, i) for i in range(n))
        return _geometry(vipc_client_geometry(c)), fds

    @property
    def stats(self) -> dict:
        cdef vipc_client_stats s
        if self.c == NULL:
            return {}
        vipc_client_get_stats(self.c, &s)
        return {"bad_packets": s.bad_packets, "stale_packets": s.stale_packets,
                "reconnects": s.reconnects, "recycled_frames": s.recycled_frames,
                "skipped_frames": s.skipped_frames}

    def last_error(self):
        """(code, detail or None) of the last failed handshake (code 0: none)."""
        cdef const char *detail = NULL
        if self.c == NULL:
            return 0, None
        cdef int code = vipc_client_last_error(self.c, &detail)
        return code, (detail.decode() if detail != NULL else None)

    def close(self) -> None:
        cdef vipc_client *c = self.c
        self.c = NULL
        if c != NULL:
            with nogil:
                vipc_client_close(c)


def available_streams(str name, double timeout_s):
    """(code, stream ids) of server name's streams: code 0 with the ids, else the C
    error code and ()."""
    cdef bytes raw = name.encode()
    cdef const char *c_name = raw
    cdef uint32_t *ids = <uint32_t *>malloc(MAX_STREAMS_LISTED_C * sizeof(uint32_t))
    cdef int64_t timeout_ns = <int64_t>(timeout_s * 1e9)
    cdef int r
    if ids == NULL:
        raise MemoryError()
    try:
        with nogil:
            r = vipc_available_streams(c_name, ids, MAX_STREAMS_LISTED_C, timeout_ns)
        if r < 0:
            return r, ()
        return 0, tuple(ids[i] for i in range(min(r, MAX_STREAMS_LISTED_C)))
    finally:
        free(ids)
