# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. The Poller.

cdef class Poller:
    """Waits on many SubSockets at once (futex_waitv on Linux)."""
    cdef list sockets
    cdef msgq_sub **subs
    cdef uint8_t *ready
    cdef int capacity
    cdef int polling  # poll calls in progress (their handles are in subs, used without the GIL)

    def __cinit__(self):
        self.sockets = []
        self.subs = NULL
        self.ready = NULL
        self.capacity = 0
        self.polling = 0

    def __dealloc__(self):
        PyMem_Free(self.subs)
        PyMem_Free(self.ready)

    def registerSocket(self, SubSocket socket) -> None:
        """Adds ``socket``; registering a socket twice has no further effect."""
        cdef SubSocket sock = socket  # upstream's parameter name, for keyword callers
        if sock.sub == NULL:
            raise IpcError("register a connected SubSocket")
        for s in self.sockets:
            if s is sock:
                return
        cdef int n = len(self.sockets) + 1
        if self.polling:  # growing would free the arrays a poll is using
            raise IpcError("another thread is polling this Poller; register sockets "
                           "before or after its poll")
        if n > self.capacity:
            new_cap = max(8, self.capacity * 2)
            subs = <msgq_sub **>PyMem_Malloc(new_cap * sizeof(msgq_sub *))
            ready = <uint8_t *>PyMem_Malloc(new_cap * sizeof(uint8_t))
            if subs == NULL or ready == NULL:
                PyMem_Free(subs)
                PyMem_Free(ready)
                raise MemoryError()
            PyMem_Free(self.subs)
            PyMem_Free(self.ready)
            self.subs = subs
            self.ready = ready
            self.capacity = new_cap
        self.sockets.append(sock)

    def poll(self, timeout) -> list:
        """Sockets with a message waiting, after at most ``timeout`` ms (negative: no
        limit). Empty list on timeout."""
        cdef int n = len(self.sockets)
        cdef int64_t deadline = -1
        cdef int64_t now, slice_ns
        cdef int r
        cdef int i
        if n == 0:
            return []
        # The handles are looked up at every poll: a socket that reconnected since it
        # was registered has a new one.
        for i in range(n):
            s = self.sockets[i]
            if (<SubSocket>s).sub == NULL:
                raise IpcError("a socket registered with this Poller was closed")
            self.subs[i] = (<SubSocket>s).sub
        if timeout is not None and timeout >= 0:
            deadline = msgq_now_ns() + <int64_t>(timeout * 1000000)
        while True:
            slice_ns = SIGNAL_CHECK_NS
            if deadline >= 0:
                now = msgq_now_ns()
                slice_ns = deadline - now
                if slice_ns < 0:
                    slice_ns = 0
                if slice_ns > SIGNAL_CHECK_NS:
                    slice_ns = SIGNAL_CHECK_NS
            for i in range(n):
                (<SubSocket>self.sockets[i]).busy += 1
            self.polling += 1
            with nogil:
                r = msgq_sub_poll(self.subs, n, slice_ns, self.ready)
            self.polling -= 1
            for i in range(n):
                (<SubSocket>self.sockets[i]).busy -= 1
            if r > 0:
                return [self.sockets[i] for i in range(n) if self.ready[i]]
            if r < 0 and r != -EINTR:
                _raise(r, "poller")
            PyErr_CheckSignals()
            if deadline >= 0 and msgq_now_ns() >= deadline:
                return []

    async def poll_async(self, timeout=None) -> list:
        """``await poller.poll_async(timeout)``: the registered sockets with a message
        waiting, after at most ``timeout`` ms (None or negative: no limit); empty on
        timeout. The task sleeps meanwhile (see ``SubSocket.receive_async``)."""
        loop = running_loop()
        deadline = None if timeout is None or timeout < 0 else loop.time() + timeout / 1000
        ready = self.poll(0)
        if not ready and timeout != 0:
            ready = self.poll(ASYNC_SPIN_NS / 1e6)  # as SubSocket._await_briefly
        ready = await wait_for_result(
            loop, lambda: self.poll(0) or None,
            partial(wait_readable_async, loop, list(self.sockets)), deadline, ready or None)
        return ready or []
