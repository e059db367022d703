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

struct msgq_bound {
  size_t size, stride;
  unsigned slots;
  uint8_t *slot_memory;
  uint8_t *source;
  /* one run's parameters and its two counters, each on a line of its own */
  unsigned window;
  long messages;
  int cpu[2];
  msgq_bound_copy copy[2];
  int failed;
  _Alignas(64) _Atomic long published;
  _Alignas(64) _Atomic long consumed;
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

static void *publisher(void *arg) {
  msgq_bound *b = arg;
  msgq_bound_pin(b->cpu[0]);
  for (long i = 0; i < b->messages; i++) {
    while (i - atomic_load_explicit(&b->consumed, memory_order_acquire) >= b->window)
      msgq_bound_pause();
    b->copy[0](slot(b, i), b->source, b->size);
    atomic_store_explicit(&b->published, i + 1, memory_order_release);
  }
  return NULL;
}

static void *subscriber(void *arg) {
  msgq_bound *b = arg;
  msgq_bound_pin(b->cpu[1]);
  volatile uint8_t sink = 0;
  for (long i = 0; i < b->messages; i++) {
    while (atomic_load_explicit(&b->published, memory_order_acquire) <= i)
      msgq_bound_pause();
    uint8_t *out = malloc(b->size); /* like the new bytes object of receive() */
    if (!out) {
      b->failed = 1;
    } else {
      b->copy[1](out, slot(b, i), b->size);
      sink ^= out[0] ^ out[b->size - 1];
      free(out);
    }
    atomic_store_explicit(&b->consumed, i + 1, memory_order_release);
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
  if (!b || window == 0 || window >= b->slots || messages <= 0) return -1;
  b->window = window;
  b->messages = messages;
  b->cpu[0] = cpu_pub;
  b->cpu[1] = cpu_sub;
  b->copy[0] = pub_copy ? pub_copy : copy_memcpy;
  b->copy[1] = sub_copy ? sub_copy : copy_memcpy;
  b->failed = 0;
  atomic_store(&b->published, 0);
  atomic_store(&b->consumed, 0);
  pthread_t pub, sub;
  const double start = msgq_bound_now_s();
  if (pthread_create(&sub, NULL, subscriber, b) != 0) return -1;
  if (pthread_create(&pub, NULL, publisher, b) != 0) {
    /* the subscriber waits for messages that never come: let it through */
    atomic_store(&b->published, messages);
    pthread_join(sub, NULL);
    return -1;
  }
  pthread_join(pub, NULL);
  pthread_join(sub, NULL);
  const double elapsed = msgq_bound_now_s() - start;
  if (b->failed || elapsed <= 0) return -1;
  return (double)messages / elapsed;
}
