# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. Reservations: room for one message, written in place, then committed
# or aborted. The protocol is written once, here, for every backend: the ZMQ backend's
# reservation (msgq/zmq_backend.py) is a subclass of Reservation too.

cdef class Reservation:
    """Room for one message, written in place and then committed: what ``reserve(n)``
    returns on every backend.

    Use as ``with pub.reserve(n) as buf: buf[:] = ...``: leaving the block commits the
    message; an exception inside it abandons the message (nothing is published). Do not
    keep ``buf`` (or slices of it) past the block. Committing twice, or after the socket
    was closed or reconnected (which abort it), raises RuntimeError; aborting again does
    nothing.

    A backend subclasses it and says what committing and aborting do with the socket
    (``_publish``, ``_drop``); ``view`` is the writable memoryview of the room.
    """
    cdef object view
    cdef bint done

    def __init__(self, view) -> None:
        self.view = view
        self.done = False

    def __enter__(self):
        return self.view

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self._commit()
        else:
            self.abort()
        return False

    def commit(self) -> None:
        """Publishes the message written into the reserved buffer."""
        self._commit()

    cdef int _commit(self) except -1:
        if self.done:
            raise RuntimeError("reservation already committed or aborted (was the socket "
                               "closed or reconnected?)")
        self.done = True
        self.view.release()
        self._publish()
        return 0

    def abort(self) -> None:
        """Drops the reservation; subscribers never see it."""
        if self.done:
            return
        self.done = True
        self.view.release()
        self._drop()

    cpdef _publish(self):
        """Publishes what was written (the view is released by now) and lets the socket
        take another reservation."""
        raise NotImplementedError

    cpdef _drop(self):
        """Forgets the room without publishing it and lets the socket take another
        reservation."""
        raise NotImplementedError


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
