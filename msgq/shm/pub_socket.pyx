# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. The publisher.

cdef class PubSocket:
    """The single publisher of an endpoint."""
    cdef msgq_pub *pub  # NULL while not connected
    cdef object reservation  # the open Reservation, if any
    cdef int busy  # calls in progress without the GIL (other threads may run)
    cdef int exports  # buffers exported by this socket's reservations (the ring is in them)
    cdef bint held  # the handle holds its mappings (msgq.h O8) for those buffers
    cdef readonly object endpoint

    def __cinit__(self):
        self.pub = NULL
        self.reservation = None
        self.busy = 0
        self.exports = 0
        self.held = False
        self.endpoint = None

    def __dealloc__(self):
        # No buffer of a reservation outlives its socket (each holds the socket through
        # its reservation) but in a garbage cycle freed along with it: nothing left can
        # use the mappings kept for them (O8), so they go with the socket.
        if self.held:
            msgq_pub_hold_mappings(self.pub, 0)
        self._disconnect()

    cdef void _disconnect(self) noexcept:
        # msgq_pub_close gives up ownership only in the process that connected (a copy
        # inherited through fork() leaves it to its parent).
        # A held handle (a buffer of a reservation still alive: only a garbage-collected
        # cycle gets here then) leaves its mappings mapped for the life of the process.
        msgq_pub_close(self.pub)
        self.pub = NULL
        self.held = False

    cdef void _hold(self) noexcept:
        """A buffer of a reservation is out: from now on a queue file the handle gives up
        (following a replaced one inside send or reserve, msgq.h O6) stays mapped under it
        (O8) until the last such buffer is released (_let_go)."""
        if not self.held and self.pub != NULL:
            msgq_pub_hold_mappings(self.pub, 1)
            self.held = True

    cdef void _let_go(self) noexcept:
        """No buffer of a reservation is out any more: the queues kept for them are
        unmapped, unless another thread is inside a send without the GIL (it may be
        following the file right now): then that send lets go when it returns."""
        if self.held and not self.busy:
            msgq_pub_hold_mappings(self.pub, 0)
            self.held = False

    cdef int _check_idle(self) except -1:
        """Before the mapping goes away: no other thread may be inside a call, an open
        reservation is abandoned, and no buffer of a reservation may be alive (it would
        point into unmapped memory)."""
        if self.busy:
            raise IpcError(f"endpoint {self.endpoint!r}: another thread is sending on this "
                           "socket; close or reconnect it when that call has returned")
        if self.reservation is not None:
            self.reservation.abort()
        if self.exports:
            raise IpcError(f"endpoint {self.endpoint!r}: a buffer of a reservation on this "
                           "socket is still in use (a slice, memoryview or numpy array "
                           "taken from a reserve() block); release it before closing or "
                           "reconnecting")
        return 0

    cdef int _check_not_sending(self) except -1:
        """Before a send or reserve: no other thread is inside a send without the GIL (the
        two would share the handle's one reservation, and a replaced queue file followed
        here, O6, would unmap the ring under its copy)."""
        if self.busy:
            raise IpcError(f"endpoint {self.endpoint!r}: another thread is sending on this "
                           "socket; send or reserve again when that call has returned")
        return 0

    cdef int _fail(self, int r) except -1:
        """Raises the error of a call; a handle that lost its queue (a failed follow of a
        replaced file, msgq.h O6) is dropped first, so the socket reads as closed."""
        if self.pub != NULL and not msgq_pub_is_open(self.pub):
            self._disconnect()
        _raise(r, self.endpoint)
        return -1

    def connect(self, context, endpoint, segment_size=0, checksum=None) -> None:
        """Opens (or creates) the queue of ``endpoint`` and becomes its publisher.

        A previous publisher of the endpoint loses it: its next ``send`` raises
        ``MultiplePublishersError``. Subscribers already connected stay connected.
        ``segment_size`` 0 means the existing size, or the default for a new queue.
        ``checksum`` (None: the MSGQ_CHECKSUM environment variable) makes a queue this
        call creates carry a CRC32C of every message; an unused queue without it is
        replaced, one in use keeps what it has (see the ``checksum`` property).
        """
        cdef msgq_pub *opened = NULL
        self._check_idle()
        _open_queue(endpoint, segment_size, _open_flags(checksum), &opened)
        try:
            # The open ran without the GIL: another thread may have started a send or a
            # reservation on the old handle meanwhile (see SubSocket.connect).
            self._check_idle()
        except BaseException:
            msgq_pub_close(opened)
            raise
        self._disconnect()
        self.pub = opened
        self.endpoint = endpoint

    cdef int _check_connected(self) except -1:
        if self.pub == NULL:
            raise IpcError("socket is not connected; call connect() first")
        return 0

    cdef int _too_large(self, Py_ssize_t n) except -1:
        raise ValueError(
            f"endpoint {self.endpoint!r}: message of {n} bytes exceeds the "
            f"largest this queue takes ({self.max_message_size} bytes, a "
            f"third of segment size {self.segment_size}); use a larger "
            "segment_size")

    def send(self, data) -> int:
        """Publishes ``data`` (bytes or any contiguous bytes-like object) without an
        intermediate copy. Returns the number of bytes sent."""
        cdef Py_buffer view
        cdef const char *ptr
        cdef Py_ssize_t n
        cdef int r
        cdef bint release = False
        self._check_connected()
        self._check_not_sending()
        if self.reservation is not None:
            raise RuntimeError("a reservation is open on this socket; commit it first")
        if type(data) is bytes:
            ptr = PyBytes_AS_STRING(data)
            n = len(<bytes>data)
        else:
            if isinstance(data, str):
                raise TypeError("send() takes bytes-like data, not str; encode it first")
            try:
                PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
            except (BufferError, ValueError) as e:
                raise TypeError(f"send() needs a contiguous bytes-like object: {e}") from None
            except TypeError:
                raise TypeError(
                    f"send() takes a bytes-like object, not {type(data).__name__}") from None
            ptr = <const char *>view.buf
            n = view.len
            release = True
        try:
            if n > 0xFFFFFFFF:
                _raise(MSGQ_ETOOLARGE, self.endpoint)
            while True:
                # A replaced queue file is followed inside msgq_pub_send (msgq.h O6).
                if n >= NOGIL_COPY_BYTES:
                    self.busy += 1
                    with nogil:
                        r = msgq_pub_send(self.pub, ptr, <size_t>n)
                    self.busy -= 1
                    if self.held and not self.exports:
                        self._let_go()  # the last buffer went while this call ran
                else:
                    r = msgq_pub_send(self.pub, ptr, <size_t>n)
                if r != -EAGAIN:  # following waited 50 ms for a file lock: check signals
                    break
                PyErr_CheckSignals()
            if r < 0:
                if r == MSGQ_ETOOLARGE:
                    self._too_large(n)
                self._fail(r)
        finally:
            if release:
                PyBuffer_Release(&view)
        return n

    def reserve(self, Py_ssize_t size) -> Reservation:
        """Reserves ``size`` bytes in the ring for a message written in place (zero
        copies): ``with pub.reserve(n) as buf: buf[:n] = ...``."""
        cdef void *dst
        cdef int r
        self._check_connected()
        self._check_not_sending()
        if self.reservation is not None:
            raise RuntimeError("a reservation is already open on this socket")
        if size < 0:
            raise ValueError("size must be >= 0")
        while True:
            r = msgq_pub_reserve(self.pub, <size_t>size, &dst)
            if r != -EAGAIN:
                break
            PyErr_CheckSignals()
        if r < 0:
            if r == MSGQ_ETOOLARGE:
                raise ValueError(
                    f"endpoint {self.endpoint!r}: message of {size} bytes exceeds the largest "
                    f"this queue takes ({self.max_message_size} bytes)")
            self._fail(r)
        cdef RingReservation res = RingReservation.__new__(RingReservation)
        res.pub = self
        res.data = <char *>dst
        res.size = size
        res.done = False
        res.view = PyMemoryView_FromObject(res)  # an export of res: counted in self.exports
        self.reservation = res
        return res

    def all_readers_updated(self) -> bool:
        """True when every live subscriber, and at least one, has read everything sent so
        far (upstream's meaning: False while no subscriber is connected)."""
        self._check_connected()
        return msgq_pub_all_readers_updated(self.pub) == 1

    def wait_until_read(self, timeout=None, double poll_interval=0.001) -> bool:
        """Blocks until ``all_readers_updated()`` (True) or until ``timeout`` seconds
        passed (False); ``timeout`` None waits forever. ``poll_interval`` in seconds."""
        import time
        self._check_connected()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not msgq_pub_all_readers_updated(self.pub):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_interval)
            self._check_connected()  # another thread may have closed it meanwhile
        return True

    def wait_for_readers(self, double timeout=1.0, double interval=0.001) -> None:
        """Upstream's wait: returns once at least one subscriber is connected and every
        subscriber has read everything; raises TimeoutError after ``timeout`` seconds.
        ``interval``: seconds between checks. :meth:`wait_until_read` returns a bool
        instead."""
        if not self.wait_until_read(timeout, interval):
            raise readers_timeout(self.endpoint, timeout, self.num_readers)

    @property
    def num_readers(self) -> int:
        """Subscribers currently connected (live processes only)."""
        self._check_connected()
        return msgq_pub_num_readers(self.pub)

    @property
    def segment_size(self) -> int:
        self._check_connected()
        return msgq_pub_segment_size(self.pub)

    @property
    def max_message_size(self) -> int:
        self._check_connected()
        return msgq_pub_max_message_size(self.pub)

    @property
    def checksum(self) -> bool:
        """Whether the queue carries a CRC32C of every message (chosen at creation)."""
        self._check_connected()
        return bool(msgq_pub_checksum(self.pub))

    @property
    def reclaimed_slots(self) -> int:
        """Reader slots of dead subscribers this publisher gave back (its sweeps)."""
        self._check_connected()
        return msgq_pub_reclaimed_slots(self.pub)

    @property
    def early_wraps(self) -> int:
        """Wraps to the ring's start taken early because every subscriber had read
        everything (the ring's start is reused while cached; docs/ring.md)."""
        self._check_connected()
        return msgq_pub_early_wraps(self.pub)

    def close(self) -> None:
        """Releases the queue (abandoning an open reservation); the socket can connect
        again. Raises IpcError while another thread is inside a call on it, or while a
        buffer taken from a reservation (a slice, a numpy array) is still alive."""
        self._check_idle()
        self._disconnect()
