# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The shared-memory (msgq) backend: Context, PubSocket, SubSocket and Poller over the C
ring in ``msgq/src``. Thin by design: the protocol lives in C, the API shape in Python
(``msgq/__init__.py``); this module only converts arguments, errors and the GIL."""

from cpython.buffer cimport (
    PyBUF_SIMPLE,
    PyBUF_WRITABLE,
    PyBuffer_FillInfo,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.errno cimport EAGAIN, EBUSY, EINTR, ENOSPC, EPERM
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy
from posix.unistd cimport getpid
from posix.types cimport pid_t

from msgq.ring cimport *

import asyncio
import os
import threading
import time
import weakref
from functools import partial

from msgq.aio import await_until, next_message, wait_for_result
from msgq.errors import IpcError, MessageOverwritten, MultiplePublishersError, readers_timeout

cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_WRITE

#: Size of a queue's data ring when none is asked for (bytes).
DEFAULT_SEGMENT_SIZE = MSGQ_DEFAULT_SEGMENT_SIZE
MIN_SEGMENT_SIZE = MSGQ_MIN_SEGMENT_SIZE
MAX_SEGMENT_SIZE = MSGQ_MAX_SEGMENT_SIZE
READER_SLOTS = MSGQ_READER_SLOTS
LAYOUT_VERSION = MSGQ_LAYOUT_VERSION
#: Queue files are named QUEUE_FILE_PREFIX + endpoint in the queue folder.
QUEUE_FILE_PREFIX = MSGQ_QUEUE_FILE_PREFIX.decode("ascii")

# Longest time a blocking call stays in C without checking for Python signals, so that
# Ctrl-C is answered promptly however long the timeout.
cdef int64_t SIGNAL_CHECK_NS = 50 * 1000 * 1000
# Copies at least this large run without the GIL.
cdef Py_ssize_t NOGIL_COPY_BYTES = 64 * 1024


cdef bytes _name_bytes(object name, str what):
    if isinstance(name, str):
        return (<str>name).encode("utf-8")
    if isinstance(name, bytes):
        return <bytes>name
    raise TypeError(f"{what} must be str or bytes, not {type(name).__name__}")


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


cdef int _raise_os(int code, object path) except -1:
    if code == -EAGAIN:
        raise BlockingIOError(
            EAGAIN, "another process is creating or opening this queue right now; try again",
            os.fsdecode(path))
    raise OSError(-code, msgq_strerror(code).decode("utf-8", "replace"), os.fsdecode(path))


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
    (subscribers asleep), ``checksum`` (messages carry a CRC32C), ``superseded`` (the
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


cdef unsigned _open_flags(object checksum, bint conflate=False):
    """MSGQ_OPEN_* for msgq_pub_open/msgq_sub_open: ``checksum`` None leaves the choice
    to the MSGQ_CHECKSUM environment variable (read by the C API)."""
    cdef unsigned flags = MSGQ_OPEN_CONFLATE if conflate else 0
    if checksum is not None:
        flags |= MSGQ_OPEN_CHECKSUM if checksum else MSGQ_OPEN_NO_CHECKSUM
    return flags


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


cdef class Context:
    """Process-wide handle kept for API compatibility; the shm backend needs no state."""

    def term(self) -> None:
        pass


cdef class Reservation:
    """Room for one message inside the ring, written in place and then committed.

    Use as ``with pub.reserve(n) as buf: buf[:] = ...``: leaving the block commits the
    message; an exception inside it abandons the message (nothing is published). Do not
    keep ``buf`` (or slices of it) past the block.
    """
    cdef PubSocket pub
    cdef object view
    cdef bint done

    def __enter__(self):
        return self.view

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False

    def commit(self) -> None:
        """Publishes the message written into the reserved buffer."""
        if self.done:
            raise RuntimeError("reservation already committed or aborted (was the socket "
                               "closed or reconnected?)")
        self.done = True
        self.view.release()
        cdef int r = msgq_pub_commit(self.pub.pub)
        self.pub.reservation = None
        if r < 0:
            _raise(r, self.pub.endpoint)

    def abort(self) -> None:
        """Drops the reservation; subscribers never see it."""
        if self.done:
            return
        self.done = True
        self.view.release()
        msgq_pub_abort(self.pub.pub)
        self.pub.reservation = None


cdef class PubSocket:
    """The single publisher of an endpoint."""
    cdef msgq_pub *pub  # NULL while not connected
    cdef object reservation  # the open Reservation, if any
    cdef int busy  # calls in progress without the GIL (other threads may run)
    cdef readonly object endpoint

    def __cinit__(self):
        self.pub = NULL
        self.reservation = None
        self.busy = 0
        self.endpoint = None

    def __dealloc__(self):
        self._disconnect()

    cdef void _disconnect(self) noexcept:
        # msgq_pub_close gives up ownership only in the process that connected (a copy
        # inherited through fork() leaves it to its parent).
        msgq_pub_close(self.pub)
        self.pub = NULL

    cdef int _check_idle(self) except -1:
        """Before the mapping goes away: no other thread may be inside a call, and an open
        reservation is abandoned (its buffer would point into unmapped memory)."""
        if self.busy:
            raise IpcError(f"endpoint {self.endpoint!r}: another thread is sending on this "
                           "socket; close or reconnect it when that call has returned")
        if self.reservation is not None:
            self.reservation.abort()
        return 0

    cdef int _fail(self, int r) except -1:
        """Raises the error of a call; a handle that lost its queue (a failed follow of a
        replaced file, msgq.h O6) is dropped first, so the socket reads as closed."""
        if self.pub != NULL and not msgq_pub_is_open(self.pub):
            self._disconnect()
        _raise(r, self.endpoint)
        return -1

    def connect(self, context, endpoint, segment_size=0, checksum=None) -> None:
        """Opens (or creates) the queue of ``endpoint`` and becomes its publisher.

        A previous publisher of the endpoint loses it: its next ``send`` raises
        ``MultiplePublishersError``. Subscribers already connected stay connected.
        ``segment_size`` 0 means the existing size, or the default for a new queue.
        ``checksum`` (None: the MSGQ_CHECKSUM environment variable) makes a queue this
        call creates carry a CRC32C of every message; an unused queue without it is
        replaced, one in use keeps what it has (see the ``checksum`` property).
        """
        cdef msgq_pub *opened = NULL
        cdef int r
        self._check_idle()
        cdef bytes name = _endpoint_arg(endpoint, segment_size)
        cdef const char *c_name = name
        cdef uint64_t size = segment_size
        cdef unsigned flags = _open_flags(checksum)
        while True:
            with nogil:
                r = msgq_pub_open(c_name, size, flags, &opened)
            if r != -EAGAIN:  # another opener holds the file lock: let Ctrl-C through
                break
            PyErr_CheckSignals()
        if r < 0:
            _raise(r, endpoint)
        self._disconnect()
        self.pub = opened
        self.endpoint = endpoint

    cdef int _check_connected(self) except -1:
        if self.pub == NULL:
            raise IpcError("socket is not connected; call connect() first")
        return 0

    cdef int _too_large(self, Py_ssize_t n) except -1:
        raise ValueError(
            f"endpoint {self.endpoint!r}: message of {n} bytes exceeds the "
            f"largest this queue takes ({self.max_message_size} bytes, a "
            f"third of segment size {self.segment_size}); use a larger "
            "segment_size")

    def send(self, data) -> int:
        """Publishes ``data`` (bytes or any contiguous bytes-like object) without an
        intermediate copy. Returns the number of bytes sent."""
        cdef Py_buffer view
        cdef const char *ptr
        cdef Py_ssize_t n
        cdef int r
        cdef bint release = False
        self._check_connected()
        if self.reservation is not None:
            raise RuntimeError("a reservation is open on this socket; commit it first")
        if type(data) is bytes:
            ptr = PyBytes_AS_STRING(data)
            n = len(<bytes>data)
        else:
            if isinstance(data, str):
                raise TypeError("send() takes bytes-like data, not str; encode it first")
            try:
                PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
            except (BufferError, ValueError) as e:
                raise TypeError(f"send() needs a contiguous bytes-like object: {e}") from None
            except TypeError:
                raise TypeError(
                    f"send() takes a bytes-like object, not {type(data).__name__}") from None
            ptr = <const char *>view.buf
            n = view.len
            release = True
        try:
            if n > 0xFFFFFFFF:
                _raise(MSGQ_ETOOLARGE, self.endpoint)
            while True:
                # A replaced queue file is followed inside msgq_pub_send (msgq.h O6).
                if n >= NOGIL_COPY_BYTES:
                    self.busy += 1
                    with nogil:
                        r = msgq_pub_send(self.pub, ptr, <size_t>n)
                    self.busy -= 1
                else:
                    r = msgq_pub_send(self.pub, ptr, <size_t>n)
                if r != -EAGAIN:  # following waited 50 ms for a file lock: check signals
                    break
                PyErr_CheckSignals()
            if r < 0:
                if r == MSGQ_ETOOLARGE:
                    self._too_large(n)
                self._fail(r)
        finally:
            if release:
                PyBuffer_Release(&view)
        return n

    def reserve(self, Py_ssize_t size) -> Reservation:
        """Reserves ``size`` bytes in the ring for a message written in place (zero
        copies): ``with pub.reserve(n) as buf: buf[:n] = ...``."""
        cdef void *dst
        cdef int r
        self._check_connected()
        if self.reservation is not None:
            raise RuntimeError("a reservation is already open on this socket")
        if size < 0:
            raise ValueError("size must be >= 0")
        while True:
            r = msgq_pub_reserve(self.pub, <size_t>size, &dst)
            if r != -EAGAIN:
                break
            PyErr_CheckSignals()
        if r < 0:
            if r == MSGQ_ETOOLARGE:
                raise ValueError(
                    f"endpoint {self.endpoint!r}: message of {size} bytes exceeds the largest "
                    f"this queue takes ({self.max_message_size} bytes)")
            self._fail(r)
        cdef Reservation res = Reservation.__new__(Reservation)
        res.pub = self
        res.view = PyMemoryView_FromMemory(<char *>dst, size, PyBUF_WRITE)
        res.done = False
        self.reservation = res
        return res

    def all_readers_updated(self) -> bool:
        """True when every live subscriber, and at least one, has read everything sent so
        far (upstream's meaning: False while no subscriber is connected)."""
        self._check_connected()
        return msgq_pub_all_readers_updated(self.pub) == 1

    def wait_until_read(self, timeout=None, double poll_interval=0.001) -> bool:
        """Blocks until ``all_readers_updated()`` (True) or until ``timeout`` seconds
        passed (False); ``timeout`` None waits forever. ``poll_interval`` in seconds."""
        import time
        self._check_connected()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not msgq_pub_all_readers_updated(self.pub):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_interval)
            self._check_connected()  # another thread may have closed it meanwhile
        return True

    def wait_for_readers(self, double timeout=1.0, double interval=0.001) -> None:
        """Upstream's wait: returns once at least one subscriber is connected and every
        subscriber has read everything; raises TimeoutError after ``timeout`` seconds.
        ``interval``: seconds between checks. :meth:`wait_until_read` returns a bool
        instead."""
        if not self.wait_until_read(timeout, interval):
            raise readers_timeout(self.endpoint, timeout, self.num_readers)

    @property
    def num_readers(self) -> int:
        """Subscribers currently connected (live processes only)."""
        self._check_connected()
        return msgq_pub_num_readers(self.pub)

    @property
    def segment_size(self) -> int:
        self._check_connected()
        return msgq_pub_segment_size(self.pub)

    @property
    def max_message_size(self) -> int:
        self._check_connected()
        return msgq_pub_max_message_size(self.pub)

    @property
    def checksum(self) -> bool:
        """Whether the queue carries a CRC32C of every message (chosen at creation)."""
        self._check_connected()
        return bool(msgq_pub_checksum(self.pub))

    @property
    def reclaimed_slots(self) -> int:
        """Reader slots of dead subscribers this publisher gave back (its sweeps)."""
        self._check_connected()
        return msgq_pub_reclaimed_slots(self.pub)

    @property
    def early_wraps(self) -> int:
        """Wraps to the ring's start taken early because every subscriber had read
        everything (the ring's start is reused while cached; docs/ring.md)."""
        self._check_connected()
        return msgq_pub_early_wraps(self.pub)

    def close(self) -> None:
        """Releases the queue (abandoning an open reservation); the socket can connect
        again. Raises IpcError while another thread is inside a call on it."""
        self._check_idle()
        self._disconnect()


