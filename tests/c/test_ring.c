/* C unit tests of the msgq ring: protocol behaviour on memory this test owns, header
 * validation, hostile values in every part of the segment, and a threaded stress run.
 * Prints "N passed, N failed" and exits non-zero on any failure. Run under the
 * sanitizer variants of SConstruct to catch out-of-bounds reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "msgq_errors.h"
#include "msgq_ring.h"
#include "os_wait.h"
#include "queue_file.h"

#include "test_support.h"

/* A queue in ordinary memory, formatted like a fresh queue file. */
static test_queue make_queue_flags(uint32_t capacity, uint32_t flags) {
  test_queue q;
  q.size = MSGQ_HEADER_SIZE + capacity;
  q.mem = aligned_alloc(64, q.size);
  memset(q.mem, 0, q.size);
  if (msgq_ring_format(q.mem, q.size, flags) != 0 ||
      msgq_ring_attach(&q.ring, q.mem, q.size) != 0) {
    fprintf(stderr, "cannot format test queue\n");
    exit(2);
  }
  return q;
}

static test_queue make_queue(uint32_t capacity) { return make_queue_flags(capacity, 0); }

static void free_queue(test_queue *q) { free(q->mem); }

static void test_header_round_trip(void) {
  test_queue q = make_queue(4096);
  msgq_ring r;
  CHECK(msgq_ring_attach(&r, q.mem, q.size) == 0);
  CHECK(r.capacity == 4096);
  CHECK(msgq_ring_attach(&r, q.mem, q.size - 8) == MSGQ_EGEOMETRY);
  CHECK(msgq_ring_attach(&r, q.mem, 4) == MSGQ_EBADMAGIC);
  CHECK(msgq_ring_attach(&r, q.mem, 100) == MSGQ_EGEOMETRY);
  CHECK(msgq_ring_format(q.mem, 10, 0) == MSGQ_EBADSIZE);
  CHECK(msgq_ring_format(q.mem, MSGQ_HEADER_SIZE + 100, 0) == MSGQ_EBADSIZE); /* not 8-aligned */
  free_queue(&q);
}

static void test_header_fields_validated(void) {
  /* Each header field with a wrong value makes attach fail with the right code. */
  struct {
    size_t offset;
    uint32_t value;
    int code;
  } cases[] = {
      {offsetof(msgq_header, magic), 0x12345678u, MSGQ_EBADMAGIC},
      {offsetof(msgq_header, layout_version), 1u, MSGQ_EVERSION},
      {offsetof(msgq_header, flags), 0x80u, MSGQ_EGEOMETRY},
      {offsetof(msgq_header, header_size), 64u, MSGQ_EGEOMETRY},
      {offsetof(msgq_header, total_size), 1u, MSGQ_EGEOMETRY},
      {offsetof(msgq_header, capacity), 8192u, MSGQ_EGEOMETRY},
      {offsetof(msgq_header, capacity), 0u, MSGQ_EGEOMETRY},
      {offsetof(msgq_header, num_reader_slots), 65u, MSGQ_EGEOMETRY},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    test_queue q = make_queue(4096);
    memcpy((uint8_t *)q.mem + cases[i].offset, &cases[i].value, sizeof(uint32_t));
    msgq_ring r;
    CHECK(msgq_ring_attach(&r, q.mem, q.size) == cases[i].code);
    free_queue(&q);
  }
}

static void test_capacity_rules(void) {
  CHECK(msgq_ring_capacity_for(0) == MSGQ_EBADSIZE);
  CHECK(msgq_ring_capacity_for(63) == MSGQ_EBADSIZE);
  CHECK(msgq_ring_capacity_for(64) == 64);
  CHECK(msgq_ring_capacity_for(65) == 72);
  CHECK(msgq_ring_capacity_for(0x100000000ULL) == MSGQ_EBADSIZE);
  CHECK(msgq_ring_max_message_size(4096) == 1352); /* (4096 - 8) / 3 = 1362 -> 1360, less 8 */
  /* Three largest messages plus the reserved 8 bytes fit. */
  uint32_t m = msgq_ring_max_message_size(4096);
  CHECK(3u * (8u + ((m + 7u) & ~7u)) + 8u <= 4096u);
}

static void test_round_trip_and_empty_message(void) {
  test_queue q = make_queue(4096);
  msgq_publisher pub;
  msgq_subscriber sub;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  uint8_t buf[2048];
  CHECK(receive(&sub, buf, sizeof buf) == -1);
  CHECK(msgq_publisher_send(&pub, "hello", 5) == 0);
  CHECK(msgq_publisher_send(&pub, "", 0) == 0);
  CHECK(receive(&sub, buf, sizeof buf) == 5 && memcmp(buf, "hello", 5) == 0);
  CHECK(receive(&sub, buf, sizeof buf) == 0);
  CHECK(receive(&sub, buf, sizeof buf) == -1);
  CHECK(msgq_publisher_all_readers_updated(&pub) == 1);
  msgq_subscriber_release(&sub);
  /* upstream's meaning: with no reader connected nobody has read anything */
  CHECK(msgq_publisher_all_readers_updated(&pub) == 0);
  free_queue(&q);
}

static void test_too_large_and_not_owner(void) {
  test_queue q = make_queue(4096);
  msgq_publisher first, second;
  msgq_publisher_init(&first, &q.ring);
  static uint8_t big[4096];
  uint32_t max = msgq_ring_max_message_size(4096);
  CHECK(msgq_publisher_send(&first, big, max) == 0);
  CHECK(msgq_publisher_send(&first, big, max + 1) == MSGQ_ETOOLARGE);
  msgq_publisher_init(&second, &q.ring);
  CHECK(msgq_publisher_send(&first, big, 1) == MSGQ_ENOTOWNER);
  CHECK(msgq_publisher_send(&second, big, 1) == 0);
  CHECK(msgq_publisher_commit(&second) == MSGQ_ENORESERVE);
  free_queue(&q);
}

static void test_wrap_around(void) {
  test_queue q = make_queue(256);
  msgq_publisher pub;
  msgq_subscriber sub;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  uint8_t msg[64], buf[128];
  for (int i = 0; i < 10000; i++) {
    uint32_t len = (uint32_t)(i % 61);
    for (uint32_t k = 0; k < len; k++) msg[k] = (uint8_t)(i + k);
    CHECK(msgq_publisher_send(&pub, msg, len) == 0);
    long got = receive(&sub, buf, sizeof buf);
    CHECK(got == (long)len);
    CHECK(memcmp(buf, msg, len) == 0);
  }
  CHECK(sub.resets == 0);
  CHECK((q.ring.header->write_pointer >> 32) > 100); /* many cycles went by */
  free_queue(&q);
}

