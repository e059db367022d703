# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. receive_view: a message read where it lies in the ring.

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
    cdef bint entered  # a message was taken: the view is entered once

    def __cinit__(self, SubSocket sock, bint non_blocking):
        self.sock = sock
        self.non_blocking = non_blocking
        self.holding = False
        self.view = None
        self.entered = False

    def __enter__(self):
        cdef SubSocket sock = self.sock
        if self.holding or self.entered:
            raise RuntimeError("a message view is entered once")
        sock._check_connected()
        sock._check_can_take()
        sock.view_open = True
        try:
            if not sock._next_message(&self.payload, &self.size, self.non_blocking):
                sock.view_open = False
                return None
        except BaseException:
            sock.view_open = False
            raise
        self.holding = True
        self.entered = True
        self.view = memoryview(self)
        return self.view

    def __exit__(self, exc_type, exc, tb):
        cdef int r
        cdef msgq_sub_stats before, after
        if not self.holding:
            return False
        self.holding = False
        # The block's own view ends here (slices taken from it stay valid) and is let go
        # of either way: it exports this object, so keeping it would make a reference
        # cycle, which CPython's collector cannot clear while something still holds a
        # buffer of the view (3.11 crashes: memoryview's tp_clear drops its buffer
        # although exported, then the holder's release reads it).
        view, self.view = self.view, None
        try:
            view.release()
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
        self.sock._hold()  # and a replaced queue file followed later stays mapped too

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("a message view is read-only")
        if not self.holding:
            raise BufferError("the message view is not open")
        PyBuffer_FillInfo(buffer, self, <void *>self.payload, self.size, 1, flags)
        if self.sock.exports == 0:
            self.sock._hold()
        self.sock.exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        # None only when the garbage collector broke a cycle holding this view, its
        # socket and a buffer of it (tp_clear empties self.sock first).
        if self.sock is not None:
            self.sock.exports -= 1
            if self.sock.exports == 0:
                self.sock._let_go()
