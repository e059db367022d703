# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The shared-memory (msgq) backend: Context, PubSocket, SubSocket and Poller over the C
ring in ``msgq/src``. Thin by design: the protocol lives in C, the API shape in Python
(``msgq/__init__.py``); this module only converts arguments, errors and the GIL.

One extension module made of one file per concept (the way uvloop splits its loop):
this file holds the cimports, imports and constants and includes the files of
``msgq/shm/``; the C declarations are the ``.pxd`` files of ``msgq/cdefs/``
(docs/layout.md lists both)."""

from cpython.buffer cimport (
    PyBUF_SIMPLE,
    PyBUF_WRITABLE,
    PyBuffer_FillInfo,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.memoryview cimport PyMemoryView_FromObject
from libc.errno cimport EAGAIN, EBUSY, EINTR, ENOSPC, EPERM
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from msgq.cdefs.crc32c cimport *
from msgq.cdefs.msgq cimport *
from msgq.cdefs.msgq_errors cimport *
from msgq.cdefs.msgq_ring cimport *
from msgq.cdefs.os_wait cimport *
from msgq.cdefs.queue_file cimport *
from msgq._reservation cimport Reservation

import os
import threading
import time
import weakref
from functools import partial

from msgq.aio import await_until, next_message, running_loop, wait_for_result
from msgq.errors import IpcError, MessageOverwritten, MultiplePublishersError, readers_timeout

# The backend-neutral Reservation base (msgq/_reservation.pyx), kept importable from here.
globals()["Reservation"] = Reservation

#: Size of a queue's data ring when none is asked for (bytes).
DEFAULT_SEGMENT_SIZE = MSGQ_DEFAULT_SEGMENT_SIZE
MIN_SEGMENT_SIZE = MSGQ_MIN_SEGMENT_SIZE
MAX_SEGMENT_SIZE = MSGQ_MAX_SEGMENT_SIZE
READER_SLOTS = MSGQ_READER_SLOTS
LAYOUT_VERSION = MSGQ_LAYOUT_VERSION
#: Queue files are named QUEUE_FILE_PREFIX + endpoint in the queue folder.
QUEUE_FILE_PREFIX = MSGQ_QUEUE_FILE_PREFIX.decode("ascii")
#: A message is in every subscriber's queue when ``send`` returns (the backend protocol's
#: flag; see msgq/sockets.py).
QUEUED_ON_SEND = True

# Longest time a blocking call stays in C without checking for Python signals, so that
# Ctrl-C is answered promptly however long the timeout.
cdef int64_t SIGNAL_CHECK_NS = 50 * 1000 * 1000
# Copies at least this large run without the GIL.
cdef Py_ssize_t NOGIL_COPY_BYTES = 64 * 1024


cdef class Context:
    """Process-wide handle kept for API compatibility; the shm backend needs no state."""

    def term(self) -> None:
        pass


include "shm/errors.pyx"
include "shm/queue_admin.pyx"
include "shm/queue_open.pyx"
include "shm/reservation.pyx"
include "shm/pub_socket.pyx"
include "shm/sub_socket.pyx"
include "shm/message_view.pyx"
include "shm/waiter.pyx"
include "shm/poller.pyx"
