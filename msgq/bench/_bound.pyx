# cython: language_level=3
"""The cache bounds of a stream of large messages between two CPUs (msgq/bench/src/
cache_bound.h): a model publisher and subscriber in C with no protocol, over a few warm
slots. In the copy model each copies every message once; in the one-copy model the
subscriber reads each message where it lies. ``python -m msgq.bench`` reports its copying
rows as a fraction of the first and its view rows as a fraction of the second: a
transport that copies as much beats them only by writing a message into the buffer of the
message it has just published, once every reader has released that one.

Layer: the benchmarks (msgq.bench), beside the transports they measure.
"""

import os

cdef extern from "cache_bound.h":
    ctypedef struct msgq_bound:
        pass
    ctypedef void (*msgq_bound_copy)(void *dst, const void *src, size_t n)
    msgq_bound *msgq_bound_open(size_t size, unsigned slots)
    void msgq_bound_close(msgq_bound *bound)
    double msgq_bound_rate(msgq_bound *bound, unsigned window, long messages, int cpu_pub,
                           int cpu_sub, msgq_bound_copy pub_copy,
                           msgq_bound_copy sub_copy) nogil
    double msgq_bound_fanout_rate(msgq_bound *bound, unsigned subscribers, unsigned window,
                                  long messages, int cpu_pub, int cpu_other,
                                  msgq_bound_copy pub_copy, msgq_bound_copy sub_copy) nogil
    unsigned MSGQ_BOUND_MAX_SUBSCRIBERS
    void msgq_bound_read_ends(void *dst, const void *src, size_t n)

cdef unsigned _SLOTS = 4, _WINDOW = 2
#: The copy model's layout: four slots, the publisher at most two messages ahead.
SLOTS = _SLOTS
WINDOW = _WINDOW
cdef unsigned _VIEW_SLOTS = 2, _VIEW_WINDOW = 1
#: The one-copy model's layout: two slots, the publisher writing one while the subscriber
#: may still hold the other (never into the message it has just published).
VIEW_SLOTS = _VIEW_SLOTS
VIEW_WINDOW = _VIEW_WINDOW


def cache_bound(Py_ssize_t size, double seconds=0.1, int rounds=5):
    """Messages per second of the copy model for ``size``-byte messages (the best of
    ``rounds`` runs of about ``seconds`` each, after an untimed one), its publisher and
    subscriber on the first two CPUs this process may use. ValueError without two CPUs
    or with a size < 1; MemoryError when the slots cannot be allocated."""
    return _best_rate(size, seconds, rounds, _SLOTS, _WINDOW, False)


def fanout_bound(Py_ssize_t size, int subscribers, double seconds=0.1, int rounds=5):
    """Messages per second of the copy model with ``subscribers`` subscriber threads, each
    copying every message out into a freshly allocated buffer: subscribers + 1 copies of
    each message on the first two CPUs this process may use (the publisher on the first,
    the subscribers alternating from the second; with more threads than CPUs every wait
    yields the CPU). The same slots and window as :func:`cache_bound`, which is this
    model with one subscriber. ValueError also for subscribers outside 1..16."""
    if subscribers < 1 or subscribers > <int>MSGQ_BOUND_MAX_SUBSCRIBERS:
        raise ValueError(f"subscribers must be 1..{MSGQ_BOUND_MAX_SUBSCRIBERS}, "
                         f"not {subscribers}")
    return _best_rate(size, seconds, rounds, _SLOTS, _WINDOW, False, subscribers)


def view_bound(Py_ssize_t size, double seconds=0.1, int rounds=5):
    """Messages per second of the one-copy model: the publisher copies each message into
    one of two warm slots, never the one it has just published (a reader may still hold
    it), and the subscriber reads only the message's first and last bytes in place. A
    transport whose publisher copies each message once beats it only when its readers
    release each message before the next send (then the publisher may rewrite the buffer
    it has just published, still in its cache). Same arguments and errors as
    :func:`cache_bound`."""
    return _best_rate(size, seconds, rounds, _VIEW_SLOTS, _VIEW_WINDOW, True)


cdef double _best_rate(Py_ssize_t size, double seconds, int rounds, unsigned slots,
                       unsigned window, bint view, unsigned subscribers=1) except -1:
    if size < 1:
        raise ValueError(f"size must be >= 1, not {size}")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise ValueError("the cache bound needs two CPUs (one per copy)")
    cdef int cpu_pub = cpus[0], cpu_sub = cpus[1]
    cdef msgq_bound_copy sub_copy = NULL  # memcpy into a new buffer
    if view:
        sub_copy = msgq_bound_read_ends  # the first and last bytes, in place
    cdef msgq_bound *bound = msgq_bound_open(<size_t>size, slots)
    if bound == NULL:
        raise MemoryError(f"{slots} slots of {size} bytes")
    cdef double rate, best = 0.0
    cdef long messages = 64
    try:
        with nogil:
            rate = msgq_bound_fanout_rate(bound, subscribers, window, messages, cpu_pub,
                                          cpu_sub, NULL, sub_copy)
        if rate <= 0:
            raise OSError("the model's threads could not run")
        # as many messages as take about `seconds` at the untimed run's rate
        messages = max(64, <long>(rate * seconds))
        for _ in range(rounds):
            with nogil:
                rate = msgq_bound_fanout_rate(bound, subscribers, window, messages,
                                              cpu_pub, cpu_sub, NULL, sub_copy)
            if rate <= 0:
                raise OSError("the model's threads could not run")
            best = max(best, rate)
    finally:
        msgq_bound_close(bound)
    return best
