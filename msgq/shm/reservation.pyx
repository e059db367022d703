# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. The shared-memory ring's reservation: the Reservation protocol itself
# (commit, abort, the with block) is backend-neutral, in msgq/_reservation.pyx, which
# the ZMQ backend's reservation subclasses too.

cdef class RingReservation(Reservation):
    """A :class:`Reservation` in the ring of a shared-memory queue: the room is the
    message's place in the ring, so committing publishes it without a copy.

    Its view is a buffer exported by the reservation itself, counted on the socket: a
    slice, memoryview or numpy array taken from it keeps that count up until it is
    released, and the socket refuses to close or reconnect (to unmap the ring) meanwhile,
    as for receive_view's views; a queue file replaced meanwhile is followed by the
    socket, but its ring stays mapped until that count is back at 0 (msgq.h O8)."""
    cdef PubSocket pub
    cdef char *data  # the room in the ring
    cdef Py_ssize_t size

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        if self.done:
            raise BufferError("the reservation was committed or aborted")
        PyBuffer_FillInfo(buffer, self, <void *>self.data, self.size, 0, flags)
        if self.pub.exports == 0:
            self.pub._hold()
        self.pub.exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        # None only when the garbage collector broke a cycle holding this reservation,
        # its socket and a buffer of it (tp_clear empties self.pub first): the socket is
        # garbage too, and nothing is left to count.
        if self.pub is not None:
            self.pub.exports -= 1
            if self.pub.exports == 0:
                self.pub._let_go()

    cpdef _publish(self):
        cdef int r = msgq_pub_commit(self.pub.pub)
        self.pub.reservation = None
        if r < 0:
            _raise(r, self.pub.endpoint)

    cpdef _drop(self):
        msgq_pub_abort(self.pub.pub)
        self.pub.reservation = None
