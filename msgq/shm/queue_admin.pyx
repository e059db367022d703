# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. Queue administration: endpoint names, paths, the prefix, liveness,
# inspecting and removing queue files, and crc32c.

cdef bytes _name_bytes(object name, str what):
    if isinstance(name, str):
        return (<str>name).encode("utf-8")
    if isinstance(name, bytes):
        return <bytes>name
    raise TypeError(f"{what} must be str or bytes, not {type(name).__name__}")


def validate_endpoint(endpoint) -> None:
    """Raises ValueError unless ``endpoint`` is an allowed endpoint name."""
    cdef bytes name = _name_bytes(endpoint, "endpoint")
    if b"\0" in name or msgq_validate_name(name) < 0:
        _raise(MSGQ_EBADNAME, endpoint)


def queue_path(endpoint) -> str:
    """The file that holds ``endpoint``'s queue, under the current prefix."""
    cdef bytes name = _name_bytes(endpoint, "endpoint")
    cdef char out[MSGQ_MAX_PATH_LEN]
    if b"\0" in name:
        _raise(MSGQ_EBADNAME, endpoint)
    cdef int r = msgq_queue_path(name, out, MSGQ_MAX_PATH_LEN)
    if r < 0:
        _raise(r, endpoint)
    return out.decode("utf-8")


def queue_dir(bint create=False) -> str:
    """The folder queue files go to: the shm folder, plus the prefix folder when
    MSGQ_PREFIX/OPENPILOT_PREFIX is set (made, with the right permissions, if ``create``)."""
    cdef char out[MSGQ_MAX_PATH_LEN]
    cdef int r = (msgq_ensure_queue_dir(out, MSGQ_MAX_PATH_LEN) if create
                  else msgq_queue_dir(out, MSGQ_MAX_PATH_LEN))
    if r < 0:
        if r == MSGQ_EBADNAME:
            raise ValueError(f"prefix {_raw_prefix()!r} (MSGQ_PREFIX/OPENPILOT_PREFIX): "
                             f"{msgq_strerror(r).decode()}")
        raise IpcError(f"queue folder: {msgq_strerror(r).decode()}")
    return out.decode("utf-8")


cdef str _raw_prefix():
    cdef const char *p = msgq_namespace_prefix()
    return p.decode("utf-8", "replace") if p != NULL else ""


def namespace_prefix() -> str:
    """The namespace prefix (MSGQ_PREFIX, else OPENPILOT_PREFIX), or "" when unset;
    ValueError when it is not a valid name."""
    prefix = _raw_prefix()
    if prefix and msgq_validate_name(prefix.encode("utf-8")) < 0:
        raise ValueError(
            f"prefix {prefix!r} (MSGQ_PREFIX/OPENPILOT_PREFIX) is not a valid name: use "
            "1-100 characters from A-Z a-z 0-9 _ - .")
    return prefix


def process_alive(int pid) -> bool:
    """Whether process ``pid`` exists (kill(pid, 0); a process of another user counts as
    alive; pid <= 0 never does): the liveness rule of reader slots and publishers."""
    return pid > 0 and os_process_alive(pid) != 0


def queue_file_mode() -> int:
    """The mode new queue (and fake event) files get: MSGQ_SHM_MODE, default 0o600."""
    return msgq_queue_file_mode()


cdef dict _queue_info_dict(object path, int code, const msgq_queue_info *info):
    """The Python view of a msgq_queue_info (see inspect_queue)."""
    cdef int64_t now = os_monotonic_ns()
    cdef bint valid = code == 0
    cdef uint32_t cycle = <uint32_t>(info.write_pointer >> 32)
    cdef uint32_t offset = <uint32_t>info.write_pointer
    readers = [
        {"slot": i, "pid": info.reader_pids[i], "alive": bool(info.reader_alive[i])}
        for i in range(MSGQ_READER_SLOTS) if info.reader_pids[i] > 0
    ]
    return {
        "path": os.fsdecode(path),
        "valid": valid,
        "error": None if valid else msgq_strerror(code).decode("utf-8", "replace"),
        "unfinished": bool(info.unfinished),
        "file_size": info.file_size,
        "layout_version": info.layout_version or None,
        "segment_size": info.capacity if valid else None,
        "created_ns": info.created_ns if valid else None,
        "age_s": (now - <int64_t>info.created_ns) / 1e9
                 if valid and 0 < info.created_ns <= <uint64_t>now else None,
        "creator_pid": info.creator_pid if valid else None,
        "publisher_pid": info.publisher_pid if valid and info.publisher_pid > 0 else None,
        "publisher_alive": bool(info.publisher_alive),
        "write_pointer": info.write_pointer if valid else None,
        "write_cycle": cycle if valid else None,
        "write_offset": offset if valid else None,
        "bytes_written": <uint64_t>cycle * info.capacity + offset if valid else None,
        "waiters": info.num_waiters if valid else None,
        "wakes": info.wakes if valid else None,
        "checksum": bool(info.flags & MSGQ_FLAG_CHECKSUM) if valid else None,
        "superseded": bool(info.superseded) if valid else None,
        "readers": readers,
        "readers_claimed": info.readers_claimed,
        "readers_live": info.readers_live,
    }


