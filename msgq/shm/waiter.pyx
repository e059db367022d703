# Part of the msgq.shm_backend extension module: msgq/shm_backend.pyx includes this
# file (one module, one file per concept); the cimports, imports and constants are
# that file's. asyncio: one waiter thread per event loop.

#: How long an awaiting task looks for data itself before the waiter thread takes over.
cdef int64_t ASYNC_SPIN_NS = 20 * 1000

#: Seconds a loop's waiter thread stays after its last waiter is gone before it ends.
WAITER_LINGER_S = 1.0
#: The longest one sleep of a waiter thread (it looks at its loop and set again after).
cdef int64_t WAITER_SLICE_NS = 100 * 1000 * 1000

_waiters = weakref.WeakKeyDictionary()


cdef class _LoopWaiter:
    """Sleeps on the queues the tasks of one event loop await, in one thread, and wakes
    the loop (``call_soon_threadsafe``) for those that got data. The thread starts with
    the first waiter and ends ``WAITER_LINGER_S`` after the last one, or when the loop
    is closed or collected: nothing polls, and no thread outlives its use."""
    cdef object loop_ref
    cdef object lock
    cdef dict waiting  # id(sock) -> [sock, [futures]]
    cdef object thread
    cdef msgq_wake *wake

    def __cinit__(self, loop):
        self.loop_ref = weakref.ref(loop)
        self.lock = threading.Lock()
        self.waiting = {}
        self.thread = None
        self.wake = msgq_wake_new()
        if self.wake == NULL:
            raise MemoryError()

    def __dealloc__(self):
        msgq_wake_free(self.wake)  # the thread holds self while it runs

    def add(self, list socks, fut) -> None:
        """``fut`` is resolved once any of ``socks`` may have data."""
        cdef SubSocket sock
        with self.lock:
            for sock in socks:
                entry = self.waiting.get(id(sock))
                if entry is None:
                    self.waiting[id(sock)] = [sock, [fut]]
                    sock.async_waiter = self
                else:
                    entry[1].append(fut)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="msgq-async-waiter",
                                               daemon=True)
                self.thread.start()
        msgq_wake_raise(self.wake)

    def forget(self, list socks, fut) -> None:
        """``fut`` no longer waits (resolved, timed out or cancelled)."""
        cdef SubSocket sock
        with self.lock:
            for sock in socks:
                entry = self.waiting.get(id(sock))
                if entry is None:
                    continue
                try:
                    entry[1].remove(fut)
                except ValueError:
                    pass
                if not entry[1]:
                    del self.waiting[id(sock)]
                    sock.async_waiter = None

    def drop(self, SubSocket sock) -> None:
        """``sock`` is being closed: its waiters fail, the thread lets go of its ring."""
        with self.lock:
            entry = self.waiting.pop(id(sock), None)
            sock.async_waiter = None
        msgq_wake_raise(self.wake)
        if entry is not None:
            loop = self.loop_ref()
            error = IpcError(f"endpoint {sock.endpoint!r}: the socket was closed while a "
                             "task awaited it")
            if loop is not None and not loop.is_closed():
                for fut in entry[1]:
                    loop.call_soon_threadsafe(_fail, fut, error)

    def _run(self) -> None:
        cdef msgq_sub **subs = NULL
        cdef uint8_t *ready = NULL
        cdef int capacity = 0
        cdef int n, i, r
        cdef uint32_t seen
        cdef SubSocket sock
        idle_since = None
        try:
            while True:
                loop = self.loop_ref()
                if loop is None or loop.is_closed():
                    with self.lock:
                        self.thread = None
                    return
                with self.lock:
                    seen = msgq_wake_seen(self.wake)
                    entries = list(self.waiting.values())
                    if not entries:
                        now = time.monotonic()
                        if idle_since is None:
                            idle_since = now
                        elif now - idle_since >= WAITER_LINGER_S:
                            self.thread = None
                            return
                    else:
                        idle_since = None
                    n = len(entries)
                    if n > capacity:
                        PyMem_Free(subs)
                        PyMem_Free(ready)
                        capacity = max(8, 2 * n)
                        subs = <msgq_sub **>PyMem_Malloc(capacity * sizeof(void *))
                        ready = <uint8_t *>PyMem_Malloc(capacity)
                        if subs == NULL or ready == NULL:
                            raise MemoryError()
                    for i in range(n):
                        sock = entries[i][0]
                        subs[i] = sock.sub
                        sock.async_busy += 1
                del loop
                with nogil:
                    r = msgq_sub_poll_until(subs, n, WAITER_SLICE_NS, ready, self.wake, seen)
                woken = []
                with self.lock:
                    for i in range(n):
                        sock = entries[i][0]
                        sock.async_busy -= 1
                        if r > 0 and ready[i]:
                            entry = self.waiting.pop(id(sock), None)
                            if entry is not None:
                                sock.async_waiter = None
                                woken.extend(entry[1])
                if woken:
                    loop = self.loop_ref()
                    if loop is None:
                        continue
                    try:
                        loop.call_soon_threadsafe(_resolve, woken)
                    except RuntimeError:  # the loop was closed meanwhile
                        pass
                    del loop
        except BaseException:
            # Whatever went wrong here, no task may wait for a thread that is gone: every
            # waiter is woken (it looks again, and a new thread starts if it must wait).
            with self.lock:
                self.thread = None
                woken = [fut for entry in self.waiting.values() for fut in entry[1]]
            loop = self.loop_ref()
            if loop is not None and not loop.is_closed() and woken:
                loop.call_soon_threadsafe(_resolve, woken)
            raise
        finally:
            PyMem_Free(subs)
            PyMem_Free(ready)


def _resolve(list futures) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


def _fail(fut, error) -> None:
    if not fut.done():
        fut.set_exception(error)


cdef _LoopWaiter _waiter_of(loop):
    waiter = _waiters.get(loop)
    if waiter is None:
        waiter = _waiters[loop] = _LoopWaiter(loop)
    return waiter


async def wait_readable_async(loop, list socks, deadline=None) -> None:
    """Returns once any of ``socks`` (connected SubSockets) may have data, or at
    ``deadline`` (the loop's clock; None: no limit). Cancellable."""
    cdef _LoopWaiter waiter = _waiter_of(loop)
    for sock in socks:
        if (<SubSocket>sock).sub == NULL:
            raise IpcError("socket is not connected; call connect() first")
    fut = loop.create_future()
    waiter.add(socks, fut)
    try:
        await await_until(loop, fut, deadline)
    finally:
        waiter.forget(socks, fut)
