# Declarations of the C core (msgq/src/msgq_errors.h) for the Cython binding; nothing but
# the C API lives here (msgq/shm_backend.pyx cimports it).

cdef extern from "src/msgq_errors.h" nogil:
    enum:
        MSGQ_EBADNAME
        MSGQ_EBADMAGIC
        MSGQ_EVERSION
        MSGQ_EGEOMETRY
        MSGQ_ENOSLOT
        MSGQ_ENOTOWNER
        MSGQ_ETOOLARGE
        MSGQ_EBADSIZE
        MSGQ_ESIZEMISMATCH
        MSGQ_ENORESERVE
        MSGQ_EBUFFER
        MSGQ_ESUPERSEDED
        MSGQ_ECHECKSUM
        MSGQ_ECLOSED
    const char *msgq_strerror(int code)
