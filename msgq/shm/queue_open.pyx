# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. Opening a queue: the one connect loop of the publisher and the
# subscriber.

ctypedef fused queue_handle:
    msgq_pub
    msgq_sub


cdef unsigned _open_flags(object checksum, bint conflate=False):
    """MSGQ_OPEN_* for msgq_pub_open/msgq_sub_open: ``checksum`` None leaves the choice
    to the MSGQ_CHECKSUM environment variable (read by the C API)."""
    cdef unsigned flags = MSGQ_OPEN_CONFLATE if conflate else 0
    if checksum is not None:
        flags |= MSGQ_OPEN_CHECKSUM if checksum else MSGQ_OPEN_NO_CHECKSUM
    return flags


cdef bytes _endpoint_arg(object endpoint, object segment_size):
    """The endpoint as the C API takes it, after the checks only Python can make (type,
    NUL bytes, a size that fits uint64); names and sizes are validated by msgq.h."""
    cdef bytes name = _name_bytes(endpoint, "endpoint")
    if b"\0" in name:
        _raise(MSGQ_EBADNAME, endpoint)
    if not isinstance(segment_size, int):
        raise TypeError(f"segment_size must be int, not {type(segment_size).__name__}")
    if segment_size < 0 or segment_size > MSGQ_MAX_SEGMENT_SIZE:
        _raise(MSGQ_EBADSIZE, endpoint)
    return name


cdef int _open_queue(object endpoint, object segment_size, unsigned flags,
                     queue_handle **opened) except -1:
    """Opens (or creates) the queue of ``endpoint`` as its publisher (``msgq_pub_open``)
    or as a subscriber (``msgq_sub_open``), whichever handle ``opened`` points to, and
    raises the contract's exception when that fails. The file lock is waited for without
    the GIL, 50 ms at a time (-EAGAIN): Ctrl-C is answered between the tries."""
    cdef bytes name = _endpoint_arg(endpoint, segment_size)
    cdef const char *c_name = name
    cdef uint64_t size = segment_size
    cdef int r
    while True:
        with nogil:
            if queue_handle is msgq_pub:
                r = msgq_pub_open(c_name, size, flags, opened)
            else:
                r = msgq_sub_open(c_name, size, flags, opened)
        if r != -EAGAIN:  # another opener holds the file lock: let Ctrl-C through
            break
        PyErr_CheckSignals()
    if r < 0:
        _raise(r, endpoint)
    return 0
