# cython: language_level=3, boundscheck=False, wraparound=False
"""The log scanner (msgq/logs/src/log_scan.c) for Python: whole runs of messages of a
decompressed log stream split and peeked in one call, as numpy arrays; and
:class:`LogEvent`, the raw event, made here without a Python call per event."""

import numpy as np

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from "log_scan.h":
    ctypedef struct log_event_layout:
        uint32_t mono_byte
        uint32_t valid_byte
        uint32_t valid_bit
        uint32_t discriminant_byte
        uint32_t services
        uint64_t mono_default
        uint8_t valid_default

    ctypedef struct log_scan_out:
        int64_t *offset
        uint32_t *length
        uint16_t *service
        uint8_t *flags
        uint64_t *mono_ns
        size_t capacity

    size_t log_scan(const uint8_t *buf, size_t len, size_t pos,
                    const log_event_layout *layout, log_scan_out *out, size_t *stop,
                    int *why) nogil

    int64_t log_message_extent(const uint8_t *segment, uint64_t words) nogil

    ctypedef int (*log_identify_fn)(void *ctx, const uint8_t *msg, size_t len, int keep)

    ctypedef struct log_splitter:
        const log_event_layout *layout
        log_identify_fn identify
        void *ctx
        int raw
        int64_t pos, previous, origin, damage
        int resyncing, final, failed
        int64_t keep, carry, kept

    ctypedef struct log_split_result:
        int64_t offset
        int64_t length
        int peeked
        uint64_t mono_ns
        uint16_t service
        uint8_t flags
        int detail
        uint64_t value
        size_t count

    enum:
        LOG_SPLIT_RUN, LOG_SPLIT_MESSAGE, LOG_SPLIT_CORRUPT, LOG_SPLIT_WAIT, LOG_SPLIT_ERROR
        LOG_DETAIL_SEGMENTS, LOG_DETAIL_NO_DATA, LOG_DETAIL_TOO_LARGE, LOG_DETAIL_NOT_DECODED
        LOG_DETAIL_RUNS_PAST
        LOG_MAX_SEGMENTS, LOG_MAX_MESSAGE_BYTES

    void log_split_init(log_splitter *sp, const log_event_layout *layout,
                        log_identify_fn identify, void *ctx, int raw)
    void log_split_begin(log_splitter *sp, int final)
    int log_split_cut(log_splitter *sp, size_t len, int64_t *left)
    void log_split_damaged(log_splitter *sp)
    void log_split_break(log_splitter *sp)
    int log_split_finish(const log_splitter *sp, size_t len, int64_t *at, int64_t *left)
    int log_split_next(log_splitter *sp, const uint8_t *buf, size_t len, log_scan_out *out,
                       log_split_result *res)
    size_t log_split_run_capacity(const log_splitter *sp, size_t len)

#: Why a scan stopped (log_scan_stop).
END = 0
INCOMPLETE = 1
BAD_FRAMING = 2
NOT_PEEKED = 3
FULL = 4
#: flags bits
VALID = 1
ROOT_WHOLE = 2


cdef class ScanLayout:
    """The peeked fields' places and defaults (an :class:`~msgq.schemas.framing.EventLayout`)
    in the form the C scanner takes."""

    cdef log_event_layout c
    cdef readonly tuple services

    def __init__(self, layout):
        if layout.mono_byte < 0 or layout.valid_byte < 0 or layout.discriminant_byte < 0:
            raise ValueError("an event layout's byte offsets are not negative")
        self.c.mono_byte = layout.mono_byte
        self.c.valid_byte = layout.valid_byte
        self.c.valid_bit = layout.valid_bit
        self.c.discriminant_byte = layout.discriminant_byte
        self.c.services = min(len(layout.services), 0xFFFF)
        self.c.mono_default = layout.mono_default
        self.c.valid_default = 1 if layout.valid_default else 0
        self.services = tuple(layout.services)


cdef tuple _run_arrays(size_t capacity):
    """The arrays a run of ``capacity`` messages fills: offset, length, service, flags,
    mono_ns."""
    return (np.empty(capacity, np.int64), np.empty(capacity, np.uint32),
            np.empty(capacity, np.uint16), np.empty(capacity, np.uint8),
            np.empty(capacity, np.uint64))


