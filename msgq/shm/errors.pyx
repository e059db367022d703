# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. C error codes to the exceptions the contract promises.

cdef int _raise(int code, object endpoint) except -1:
    """Turns a negative C return code into the exception the contract promises."""
    msg = msgq_strerror(code).decode("utf-8", "replace")
    where = f"endpoint {endpoint!r}"
    if code == MSGQ_ENOTOWNER:
        raise MultiplePublishersError(f"{where}: {msg}")
    if code == MSGQ_ENOSLOT:
        raise IpcError(f"{where}: all {MSGQ_READER_SLOTS} reader slots are held by live "
                       "subscribers; close a subscriber first")
    if code == MSGQ_EBADNAME:
        raise ValueError(f"{where}: {msg}; check the endpoint and MSGQ_PREFIX/OPENPILOT_PREFIX")
    if code == MSGQ_EBADSIZE:
        raise ValueError(
            f"{where}: {msg}: segment_size must be between {MSGQ_MIN_SEGMENT_SIZE} and "
            f"{MSGQ_MAX_SEGMENT_SIZE} bytes")
    if code == MSGQ_ESIZEMISMATCH:
        raise ValueError(
            f"{where}: {msg}; give its subscribers the same segment_size, or connect "
            "with segment_size=0 to adopt the existing size")
    if code == -EPERM:
        raise IpcError(
            f"{where}: the queue file or prefix folder belongs to another user; remove it, "
            "or set MSGQ_SHM_MODE (e.g. 0660) in every process to share queues across users")
    if code == -ENOSPC:
        raise IpcError(
            f"{where}: {msg}: the shared-memory folder is full; free space there or use "
            "a smaller segment_size")
    if code in (MSGQ_EBADMAGIC, MSGQ_EVERSION, MSGQ_EGEOMETRY):
        raise IpcError(f"{where}: {msg}; remove the queue file if no process uses it")
    raise IpcError(f"{where}: {msg}")


cdef int _raise_os(int code, object path) except -1:
    """Turns a negative C return code of a queue-file operation into OSError (and
    BlockingIOError while another process holds the file's lock)."""
    if code == -EAGAIN:
        raise BlockingIOError(
            EAGAIN, "another process is creating or opening this queue right now; try again",
            os.fsdecode(path))
    raise OSError(-code, msgq_strerror(code).decode("utf-8", "replace"), os.fsdecode(path))