cdef class SubSocket:
    """One subscriber of an endpoint: receives every message sent after it connected
    (or only the newest, with ``conflate``)."""
    cdef msgq_sub *sub  # NULL while not connected
    cdef msgq_sub_stats last_stats  # counters of the last connection, once closed
    cdef bint conflate_flag
    cdef int busy  # calls in progress without the GIL (other threads may run)
    cdef int exports  # buffers exported by this socket's message views (the ring is in them)
    cdef bint view_open  # a receive_view block holds the next message
    cdef bint lent_views  # the current mapping was lent to a decoder (see _disconnect)
    cdef int async_busy  # a loop's waiter thread sleeps on this queue (see _LoopWaiter)
    cdef object async_waiter  # that waiter, while it has this socket in its set
    cdef int64_t timeout_ns
    cdef readonly object endpoint

    def __cinit__(self):
        self.sub = NULL
        self.conflate_flag = False
        self.last_stats.resets = 0
        self.last_stats.corrupt_resets = 0
        self.last_stats.checksum_errors = 0
        self.busy = 0
        self.exports = 0
        self.view_open = False
        self.lent_views = False
        self.async_busy = 0
        self.async_waiter = None
        self.timeout_ns = -1
        self.endpoint = None

    def __dealloc__(self):
        self._disconnect()

    cdef void _disconnect(self) noexcept:
        if self.sub != NULL:
            msgq_sub_get_stats(self.sub, &self.last_stats)
            # msgq_sub_close frees the reader slot only in the process that connected (a
            # copy inherited through fork() leaves its parent's slot alone).
            if self.lent_views:
                # A reader decoded in place (MessageView.keep_readable) may still point
                # into the mapping although no buffer of it is exported any more (pycapnp
                # keeps a raw pointer): it stays mapped for the life of the process, so a
                # reader misused after its block reads stale bytes, never unmapped memory.
                msgq_sub_close_keep_mapping(self.sub)
            else:
                msgq_sub_close(self.sub)
            self.sub = NULL
            self.lent_views = False

    cdef int _check_idle(self) except -1:
        if self.busy:
            raise IpcError(f"endpoint {self.endpoint!r}: another thread is receiving or "
                           "polling on this socket; close or reconnect it when that call "
                           "has returned")
        if self.async_busy:
            raise IpcError(f"endpoint {self.endpoint!r}: an event loop's waiter thread "
                           "still sleeps on this socket's queue; try again")
        if self.exports or self.view_open:
            raise IpcError(f"endpoint {self.endpoint!r}: a view of a message in this "
                           "socket's queue is still in use (a receive_view block, or a "
                           "memoryview taken from one); release it before closing or "
                           "reconnecting")
        return 0

    cdef int _check_no_view(self) except -1:
        if self.view_open:
            raise RuntimeError(f"endpoint {self.endpoint!r}: a receive_view block holds "
                               "the next message; leave it before receiving again")
        return 0

    cdef int _fail(self, int r) except -1:
        """Raises the error of a call; a handle that lost its queue (msgq.h O6) is dropped
        first, so the socket reads as closed."""
        if self.sub != NULL and not msgq_sub_is_open(self.sub):
            self._disconnect()
        _raise(r, self.endpoint)
        return -1

    def connect(self, context, endpoint, address=b"127.0.0.1", bint conflate=False,
                segment_size=0) -> None:
        """Opens (or creates) the queue of ``endpoint`` and takes a reader slot.

        ``address`` is accepted for compatibility (it matters to the ZMQ backend only).
        Raises ``IpcError`` when every reader slot is held by a live subscriber.
        """
        cdef msgq_sub *opened = NULL
        cdef int r
        if not isinstance(address, (str, bytes)):
            raise TypeError(f"address must be str or bytes, not {type(address).__name__}")
        self._check_idle()
        cdef bytes name = _endpoint_arg(endpoint, segment_size)
        cdef const char *c_name = name
        cdef uint64_t size = segment_size
        cdef unsigned flags = _open_flags(None, conflate)
        while True:
            with nogil:
                r = msgq_sub_open(c_name, size, flags, &opened)
            if r != -EAGAIN:  # another opener holds the file lock: let Ctrl-C through
                break
            PyErr_CheckSignals()
        if r < 0:
            _raise(r, endpoint)
        self._disconnect()
        self.sub = opened
        self.conflate_flag = conflate
        self.endpoint = endpoint

    def setTimeout(self, timeout) -> None:
        """Timeout of a blocking ``receive`` in milliseconds; negative: wait forever."""
        if timeout is None or timeout < 0:
            self.timeout_ns = -1
        else:
            self.timeout_ns = <int64_t>(timeout * 1000000)

    cdef int _check_connected(self) except -1:
        if self.sub == NULL:
            raise IpcError("socket is not connected; call connect() first")
        return 0

    cdef int _wait(self) except -1:
        """Waits for data within the socket timeout. 1: data, 0: timed out."""
        cdef int64_t deadline = -1
        cdef int64_t now, slice_ns
        cdef int r
        if self.timeout_ns >= 0:
            deadline = msgq_now_ns() + self.timeout_ns
        while True:
            slice_ns = SIGNAL_CHECK_NS
            if deadline >= 0:
                now = msgq_now_ns()
                if now >= deadline:
                    return 0
                if deadline - now < slice_ns:
                    slice_ns = deadline - now
            self.busy += 1
            with nogil:
                r = msgq_sub_wait(self.sub, slice_ns)
            self.busy -= 1
            if r == 1:
                return 1
            PyErr_CheckSignals()

    cdef int _next_message(self, const void **payload, size_t *size,
                           bint non_blocking) except -1:
        """Finds the next message, waiting within the timeout unless ``non_blocking``:
        1 with ``payload``/``size`` viewing it in the ring, 0 when there is none. A
        replaced queue file is followed inside msgq_sub_view (msgq.h O6)."""
        cdef int r
        while True:
            r = msgq_sub_view(self.sub, payload, size)
            if r == 1:
                return 1
            if r == -EAGAIN:
                PyErr_CheckSignals()
                continue
            if r < 0:
                self._fail(r)
            if non_blocking or self.timeout_ns == 0 or not self._wait():
                return 0

    cdef void _copy_out(self, void *dst, const void *payload, size_t size) noexcept:
        """The one copy out of the ring; large ones let other threads run."""
        if size >= <size_t>NOGIL_COPY_BYTES:
            self.busy += 1
            with nogil:
                memcpy(dst, payload, size)
            self.busy -= 1
        else:
            memcpy(dst, payload, size)

    def receive(self, bint non_blocking=False):
        """Returns the next message as ``bytes`` (one copy), or None when there is none
        (non-blocking) or the timeout passed."""
        cdef const void *payload
        cdef size_t size
        cdef bytes msg
        self._check_connected()
        self._check_no_view()
        while self._next_message(&payload, &size, non_blocking):
            msg = PyBytes_FromStringAndSize(NULL, size)
            self._copy_out(PyBytes_AS_STRING(msg), payload, size)
            if msgq_sub_view_end(self.sub, PyBytes_AS_STRING(msg)) == 1:
                return msg
            # overwritten while copying: the reader was reset; look again
        return None

    def receive_into(self, buffer, bint non_blocking=False):
        """Copies the next message into ``buffer`` (any writable bytes-like object) and
        returns its size, or None as ``receive``. A buffer too small raises ValueError
        and leaves the message in the queue."""
        cdef Py_buffer view
        cdef const void *payload
        cdef size_t size
        self._check_connected()
        self._check_no_view()
        try:
            PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE | PyBUF_WRITABLE)
        except (BufferError, ValueError) as e:
            raise TypeError(f"receive_into() needs a writable contiguous buffer: {e}") from None
        try:
            while self._next_message(&payload, &size, non_blocking):
                if size > <size_t>view.len:
                    raise ValueError(
                        f"message of {size} bytes does not fit a buffer of {view.len} "
                        "bytes; the message stays queued")
                self._copy_out(view.buf, payload, size)
                if msgq_sub_view_end(self.sub, view.buf) == 1:
                    return size
            return None
        finally:
            PyBuffer_Release(&view)

    def receive_view(self, bint non_blocking=False) -> MessageView:
        """The next message where it lies in shared memory, without a copy::

            with sub.receive_view() as view:   # a read-only memoryview, or None
                use(view)                      # as receive: None on timeout/no message

        Leaving the block checks that the publisher did not overwrite the message while
        it was in use; if it may have, :class:`msgq.MessageOverwritten` is raised (the
        bytes read may be torn: discard what was computed from them). The rule: finish
        with the bytes, or copy them out, inside the block; a view kept after it reads
        whatever the ring holds by then. The message is taken when the block is entered
        (blocking within the socket's timeout unless ``non_blocking``); other receives
        on this socket raise RuntimeError inside the block, and ``close`` raises
        IpcError while any memoryview of the message is alive."""
        self._check_connected()
        self._check_no_view()
        return MessageView(self, non_blocking)

    def has_data(self) -> bool:
        """True when ``receive(non_blocking=True)`` would return a message."""
        self._check_connected()
        return msgq_sub_has_data(self.sub) == 1

    @property
    def conflate(self) -> bool:
        return self.conflate_flag

    cdef msgq_sub_stats _stats(self):
        cdef msgq_sub_stats s = self.last_stats
        if self.sub != NULL:
            msgq_sub_get_stats(self.sub, &s)
        return s

    @property
    def resets(self) -> int:
        """Times this subscriber fell a whole ring behind and skipped ahead (lost
        messages), including resets caused by corrupt values in the queue."""
        return self._stats().resets

    @property
    def corrupt_resets(self) -> int:
        """Resets caused by out-of-range values found in the shared segment."""
        return self._stats().corrupt_resets

    @property
    def checksum_errors(self) -> int:
        """Messages dropped because their bytes did not match their CRC32C (checksummed
        queues only)."""
        return self._stats().checksum_errors

    @property
    def checksum(self) -> bool:
        """Whether the queue carries a CRC32C of every message (chosen at creation)."""
        self._check_connected()
        return bool(msgq_sub_checksum(self.sub))

    @property
    def segment_size(self) -> int:
        self._check_connected()
        return msgq_sub_segment_size(self.sub)

    def close(self) -> None:
        """Gives the reader slot back; the socket can connect again. Tasks awaiting it
        (``receive_async``, ``poll_async``) get IpcError. Raises IpcError while another
        thread is inside a call on it."""
        self._release_async_waiter()
        self._check_idle()
        self._disconnect()

    cdef int _release_async_waiter(self) except -1:
        """Fails the tasks awaiting this socket and waits until the loop's waiter thread
        no longer sleeps on its ring (it is told to let go at once)."""
        if self.async_waiter is not None:
            (<_LoopWaiter>self.async_waiter).drop(self)
        cdef double give_up = time.monotonic() + 2.0
        while self.async_busy and time.monotonic() < give_up:
            time.sleep(0.0002)  # lets the waiter thread take the GIL and return
        return 0

    # --- asyncio -----------------------------------------------------------------

    async def receive_async(self):
        """``await sub.receive_async()``: the next message as ``bytes``, or None when the
        socket's timeout (``setTimeout``, ms) passes first. The task sleeps while it
        waits (one thread per event loop sleeps on every awaited queue for it);
        cancelling it loses no message: a message is taken only by the call that
        returns it."""
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout_ns < 0 else loop.time() + self.timeout_ns / 1e9
        msg = self.receive(non_blocking=True)
        if msg is None and self.timeout_ns != 0 and self._await_briefly():
            msg = self.receive(non_blocking=True)
        if msg is not None:
            return msg
        return await wait_for_result(
            loop, partial(self.receive, non_blocking=True),
            partial(wait_readable_async, loop, [self]), deadline)

    cdef bint _await_briefly(self):
        """Looks for data for up to ASYNC_SPIN_NS in the loop's own thread (spinning,
        or yielding the CPU on a single-CPU machine) before a task hands the wait to the
        waiter thread: a reply that comes within microseconds then skips two thread
        hand-offs. Bounded, once per wait, so an idle task still costs nothing."""
        cdef int r
        self.busy += 1
        with nogil:
            r = msgq_sub_wait(self.sub, ASYNC_SPIN_NS)
        self.busy -= 1
        return r == 1

    def __aiter__(self):
        return self

    async def __anext__(self):
        """``async for msg in sub``: every message, waiting as long as it takes (timeouts
        do not end the loop; closing the socket does)."""
        return await next_message(self, self._is_open)

    def _is_open(self):
        return self.sub != NULL


