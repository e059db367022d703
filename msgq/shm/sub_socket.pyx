# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. The subscriber.

cdef class SubSocket:
    """One subscriber of an endpoint: receives every message sent after it connected
    (or only the newest, with ``conflate``)."""
    cdef msgq_sub *sub  # NULL while not connected
    cdef msgq_sub_stats last_stats  # counters of the last connection, once closed
    cdef bint conflate_flag
    cdef int busy  # calls in progress without the GIL (other threads may run)
    cdef int copying  # of those, receives copying a message out of the ring (_copy_out)
    cdef int exports  # buffers exported by this socket's message views (the ring is in them)
    cdef bint view_open  # a receive_view block holds the next message
    cdef bint lent_views  # the current mapping was lent to a decoder (see _disconnect)
    cdef bint held  # the handle holds its mappings (msgq.h O8): views or lent_views
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
        self.copying = 0
        self.exports = 0
        self.view_open = False
        self.lent_views = False
        self.held = False
        self.async_busy = 0
        self.async_waiter = None
        self.timeout_ns = -1
        self.endpoint = None

    def __dealloc__(self):
        # As PubSocket's: the views' kept mappings go with the socket (not those lent to
        # a decoder, which _disconnect keeps).
        if self.held and not self.lent_views:
            msgq_sub_hold_mappings(self.sub, 0)
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
                # (held: a buffer of a view is still alive, only in a garbage-collected
                # cycle or a failed follow; the mappings then stay, O8)
                msgq_sub_close(self.sub)
            self.sub = NULL
            self.lent_views = False
            self.held = False

    cdef void _hold(self) noexcept:
        """A buffer of a view is out (or the mapping was lent to a decoder): from now on a
        queue file the handle gives up (following a replaced one inside a receive, msgq.h
        O6) stays mapped under it (O8). Follows run only with the GIL held, as this."""
        if not self.held and self.sub != NULL:
            msgq_sub_hold_mappings(self.sub, 1)
            self.held = True

    cdef void _let_go(self) noexcept:
        """No buffer of a view is out any more: the queues kept for them are unmapped
        (never those lent to a decoder, which stay for the life of the process)."""
        if self.held and not self.lent_views:
            msgq_sub_hold_mappings(self.sub, 0)
            self.held = False

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

    cdef int _check_can_take(self) except -1:
        """Before a receive takes a message: no receive_view block holds the next one, and
        no other thread is copying one out of the ring without the GIL (this call would
        end its view, O5, or follow a replaced queue file, O6, unmapping the ring under
        its copy). A thread waiting or polling on the queue is no obstacle (O6)."""
        if self.view_open:
            raise RuntimeError(f"endpoint {self.endpoint!r}: a receive_view block holds "
                               "the next message; leave it before receiving again")
        if self.copying:
            raise IpcError(f"endpoint {self.endpoint!r}: another thread is receiving on "
                           "this socket; receive again when that call has returned")
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
        if not isinstance(address, (str, bytes)):
            raise TypeError(f"address must be str or bytes, not {type(address).__name__}")
        self._check_idle()
        _open_queue(endpoint, segment_size, _open_flags(None, conflate), &opened)
        try:
            # The open ran without the GIL: another thread may have started a call on
            # the old handle meanwhile, which closing it now would pull away under it.
            self._check_idle()
        except BaseException:
            msgq_sub_close(opened)
            raise
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
            self.copying += 1
            with nogil:
                memcpy(dst, payload, size)
            self.copying -= 1
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
        self._check_can_take()
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
        self._check_can_take()
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
        self._check_can_take()
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
        loop = running_loop()
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
