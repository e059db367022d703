/* The cache bound of a stream of large messages from one CPU to another: what the memory
 * system lets a publisher and a subscriber reach when each message is copied twice, as a
 * Python publisher and subscriber copy it (the publisher's bytes in; the subscriber's out
 * into a freshly allocated buffer, as receive() makes a new bytes object), with no
 * protocol at all. A model, not a transport: the slots are plain memory, the handover two
 * counters. With few slots (4, a window of 2) every byte stays cache-warm, so no design
 * that makes those two copies can be faster; `python -m msgq.bench` reports its copying
 * rows as a fraction of it, and tests/c/bench_large_messages.c compares layouts with
 * it. */
#ifndef MSGQ_BENCH_CACHE_BOUND_H
#define MSGQ_BENCH_CACHE_BOUND_H

#include <stddef.h>

typedef void (*msgq_bound_copy)(void *dst, const void *src, size_t n);

typedef struct msgq_bound msgq_bound;

/* Slots for messages of `size` bytes (each 64-byte aligned) and the publisher's source;
 * NULL when out of memory. */
msgq_bound *msgq_bound_open(size_t size, unsigned slots);
void msgq_bound_close(msgq_bound *bound);

/* Messages per second of one run of `messages`: the publisher on CPU `cpu_pub` copies
 * the source into slot i % slots, at most `window` (< slots) messages ahead of the
 * subscriber on CPU `cpu_sub`, which copies each out. NULL copies are memcpy. Negative
 * when a thread cannot start or the arguments are out of range. */
double msgq_bound_rate(msgq_bound *bound, unsigned window, long messages, int cpu_pub,
                       int cpu_sub, msgq_bound_copy pub_copy, msgq_bound_copy sub_copy);

/* The fan-out model: as msgq_bound_rate, with `subscribers` (1..MSGQ_BOUND_MAX_SUBSCRIBERS)
 * subscriber threads that each copy every message out, and the publisher at most
 * `window` messages ahead of the slowest. So each message is copied subscribers + 1
 * times on two CPUs: the publisher on `cpu_pub`, the first subscriber on `cpu_other`,
 * the next ones alternating between the two. With more threads than the two CPUs the
 * waits yield the CPU (sched_yield) instead of spinning, as a process that waits must.
 * One subscriber is msgq_bound_rate. */
#define MSGQ_BOUND_MAX_SUBSCRIBERS 16u
double msgq_bound_fanout_rate(msgq_bound *bound, unsigned subscribers, unsigned window,
                              long messages, int cpu_pub, int cpu_other,
                              msgq_bound_copy pub_copy, msgq_bound_copy sub_copy);

/* The one-copy model's subscriber copy: reads the message's first and last bytes in
 * place (into dst's first and last), as the view rows of `python -m msgq.bench` check
 * their sequence numbers. With 2 slots and a window of 1 the model is the one-copy
 * bound: the publisher copies each message into the slot it did not just publish. */
void msgq_bound_read_ends(void *dst, const void *src, size_t n);
/* The helpers of the model's threads, for other benchmarks of the same kind: pin the
 * calling thread to `cpu`; a spin-wait hint; CLOCK_MONOTONIC in seconds. */
void msgq_bound_pin(int cpu);
void msgq_bound_pause(void);
double msgq_bound_now_s(void);

#endif