#: How long an awaiting task looks for data itself before the waiter thread takes over.
cdef int64_t ASYNC_SPIN_NS = 20 * 1000

#: Seconds a loop's waiter thread stays after its last waiter is gone before it ends.
WAITER_LINGER_S = 1.0
#: The longest one sleep of a waiter thread (it looks at its loop and set again after).
cdef int64_t WAITER_SLICE_NS = 100 * 1000 * 1000

_waiters = weakref.WeakKeyDictionary()


cdef class _LoopWaiter:
    """Sleeps on the queues the tasks of one event loop await, in one thread, and wakes
    the loop (``call_soon_threadsafe``) for those that got data. The thread starts with
    the first waiter and ends ``WAITER_LINGER_S`` after the last one, or when the loop
    is closed or collected: nothing polls, and no thread outlives its use."""
    cdef object loop_ref
    cdef object lock
    cdef dict waiting  # id(sock) -> [sock, [futures]]
    cdef object thread
    cdef msgq_wake *wake

    def __cinit__(self, loop):
        self.loop_ref = weakref.ref(loop)
        self.lock = threading.Lock()
        self.waiting = {}
        self.thread = None
        self.wake = msgq_wake_new()
        if self.wake == NULL:
            raise MemoryError()

    def __dealloc__(self):
        msgq_wake_free(self.wake)  # the thread holds self while it runs

    def add(self, list socks, fut) -> None:
        """``fut`` is resolved once any of ``socks`` may have data."""
        cdef SubSocket sock
        with self.lock:
            for sock in socks:
                entry = self.waiting.get(id(sock))
                if entry is None:
                    self.waiting[id(sock)] = [sock, [fut]]
                    sock.async_waiter = self
                else:
                    entry[1].append(fut)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="msgq-async-waiter",
                                               daemon=True)
                self.thread.start()
        msgq_wake_raise(self.wake)

    def forget(self, list socks, fut) -> None:
        """``fut`` no longer waits (resolved, timed out or cancelled)."""
        cdef SubSocket sock
        with self.lock:
            for sock in socks:
                entry = self.waiting.get(id(sock))
                if entry is None:
                    continue
                try:
                    entry[1].remove(fut)
                except ValueError:
                    pass
                if not entry[1]:
                    del self.waiting[id(sock)]
                    sock.async_waiter = None

    def drop(self, SubSocket sock) -> None:
        """``sock`` is being closed: its waiters fail, the thread lets go of its ring."""
        with self.lock:
            entry = self.waiting.pop(id(sock), None)
            sock.async_waiter = None
        msgq_wake_raise(self.wake)
        if entry is not None:
            loop = self.loop_ref()
            error = IpcError(f"endpoint {sock.endpoint!r}: the socket was closed while a "
                             "task awaited it")
            if loop is not None and not loop.is_closed():
                for fut in entry[1]:
                    loop.call_soon_threadsafe(_fail, fut, error)

    def _run(self) -> None:
        cdef msgq_sub **subs = NULL
        cdef uint8_t *ready = NULL
        cdef int capacity = 0
        cdef int n, i, r
        cdef uint32_t seen
        cdef SubSocket sock
        idle_since = None
        try:
            while True:
                loop = self.loop_ref()
                if loop is None or loop.is_closed():
                    with self.lock:
                        self.thread = None
                    return
                with self.lock:
                    seen = msgq_wake_seen(self.wake)
                    entries = list(self.waiting.values())
                    if not entries:
                        now = time.monotonic()
                        if idle_since is None:
                            idle_since = now
                        elif now - idle_since >= WAITER_LINGER_S:
                            self.thread = None
                            return
                    else:
                        idle_since = None
                    n = len(entries)
                    if n > capacity:
                        PyMem_Free(subs)
                        PyMem_Free(ready)
                        capacity = max(8, 2 * n)
                        subs = <msgq_sub **>PyMem_Malloc(capacity * sizeof(void *))
                        ready = <uint8_t *>PyMem_Malloc(capacity)
                        if subs == NULL or ready == NULL:
                            raise MemoryError()
                    for i in range(n):
                        sock = entries[i][0]
                        subs[i] = sock.sub
                        sock.async_busy += 1
                del loop
                with nogil:
                    r = msgq_sub_poll_until(subs, n, WAITER_SLICE_NS, ready, self.wake, seen)
                woken = []
                with self.lock:
                    for i in range(n):
                        sock = entries[i][0]
                        sock.async_busy -= 1
                        if r > 0 and ready[i]:
                            entry = self.waiting.pop(id(sock), None)
                            if entry is not None:
                                sock.async_waiter = None
                                woken.extend(entry[1])
                if woken:
                    loop = self.loop_ref()
                    if loop is None:
                        continue
                    try:
                        loop.call_soon_threadsafe(_resolve, woken)
                    except RuntimeError:  # the loop was closed meanwhile
                        pass
                    del loop
        except BaseException:
            # Whatever went wrong here, no task may wait for a thread that is gone: every
            # waiter is woken (it looks again, and a new thread starts if it must wait).
            with self.lock:
                self.thread = None
                woken = [fut for entry in self.waiting.values() for fut in entry[1]]
            loop = self.loop_ref()
            if loop is not None and not loop.is_closed() and woken:
                loop.call_soon_threadsafe(_resolve, woken)
            raise
        finally:
            PyMem_Free(subs)
            PyMem_Free(ready)


