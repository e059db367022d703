# Declarations of the C core (msgq/src/msgq.h) for the Cython binding; nothing but
# the C API lives here (msgq/shm_backend.pyx cimports it).

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t


cdef extern from "src/msgq.h" nogil:
    # The public C API: the sockets' whole life cycle (open, send, receive, poll, close).
    ctypedef struct msgq_pub:
        pass
    ctypedef struct msgq_sub:
        pass
    ctypedef struct msgq_sub_stats:
        uint64_t resets
        uint64_t corrupt_resets
        uint64_t checksum_errors
    const unsigned MSGQ_OPEN_CONFLATE
    const unsigned MSGQ_OPEN_CHECKSUM
    const unsigned MSGQ_OPEN_NO_CHECKSUM

    int msgq_pub_open(const char *endpoint, uint64_t segment_size, unsigned open_flags,
                      msgq_pub **out)
    int msgq_pub_reopen(msgq_pub *pub, const char *endpoint, uint64_t segment_size,
                        unsigned open_flags)
    void msgq_pub_close(msgq_pub *pub)
    void msgq_pub_hold_mappings(msgq_pub *pub, int hold)
    int msgq_pub_send(msgq_pub *pub, const void *data, size_t size)
    int msgq_pub_reserve(msgq_pub *pub, size_t size, void **payload)
    int msgq_pub_commit(msgq_pub *pub)
    void msgq_pub_abort(msgq_pub *pub)
    int msgq_pub_num_readers(const msgq_pub *pub)
    int msgq_pub_all_readers_updated(const msgq_pub *pub)
    uint64_t msgq_pub_reclaimed_slots(const msgq_pub *pub)
    uint64_t msgq_pub_early_wraps(const msgq_pub *pub)
    uint32_t msgq_pub_segment_size(const msgq_pub *pub)
    uint32_t msgq_pub_max_message_size(const msgq_pub *pub)
    int msgq_pub_checksum(const msgq_pub *pub)
    const char *msgq_pub_endpoint(const msgq_pub *pub)
    int msgq_pub_is_open(const msgq_pub *pub)

    int msgq_sub_open(const char *endpoint, uint64_t segment_size, unsigned open_flags,
                      msgq_sub **out)
    int msgq_sub_reopen(msgq_sub *sub, const char *endpoint, uint64_t segment_size,
                        unsigned open_flags)
    void msgq_sub_close(msgq_sub *sub)
    int msgq_sub_recv(msgq_sub *sub, void *buf, size_t cap, size_t *size, int64_t timeout_ns)
    int msgq_sub_view(msgq_sub *sub, const void **data, size_t *size)
    int msgq_sub_view_end(msgq_sub *sub, const void *copy)
    int msgq_sub_has_data(msgq_sub *sub)
    int msgq_sub_wait(msgq_sub *sub, int64_t timeout_ns)
    int msgq_sub_poll(msgq_sub *const *subs, int n, int64_t timeout_ns, uint8_t *ready)
    ctypedef struct msgq_wake:
        pass
    msgq_wake *msgq_wake_new()
    void msgq_wake_free(msgq_wake *wake)
    uint32_t msgq_wake_seen(msgq_wake *wake)
    void msgq_wake_raise(msgq_wake *wake)
    int msgq_sub_poll_until(msgq_sub *const *subs, int n, int64_t timeout_ns,
                            uint8_t *ready, msgq_wake *wake, uint32_t seen)
    void msgq_sub_close_keep_mapping(msgq_sub *sub)
    void msgq_sub_hold_mappings(msgq_sub *sub, int hold)
    void msgq_sub_get_stats(const msgq_sub *sub, msgq_sub_stats *out)
    uint32_t msgq_sub_segment_size(const msgq_sub *sub)
    int msgq_sub_checksum(const msgq_sub *sub)
    int msgq_sub_conflate(const msgq_sub *sub)
    const char *msgq_sub_endpoint(const msgq_sub *sub)
    int msgq_sub_is_open(const msgq_sub *sub)
    int64_t msgq_now_ns()