static void test_overtaken_reader_is_reset(void) {
  test_queue q = make_queue(512);
  msgq_publisher pub;
  msgq_subscriber slow, fast;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&slow, &q.ring, false) == 0);
  CHECK(msgq_subscriber_init(&fast, &q.ring, false) == 0);
  uint8_t buf[256];
  uint64_t payload;
  for (uint64_t i = 0; i < 100; i++) {
    payload = i;
    CHECK(msgq_publisher_send(&pub, &payload, sizeof payload) == 0);
    CHECK(receive(&fast, buf, sizeof buf) == 8);
    CHECK(memcmp(buf, &payload, 8) == 0);
  }
  /* The slow reader was lapped: it proves so from write_reserve and resets. */
  CHECK(receive(&slow, buf, sizeof buf) == -1);
  CHECK(slow.resets == 1);
  CHECK(slow.read_pointer == q.ring.header->write_pointer);
  payload = 1000;
  CHECK(msgq_publisher_send(&pub, &payload, 8) == 0);
  CHECK(receive(&slow, buf, sizeof buf) == 8 && memcmp(buf, &payload, 8) == 0);
  CHECK(fast.resets == 0);
  free_queue(&q);
}

/* A reader peeks the first message of a 256-byte ring; the writer then laps it (writes
 * over those bytes in the next cycle) before the reader is done. */
static const uint8_t *peek_then_lap(test_queue *q, msgq_publisher *pub, msgq_subscriber *sub) {
  *q = make_queue(256);
  msgq_publisher_init(pub, &q->ring);
  CHECK(msgq_subscriber_init(sub, &q->ring, false) == 0);
  uint8_t msg[40] = {0};
  CHECK(msgq_publisher_send(pub, msg, sizeof msg) == 0);
  const uint8_t *payload;
  uint32_t size;
  CHECK(msgq_subscriber_peek(sub, &payload, &size) == 1); /* bytes 0..48 of cycle 0 */
  while ((atomic_load(&q->ring.header->write_reserve) >> 32) == 0)
    CHECK(msgq_publisher_send(pub, msg, sizeof msg) == 0);
  return payload;
}

static void test_invalidation_during_copy_is_detected(void) {
  /* A reader peeks, the writer laps it before consume: consume reports the tear. */
  test_queue q;
  msgq_publisher pub;
  msgq_subscriber sub;
  const uint8_t *payload = peek_then_lap(&q, &pub, &sub);
  CHECK(msgq_subscriber_consume(&sub, payload) == 0);
  CHECK(sub.resets == 1);
  free_queue(&q);
}

static void test_one_damaged_reserve_copy_never_hides_a_tear(void) {
  /* As above, then a write lowers one copy of the reserve to the new cycle's start (a
   * single reserve then said "intact": version 5 delivered the overwritten bytes). The
   * other copy keeps the true value, so consume still reports the tear. */
  for (int damaged = 0; damaged < 2; damaged++) {
    test_queue q;
    msgq_publisher pub;
    msgq_subscriber sub;
    const uint8_t *payload = peek_then_lap(&q, &pub, &sub);
    msgq_header *h = q.ring.header;
    uint64_t lowered = atomic_load(&h->write_reserve) & ~(uint64_t)UINT32_MAX; /* (1, 0) */
    if (damaged == 0)
      atomic_store(&h->write_reserve, lowered);
    else
      atomic_store(&h->write_reserve_check, ~lowered);
    CHECK(msgq_subscriber_consume(&sub, payload) == 0);
    CHECK(sub.resets == 1);
    free_queue(&q);
  }
}

static void test_damaged_header_moves_live_processes(void) {
  /* A write into the immutable header (here: capacity) makes the next opener replace the
   * file, and it may not recognise the file as ours to mark it. The live processes mark
   * it themselves: a subscriber once it has read everything, the publisher at its sweep;
   * both then report MSGQ_ESUPERSEDED (re-open the endpoint). */
  for (int who = 0; who < 2; who++) {
    test_queue q = make_queue(1024);
    msgq_publisher pub;
    msgq_subscriber sub;
    msgq_publisher_init(&pub, &q.ring);
    CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
    uint8_t msg[16] = {1}, buf[64];
    CHECK(msgq_publisher_send(&pub, msg, sizeof msg) == 0);
    q.ring.header->capacity ^= 8u;
    if (who == 0) {
      CHECK(receive(&sub, buf, sizeof buf) == sizeof msg); /* what was sent still comes */
      const uint8_t *payload;
      uint32_t size;
      CHECK(msgq_subscriber_peek(&sub, &payload, &size) == MSGQ_ESUPERSEDED);
    } else {
      msgq_publisher_sweep(&pub);
    }
    CHECK(atomic_load(&q.ring.header->superseded) == 1u);
    CHECK(msgq_publisher_send(&pub, msg, sizeof msg) == MSGQ_ESUPERSEDED);
    CHECK(msgq_subscriber_has_data(&sub) == 1);
    free_queue(&q);
  }
}

static void test_view_overwritten_is_reported(void) {
  /* A reader uses a message in place; when the writer laps it meanwhile, the release
   * says so (0) and the reader jumps forward; otherwise it advances (1). */
  test_queue q = make_queue(256);
  msgq_publisher pub;
  msgq_subscriber sub;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  uint8_t msg[40] = {1, 2, 3};
  const uint8_t *payload;
  uint32_t size;
  CHECK(msgq_publisher_send(&pub, msg, sizeof msg) == 0);
  CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1 && size == 40);
  CHECK(memcmp(payload, msg, 40) == 0);
  CHECK(msgq_subscriber_release_view(&sub) == 1);
  CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 0);
  CHECK(msgq_publisher_send(&pub, msg, sizeof msg) == 0);
  CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1);
  for (int i = 0; i < 10; i++) CHECK(msgq_publisher_send(&pub, msg, sizeof msg) == 0);
  CHECK(msgq_subscriber_release_view(&sub) == 0);
  CHECK(sub.resets == 1);
  free_queue(&q);

  /* Checksummed: bytes changed under an intact region (damage) are reported apart. */
  test_queue c = make_queue_flags(4096, MSGQ_FLAG_CHECKSUM);
  msgq_publisher_init(&pub, &c.ring);
  CHECK(msgq_subscriber_init(&sub, &c.ring, false) == 0);
  CHECK(msgq_publisher_send(&pub, msg, sizeof msg) == 0);
  CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1);
  ((uint8_t *)payload)[5] ^= 0x40;
  CHECK(msgq_subscriber_release_view(&sub) == MSGQ_ECHECKSUM);
  CHECK(sub.checksum_errors == 1);
  CHECK(msgq_publisher_send(&pub, msg, sizeof msg) == 0);
  CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1);
  CHECK(msgq_subscriber_release_view(&sub) == 1);
  free_queue(&c);
}