def _resolve(list futures) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


def _fail(fut, error) -> None:
    if not fut.done():
        fut.set_exception(error)


cdef _LoopWaiter _waiter_of(loop):
    waiter = _waiters.get(loop)
    if waiter is None:
        waiter = _waiters[loop] = _LoopWaiter(loop)
    return waiter


async def wait_readable_async(loop, list socks, deadline=None) -> None:
    """Returns once any of ``socks`` (connected SubSockets) may have data, or at
    ``deadline`` (the loop's clock; None: no limit). Cancellable."""
    cdef _LoopWaiter waiter = _waiter_of(loop)
    for sock in socks:
        if (<SubSocket>sock).sub == NULL:
            raise IpcError("socket is not connected; call connect() first")
    fut = loop.create_future()
    waiter.add(socks, fut)
    try:
        await await_until(loop, fut, deadline)
    finally:
        waiter.forget(socks, fut)


cdef class MessageView:
    """The context manager of :meth:`SubSocket.receive_view`: entering takes the next
    message and gives a read-only memoryview of it in the ring (or None); leaving ends
    its use and raises :class:`msgq.MessageOverwritten` when the publisher may have
    overwritten it meanwhile (or, in a checksummed queue, it does not match its CRC32C).
    While any memoryview of it is alive the socket's mapping stays (close raises)."""
    cdef SubSocket sock
    cdef bint non_blocking
    cdef bint holding
    cdef const void *payload
    cdef size_t size
    cdef object view

    def __cinit__(self, SubSocket sock, bint non_blocking):
        self.sock = sock
        self.non_blocking = non_blocking
        self.holding = False
        self.view = None

    def __enter__(self):
        cdef SubSocket sock = self.sock
        if self.holding or self.view is not None:
            raise RuntimeError("a message view is entered once")
        sock._check_connected()
        sock._check_no_view()
        sock.view_open = True
        try:
            if not sock._next_message(&self.payload, &self.size, self.non_blocking):
                sock.view_open = False
                return None
        except BaseException:
            sock.view_open = False
            raise
        self.holding = True
        self.view = memoryview(self)
        return self.view

    def __exit__(self, exc_type, exc, tb):
        cdef int r
        cdef msgq_sub_stats before, after
        if not self.holding:
            return False
        self.holding = False
        try:
            self.view.release()  # the block's own view; slices taken from it stay valid
        except BufferError:
            pass  # something (numpy, say) holds a buffer of it: it keeps the ring mapped
        msgq_sub_get_stats(self.sock.sub, &before)
        r = msgq_sub_view_end(self.sock.sub, NULL)
        msgq_sub_get_stats(self.sock.sub, &after)
        self.sock.view_open = False
        if exc_type is not None or r == 1:
            return False  # the block's own exception goes on unchanged
        if r < 0:
            self.sock._fail(r)
        if after.checksum_errors != before.checksum_errors:
            raise MessageOverwritten(
                f"endpoint {self.sock.endpoint!r}: the {self.size}-byte message viewed did "
                "not match its CRC32C (counted in checksum_errors); discard what was "
                "computed from it")
        raise MessageOverwritten(
            f"endpoint {self.sock.endpoint!r}: the publisher may have overwritten the "
            f"{self.size}-byte message while it was viewed (this subscriber fell a ring "
            "behind); discard what was computed from it")

    def keep_readable(self) -> None:
        """Promises that the bytes stay readable (though not intact) after the block and
        after ``close``, for a decoder that keeps raw pointers into them without holding
        a buffer (pycapnp's readers): the socket's mapping is then never unmapped."""
        self.sock.lent_views = True

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("a message view is read-only")
        if not self.holding:
            raise BufferError("the message view is not open")
        PyBuffer_FillInfo(buffer, self, <void *>self.payload, self.size, 1, flags)
        self.sock.exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        self.sock.exports -= 1