cdef int _aim(log_scan_out *out, tuple arrays, size_t capacity) except -1:
    """Points ``out`` at ``arrays`` (of :func:`_run_arrays`, ``capacity`` long at least;
    the caller keeps them alive while C writes)."""
    cdef int64_t[::1] o = arrays[0]
    cdef uint32_t[::1] l = arrays[1]
    cdef uint16_t[::1] s = arrays[2]
    cdef uint8_t[::1] f = arrays[3]
    cdef uint64_t[::1] m = arrays[4]
    out.offset = &o[0]
    out.length = &l[0]
    out.service = &s[0]
    out.flags = &f[0]
    out.mono_ns = &m[0]
    out.capacity = capacity
    return 0


def scan(const uint8_t[::1] buf, Py_ssize_t pos, ScanLayout layout, Py_ssize_t end=-1):
    """Scans ``buf[pos:end]`` message after message while each is whole and peeked.

    Returns ``(stop, why, offset, length, service, flags, mono_ns)``: where the scan
    stopped, why (END, INCOMPLETE, BAD_FRAMING, NOT_PEEKED), and one array entry per
    message (offsets in ``buf``)."""
    cdef size_t n_bytes = buf.shape[0] if end < 0 else min(<size_t>end, <size_t>buf.shape[0])
    if pos < 0 or <size_t>pos > n_bytes:
        raise ValueError(f"scan position {pos} is outside the buffer of {n_bytes} bytes")
    # the smallest message is 16 bytes (an 8-byte header and one word)
    cdef size_t capacity = (n_bytes - pos) // 16 + 1
    arrays = _run_arrays(capacity)
    offset, length, service, flags, mono = arrays
    cdef log_scan_out out
    _aim(&out, arrays, capacity)
    cdef size_t stop = pos
    cdef int why = END
    cdef size_t n = 0
    cdef const uint8_t *data = &buf[0] if buf.shape[0] else NULL
    if n_bytes > <size_t>pos:
        with nogil:
            n = log_scan(data, n_bytes, pos, &layout.c, &out, &stop, &why)
    return stop, why, offset[:n], length[:n], service[:n], flags[:n], mono[:n]


cdef class LogEvent:
    """One event's bytes with the fields every tool needs, read without decoding:
    ``data``, ``mono_ns`` (logMonoTime), ``valid``, ``service``, ``path`` (the segment)
    and ``offset`` (in the segment's uncompressed stream). Immutable; equal when every
    field is."""

    cdef readonly bytes data
    cdef readonly object mono_ns
    cdef readonly bint valid
    cdef readonly str service
    cdef readonly str path
    cdef readonly object offset

    def __init__(self, bytes data, mono_ns, bint valid, str service, str path, offset):
        self.data = data
        self.mono_ns = int(mono_ns)
        self.valid = valid
        self.service = service
        self.path = path
        self.offset = int(offset)

    def _key(self):
        return (self.data, self.mono_ns, self.valid, self.service, self.path, self.offset)

    def __eq__(self, other):
        if type(other) is not LogEvent:
            return NotImplemented
        return self._key() == (<LogEvent>other)._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"LogEvent(data={self.data!r}, mono_ns={self.mono_ns!r}, "
                f"valid={bool(self.valid)!r}, service={self.service!r}, path={self.path!r}, "
                f"offset={self.offset!r})")

    def __reduce__(self):
        return (LogEvent, self._key())


def log_events(bytes data, const int64_t[::1] offset, const uint32_t[::1] length,
               const uint16_t[::1] service, const uint8_t[::1] flags,
               const uint64_t[::1] mono_ns, tuple names, str path, Py_ssize_t stream_offset,
               const uint8_t[::1] wanted=None, start_mono_ns=None):
    """The :class:`LogEvent` of each scanned message of ``data`` (arrays from
    :func:`scan`), ``names`` the service of each index; only those whose service index
    is set in ``wanted`` (None: all) and, with ``start_mono_ns``, not older."""
    cdef Py_ssize_t n = offset.shape[0], i
    cdef uint64_t start = 0
    cdef bint by_time = start_mono_ns is not None
    cdef bint by_service = wanted is not None
    cdef const char *base = data
    cdef LogEvent e
    cdef uint16_t which
    if by_time:
        if start_mono_ns <= 0:
            by_time = False
        else:
            start = min(start_mono_ns, 0xFFFFFFFFFFFFFFFF)
    if length.shape[0] < n or service.shape[0] < n or flags.shape[0] < n \
            or mono_ns.shape[0] < n:
        raise ValueError("the scan arrays differ in length")
    for i in range(n):
        if offset[i] < 0 or offset[i] + length[i] > len(data):
            raise ValueError("a scanned message lies outside its buffer")
        if service[i] >= len(names):
            raise ValueError("a scanned service index has no name")
    out = []
    for i in range(n):
        which = service[i]
        if by_service and (which >= wanted.shape[0] or not wanted[which]):
            continue
        if by_time and mono_ns[i] < start:
            continue
        e = LogEvent.__new__(LogEvent)
        e.data = PyBytes_FromStringAndSize(base + offset[i], length[i])
        e.mono_ns = mono_ns[i]
        e.valid = flags[i] & VALID
        e.service = names[which]
        e.path = path
        e.offset = stream_offset + offset[i]
        out.append(e)
    return out