/* The payload of message `seq` of `len` bytes: its sequence number, then bytes derived
 * from both, so a reader can tell which message it got and that it is whole. */
static void fill_message(uint8_t *msg, uint64_t seq, uint32_t len) {
  memcpy(msg, &seq, 8);
  for (uint32_t k = 8; k < len; k++) msg[k] = (uint8_t)(seq * 131u + k);
}

static bool is_message(const uint8_t *buf, long got, uint64_t seq, uint32_t len) {
  uint8_t want[2048];
  if (got != (long)len || len > sizeof want) return false;
  fill_message(want, seq, len);
  return memcmp(buf, want, len) == 0;
}

/* A fresh queue of `capacity` bytes with a publisher and one subscriber. */
static void open_pair(test_queue *q, uint32_t capacity, msgq_publisher *pub,
                      msgq_subscriber *sub) {
  *q = make_queue(capacity);
  attach_pair(q, pub, sub);
}

static void test_early_wrap_keeps_the_ring_warm(void) {
  /* A reader that keeps up lets the writer go back to the ring's start once it is a
   * quarter in (I7): the bytes in use stay few, and every message arrives whole. */
  const uint32_t capacity = 64u * 1024u, len = 1000u, total = 8u + 1000u;
  test_queue q;
  msgq_publisher pub;
  msgq_subscriber sub;
  open_pair(&q, capacity, &pub, &sub);
  uint8_t msg[1000], buf[2048];
  uint32_t highest = 0;
  for (uint64_t seq = 1; seq <= 2000; seq++) {
    fill_message(msg, seq, len);
    CHECK(msgq_publisher_send(&pub, msg, len) == 0);
    uint32_t offset = (uint32_t)atomic_load(&q.ring.header->write_pointer);
    if (offset > highest) highest = offset;
    CHECK(is_message(buf, receive(&sub, buf, sizeof buf), seq, len));
  }
  CHECK(sub.resets == 0);
  CHECK(pub.early_wraps > 100);
  CHECK(highest <= capacity / 4u + total); /* never further than a quarter and a message */
  free_queue(&q);
}

static void test_early_wrap_waits_for_every_reader(void) {
  /* A reader that is behind, holds a view, or whose process died (until the sweep frees
   * its slot) keeps the writer on its way round the whole ring. */
  const uint32_t capacity = 64u * 1024u, len = 1000u;
  uint8_t msg[1000] = {0}, buf[2048];
  test_queue q = make_queue(capacity);
  msgq_publisher pub;
  msgq_subscriber keeping_up, idle;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&keeping_up, &q.ring, false) == 0);
  CHECK(msgq_subscriber_init(&idle, &q.ring, false) == 0);
  for (int i = 0; i < 200; i++) {
    CHECK(msgq_publisher_send(&pub, msg, len) == 0);
    CHECK(receive(&keeping_up, buf, sizeof buf) == (long)len);
  }
  CHECK(pub.early_wraps == 0);
  msgq_subscriber_release(&idle);
  free_queue(&q);

  /* A view held across sends: no early wrap under it, and it stays intact. */
  q = make_queue(capacity);
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&keeping_up, &q.ring, false) == 0);
  fill_message(msg, 7, len);
  CHECK(msgq_publisher_send(&pub, msg, len) == 0);
  const uint8_t *payload;
  uint32_t size;
  CHECK(msgq_subscriber_peek(&keeping_up, &payload, &size) == 1 && size == len);
  for (int i = 0; i < 40; i++) CHECK(msgq_publisher_send(&pub, msg, len) == 0);
  CHECK(pub.early_wraps == 0);
  CHECK(is_message(payload, (long)size, 7, len));
  CHECK(msgq_subscriber_release_view(&keeping_up) == 1);
  free_queue(&q);

  /* A slot left by a dead process: honoured until the sweep gives it back. */
  q = make_queue(capacity);
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&keeping_up, &q.ring, false) == 0);
  pid_t child = fork();
  if (child == 0) _exit(0);
  CHECK(child > 0 && waitpid(child, NULL, 0) == child);
  atomic_store(&q.ring.header->readers[40].owner_pid, (int32_t)child);
  atomic_store(&q.ring.header->readers[40].read_pointer, 0);
  pub.next_sweep_ns = INT64_MAX; /* no sweep on the way */
  for (int i = 0; i < 200; i++) {
    CHECK(msgq_publisher_send(&pub, msg, len) == 0);
    CHECK(receive(&keeping_up, buf, sizeof buf) == (long)len);
  }
  CHECK(pub.early_wraps == 0);
  CHECK(msgq_publisher_sweep(&pub) == 1);
  for (int i = 0; i < 200; i++) {
    CHECK(msgq_publisher_send(&pub, msg, len) == 0);
    CHECK(receive(&keeping_up, buf, sizeof buf) == (long)len);
  }
  CHECK(pub.early_wraps > 0);
  free_queue(&q);
}

static void test_reader_stalled_after_an_early_wrap_keeps_a_whole_ring(void) {
  /* The reader stops right after the writer wrapped early: the marker behind it is soon
   * overwritten, yet last_wrap lets it go on at the new cycle's start, so it loses
   * nothing until the writer comes round the whole ring. */
  const uint32_t capacity = 64u * 1024u, len = 1000u, total = 8u + 1000u;
  test_queue q;
  msgq_publisher pub;
  msgq_subscriber sub;
  open_pair(&q, capacity, &pub, &sub);
  uint8_t msg[1000], buf[2048];
  uint64_t seq = 0;
  while (pub.early_wraps == 0 && seq < 1000) {
    fill_message(msg, ++seq, len);
    CHECK(msgq_publisher_send(&pub, msg, len) == 0);
    if (pub.early_wraps == 0) CHECK(is_message(buf, receive(&sub, buf, sizeof buf), seq, len));
  }
  CHECK(pub.early_wraps == 1);
  /* The message that went to the start is unread, and so is everything up to the last
   * one that fits before the ring's end. */
  const uint64_t first_unread = seq;
  const uint32_t fit = (capacity - 8u) / total - 1u;
  while (seq < first_unread + fit - 1) {
    fill_message(msg, ++seq, len);
    CHECK(msgq_publisher_send(&pub, msg, len) == 0);
  }
  CHECK(pub.early_wraps == 1);
  for (uint64_t want = first_unread; want <= seq; want++)
    CHECK(is_message(buf, receive(&sub, buf, sizeof buf), want, len));
  CHECK(receive(&sub, buf, sizeof buf) == -1);
  CHECK(sub.resets == 0);
  free_queue(&q);
}

