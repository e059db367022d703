# Declarations of the C core (msgq/src/os_wait.h) for the Cython binding; nothing but
# the C API lives here (msgq/shm_backend.pyx cimports it).

from libc.stdint cimport int64_t


cdef extern from "src/os_wait.h" nogil:
    int64_t os_monotonic_ns()
    int os_process_alive(int pid)
