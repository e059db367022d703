# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. The shared-memory ring's reservation: the Reservation protocol itself
# (commit, abort, the with block) is backend-neutral, in msgq/_reservation.pyx, which
# the ZMQ backend's reservation subclasses too.

cdef class RingReservation(Reservation):
    """A :class:`Reservation` in the ring of a shared-memory queue: the room is the
    message's place in the ring, so committing publishes it without a copy."""
    cdef PubSocket pub

    cpdef _publish(self):
        cdef int r = msgq_pub_commit(self.pub.pub)
        self.pub.reservation = None
        if r < 0:
            _raise(r, self.pub.endpoint)

    cpdef _drop(self):
        msgq_pub_abort(self.pub.pub)
        self.pub.reservation = None