static void test_damaged_last_wrap_costs_messages_never_bytes(void) {
  /* last_wrap pointed at a stalled reader's position by someone else: the reader may
   * skip to the next cycle's start (losing messages) but only delivers messages that
   * were sent, whole and in order. */
  const uint32_t capacity = 16u * 1024u, len = 500u;
  uint8_t msg[500], buf[2048];
  for (int variant = 0; variant < 3; variant++) {
    test_queue q;
    msgq_publisher pub;
    msgq_subscriber sub;
    open_pair(&q, capacity, &pub, &sub);
    uint64_t seq = 0, last = 0, delivered = 0;
    for (int round = 0; round < 200; round++) {
      int burst = 1 + (round * 7 + variant) % 45;
      for (int i = 0; i < burst; i++) {
        fill_message(msg, ++seq, len);
        CHECK(msgq_publisher_send(&pub, msg, len) == 0);
      }
      uint64_t here = atomic_load(&sub.read_pointer);
      uint64_t lie = variant == 0 ? here : variant == 1 ? here + 8 : ~here;
      atomic_store(&q.ring.header->last_wrap, lie);
      long got;
      while ((got = receive(&sub, buf, sizeof buf)) >= 0) {
        uint64_t s;
        memcpy(&s, buf, 8);
        CHECK(s > last && s <= seq && is_message(buf, got, s, len));
        last = s;
        delivered++;
      }
      /* Whatever it skipped, it ends where the writer is. */
      CHECK(atomic_load(&sub.read_pointer) == atomic_load(&q.ring.header->write_pointer));
    }
    CHECK(delivered > seq / 4); /* bursts longer than the ring lose their start */
    free_queue(&q);
  }
}

static void test_conflate(void) {
  /* Conflating readers get the newest message: after many wraps of the ring, after being
   * lapped (they never read while the writer went round several times), and while
   * reading along. */
  test_queue q = make_queue(1024);
  msgq_publisher pub;
  msgq_subscriber sub, lapped;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&sub, &q.ring, true) == 0);
  CHECK(msgq_subscriber_init(&lapped, &q.ring, true) == 0);
  uint8_t buf[64];
  uint32_t got;
  for (uint32_t round = 0; round < 20; round++) {
    /* 16 bytes each: 200 messages are 3.1 rings' worth, so the writer wraps 3 times */
    for (uint32_t i = 0; i < 200; i++) {
      uint32_t v = round * 1000 + i;
      CHECK(msgq_publisher_send(&pub, &v, sizeof v) == 0);
    }
    CHECK(receive(&sub, buf, sizeof buf) == 4);
    memcpy(&got, buf, 4);
    CHECK(got == round * 1000 + 199);
    CHECK(receive(&sub, buf, sizeof buf) == -1);
  }
  CHECK((q.ring.header->write_pointer >> 32) >= 60); /* the ring really wrapped */
  CHECK(receive(&lapped, buf, sizeof buf) == 4); /* lapped 60 times: still the newest */
  memcpy(&got, buf, 4);
  CHECK(got == 19 * 1000 + 199);
  CHECK(receive(&lapped, buf, sizeof buf) == -1);
  free_queue(&q);
}

static void test_wait_never_sleeps_unbounded(void) {
  /* A damaged waiting bit can hide a sleeper from the publisher; a wait without timeout
   * must still come back (and the caller look again) instead of sleeping for ever. */
  test_queue q = make_queue(1024);
  msgq_subscriber sub;
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  int64_t start = os_monotonic_ns();
  CHECK(msgq_subscriber_wait(&sub, -1) == 0);
  int64_t slept = os_monotonic_ns() - start;
  CHECK(slept >= 50000000 && slept < 2000000000);
  CHECK(atomic_load(&q.ring.header->waiting_readers) == 0); /* its bit is gone again */
  free_queue(&q);
}

static int64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *publish_after_1ms(void *arg) {
  struct timespec pause = {0, 1000000};
  nanosleep(&pause, NULL);
  CHECK(msgq_publisher_send((msgq_publisher *)arg, "late", 4) == 0);
  return NULL;
}

/* Run in a child of its own (SPIN_CHILD), whose environment sets a 5 ms look before
 * sleeping: a budget large enough that a wait which wrongly looks burns CPU measurably;
 * a wait of ten budgets (50 ms) or longer counts as slow. */
#define SPIN_CHILD "--slow-stream-waits"
static void slow_stream_waits(void) {
  test_queue q = make_queue(1024);
  msgq_publisher pub;
  msgq_subscriber sub;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  /* A wait that timed out is recorded as long as it lasted... */
  CHECK(msgq_subscriber_wait(&sub, 80000000) == 0);
  CHECK(atomic_load(&sub.last_wait_ns) >= 80000000);
  /* ...so the next one sleeps at once: no 5 ms of looking. */
  int64_t cpu = thread_cpu_ns();
  CHECK(msgq_subscriber_wait(&sub, 30000000) == 0);
  cpu = thread_cpu_ns() - cpu;
  CHECK(cpu < 2000000);
  /* A wait that data ended early is recorded as that short (about 1 ms, under the 50 ms
   * of a slow stream): the next one looks again. On a busy machine (CI, TSan) this thread
   * can lose the CPU for longer than the publisher's 1 ms, so the message is there before
   * the wait begins and nothing is recorded: take it and try again. */
  int64_t waited = 0;
  for (int attempt = 0; attempt < 20; attempt++) {
    int64_t recorded = atomic_load(&sub.last_wait_ns);
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, publish_after_1ms, &pub) == 0);
    int64_t start = os_monotonic_ns();
    CHECK(msgq_subscriber_wait(&sub, 90000000) == 1);
    waited = os_monotonic_ns() - start;
    pthread_join(thread, NULL);
    if (atomic_load(&sub.last_wait_ns) != recorded) break;
    const uint8_t *payload;
    uint32_t size;
    CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1 && size == 4);
    char copy[4];
    memcpy(copy, payload, 4);
    CHECK(msgq_subscriber_consume(&sub, copy) == 1);
  }
  CHECK(atomic_load(&sub.last_wait_ns) > 0 && atomic_load(&sub.last_wait_ns) <= waited);
  /* Data already there is no wait: nothing is recorded. */
  int64_t before = atomic_load(&sub.last_wait_ns);
  CHECK(msgq_subscriber_wait(&sub, 90000000) == 1);
  CHECK(atomic_load(&sub.last_wait_ns) == before);
  free_queue(&q);
}

