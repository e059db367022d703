# cython: language_level=3
"""The Reservation base: ``reserve(n)``'s commit/abort protocol, written once for every
backend. Backend-neutral on purpose (no C core, nothing Linux-only): the shared-memory
ring's RingReservation (msgq.shm_backend) cimports it, the ZMQ backend subclasses it in
Python, and neither imports the other."""


cdef class Reservation:
    """Room for one message, written in place and then committed: what ``reserve(n)``
    returns on every backend.

    Use as ``with pub.reserve(n) as buf: buf[:] = ...``: leaving the block commits the
    message; an exception inside it abandons the message (nothing is published). Do not
    keep ``buf`` (or slices of it) past the block: what is written through them later
    changes a message already published. Committing twice, or after the socket was
    closed or reconnected (which abort it), raises RuntimeError; aborting again does
    nothing. A buffer taken from ``buf`` that is still alive when the block ends (a
    numpy array, a slice) neither stops the commit nor blocks the socket; the backend
    keeps the memory behind it valid (the shared-memory socket refuses ``close`` and
    reconnecting while one is alive).

    A backend subclasses it and says what committing and aborting do with the socket
    (``_publish``, ``_drop``); ``view`` is the writable memoryview of the room.
    """

    def __init__(self, view) -> None:
        self.view = view
        self.done = False

    def __enter__(self):
        if self.done:
            raise RuntimeError("reservation already committed or aborted (was the socket "
                               "closed or reconnected?)")
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
        self._end_view()
        self._publish()
        return 0

    cdef int _end_view(self) except -1:
        # The block's own view ends here. A buffer exported from it (numpy's, say) makes
        # release() fail with BufferError: the reservation must still be published or
        # dropped, or the socket would wait for it until reconnected; what keeps that
        # buffer's memory valid is the backend's business (see the class docstring). The
        # view is dropped either way: one whose release failed lives on only as long as
        # what holds it (a reservation that exports its view itself would otherwise
        # form a cycle with it, kept until the garbage collector ran).
        view, self.view = self.view, None
        try:
            view.release()
        except BufferError:
            pass
        return 0

    def abort(self) -> None:
        """Drops the reservation; subscribers never see it."""
        if self.done:
            return
        self.done = True
        self._end_view()
        self._drop()

    cpdef _publish(self):
        """Publishes what was written (the view is released by now) and lets the socket
        take another reservation."""
        raise NotImplementedError

    cpdef _drop(self):
        """Forgets the room without publishing it and lets the socket take another
        reservation."""
        raise NotImplementedError
