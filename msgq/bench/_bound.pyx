# cython: language_level=3
"""The cache bound of a stream of large messages between two CPUs (msgq/bench/src/
cache_bound.h): a model publisher and subscriber in C, each copying every message once,
over a few warm slots, with no protocol. ``python -m msgq.bench`` reports its copying
rows as a fraction of it: no transport that makes those two copies can beat it.

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

cdef unsigned _SLOTS = 4, _WINDOW = 2
#: The model's layout: four slots, the publisher at most two messages ahead.
SLOTS = _SLOTS
WINDOW = _WINDOW


def cache_bound(Py_ssize_t size, double seconds=0.1, int rounds=5):
    """Messages per second of the model for ``size``-byte messages (the best of
    ``rounds`` runs of about ``seconds`` each, after an untimed one), its publisher and
    subscriber on the first two CPUs this process may use. ValueError without two CPUs
    or with a size < 1; MemoryError when the slots cannot be allocated."""
    if size < 1:
        raise ValueError(f"size must be >= 1, not {size}")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise ValueError("the cache bound needs two CPUs (one per copy)")
    cdef int cpu_pub = cpus[0], cpu_sub = cpus[1]
    cdef msgq_bound *bound = msgq_bound_open(<size_t>size, _SLOTS)
    if bound == NULL:
        raise MemoryError(f"{SLOTS} slots of {size} bytes")
    cdef double rate, best = 0.0
    cdef long messages = 64
    try:
        with nogil:
            rate = msgq_bound_rate(bound, _WINDOW, messages, cpu_pub, cpu_sub, NULL, NULL)
        if rate <= 0:
            raise OSError("the model's threads could not run")
        # as many messages as take about `seconds` at the untimed run's rate
        messages = max(64, <long>(rate * seconds))
        for _ in range(rounds):
            with nogil:
                rate = msgq_bound_rate(bound, _WINDOW, messages, cpu_pub, cpu_sub, NULL,
                                       NULL)
            if rate <= 0:
                raise OSError("the model's threads could not run")
            best = max(best, rate)
    finally:
        msgq_bound_close(bound)
    return best