cdef class Poller:
    """Waits on many SubSockets at once (futex_waitv on Linux)."""
    cdef list sockets
    cdef msgq_sub **subs
    cdef uint8_t *ready
    cdef int capacity

    def __cinit__(self):
        self.sockets = []
        self.subs = NULL
        self.ready = NULL
        self.capacity = 0

    def __dealloc__(self):
        PyMem_Free(self.subs)
        PyMem_Free(self.ready)

    def registerSocket(self, SubSocket socket) -> None:
        """Adds ``socket``; registering a socket twice has no further effect."""
        cdef SubSocket sock = socket  # upstream's parameter name, for keyword callers
        if sock.sub == NULL:
            raise IpcError("register a connected SubSocket")
        for s in self.sockets:
            if s is sock:
                return
        cdef int n = len(self.sockets) + 1
        if n > self.capacity:
            new_cap = max(8, self.capacity * 2)
            subs = <msgq_sub **>PyMem_Malloc(new_cap * sizeof(msgq_sub *))
            ready = <uint8_t *>PyMem_Malloc(new_cap * sizeof(uint8_t))
            if subs == NULL or ready == NULL:
                PyMem_Free(subs)
                PyMem_Free(ready)
                raise MemoryError()
            PyMem_Free(self.subs)
            PyMem_Free(self.ready)
            self.subs = subs
            self.ready = ready
            self.capacity = new_cap
        self.sockets.append(sock)

    def poll(self, timeout) -> list:
        """Sockets with a message waiting, after at most ``timeout`` ms (negative: no
        limit). Empty list on timeout."""
        cdef int n = len(self.sockets)
        cdef int64_t deadline = -1
        cdef int64_t now, slice_ns
        cdef int r
        cdef int i
        if n == 0:
            return []
        # The handles are looked up at every poll: a socket that reconnected since it
        # was registered has a new one.
        for i in range(n):
            s = self.sockets[i]
            if (<SubSocket>s).sub == NULL:
                raise IpcError("a socket registered with this Poller was closed")
            self.subs[i] = (<SubSocket>s).sub
        if timeout is not None and timeout >= 0:
            deadline = msgq_now_ns() + <int64_t>(timeout * 1000000)
        while True:
            slice_ns = SIGNAL_CHECK_NS
            if deadline >= 0:
                now = msgq_now_ns()
                slice_ns = deadline - now
                if slice_ns < 0:
                    slice_ns = 0
                if slice_ns > SIGNAL_CHECK_NS:
                    slice_ns = SIGNAL_CHECK_NS
            for s in self.sockets:
                (<SubSocket>s).busy += 1
            with nogil:
                r = msgq_sub_poll(self.subs, n, slice_ns, self.ready)
            for s in self.sockets:
                (<SubSocket>s).busy -= 1
            if r > 0:
                return [self.sockets[i] for i in range(n) if self.ready[i]]
            if r < 0 and r != -EINTR:
                _raise(r, "poller")
            PyErr_CheckSignals()
            if deadline >= 0 and msgq_now_ns() >= deadline:
                return []

    async def poll_async(self, timeout=None) -> list:
        """``await poller.poll_async(timeout)``: the registered sockets with a message
        waiting, after at most ``timeout`` ms (None or negative: no limit); empty on
        timeout. The task sleeps meanwhile (see ``SubSocket.receive_async``)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None or timeout < 0 else loop.time() + timeout / 1000
        ready = self.poll(0)
        if not ready and timeout != 0:
            ready = self.poll(ASYNC_SPIN_NS / 1e6)  # as SubSocket._await_briefly
        ready = await wait_for_result(
            loop, lambda: self.poll(0) or None,
            partial(wait_readable_async, loop, list(self.sockets)), deadline, ready or None)
        return ready or []
