/* The cache bound of a stream of large messages (cache_bound.h). Linux: the two threads
 * are pinned with sched_setaffinity. */
#define _GNU_SOURCE
#include "cache_bound.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* A subscriber's count of messages copied out, on a line of its own. */
struct bound_progress {
  _Alignas(64) _Atomic long consumed;
};

struct msgq_bound {
  size_t size, stride;
  unsigned slots;
  uint8_t *slot_memory;
  uint8_t *source;
  /* one run's parameters and its counters, each on a line of its own */
  unsigned window;
  unsigned subscribers;
  long messages;
  int cpu[2];
  int yield; /* more threads than CPUs: waits give the CPU away */
  msgq_bound_copy copy[2];
  _Atomic int failed;
  _Alignas(64) _Atomic long published;
  struct bound_progress progress[MSGQ_BOUND_MAX_SUBSCRIBERS];
};

/* The argument of one subscriber thread. */
struct bound_reader {
  msgq_bound *bound;
  unsigned index;
};

static void copy_memcpy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }

void msgq_bound_read_ends(void *dst, const void *src, size_t n) {
  ((uint8_t *)dst)[0] = ((const uint8_t *)src)[0];
  ((uint8_t *)dst)[n - 1] = ((const uint8_t *)src)[n - 1];
}

void msgq_bound_pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

void msgq_bound_pause(void) {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

static uint8_t *slot(const msgq_bound *b, long i) {
  return b->slot_memory + (size_t)(i % b->slots) * b->stride;
}

msgq_bound *msgq_bound_open(size_t size, unsigned slots) {
  if (size == 0 || slots < 2) return NULL;
  msgq_bound *b = aligned_alloc(64, sizeof *b);
  if (!b) return NULL;
  memset(b, 0, sizeof *b);
  b->size = size;
  b->stride = (size + 127u) / 64u * 64u; /* a line apart: no slot shares one */
  b->slots = slots;
  b->slot_memory = aligned_alloc(4096, (b->stride * slots + 4095u) / 4096u * 4096u);
  b->source = aligned_alloc(64, (size + 63u) / 64u * 64u);
  if (!b->slot_memory || !b->source) {
    msgq_bound_close(b);
    return NULL;
  }
  memset(b->slot_memory, 0, b->stride * slots); /* pages faulted in before any run */
  for (size_t i = 0; i < size; i++) b->source[i] = (uint8_t)(i * 13u);
  return b;
}

void msgq_bound_close(msgq_bound *b) {
  if (!b) return;
  free(b->slot_memory);
  free(b->source);
  free(b);
}

static void bound_wait(const msgq_bound *b) {
  if (b->yield)
    sched_yield();
  else
    msgq_bound_pause();
}

/* The slowest subscriber's count (acquire: its copies out of the slots come before). */
static long least_consumed(msgq_bound *b) {
  long least = atomic_load_explicit(&b->progress[0].consumed, memory_order_acquire);
  for (unsigned k = 1; k < b->subscribers; k++) {
    long c = atomic_load_explicit(&b->progress[k].consumed, memory_order_acquire);
    if (c < least) least = c;
  }
  return least;
}

static void *publisher(void *arg) {
  msgq_bound *b = arg;
  msgq_bound_pin(b->cpu[0]);
  for (long i = 0; i < b->messages; i++) {
    while (i - least_consumed(b) >= b->window) bound_wait(b);
    b->copy[0](slot(b, i), b->source, b->size);
    atomic_store_explicit(&b->published, i + 1, memory_order_release);
  }
  return NULL;
}

static void *subscriber(void *arg) {
  const struct bound_reader *reader = arg;
  msgq_bound *b = reader->bound;
  /* the first on the publisher's other CPU, the next ones alternating */
  msgq_bound_pin(b->cpu[(reader->index + 1u) % 2u]);
  volatile uint8_t sink = 0;
  for (long i = 0; i < b->messages; i++) {
    while (atomic_load_explicit(&b->published, memory_order_acquire) <= i) bound_wait(b);
    uint8_t *out = malloc(b->size); /* like the new bytes object of receive() */
    if (!out) {
      atomic_store(&b->failed, 1);
    } else {
      b->copy[1](out, slot(b, i), b->size);
      sink ^= out[0] ^ out[b->size - 1];
      free(out);
    }
    atomic_store_explicit(&b->progress[reader->index].consumed, i + 1,
                          memory_order_release);
  }
  (void)sink;
  return NULL;
}

double msgq_bound_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double msgq_bound_rate(msgq_bound *b, unsigned window, long messages, int cpu_pub,
                       int cpu_sub, msgq_bound_copy pub_copy, msgq_bound_copy sub_copy) {
  return msgq_bound_fanout_rate(b, 1u, window, messages, cpu_pub, cpu_sub, pub_copy,
                                sub_copy);
}

double msgq_bound_fanout_rate(msgq_bound *b, unsigned subscribers, unsigned window,
                              long messages, int cpu_pub, int cpu_other,
                              msgq_bound_copy pub_copy, msgq_bound_copy sub_copy) {
  if (!b || window == 0 || window >= b->slots || messages <= 0 || subscribers == 0 ||
      subscribers > MSGQ_BOUND_MAX_SUBSCRIBERS)
    return -1;
  b->window = window;
  b->subscribers = subscribers;
  b->messages = messages;
  b->cpu[0] = cpu_pub;
  b->cpu[1] = cpu_other;
  b->yield = subscribers > 1u; /* 1 + subscribers threads on two CPUs */
  b->copy[0] = pub_copy ? pub_copy : copy_memcpy;
  b->copy[1] = sub_copy ? sub_copy : copy_memcpy;
  atomic_store(&b->failed, 0);
  atomic_store(&b->published, 0);
  for (unsigned k = 0; k < subscribers; k++) atomic_store(&b->progress[k].consumed, 0);
  pthread_t pub, subs[MSGQ_BOUND_MAX_SUBSCRIBERS];
  struct bound_reader readers[MSGQ_BOUND_MAX_SUBSCRIBERS];
  unsigned started = 0;
  const double start = msgq_bound_now_s();
  for (; started < subscribers; started++) {
    readers[started] = (struct bound_reader){b, started};
    if (pthread_create(&subs[started], NULL, subscriber, &readers[started]) != 0) break;
  }
  const int pub_ok =
      started == subscribers && pthread_create(&pub, NULL, publisher, b) == 0;
  if (!pub_ok) /* the subscribers wait for messages that never come: let them through */
    atomic_store(&b->published, messages);
  else
    pthread_join(pub, NULL);
  for (unsigned k = 0; k < started; k++) pthread_join(subs[k], NULL);
  const double elapsed = msgq_bound_now_s() - start;
  if (!pub_ok || atomic_load(&b->failed) || elapsed <= 0) return -1;
  return (double)messages / elapsed;
}
