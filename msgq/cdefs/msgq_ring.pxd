# Declarations of the C core (msgq/src/msgq_ring.h) for the Cython binding; nothing but
# the C API lives here (msgq/shm_backend.pyx cimports it).

from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t


cdef extern from "src/msgq_ring.h" nogil:
    const uint64_t MSGQ_DEFAULT_SEGMENT_SIZE
    const uint64_t MSGQ_MIN_SEGMENT_SIZE
    const uint64_t MSGQ_MAX_SEGMENT_SIZE
    const unsigned int MSGQ_READER_SLOTS
    const unsigned int MSGQ_LAYOUT_VERSION
    const unsigned int MSGQ_FLAG_CHECKSUM

    ctypedef struct msgq_queue_info:
        int status
        uint64_t file_size
        uint64_t magic
        uint32_t layout_version
        int unfinished
        uint32_t capacity
        uint64_t created_ns
        int32_t creator_pid
        int32_t publisher_pid
        int publisher_alive
        uint64_t write_pointer
        uint32_t flags
        int superseded
        uint32_t num_waiters
        uint32_t wakes
        uint32_t readers_claimed
        uint32_t readers_live
        int32_t reader_pids[64]
        uint8_t reader_alive[64]

    int msgq_ring_inspect(const void *mem, size_t size, msgq_queue_info *out)
