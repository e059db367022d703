# The C types and codes VisionIPC's binding uses throughout (_native.pyx and the files it
# includes): included, not cimported, because the sources live in visionipc/ while the
# module is in msgq.visionipc. The headers are the definitions; this only declares them
# to Cython.
from libc.stdint cimport uint32_t, uint64_t


cdef extern from "src/vipc_errors.h":
    enum:
        VIPC_EPROTOCOL
        VIPC_ENOTALLOWED
        VIPC_EUNKNOWNSTREAM
        VIPC_EBADPACKET
        VIPC_EGEOMETRY
    const char *vipc_strerror(int code)

cdef extern from "src/vipc_layout.h":
    ctypedef struct vipc_geometry:
        uint32_t width
        uint32_t height
        uint32_t stride
        uint32_t uv_offset
        uint64_t size

cdef extern from "src/vipc_packet.h":
    enum:
        VIPC_PACKET_SIZE