static void test_slow_stream_waits_sleep_at_once(void) {
  pid_t child = fork();
  if (child == 0) {
    setenv("MSGQ_WAIT_SPIN_US", "5000", 1);
    execl("/proc/self/exe", "test_ring", SPIN_CHILD, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  CHECK(child > 0 && waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_crc32c(void) {
  CHECK(msgq_crc32c("123456789", 9) == 0xE3069283u);
  CHECK(msgq_crc32c_portable("123456789", 9) == 0xE3069283u);
  CHECK(msgq_crc32c("", 0) == 0);
  uint8_t buf[1000];
  unsigned seed = 3;
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)rand_r(&seed);
  for (size_t off = 0; off < 9; off++)
    for (size_t len = 0; len + off <= sizeof buf; len += 37)
      CHECK(msgq_crc32c(buf + off, len) == msgq_crc32c_portable(buf + off, len));
}

static void test_checksummed_queue_drops_damaged_messages(void) {
  /* A process with write access changes a published message's bytes: in a queue made
   * with MSGQ_FLAG_CHECKSUM the reader drops it and counts it; the next one arrives. */
  test_queue q = make_queue_flags(4096, MSGQ_FLAG_CHECKSUM);
  CHECK(q.ring.flags == MSGQ_FLAG_CHECKSUM);
  msgq_publisher pub;
  msgq_subscriber sub;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  uint8_t buf[64];
  CHECK(msgq_publisher_send(&pub, "first message", 13) == 0);
  CHECK(msgq_publisher_send(&pub, "second", 6) == 0);
  q.ring.data[8 + 3] ^= 0x20; /* one bit of the first payload */
  CHECK(receive(&sub, buf, sizeof buf) == 6 && memcmp(buf, "second", 6) == 0);
  CHECK(sub.checksum_errors == 1);
  CHECK(receive(&sub, buf, sizeof buf) == -1);
  free_queue(&q);
}

static void test_garbage_size_prefixes(void) {
  const int64_t values[] = {-2, -1000, INT64_MIN, INT64_MAX, 1 << 30, 4096, 4096 - 8, 4096 - 16,
                            255, 3};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    test_queue q = make_queue(4096);
    msgq_publisher pub;
    msgq_subscriber sub;
    msgq_publisher_init(&pub, &q.ring);
    CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
    uint8_t msg[100] = {1}, buf[4096];
    CHECK(msgq_publisher_send(&pub, msg, sizeof msg) == 0);
    memcpy(q.ring.data, &values[i], 8);
    /* In-range garbage reads as (garbage) messages inside the published bytes; out-of-
     * range garbage resets the reader. Either way it ends where the writer is. */
    int drained = 0;
    while (receive(&sub, buf, sizeof buf) >= 0 && drained < 1000) drained++;
    CHECK(drained < 1000);
    /* The reader follows the writer again from here on. */
    CHECK(msgq_publisher_send(&pub, "after", 5) == 0);
    CHECK(receive(&sub, buf, sizeof buf) == 5 && memcmp(buf, "after", 5) == 0);
    free_queue(&q);
  }
}

static void test_random_garbage_anywhere(void) {
  /* Scribbles random bytes over the live parts of the segment (publisher line, wake line,
   * reader slots, ring) between operations. Under ASan any out-of-bounds access aborts. */
  test_queue q = make_queue(2048);
  msgq_publisher pub;
  msgq_subscriber subs[3];
  msgq_publisher_init(&pub, &q.ring);
  for (int s = 0; s < 3; s++) CHECK(msgq_subscriber_init(&subs[s], &q.ring, s == 2) == 0);
  unsigned seed = 12345;
  uint8_t msg[700], buf[2048];
  size_t mutable_start = offsetof(msgq_header, write_pointer);
  for (int iter = 0; iter < 20000; iter++) {
    uint32_t len = (uint32_t)(rand_r(&seed) % sizeof msg);
    int r = msgq_publisher_send(&pub, msg, len);
    if (r == MSGQ_ESUPERSEDED) atomic_store(&q.ring.header->superseded, 0); /* scribbled */
    if (r == MSGQ_ENOTOWNER || r == MSGQ_ESUPERSEDED)
      msgq_publisher_init(&pub, &q.ring); /* token was scribbled */
    if (iter % 7 == 0) {
      size_t at = mutable_start + (size_t)rand_r(&seed) % (q.size - mutable_start - 8);
      uint64_t junk = ((uint64_t)rand_r(&seed) << 33) ^ (uint64_t)rand_r(&seed);
      memcpy((uint8_t *)q.mem + at, &junk, 8);
    }
    for (int s = 0; s < 3; s++) {
      long got = receive(&subs[s], buf, sizeof buf);
      CHECK(got <= (long)msgq_ring_max_message_size(q.ring.capacity));
    }
  }
  free_queue(&q);
}

static void test_reader_slots_exhaust_and_free(void) {
  test_queue q = make_queue(256);
  static msgq_subscriber subs[MSGQ_READER_SLOTS + 2];
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++)
    CHECK(msgq_subscriber_init(&subs[i], &q.ring, false) == 0);
  CHECK(msgq_subscriber_init(&subs[MSGQ_READER_SLOTS], &q.ring, false) == MSGQ_ENOSLOT);
  msgq_subscriber_release(&subs[5]);
  CHECK(msgq_subscriber_init(&subs[MSGQ_READER_SLOTS], &q.ring, false) == 0);
  CHECK(subs[MSGQ_READER_SLOTS].slot == 5);
  /* A slot owned by a pid that does not exist is reclaimed when none is free. */
  atomic_store(&q.ring.header->readers[7].owner_pid, 0x7ffffff0);
  CHECK(msgq_ring_live_readers(&q.ring) == (int)MSGQ_READER_SLOTS - 1);
  CHECK(msgq_subscriber_init(&subs[MSGQ_READER_SLOTS + 1], &q.ring, false) == 0);
  CHECK(subs[MSGQ_READER_SLOTS + 1].slot == 7);
  CHECK(msgq_ring_live_readers(&q.ring) == (int)MSGQ_READER_SLOTS);
  free_queue(&q);
}

/* A subscriber that opened a queue but has not taken its slot yet must count as a user:
 * a publisher asking for another size may not re-create (truncate) the file under it. */
static _Atomic int opened;
static void *open_and_register_slowly(void *arg) {
  msgq_subscriber *sub = arg;
  msgq_ring ring;
  int fd;
  if (msgq_queue_open("recreate_race", 0, 0, MSGQ_ROLE_SUBSCRIBER, &ring, &fd) != 0) return NULL;
  atomic_store(&opened, 1);
  struct timespec pause = {0, 50 * 1000 * 1000}; /* preempted before registering */
  nanosleep(&pause, NULL);
  msgq_subscriber_init(sub, &ring, false);
  msgq_queue_unlock(fd);
  return NULL;
}

static void test_queue_not_recreated_under_a_new_subscriber(void) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "ctest_%d", (int)getpid());
  setenv("MSGQ_PREFIX", prefix, 1);
  msgq_ring ring;
  CHECK(msgq_queue_open("recreate_race", 4096, 0, MSGQ_ROLE_PUBLISHER, &ring, NULL) == 0);
  msgq_queue_unmap(&ring); /* a stale, unused 4 KiB queue */
  msgq_subscriber sub;
  pthread_t t;
  atomic_store(&opened, 0);
  pthread_create(&t, NULL, open_and_register_slowly, &sub);
  while (!atomic_load(&opened)) sched_yield();
  /* Waits until the subscriber registered (retrying while the lock is held, as the
   * binding does), then finds the queue in use and too small. */
  int r;
  while ((r = msgq_queue_open("recreate_race", 65536, 0, MSGQ_ROLE_PUBLISHER, &ring, NULL)) ==
         -EAGAIN) {
  }
  CHECK(r == MSGQ_ESIZEMISMATCH);
  pthread_join(t, NULL);
  CHECK(sub.ring.capacity == 4096 && sub.ring.header->capacity == 4096);
  char path[MSGQ_MAX_PATH_LEN], dir[MSGQ_MAX_PATH_LEN];
  msgq_queue_path("recreate_race", path, sizeof path);
  msgq_queue_dir(dir, sizeof dir);
  msgq_subscriber_release(&sub);
  msgq_queue_unmap(&sub.ring);
  unlink(path);
  rmdir(dir);
  unsetenv("MSGQ_PREFIX");
}

