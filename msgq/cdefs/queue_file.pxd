# Declarations of the C core (msgq/src/queue_file.h) for the Cython binding; nothing but
# the C API lives here (msgq/shm_backend.pyx cimports it).

from msgq.cdefs.msgq_ring cimport msgq_queue_info


cdef extern from "src/queue_file.h" nogil:
    const char *MSGQ_QUEUE_FILE_PREFIX
    enum:
        MSGQ_MAX_PATH_LEN
    int msgq_validate_name(const char *name)
    int msgq_ensure_queue_dir(char *out, size_t out_len)
    int msgq_queue_dir(char *out, size_t out_len)
    const char *msgq_namespace_prefix()
    unsigned int msgq_queue_file_mode()
    int msgq_queue_path(const char *endpoint, char *out, size_t out_len)
    int msgq_queue_inspect(const char *path, msgq_queue_info *out)
    int msgq_queue_remove_unused(const char *path, int remove_damaged, msgq_queue_info *out)
