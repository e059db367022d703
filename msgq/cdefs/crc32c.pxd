# Declarations of the C core (msgq/src/crc32c.h) for the Cython binding; nothing but
# the C API lives here (msgq/shm_backend.pyx cimports it).

from libc.stdint cimport uint32_t


cdef extern from "src/crc32c.h" nogil:
    uint32_t msgq_crc32c(const void *data, size_t len)
    const char *msgq_crc32c_implementation()