static void test_names(void) {
  CHECK(msgq_validate_name("carState") == 0);
  CHECK(msgq_validate_name("a.b-c_9") == 0);
  CHECK(msgq_validate_name("") == MSGQ_EBADNAME);
  CHECK(msgq_validate_name(".") == MSGQ_EBADNAME);
  CHECK(msgq_validate_name("..") == MSGQ_EBADNAME);
  CHECK(msgq_validate_name("a/b") == MSGQ_EBADNAME);
  CHECK(msgq_validate_name("a b") == MSGQ_EBADNAME);
  char long_name[MSGQ_MAX_NAME_LEN + 2];
  memset(long_name, 'a', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  CHECK(msgq_validate_name(long_name) == MSGQ_EBADNAME);
  long_name[MSGQ_MAX_NAME_LEN] = '\0';
  CHECK(msgq_validate_name(long_name) == 0);
}

/* --- inspection (msgq queues) -------------------------------------------------------- */

/* A pid that cannot exist (above the kernel's largest pid_max). */
#define DEAD_PID 0x7ffffff0

static void test_inspect_reports_without_touching(void) {
  test_queue q = make_queue(4096);
  msgq_queue_info info;
  CHECK(msgq_ring_inspect(q.mem, q.size, &info) == 0);
  CHECK(info.capacity == 4096 && info.file_size == q.size);
  CHECK(info.publisher_pid == 0 && !info.publisher_alive);
  CHECK(info.readers_claimed == 0 && info.readers_live == 0 && info.write_pointer == 0);
  CHECK(info.creator_pid == (int32_t)getpid() && info.created_ns > 0);

  msgq_publisher pub;
  msgq_subscriber sub;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  CHECK(msgq_publisher_send(&pub, "hello", 5) == 0);
  /* A reader slot and the publisher held by dead processes count as claimed, not live. */
  atomic_store(&q.ring.header->readers[9].owner_pid, DEAD_PID);
  void *before = malloc(q.size);
  memcpy(before, q.mem, q.size);
  CHECK(msgq_ring_inspect(q.mem, q.size, &info) == 0);
  CHECK(memcmp(before, q.mem, q.size) == 0); /* inspecting writes nothing */
  CHECK(info.publisher_pid == (int32_t)getpid() && info.publisher_alive);
  CHECK(info.write_pointer == 16); /* 8-byte size prefix + 5 bytes padded to 8 */
  CHECK(info.readers_claimed == 2 && info.readers_live == 1);
  CHECK(info.reader_pids[sub.slot] == (int32_t)getpid() && info.reader_alive[sub.slot]);
  CHECK(info.reader_pids[9] == DEAD_PID && !info.reader_alive[9]);
  CHECK(info.reader_pids[sub.slot] == getpid());
  atomic_store(&q.ring.header->publisher_pid, DEAD_PID);
  CHECK(msgq_ring_inspect(q.mem, q.size, &info) == 0);
  CHECK(info.publisher_pid == DEAD_PID && !info.publisher_alive);
  free(before);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_inspect_damaged_headers(void) {
  test_queue q = make_queue(4096);
  msgq_queue_info info;
  CHECK(msgq_ring_inspect(NULL, 0, &info) == MSGQ_EBADMAGIC && info.unfinished);
  CHECK(msgq_ring_inspect(q.mem, 4, &info) == MSGQ_EBADMAGIC && !info.unfinished);
  CHECK(msgq_ring_inspect(q.mem, 100, &info) == MSGQ_EGEOMETRY); /* truncated */
  CHECK(msgq_ring_inspect(q.mem, q.size - 8, &info) == MSGQ_EGEOMETRY);
  CHECK(info.magic == MSGQ_MAGIC && info.layout_version == MSGQ_LAYOUT_VERSION);
  CHECK(info.capacity == 0 && info.publisher_pid == 0); /* nothing past the damage */
  q.ring.header->layout_version = 7;
  CHECK(msgq_ring_inspect(q.mem, q.size, &info) == MSGQ_EVERSION && info.layout_version == 7);
  atomic_store(&q.ring.header->magic, 0);
  CHECK(msgq_ring_inspect(q.mem, q.size, &info) == MSGQ_EBADMAGIC && info.magic == 0);
  CHECK(info.layout_version == 0); /* not read from a file that is not a queue */
  CHECK(info.unfinished);
  free_queue(&q);

  /* Random bytes of every small length, in buffers exactly that long (ASan catches any
   * read past the end), and valid headers with random mutable parts. */
  unsigned seed = 777;
  for (size_t size = 0; size < MSGQ_HEADER_SIZE + 200; size += 1 + size / 16) {
    uint8_t *mem = malloc(size ? size : 1);
    for (size_t i = 0; i < size; i++) mem[i] = (uint8_t)rand_r(&seed);
    int r = msgq_ring_inspect(mem, size, &info);
    CHECK(r == MSGQ_EBADMAGIC || r == MSGQ_EVERSION || r == MSGQ_EGEOMETRY);
    free(mem);
  }
  for (int iter = 0; iter < 200; iter++) {
    test_queue g = make_queue(1024);
    size_t start = offsetof(msgq_header, write_pointer);
    for (size_t i = start; i < g.size; i++) ((uint8_t *)g.mem)[i] = (uint8_t)rand_r(&seed);
    CHECK(msgq_ring_inspect(g.mem, g.size, &info) == 0);
    CHECK(info.readers_live <= info.readers_claimed &&
          info.readers_claimed <= MSGQ_READER_SLOTS);
    free_queue(&g);
  }
}

static void write_file(const char *path, const void *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) {
    if (write(fd, data, len) != (ssize_t)len) fprintf(stderr, "short write %s\n", path);
    close(fd);
  }
}

static int file_exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static void test_queue_file_inspect_and_remove(void) {
  char prefix[64], path[MSGQ_MAX_PATH_LEN], dir[MSGQ_MAX_PATH_LEN], other[MSGQ_MAX_PATH_LEN];
  snprintf(prefix, sizeof prefix, "ctest_inspect_%d", (int)getpid());
  setenv("MSGQ_PREFIX", prefix, 1);
  msgq_queue_info info;
  msgq_ring ring;
  CHECK(msgq_queue_open("inspected", 4096, 0, MSGQ_ROLE_PUBLISHER, &ring, NULL) == 0);
  msgq_publisher pub;
  msgq_publisher_init(&pub, &ring);
  msgq_queue_path("inspected", path, sizeof path);
  msgq_queue_dir(dir, sizeof dir);
  CHECK(msgq_queue_inspect(path, &info) == 0);
  CHECK(info.capacity == 4096 && info.publisher_alive);
  /* A live publisher keeps its queue; once it let go, the queue goes. */
  CHECK(msgq_queue_remove_unused(path, 1, &info) == -EBUSY && file_exists(path));
  msgq_publisher_release(&pub);
  CHECK(msgq_queue_remove_unused(path, 0, &info) == 0 && !file_exists(path));
  msgq_queue_unmap(&ring);
  CHECK(msgq_queue_inspect(path, &info) == -ENOENT);

  /* An opener holding the lock (creating or registering) makes inspect give up after
   * its short wait, not block. */
  int locked;
  CHECK(msgq_queue_open("inspected", 4096, 0, MSGQ_ROLE_SUBSCRIBER, &ring, &locked) == 0);
  int64_t t0 = os_monotonic_ns();
  CHECK(msgq_queue_inspect(path, &info) == -EAGAIN);
  CHECK(msgq_queue_remove_unused(path, 1, &info) == -EAGAIN && file_exists(path));
  CHECK(os_monotonic_ns() - t0 < 2000000000LL);
  msgq_queue_unlock(locked);
  msgq_queue_unmap(&ring);
  CHECK(msgq_queue_inspect(path, &info) == 0 && info.readers_claimed == 0);
  unlink(path);

  /* Garbage is damaged: kept unless the caller allows removing damaged files. */
  msgq_queue_path("garbage", other, sizeof other);
  uint8_t junk[300];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
  write_file(other, junk, sizeof junk);
  CHECK(msgq_queue_inspect(other, &info) == MSGQ_EBADMAGIC && info.file_size == sizeof junk);
  CHECK(msgq_queue_remove_unused(other, 0, &info) == MSGQ_EBADMAGIC && file_exists(other));
  CHECK(msgq_queue_remove_unused(other, 1, &info) == 0 && !file_exists(other));
  /* A file its creator never finished (magic 0) goes without asking. */
  memset(junk, 0, sizeof junk);
  write_file(other, junk, sizeof junk);
  CHECK(msgq_queue_remove_unused(other, 0, &info) == 0 && !file_exists(other));
  /* Not a regular file: reported, never opened for long, never removed. */
  CHECK(mkfifo(other, 0600) == 0);
  CHECK(msgq_queue_inspect(other, &info) == MSGQ_EBADMAGIC);
  CHECK(msgq_queue_remove_unused(other, 1, &info) == MSGQ_EBADMAGIC && file_exists(other));
  unlink(other);
  CHECK(symlink("/etc/passwd", other) == 0);
  CHECK(msgq_queue_inspect(other, &info) == -ELOOP);
  CHECK(msgq_queue_remove_unused(other, 1, &info) == -ELOOP && file_exists(other));
  unlink(other);
  rmdir(dir);
  unsetenv("MSGQ_PREFIX");
}

/* How many of this process's fds refer to the file at path. */
static int fds_open_on(const char *path) {
  struct stat target, st;
  if (stat(path, &target) != 0) return 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char link[300];
    snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    if (stat(link, &st) == 0 && st.st_dev == target.st_dev && st.st_ino == target.st_ino)
      n++;
  }
  closedir(d);
  return n;
}

