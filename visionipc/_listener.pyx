# cython: language_level=3
"""Binding of visionipc/src/vipc_listener.c: the server's side of the handshake (one C
thread, one poll loop, no blocking calls), shared with C servers (visionipc.h). The rules
it follows are in ``listener.py``'s docs and in vipc_listener.h."""

import os

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport strerror

from msgq.errors import IpcError


cdef extern from "src/vipc_layout.h":
    ctypedef struct vipc_geometry:
        uint32_t width
        uint32_t height
        uint32_t stride
        uint32_t uv_offset
        uint64_t size

cdef extern from "src/visionipc.h":
    ctypedef struct vipc_listener_stats:
        uint64_t served, refused, bad_requests, unknown_stream, timeouts, evicted
        uint64_t disconnects, errors

cdef extern from "src/vipc_listener.h":
    ctypedef struct vipc_listener:
        pass
    int vipc_listener_start(const char *path, unsigned mode, uint64_t server_id,
                            int64_t handshake_timeout_ns, int max_pending,
                            vipc_listener **out) nogil
    int vipc_listener_set_uids(vipc_listener *l, const uint32_t *uids, size_t n, int any)
    int vipc_listener_add_stream(vipc_listener *l, uint32_t stream, const vipc_geometry *g,
                                 uint64_t map_size, const int *fds, uint32_t num_fds)
    void vipc_listener_get_stats(vipc_listener *l, vipc_listener_stats *out) nogil
    int vipc_listener_running(vipc_listener *l)
    void vipc_listener_stop(vipc_listener *l) nogil


cdef class Listener:
    """The listener of one server: ``start()`` binds ``path`` and starts the C thread,
    ``add_stream`` exports a stream created later, ``close()`` stops it. ``streams``
    (stream id -> StreamExport) are exported at start; ``policy`` is a PeerPolicy.
    ``stats`` counts what happened, per kind."""

    cdef vipc_listener *handle
    cdef readonly str path
    cdef readonly object server_id
    cdef object streams
    cdef object policy
    cdef unsigned socket_mode
    cdef double handshake_timeout_s
    cdef int max_pending

    def __init__(self, path, server_id, streams, policy, socket_mode,
                 handshake_timeout_s=1.0, max_pending=256):
        self.path = path
        self.server_id = server_id
        self.streams = streams
        self.policy = policy
        self.socket_mode = socket_mode
        self.handshake_timeout_s = handshake_timeout_s
        self.max_pending = max_pending

    def __dealloc__(self):
        if self.handle != NULL:
            with nogil:
                vipc_listener_stop(self.handle)
            self.handle = NULL

    def start(self) -> None:
        """Replaces a socket left at the path by another server (a crashed one's, or an
        older live one's), binds, and starts the thread (idempotent)."""
        cdef vipc_listener *handle = NULL
        cdef int r
        if self.handle != NULL:
            return
        cdef bytes raw = os.fsencode(self.path)
        cdef const char *c_path = raw
        cdef int64_t timeout_ns = <int64_t>(self.handshake_timeout_s * 1e9)
        cdef uint64_t server_id = self.server_id
        cdef unsigned mode = self.socket_mode
        cdef int max_pending = self.max_pending
        with nogil:
            r = vipc_listener_start(c_path, mode, server_id, timeout_ns, max_pending, &handle)
        if r == -17:  # EEXIST
            raise IpcError(
                f"VisionIPC socket path {self.path} exists and is not a socket; "
                "remove it or use another server name")
        if r < 0:
            raise IpcError(f"VisionIPC socket {self.path}: {strerror(-r).decode()}")
        self.handle = handle
        try:
            self._set_policy()
            for stream, export in list(self.streams.items()):
                self.add_stream(stream, export)
        except BaseException:
            self.close()
            raise

    cdef _set_policy(self):
        uids = sorted(self.policy.uids)
        cdef size_t n = len(uids)
        cdef uint32_t *arr = <uint32_t *>malloc(max(n, 1) * sizeof(uint32_t))
        if arr == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                arr[i] = uids[i]
            if vipc_listener_set_uids(self.handle, arr, n, self.policy.any_uid) < 0:
                raise MemoryError()
        finally:
            free(arr)

    def add_stream(self, uint32_t stream, export) -> None:
        """Exports ``stream`` (a StreamExport: geometry and the buffers' fds, which stay
        the caller's and must stay open until ``close``)."""
        cdef vipc_geometry g
        cdef int fds[128]
        if self.handle == NULL:
            return
        geometry = export.geometry
        g.width = geometry.width
        g.height = geometry.height
        g.stride = geometry.stride
        g.uv_offset = geometry.uv_offset
        g.size = geometry.size
        n = len(export.fds)
        if not 1 <= n <= 128:
            raise ValueError(f"a stream exports 1 .. 128 buffers, not {n}")
        for i, fd in enumerate(export.fds):
            fds[i] = fd
        r = vipc_listener_add_stream(self.handle, stream, &g, geometry.map_size, fds, n)
        if r < 0:
            raise IpcError(f"VisionIPC listener: cannot export stream {stream}: "
                           f"{strerror(-r).decode()}")

    def close(self) -> None:
        """Stops serving and removes the socket file if it is still ours (a newer server
        may have taken the path over). In a forked copy only closes this process's
        descriptors."""
        cdef vipc_listener *handle = self.handle
        self.handle = NULL
        if handle != NULL:
            with nogil:
                vipc_listener_stop(handle)

    @property
    def running(self) -> bool:
        return self.handle != NULL and vipc_listener_running(self.handle) == 1

    @property
    def stats(self) -> dict:
        cdef vipc_listener_stats s
        if self.handle == NULL:
            return {k: 0 for k in ("served", "refused", "bad_requests", "unknown_stream",
                                   "timeouts", "evicted", "disconnects", "errors")}
        vipc_listener_get_stats(self.handle, &s)
        return {"served": s.served, "refused": s.refused, "bad_requests": s.bad_requests,
                "unknown_stream": s.unknown_stream, "timeouts": s.timeouts,
                "evicted": s.evicted, "disconnects": s.disconnects, "errors": s.errors}
