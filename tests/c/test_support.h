/* What the ring's C tests (test_ring.c, test_pool.c) share beyond check.h: the test queue
 * type, the reader's copy-and-consume loop, a publisher with one subscriber, and the
 * scaffolding of the threaded stress runs (start the readers, wait for them, join and
 * check them). Each test program still makes its own queue memory: test_ring.c from the
 * heap (ASan sees reads past the end), test_pool.c shared (forked children use it). */
#ifndef MSGQ_TESTS_TEST_SUPPORT_H
#define MSGQ_TESTS_TEST_SUPPORT_H

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "msgq_ring.h"
#include "os_wait.h"

#include "check.h"

/* Leaves a function's own memory accesses out of ThreadSanitizer's instrumentation: for
 * the tests' payload writers and in-place checkers only, whose races with each other
 * are the intended one (a suppression would still pay for every report it drops). */
#if defined(__SANITIZE_THREAD__) /* gcc */
#define MSGQ_TEST_NO_TSAN __attribute__((no_sanitize("thread")))
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) /* clang */
#define MSGQ_TEST_NO_TSAN __attribute__((no_sanitize("thread")))
#endif
#endif
#ifndef MSGQ_TEST_NO_TSAN
#define MSGQ_TEST_NO_TSAN
#endif

/* A formatted queue the test owns, and the ring attached to it. */
typedef struct {
  void *mem;
  size_t size;
  msgq_ring ring;
} test_queue;

/* The copy out of the ring, which may race with the publisher overwriting the bytes (the
 * ring's one intended race, checked afterwards by consume): a function of its own so
 * that tests/c/tsan.supp can name exactly it. */
__attribute__((noinline, unused)) static void copy_payload(uint8_t *dst, const uint8_t *src,
                                                           size_t n) {
  memcpy(dst, src, n);
}

/* Receives one message into buf; returns its size, -1 when there is none, -2 when it is
 * larger than cap. Retries when the copy was overwritten, like the Python binding does. */
static inline long receive(msgq_subscriber *sub, uint8_t *buf, size_t cap) {
  for (;;) {
    const uint8_t *payload;
    uint32_t size;
    if (msgq_subscriber_peek(sub, &payload, &size) != 1) return -1;
    if (size > cap) return -2;
    copy_payload(buf, payload, size);
    if (msgq_subscriber_consume(sub, buf)) return (long)size;
  }
}

/* A publisher and one subscriber on the queue `q` (made by the caller). */
static inline void attach_pair(test_queue *q, msgq_publisher *pub, msgq_subscriber *sub) {
  msgq_publisher_init(pub, &q->ring);
  CHECK(msgq_subscriber_init(sub, &q->ring, false) == 0);
}

/* Waits until every reader came back to the write position (by reading, or by being
 * overtaken and reset), at most `timeout_ns`: the readers really run during the writes
 * even when the scheduler would starve a thread. */
static inline void wait_for_readers(msgq_publisher *pub, int64_t timeout_ns) {
  int64_t deadline = os_monotonic_ns() + timeout_ns;
  while (!msgq_publisher_all_readers_updated(pub) && os_monotonic_ns() < deadline)
    sched_yield();
}

/* One reader thread of a stress run: its inputs, and what it counted. */
typedef struct {
  msgq_ring *ring;
  _Atomic int *done;
  bool views; /* reads each message in place (release_view) instead of copying it */
  _Atomic int ready;
  _Atomic long received;
  long torn, out_of_order, resets, overwritten_views;
} stress_reader;

/* Starts `count` reader threads running `reader_main`, odd ones reading in place, and
 * returns once each has registered its subscriber (so none misses the first message). */
static inline void start_stress_readers(stress_reader *readers, pthread_t *threads, int count,
                                        msgq_ring *ring, _Atomic int *done,
                                        void *(*reader_main)(void *)) {
  for (int i = 0; i < count; i++) {
    memset(&readers[i], 0, sizeof readers[i]);
    readers[i].ring = ring;
    readers[i].done = done;
    readers[i].views = i % 2 == 1;
    pthread_create(&threads[i], NULL, reader_main, &readers[i]);
    while (!atomic_load(&readers[i].ready)) {
    }
  }
}

/* Joins the readers (after `*done` was set) and checks that none saw a torn message or
 * one out of order, and that each received something (`must_receive`) or at least ran
 * while data waited (received or was reset). Adds up what they received and how many
 * views they were told were overwritten. */
static inline void join_stress_readers(stress_reader *readers, pthread_t *threads, int count,
                                       bool must_receive, long *total, long *overwritten) {
  *total = *overwritten = 0;
  for (int i = 0; i < count; i++) {
    pthread_join(threads[i], NULL);
    CHECK(readers[i].torn == 0);
    CHECK(readers[i].out_of_order == 0);
    if (must_receive)
      CHECK(readers[i].received > 0);
    else
      CHECK(readers[i].received + readers[i].resets > 0);
    *total += readers[i].received;
    *overwritten += readers[i].overwritten_views;
  }
}

#endif