static void *subscribe_to_removed(void *arg) {
  msgq_subscriber *sub = arg;
  msgq_ring ring;
  int fd, r;
  while ((r = msgq_queue_open("removed", 0, 0, MSGQ_ROLE_SUBSCRIBER, &ring, &fd)) == -EAGAIN) {
  }
  if (r == 0) {
    msgq_subscriber_init(sub, &ring, false);
    msgq_queue_unlock(fd);
  }
  return NULL;
}

static void test_opener_of_a_removed_file_opens_again(void) {
  /* A subscriber that opened the path before `msgq queues --clean` unlinked it, and got
   * the lock after, must not register in the removed file (where no later publisher
   * would find it): it opens the path again and makes a fresh queue. */
  char prefix[64], path[MSGQ_MAX_PATH_LEN], dir[MSGQ_MAX_PATH_LEN];
  snprintf(prefix, sizeof prefix, "ctest_removed_%d", (int)getpid());
  setenv("MSGQ_PREFIX", prefix, 1);
  msgq_ring ring;
  int locked;
  CHECK(msgq_queue_open("removed", 4096, 0, MSGQ_ROLE_PUBLISHER, &ring, &locked) == 0);
  msgq_publisher pub;
  msgq_publisher_init(&pub, &ring);
  msgq_queue_path("removed", path, sizeof path);
  msgq_queue_dir(dir, sizeof dir);
  msgq_subscriber sub;
  memset(&sub, 0, sizeof sub);
  sub.slot = -1;
  pthread_t t;
  pthread_create(&t, NULL, subscribe_to_removed, &sub);
  while (fds_open_on(path) < 2) sched_yield(); /* it opened the file, waits for the lock */
  struct stat old;
  stat(path, &old);
  unlink(path);
  msgq_queue_unlock(locked);
  pthread_join(t, NULL);
  msgq_queue_info info;
  struct stat now;
  CHECK(stat(path, &now) == 0 && now.st_ino != old.st_ino);
  CHECK(msgq_queue_inspect(path, &info) == 0);
  CHECK(info.readers_claimed == 1 && info.publisher_pid == 0);
  CHECK(sub.slot >= 0 && sub.ring.header != ring.header);
  if (sub.slot >= 0) msgq_subscriber_release(&sub);
  msgq_queue_unmap(&sub.ring);
  msgq_publisher_release(&pub);
  msgq_queue_unmap(&ring);
  unlink(path);
  rmdir(dir);
  unsetenv("MSGQ_PREFIX");
}

/* --- threaded stress: one writer, several readers, checksummed payloads ------------- */

#define STRESS_MESSAGES 200000
#define STRESS_READERS 3