def message_extent(const uint8_t[::1] message):
    """How many words of a one-segment message its root reaches (the root pointer and
    everything the pointers lead to, up to the furthest word): the size of the segment
    for a message written tightly. None when the message has more than one segment, its
    size field disagrees with its length, a pointer leaves the segment, it holds far or
    capability pointers, or following it would take more than ``4 * words + 64`` steps.
    Bounded; nothing is decoded (log_message_extent in C)."""
    cdef size_t n = message.shape[0]
    if n < 16:
        return None
    cdef const uint8_t *p = &message[0]
    cdef uint32_t count = p[0] | (p[1] << 8) | (p[2] << 16) | (<uint32_t>p[3] << 24)
    cdef uint64_t words = p[4] | (p[5] << 8) | (p[6] << 16) | (<uint64_t>p[7] << 24)
    if count != 0 or 8 + 8 * words != n:
        return None
    cdef int64_t reached
    with nogil:
        reached = log_message_extent(p + 8, words)
    if reached == -2:
        raise MemoryError()
    return None if reached < 0 else reached


# -- splitting a log stream, damage decisions included ----------------------------------

_DETAILS = {
    LOG_DETAIL_NO_DATA: "message with no data",
    LOG_DETAIL_NOT_DECODED: "bytes that do not decode as a message",
    LOG_DETAIL_RUNS_PAST: "a length field that runs past the end of the data",
}


def _detail(int detail, uint64_t value):
    if detail == LOG_DETAIL_SEGMENTS:
        return f"segment count {value} is over {LOG_MAX_SEGMENTS}"
    if detail == LOG_DETAIL_TOO_LARGE:
        return f"message of {value} bytes is over the {LOG_MAX_MESSAGE_BYTES} limit"
    return _DETAILS[detail]


cdef int _identify(void *ctx, const uint8_t *msg, size_t length, int keep) noexcept with gil:
    cdef Splitter sp = <Splitter>ctx
    try:
        identity = sp.identify(PyBytes_FromStringAndSize(<const char *>msg, length))
    except BaseException as e:  # handed back to the caller by next_action
        sp.error = e
        return -1
    if identity is None:
        return 0
    if keep:
        sp.identity = identity
    return 1


class _StopReading(Exception):
    """Reading stops at damage (no skip_corrupt)."""


