# Declarations of the msgq C core (msgq/src). Nothing but the C API lives here.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t


cdef extern from "src/msgq_errors.h" nogil:
    enum:
        MSGQ_EBADNAME
        MSGQ_EBADMAGIC
        MSGQ_EVERSION
        MSGQ_EGEOMETRY
        MSGQ_ENOSLOT
        MSGQ_ENOTOWNER
        MSGQ_ETOOLARGE
        MSGQ_EBADSIZE
        MSGQ_ESIZEMISMATCH
        MSGQ_ENORESERVE
        MSGQ_EBUFFER
        MSGQ_ESUPERSEDED
        MSGQ_ECHECKSUM
    const char *msgq_strerror(int code)


cdef extern from "src/msgq_ring.h" nogil:
    const uint64_t MSGQ_DEFAULT_SEGMENT_SIZE
    const uint64_t MSGQ_MIN_SEGMENT_SIZE
    const uint64_t MSGQ_MAX_SEGMENT_SIZE
    const unsigned int MSGQ_READER_SLOTS
    const unsigned int MSGQ_LAYOUT_VERSION
    const unsigned int MSGQ_FLAG_CHECKSUM

    ctypedef struct msgq_ring:
        uint32_t capacity
        uint32_t flags

    ctypedef struct msgq_publisher:
        msgq_ring ring
        uint64_t reclaimed_slots

    ctypedef struct msgq_subscriber:
        msgq_ring ring
        int slot
        bint conflate
        uint64_t resets
        uint64_t corrupt_resets
        uint64_t checksum_errors

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
        uint32_t readers_claimed
        uint32_t readers_live
        int32_t reader_pids[64]
        uint8_t reader_alive[64]

    uint32_t msgq_ring_max_message_size(uint32_t capacity)
    int msgq_ring_inspect(const void *mem, size_t size, msgq_queue_info *out)
    int msgq_ring_live_readers(const msgq_ring *ring)

    void msgq_publisher_init(msgq_publisher *pub, const msgq_ring *ring)
    void msgq_publisher_release(msgq_publisher *pub)
    int msgq_publisher_send(msgq_publisher *pub, const void *data, uint32_t size)
    int msgq_publisher_reserve(msgq_publisher *pub, uint32_t size, void **payload)
    int msgq_publisher_commit(msgq_publisher *pub)
    void msgq_publisher_abort(msgq_publisher *pub)
    int msgq_publisher_all_readers_updated(const msgq_publisher *pub)
    int msgq_publisher_sweep(msgq_publisher *pub)

    int msgq_subscriber_init(msgq_subscriber *sub, const msgq_ring *ring, bint conflate)
    void msgq_subscriber_release(msgq_subscriber *sub)
    int msgq_subscriber_peek(msgq_subscriber *sub, const uint8_t **payload, uint32_t *size)
    int msgq_subscriber_consume(msgq_subscriber *sub, const void *copy)
    int msgq_subscriber_release_view(msgq_subscriber *sub)
    int msgq_subscriber_has_data(msgq_subscriber *sub)
    int msgq_subscriber_wait(msgq_subscriber *sub, int64_t timeout_ns)
    int msgq_poll(msgq_subscriber *const *subs, int n, int64_t timeout_ns, uint8_t *ready)
    ctypedef struct msgq_interrupt:
        pass
    uint32_t msgq_interrupt_seen(msgq_interrupt *interrupt)
    void msgq_interrupt_raise(msgq_interrupt *interrupt)
    int msgq_poll_until(msgq_subscriber *const *subs, int n, int64_t timeout_ns,
                        uint8_t *ready, msgq_interrupt *interrupt, uint32_t seen)


cdef extern from "src/queue_file.h" nogil:
    const char *MSGQ_QUEUE_FILE_PREFIX
    enum msgq_role:
        MSGQ_ROLE_SUBSCRIBER
        MSGQ_ROLE_PUBLISHER
    enum:
        MSGQ_MAX_PATH_LEN
    int msgq_validate_name(const char *name)
    int msgq_ensure_queue_dir(char *out, size_t out_len)
    int msgq_queue_dir(char *out, size_t out_len)
    const char *msgq_namespace_prefix()
    unsigned int msgq_queue_file_mode()
    int msgq_queue_path(const char *endpoint, char *out, size_t out_len)
    int msgq_queue_open(const char *endpoint, uint64_t segment_size, uint32_t create_flags,
                        msgq_role role, msgq_ring *ring, int *locked_fd)
    void msgq_queue_unlock(int locked_fd)
    void msgq_queue_unmap(msgq_ring *ring)
    int msgq_queue_inspect(const char *path, msgq_queue_info *out)
    int msgq_queue_remove_unused(const char *path, int remove_damaged, msgq_queue_info *out)


cdef extern from "src/crc32c.h" nogil:
    uint32_t msgq_crc32c(const void *data, size_t len)
    const char *msgq_crc32c_implementation()


cdef extern from "src/os_wait.h" nogil:
    int64_t os_monotonic_ns()
    int os_process_alive(int pid)