static uint32_t checksum(const uint8_t *p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

/* The in-place reader's use of a message: checks it where it lies (the intended race
 * with the writer, named in tsan.supp) and says whether it looked whole. Reads the
 * whole payload twice with a pause, so the writer gets a chance to lap it. */
__attribute__((noinline)) static bool view_looks_whole(const uint8_t *payload, uint32_t n,
                                                        uint64_t *seq) {
  uint32_t sum;
  memcpy(seq, payload, 8);
  memcpy(&sum, payload + 8, 4);
  bool whole = checksum(payload + 12, n - 12) == sum;
  for (int i = 0; i < 64; i++) os_cpu_relax();
  uint64_t again;
  memcpy(&again, payload, 8);
  return whole && again == *seq;
}

/* One message in place: 1 used whole, 0 overwritten (reported), -1 none, and counts a
 * view that was torn yet released as intact in r->torn (the bug this test hunts). */
static int view_one(msgq_subscriber *sub, stress_reader *r, uint64_t *seq) {
  const uint8_t *payload;
  uint32_t size;
  if (msgq_subscriber_peek(sub, &payload, &size) != 1) return -1;
  bool whole = size >= 12 && view_looks_whole(payload, size, seq);
  int released = msgq_subscriber_release_view(sub);
  if (released != 1) return 0;
  if (!whole) r->torn++;
  return 1;
}

static void *stress_reader_main(void *arg) {
  stress_reader *r = arg;
  msgq_subscriber sub;
  if (msgq_subscriber_init(&sub, r->ring, false) != 0) return NULL;
  atomic_store(&r->ready, 1);
  uint8_t buf[1024];
  uint64_t last = 0;
  for (;;) {
    if (r->views) {
      uint64_t seq = 0;
      int got = view_one(&sub, r, &seq);
      if (got == 0) { /* overwritten, and said so: the reader jumped forward */
        r->overwritten_views++;
        continue;
      }
      if (got < 0) {
        if (atomic_load(r->done)) break;
        msgq_subscriber_wait(&sub, 1000000);
        continue;
      }
      if (seq <= last && last != 0) r->out_of_order++;
      last = seq;
      r->received++;
      continue;
    }
    long n = receive(&sub, buf, sizeof buf);
    if (n < 0) {
      if (atomic_load(r->done)) {
        if (receive(&sub, buf, sizeof buf) < 0) break;
        continue;
      }
      msgq_subscriber_wait(&sub, 1000000);
      continue;
    }
    uint64_t seq;
    uint32_t sum;
    memcpy(&seq, buf, 8);
    memcpy(&sum, buf + 8, 4);
    if (checksum(buf + 12, (size_t)n - 12) != sum) r->torn++;
    if (seq <= last && last != 0) r->out_of_order++;
    last = seq;
    r->received++;
  }
  r->resets = (long)sub.resets;
  msgq_subscriber_release(&sub);
  return NULL;
}

/* `burst_max` 0: the writer waits for the readers every 2048 messages; else after bursts
 * of 1 to burst_max messages, so that most sends find every reader caught up and wrap
 * early (I7), and a reader that pauses right after such a wrap leans on last_wrap. */
static void threaded_stress(int burst_max) {
  test_queue q = make_queue(8192);
  _Atomic int done = 0;
  stress_reader readers[STRESS_READERS];
  pthread_t threads[STRESS_READERS];
  start_stress_readers(readers, threads, STRESS_READERS, &q.ring, &done, stress_reader_main);
  msgq_publisher pub;
  msgq_publisher_init(&pub, &q.ring);
  unsigned seed = 99;
  uint8_t msg[600];
  for (uint64_t seq = 1; seq <= STRESS_MESSAGES; seq++) {
    size_t len = 12 + (size_t)rand_r(&seed) % (sizeof msg - 12);
    for (size_t k = 12; k < len; k++) msg[k] = (uint8_t)(seq * 31 + k);
    uint32_t sum = checksum(msg + 12, len - 12);
    memcpy(msg, &seq, 8);
    memcpy(msg + 8, &sum, 4);
    CHECK(msgq_publisher_send(&pub, msg, (uint32_t)len) == 0);
    if (burst_max ? rand_r(&seed) % (unsigned)burst_max == 0 : seq % 2048 == 0) {
      wait_for_readers(&pub, 50000000); /* before the writer goes on, at most 50 ms */
    }
  }
  atomic_store(&done, 1);
  long total, overwritten;
  join_stress_readers(readers, threads, STRESS_READERS, false, &total, &overwritten);
  printf("     stress (bursts of %s): %ld messages received by %d readers (copies and views), 0 torn; "
         "%ld views reported overwritten, %llu early wraps\n",
         burst_max ? "1 to 64" : "2048", total, STRESS_READERS,
         overwritten, (unsigned long long)pub.early_wraps);
  free_queue(&q);
}

static void test_threaded_stress(void) { threaded_stress(0); }

static void test_threaded_stress_with_early_wraps(void) {
  threaded_stress(64);
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], SPIN_CHILD) == 0) {
    RUN(slow_stream_waits);
    printf("%s: %d passed, %d failed\n", SPIN_CHILD, passed, failed);
    return failed ? 1 : 0;
  }
  RUN(test_header_round_trip);
  RUN(test_header_fields_validated);
  RUN(test_capacity_rules);
  RUN(test_round_trip_and_empty_message);
  RUN(test_too_large_and_not_owner);
  RUN(test_wrap_around);
  RUN(test_overtaken_reader_is_reset);
  RUN(test_invalidation_during_copy_is_detected);
  RUN(test_one_damaged_reserve_copy_never_hides_a_tear);
  RUN(test_damaged_header_moves_live_processes);
  RUN(test_view_overwritten_is_reported);
  RUN(test_early_wrap_keeps_the_ring_warm);
  RUN(test_early_wrap_waits_for_every_reader);
  RUN(test_reader_stalled_after_an_early_wrap_keeps_a_whole_ring);
  RUN(test_damaged_last_wrap_costs_messages_never_bytes);
  RUN(test_conflate);
  RUN(test_wait_never_sleeps_unbounded);
  RUN(test_slow_stream_waits_sleep_at_once);
  RUN(test_crc32c);
  RUN(test_checksummed_queue_drops_damaged_messages);
  RUN(test_garbage_size_prefixes);
  RUN(test_random_garbage_anywhere);
  RUN(test_reader_slots_exhaust_and_free);
  RUN(test_names);
  RUN(test_queue_not_recreated_under_a_new_subscriber);
  RUN(test_inspect_reports_without_touching);
  RUN(test_inspect_damaged_headers);
  RUN(test_queue_file_inspect_and_remove);
  RUN(test_opener_of_a_removed_file_opens_again);
  RUN(test_threaded_stress);
  RUN(test_threaded_stress_with_early_wraps);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