cdef class Splitter:
    """One segment's decompressed stream split into messages by the C scanner
    (log_splitter), which takes every damage decision; :meth:`split` feeds it the
    stream piece by piece and hands out what it finds, in order."""

    cdef log_splitter c
    cdef ScanLayout scan_layout
    cdef object identify
    cdef object identity
    cdef object error
    cdef bytes buf
    cdef Py_ssize_t buf_offset
    cdef object arrays
    cdef log_split_result res

    def __cinit__(self, *args, **kwargs):
        # a usable state before __init__ (a subclass may not call it): no layout, and an
        # identify that is not callable fails the split with an exception, not a crash
        log_split_init(&self.c, NULL, _identify, <void *>self, 0)
        self.buf = b""
        self.buf_offset = 0

    def __init__(self, identify, ScanLayout layout=None, bint raw=False):
        self.identify = identify
        self.scan_layout = layout
        log_split_init(&self.c, &layout.c if layout is not None else NULL, _identify,
                       <void *>self, raw)

    def split(self, chunks, str path, on_problem, bint skip_corrupt, batch, message,
              problem):
        """Every whole message of the stream ``chunks`` holds (pieces with ``data``,
        ``file_offset``, ``problem`` and ``breaks_after``, as segment.py's readers make
        them), in order: ``batch(...)`` per run of peeked messages, ``message(...)`` per
        message handed over alone; damage goes to ``on_problem(problem(...))``."""
        cdef bint raw = self.c.raw
        cdef int64_t at = 0, left = 0
        cdef Py_ssize_t stream_offset = 0  # uncompressed bytes seen so far
        file_offset = 0  # where in the file buf[0] came from (its zstd frame, for zstd)
        names = self.scan_layout.services if self.scan_layout is not None else ()
        try:
            for chunk in chunks:
                data = chunk.data
                if data:
                    if not self.buf:
                        file_offset = chunk.file_offset
                    self.buf = self.buf + data if self.buf else data
                    stream_offset += len(data)
                final = chunk.problem is not None
                yield from self._pass(final, path, file_offset, on_problem, skip_corrupt,
                                      batch, message, problem, names)
                if final:
                    kind, detail = chunk.problem
                    if kind == "truncated":
                        if log_split_cut(&self.c, len(self.buf), &left):
                            if left:
                                detail = f"{detail}; {left} bytes of an unfinished " \
                                         "message dropped"
                            on_problem(problem(path, kind, self.buf_offset,
                                               self.buf_offset if raw else file_offset,
                                               detail))
                        self._drop()
                        continue
                    file_offset = chunk.file_offset
                    on_problem(problem(path, kind, stream_offset,
                                       stream_offset if raw else file_offset, detail))
                    if not skip_corrupt:
                        return
                    log_split_damaged(&self.c)  # what is left before it is lost too
                if chunk.breaks_after:
                    log_split_break(&self.c)
                    self._drop()
            yield from self._pass(True, path, file_offset, on_problem, skip_corrupt, batch,
                                  message, problem, names)
        except _StopReading:
            return
        if log_split_finish(&self.c, len(self.buf), &at, &left):
            offset = self.buf_offset + at
            on_problem(problem(path, "truncated", offset, offset if raw else file_offset,
                               f"the file ends inside a message ({left} bytes of it "
                               "dropped)"))

    def _pass(self, bint final, str path, file_offset, on_problem, bint skip_corrupt, batch,
              message, problem, tuple names):
        """One pass of the C scanner over ``buf`` (``final``: no bytes will follow)."""
        cdef bint raw = self.c.raw
        log_split_begin(&self.c, final)
        while True:
            action = self._next()
            if action is None:
                return
            if action[0] == 0:
                yield batch(self.buf, self.buf_offset, None if raw else file_offset,
                            *action[1:], names)
                continue
            offset = self.buf_offset + action[1]
            if action[0] == 1:
                yield message(action[2], offset, offset if raw else file_offset, action[3])
                continue
            on_problem(problem(path, "corrupt", offset, offset if raw else file_offset,
                               action[2]))
            if not skip_corrupt:
                raise _StopReading()

    cdef void _drop(self):
        self.buf_offset += len(self.buf)
        self.buf = b""

    cdef object _next(self):
        """What the pass finds next: ``(0, offset, length, service, flags, mono_ns)`` (a
        run), ``(1, offset, data, identity)`` (one message), ``(2, offset, detail)`` (a
        corrupt spot) or None (the pass is over: ``buf`` keeps what is not done with)."""
        cdef bytes buf = self.buf
        cdef size_t n = len(buf)
        cdef size_t capacity = log_split_run_capacity(&self.c, n)
        cdef log_scan_out out
        out.capacity = 0
        if capacity:
            # arrays a run did not take are used again (capacity only shrinks in a pass)
            if self.arrays is None or len(self.arrays[0]) < capacity:
                self.arrays = _run_arrays(capacity)
            _aim(&out, self.arrays, capacity)
        self.identity = None
        cdef int action = log_split_next(&self.c, <const uint8_t *>PyBytes_AS_STRING(buf), n,
                                         &out, &self.res)
        if action == LOG_SPLIT_RUN:
            k = self.res.count
            offset, length, service, flags, mono = self.arrays
            self.arrays = None
            return (0, offset[:k], length[:k], service[:k], flags[:k], mono[:k])
        if action == LOG_SPLIT_MESSAGE:
            at = self.res.offset
            data = buf[at:at + self.res.length]
            if self.res.peeked:
                identity = (self.res.mono_ns, bool(self.res.flags & VALID),
                            self.scan_layout.services[self.res.service])
            else:
                identity = self.identity
            return (1, at, data, identity)
        if action == LOG_SPLIT_CORRUPT:
            return (2, self.res.offset, _detail(self.res.detail, self.res.value))
        if action == LOG_SPLIT_WAIT:
            self.arrays = None
            keep = self.c.keep
            if keep:
                self.buf = buf[keep:]
            self.buf_offset += keep
            return None
        error, self.error = self.error, None
        if error is not None:
            raise error
        raise RuntimeError("the log scanner stopped on an internal error")
