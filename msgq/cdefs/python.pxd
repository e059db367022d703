# Declarations of CPython's C API that Cython's own cpython/*.pxd files leave out, for
# the Cython binding (msgq/shm_backend.pyx cimports them).

cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_WRITE
