# The Reservation base, declared for the backends that cimport it (msgq.shm_backend's
# RingReservation); msgq/_reservation.pyx has the protocol, the ZMQ backend subclasses
# it in Python.

cdef class Reservation:
    cdef object view
    cdef bint done

    cdef int _commit(self) except -1
    cdef int _end_view(self) except -1
    cpdef _publish(self)
    cpdef _drop(self)