cdef bytes _path_bytes(object path):
    cdef bytes raw = os.fsencode(path)
    if b"\0" in raw:
        raise ValueError(f"path {path!r} contains a NUL byte")
    return raw


def inspect_queue(path) -> dict:
    """Reads the header of the queue file at ``path`` without connecting to it: opened
    read-only under a shared lock (waiting at most 50 ms for an opener that is creating
    or registering), never registering as publisher or subscriber, never writing.

    Returns a dict. ``valid`` is False for a file whose header this build cannot use;
    ``error`` then says why (not a queue, another layout version, inconsistent sizes) and
    ``unfinished`` tells a file whose creator never finished it (empty or magic 0). For a
    valid queue: ``segment_size``, ``publisher_pid`` (None: no publisher) and
    ``publisher_alive``, ``readers`` (slot, pid, alive of every claimed reader slot),
    ``readers_live``/``readers_claimed``, ``write_pointer`` (``write_cycle`` and
    ``write_offset``), ``bytes_written`` (how far the write pointer has moved through the
    ring: payloads plus size prefixes, padding and skipped tails at wraps), ``waiters``
    (subscribers asleep), ``wakes`` (how many sends have woken sleepers: a counter
    that wraps at 2**32), ``checksum`` (messages carry a CRC32C), ``superseded`` (the
    file was replaced under its name), ``created_ns`` (the creator's CLOCK_MONOTONIC),
    ``age_s`` and ``creator_pid``.

    Raises ``OSError`` when the file cannot be opened (``FileNotFoundError`` when it is
    gone), and ``BlockingIOError`` while another process holds its lock.
    """
    cdef bytes raw = _path_bytes(path)
    cdef const char *c_path = raw
    cdef msgq_queue_info info
    cdef int r
    with nogil:
        r = msgq_queue_inspect(c_path, &info)
    if r < 0 and r not in (MSGQ_EBADMAGIC, MSGQ_EVERSION, MSGQ_EGEOMETRY):
        _raise_os(r, path)
    return _queue_info_dict(path, r, &info)


def remove_unused_queue(path, bint remove_damaged=False) -> dict:
    """Removes the queue file at ``path`` if no live process uses it, deciding under the
    same exclusive lock that every publisher and subscriber takes to connect, so none can
    connect in between (one that opened the file just before waits, then finds it removed
    and makes a fresh queue).

    Removed: a valid queue whose publisher and reader pids are all dead or unset, and an
    unfinished file (its creator died). A damaged header is removed only with
    ``remove_damaged`` (check first that no process has the file open). A file that is
    not a regular file is never removed.

    Returns the :func:`inspect_queue` dict of the file, with ``removed`` (bool) and
    ``kept_because`` (None when removed); when another process held the file's lock for
    50 ms, only ``path``, ``removed`` (False) and ``kept_because``. Raises ``OSError``
    when the file cannot be opened or unlinked (``FileNotFoundError`` when it is gone).
    """
    cdef bytes raw = _path_bytes(path)
    cdef const char *c_path = raw
    cdef msgq_queue_info info
    cdef int r
    with nogil:
        r = msgq_queue_remove_unused(c_path, remove_damaged, &info)
    if r == -EBUSY:
        result = _queue_info_dict(path, 0, &info)
        result.update(removed=False, kept_because="in use by a live process")
    elif r == -EAGAIN:
        result = {"path": os.fsdecode(path), "removed": False,
                  "kept_because": "being created or opened by another process right now"}
    elif r in (MSGQ_EBADMAGIC, MSGQ_EVERSION, MSGQ_EGEOMETRY):
        result = _queue_info_dict(path, r, &info)
        result.update(removed=False, kept_because="damaged header (" + result["error"] + ")")
    elif r < 0:
        _raise_os(r, path)
    else:
        result = _queue_info_dict(path, info.status, &info)
        result.update(removed=True, kept_because=None)
    return result


def crc32c(data) -> int:
    """CRC32C of ``data`` (the checksum of checksummed queues), computed by the C core."""
    cdef Py_buffer view
    cdef uint32_t c
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        c = msgq_crc32c(view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return c


def crc32c_implementation() -> str:
    """Which CRC32C this machine uses: "sse4.2", "armv8-crc" or "portable"."""
    return msgq_crc32c_implementation().decode("ascii")
