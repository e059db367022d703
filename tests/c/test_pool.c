/* C unit tests of the chunk pool of the msgq ring (docs/ring.md, P1-P6): geometry and
 * header validation, LIFO reuse, lapped readers, pinned views, damaged pool metadata,
 * a publisher killed mid-chunk, readers killed holding views, and a threaded stress run
 * with copies and views. Prints "N passed, N failed"; run plain, under ASan and TSan. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "msgq_errors.h"
#include "msgq_ring.h"
#include "os_wait.h"

#include "test_support.h"

#define SEGMENT (2u * 1024u * 1024u)
/* A message the pool takes in a queue of SEGMENT bytes (beyond its ring's largest). */
#define BIG 131072u

/* A pooled queue in a shared anonymous mapping (so forked children share it). */
static test_queue make_queue_flags(uint32_t segment, uint32_t flags) {
  test_queue q;
  q.size = MSGQ_HEADER_SIZE + segment;
  q.mem = mmap(NULL, q.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (q.mem == MAP_FAILED || msgq_ring_format(q.mem, q.size, flags) != 0 ||
      msgq_ring_attach(&q.ring, q.mem, q.size) != 0) {
    fprintf(stderr, "cannot format test queue\n");
    exit(2);
  }
  return q;
}

static test_queue make_pooled(uint32_t segment) {
  return make_queue_flags(segment, MSGQ_FLAG_POOL);
}

static void free_queue(test_queue *q) { munmap(q->mem, q->size); }

/* Message `seq` of `len` bytes (len >= 16, a multiple of 8): every 8-byte word holds
 * seq * 1000003 + its index, so any mix of two messages (a torn one) is seen. */
static void fill(uint8_t *msg, uint64_t seq, uint32_t len) {
  for (uint32_t i = 0; i < len / 8u; i++) {
    uint64_t w = seq * 1000003u + i;
    memcpy(msg + 8u * i, &w, 8);
  }
}

/* The sequence of a whole message, or 0 when it is torn or has another size. */
static uint64_t whole(const uint8_t *buf, long got, uint32_t len) {
  if (got != (long)len || len < 16) return 0;
  uint64_t w0;
  memcpy(&w0, buf, 8);
  uint64_t seq = w0 / 1000003u;
  for (uint32_t i = 0; i < len / 8u; i++) {
    uint64_t w;
    memcpy(&w, buf + 8u * i, 8);
    if (w != seq * 1000003u + i) return 0;
  }
  return seq;
}

static int send_seq(msgq_publisher *pub, uint64_t seq, uint32_t len) {
  void *dst;
  int r = msgq_publisher_reserve(pub, len, &dst);
  if (r < 0) return r;
  fill(dst, seq, len);
  return msgq_publisher_commit(pub);
}

static bool in_pool(const msgq_ring *ring, const uint8_t *p) {
  return p >= ring->pool_data && p < ring->pool_data + ring->pool_size;
}

static void test_geometry_and_header(void) {
  test_queue q = make_pooled(SEGMENT);
  const msgq_ring *r = &q.ring;
  CHECK(r->flags & MSGQ_FLAG_POOL);
  CHECK(r->segment_size == SEGMENT);
  CHECK(r->capacity >= SEGMENT / 8u && r->capacity % 8u == 0);
  CHECK(r->pool_granules >= 2 && r->pool_granules <= MSGQ_POOL_MAX_GRANULES);
  /* Ring, sequence table and granules fill the segment: the file is no larger. */
  uint64_t table = ((uint64_t)r->pool_granules * 8u + 63u) & ~(uint64_t)63u;
  CHECK(r->capacity + table + r->pool_size == SEGMENT);
  CHECK(r->pool_data == (uint8_t *)r->pool_seq + table);
  /* The largest message is what the segment allowed without a pool, and two fit. */
  CHECK(msgq_ring_max_message(r) == msgq_ring_max_message_size(SEGMENT));
  CHECK(2u * (uint64_t)msgq_ring_max_message(r) <= r->pool_size);
  /* Pool fields that disagree with the one geometry are refused. */
  msgq_header *h = q.mem;
  uint32_t saved = h->pool_granules;
  h->pool_granules = saved + 1u;
  msgq_ring other;
  CHECK(msgq_ring_attach(&other, q.mem, q.size) == MSGQ_EGEOMETRY);
  h->pool_granules = saved;
  h->granule_shift += 1u;
  CHECK(msgq_ring_attach(&other, q.mem, q.size) == MSGQ_EGEOMETRY);
  h->granule_shift -= 1u;
  h->ring_capacity += 8u;
  CHECK(msgq_ring_attach(&other, q.mem, q.size) == MSGQ_EGEOMETRY);
  h->ring_capacity -= 8u;
  CHECK(msgq_ring_attach(&other, q.mem, q.size) == 0);
  h->flags &= ~MSGQ_FLAG_POOL; /* pool fields without the flag */
  CHECK(msgq_ring_attach(&other, q.mem, q.size) == MSGQ_EGEOMETRY);
  free_queue(&q);
  /* Too small for a pool: a plain ring, whatever was asked. */
  q = make_pooled(512u * 1024u);
  CHECK(!(q.ring.flags & MSGQ_FLAG_POOL) && q.ring.pool_granules == 0);
  CHECK(q.ring.capacity == 512u * 1024u);
  free_queue(&q);
}

static void test_round_trip_and_lifo_reuse(void) {
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  const uint32_t max = msgq_ring_max_message(&q.ring) & ~7u;
  /* Small inline, large in the pool, the largest in the pool. */
  /* 128 KiB is beyond this ring's largest inline message, so it goes to the pool too. */
  const uint32_t sizes[] = {64, 16384, 131072, max, 256};
  for (unsigned i = 0; i < 5; i++) {
    CHECK(send_seq(&pub, i + 1u, sizes[i]) == 0);
    const uint8_t *payload;
    uint32_t size;
    CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1);
    CHECK(in_pool(&q.ring, payload) ==
          (sizes[i] >= MSGQ_POOL_THRESHOLD || sizes[i] > q.ring.max_inline));
    CHECK(whole(payload, size, sizes[i]) == i + 1u);
    CHECK(msgq_subscriber_release_view(&sub) == 1);
  }
  CHECK(q.ring.max_inline < 131072);
  CHECK(pub.pool.sends == 2u + (16384 >= MSGQ_POOL_THRESHOLD));
  /* A message much smaller than the chunks cut so far stays inline. */
  CHECK(send_seq(&pub, 6, 65536) == 0);
  {
    const uint8_t *payload;
    uint32_t size;
    CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1);
    CHECK(!in_pool(&q.ring, payload) && whole(payload, size, 65536) == 6);
    CHECK(msgq_subscriber_release_view(&sub) == 1);
  }
  msgq_subscriber_release(&sub);
  free_queue(&q);
  q = make_pooled(SEGMENT);
  attach_pair(&q, &pub, &sub);
  /* A reader that keeps up gets the chunk it freed last back, message after message:
   * the bytes in use stay one chunk (cache-warm). */
  const uint8_t *first = NULL;
  int same = 0;
  for (uint64_t seq = 10; seq < 110; seq++) {
    CHECK(send_seq(&pub, seq, BIG) == 0);
    const uint8_t *payload;
    uint32_t size;
    CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1);
    if (!first) first = payload;
    same += payload == first && in_pool(&q.ring, payload);
    CHECK(msgq_subscriber_release_view(&sub) == 1);
  }
  CHECK(same == 100);
  CHECK(pub.pool.laps == 0 && sub.resets == 0);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_recut_keeps_messages_in_flight(void) {
  /* A stream whose messages grow re-cuts the pool; messages sent before, and not read
   * yet, are still delivered whole. */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  static uint8_t buf[SEGMENT];
  const uint32_t sizes[] = {98304, BIG, 98304, 163840, BIG, 98304};
  for (unsigned i = 0; i < 6; i++) CHECK(send_seq(&pub, i + 1u, sizes[i]) == 0);
  CHECK(pub.pool.recuts >= 2);
  for (unsigned i = 0; i < 6; i++)
    CHECK(whole(buf, receive(&sub, buf, sizeof buf), sizes[i]) == i + 1u);
  CHECK(sub.resets == 0);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_lapped_reader_is_reset_never_torn(void) {
  /* A reader that stops is lapped (the publisher never waits), and what it then reads
   * is whole and in order. */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  CHECK(send_seq(&pub, 1, BIG) == 0);
  const uint32_t chunks = pub.pool.num_chunks;
  CHECK(chunks >= 8);
  for (uint64_t seq = 2; seq <= 3u * chunks; seq++) CHECK(send_seq(&pub, seq, BIG) == 0);
  CHECK(pub.pool.laps > 0);
  static uint8_t buf[BIG];
  uint64_t last = 0;
  long got, n = 0;
  while ((got = receive(&sub, buf, sizeof buf)) >= 0) {
    uint64_t seq = whole(buf, got, BIG);
    CHECK(seq > last);
    last = seq;
    n++;
  }
  CHECK(last == 3u * chunks);
  CHECK(n >= 1 && n <= (long)chunks);
  CHECK(sub.resets >= 1);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_pinned_view_is_not_lapped(void) {
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber a, b;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&a, &q.ring, false) == 0);
  CHECK(msgq_subscriber_init(&b, &q.ring, false) == 0);
  const uint32_t len = BIG;
  CHECK(send_seq(&pub, 1, len) == 0);
  const uint8_t *pa;
  uint32_t size;
  CHECK(msgq_subscriber_peek(&a, &pa, &size) == 1); /* a holds a view of message 1 */
  CHECK(atomic_load(&q.ring.header->readers[a.slot].pinned_chunk) != 0);
  /* b keeps reading, so the pool turns over many times past a's pinned chunk. */
  static uint8_t buf[BIG];
  CHECK(whole(buf, receive(&b, buf, sizeof buf), len) == 1);
  for (uint64_t seq = 2; seq <= 10u * pub.pool.num_chunks; seq++) {
    CHECK(send_seq(&pub, seq, len) == 0);
    long got = receive(&b, buf, sizeof buf);
    if (whole(buf, got, len) != seq) {
      fprintf(stderr, "seq %llu got %ld whole %llu resets %llu laps %llu chunks %u\n", (unsigned long long)seq, got, (unsigned long long)whole(buf, got, len), (unsigned long long)b.resets, (unsigned long long)pub.pool.laps, pub.pool.num_chunks);
      CHECK(0);
      break;
    }
  }
  CHECK(pub.pool.laps > 0); /* a is behind: the others were taken back... */
  CHECK(whole(pa, size, len) == 1); /* ...but never the one a pins */
  CHECK(msgq_subscriber_release_view(&a) == 1);
  CHECK(atomic_load(&q.ring.header->readers[a.slot].pinned_chunk) == 0);
  msgq_subscriber_release(&a);
  msgq_subscriber_release(&b);
  free_queue(&q);
}

static void test_every_chunk_pinned_never_blocks(void) {
  /* Messages so large that the pool holds two chunks; two readers pin both. The
   * publisher still sends (taking the oldest back): that view reads as overwritten,
   * exactly as a lapped view of the ring does, and the other one stays whole. */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber a, b;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(msgq_subscriber_init(&a, &q.ring, false) == 0);
  CHECK(msgq_subscriber_init(&b, &q.ring, false) == 0);
  const uint32_t len = msgq_ring_max_message(&q.ring) & ~7u;
  static uint8_t buf[SEGMENT];
  CHECK(send_seq(&pub, 1, len) == 0);
  CHECK(pub.pool.num_chunks == 2);
  CHECK(whole(buf, receive(&b, buf, sizeof buf), len) == 1);
  CHECK(send_seq(&pub, 2, len) == 0);
  const uint8_t *pa, *pb;
  uint32_t sa, sb;
  CHECK(msgq_subscriber_peek(&a, &pa, &sa) == 1); /* message 1 */
  CHECK(msgq_subscriber_peek(&b, &pb, &sb) == 1); /* message 2 */
  CHECK(pa != pb);
  CHECK(send_seq(&pub, 3, len) == 0); /* never waits */
  int ra = msgq_subscriber_release_view(&a), rb = msgq_subscriber_release_view(&b);
  CHECK(ra + rb == 1); /* exactly one chunk was taken back */
  msgq_subscriber_release(&a);
  msgq_subscriber_release(&b);
  free_queue(&q);
}

static void test_checksummed_pool(void) {
  test_queue q = make_queue_flags(SEGMENT, MSGQ_FLAG_POOL | MSGQ_FLAG_CHECKSUM);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  static uint8_t buf[BIG];
  CHECK(send_seq(&pub, 7, BIG) == 0);
  CHECK(whole(buf, receive(&sub, buf, sizeof buf), BIG) == 7);
  CHECK(send_seq(&pub, 8, BIG) == 0);
  const uint8_t *p;
  uint32_t n;
  CHECK(msgq_subscriber_peek(&sub, &p, &n) == 1);
  ((uint8_t *)p)[100] ^= 1; /* a hostile write into the chunk */
  CHECK(msgq_subscriber_release_view(&sub) == MSGQ_ECHECKSUM);
  CHECK(sub.checksum_errors == 1);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_damaged_pool_metadata(void) {
  /* Random values in the sequence table, the descriptors in the ring, the pins and the
   * pool header fields' copies: a reader never crashes, never reads out of bounds
   * (ASan) and never delivers a torn message. */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  static uint8_t buf[SEGMENT];
  unsigned seed = 7;
  long delivered = 0, torn = 0;
  msgq_header *h = q.ring.header;
  for (uint64_t seq = 1; seq <= 3000; seq++) {
    uint32_t len = 98304u + 8u * ((uint32_t)rand_r(&seed) % 8192u);
    CHECK(send_seq(&pub, seq, len) == 0);
    uint64_t last = atomic_load(&h->last_message);
    uint8_t *desc = q.ring.data + (uint32_t)last;
    uint64_t prefix;
    memcpy(&prefix, desc, 8);
    /* Message bytes are not metadata (only a checksum protects them): the descriptor
     * words are scribbled only where the newest message is a descriptor. */
    const bool is_descriptor = (prefix & MSGQ_POOL_DESCRIPTOR_BIT) != 0;
    uint64_t v = ((uint64_t)rand_r(&seed) << 33) ^ (uint64_t)rand_r(&seed);
    int what = rand_r(&seed) % 6;
    switch (what) {
      case 0: /* a sequence word */
        atomic_store(&q.ring.pool_seq[(uint32_t)rand_r(&seed) % q.ring.pool_granules], v);
        break;
      case 1: /* the descriptor's granule and size */
        if (is_descriptor) memcpy(desc + 8, &v, 8);
        break;
      case 2: /* the descriptor's sequence */
        if (is_descriptor) memcpy(desc + 16, &v, 8);
        break;
      case 3: /* the prefix: a descriptor bit on an inline message or garbage size */
        memcpy(desc, &v, 8);
        break;
      case 4: /* a pin */
        atomic_store(&h->readers[rand_r(&seed) % MSGQ_READER_SLOTS].pinned_chunk,
                     (uint32_t)v);
        break;
      default:
        break;
    }
    long got = receive(&sub, buf, sizeof buf);
    if (got >= 0) {
      delivered++;
      if (whole(buf, got, (uint32_t)got) == 0) {
        torn++;
        fprintf(stderr, "torn after damage %d: got %ld of %u (seq %llu)\n", what, got, len,
                (unsigned long long)seq);
      }
    }
  }
  CHECK(torn == 0);
  CHECK(delivered > 1000); /* damage costs some messages, not the stream */
  printf("     damage: %ld of 3000 delivered whole, %llu corrupt resets\n", delivered,
         (unsigned long long)sub.corrupt_resets);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_publisher_killed_mid_chunk(void) {
  /* A publisher dies with a chunk half written; the next one takes over: what was
   * published before is read whole, the half-written chunk never is, and every chunk
   * is handed out again (nothing leaks). */
  test_queue q = make_pooled(SEGMENT);
  msgq_subscriber sub;
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  pid_t child = fork();
  if (child == 0) {
    msgq_publisher pub;
    msgq_publisher_init(&pub, &q.ring);
    for (uint64_t seq = 1; seq <= 3; seq++) send_seq(&pub, seq, BIG);
    void *dst;
    if (msgq_publisher_reserve(&pub, BIG, &dst) == 0) memset(dst, 0xAB, 30000);
    kill(getpid(), SIGKILL);
    _exit(1);
  }
  int status;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  static uint8_t buf[BIG];
  for (uint64_t seq = 1; seq <= 3; seq++)
    CHECK(whole(buf, receive(&sub, buf, sizeof buf), BIG) == seq);
  CHECK(receive(&sub, buf, sizeof buf) == -1); /* the half-written one is not there */
  /* One chunk's granules carry an odd word: the dead publisher was writing there. */
  int odd = 0;
  for (uint32_t g = 0; g < q.ring.pool_granules; g++) odd += atomic_load(&q.ring.pool_seq[g]) & 1u;
  CHECK(odd == (int)(BIG >> q.ring.granule_shift));
  msgq_publisher pub;
  msgq_publisher_init(&pub, &q.ring);
  CHECK(send_seq(&pub, 10, BIG) == 0);
  CHECK(whole(buf, receive(&sub, buf, sizeof buf), BIG) == 10);
  /* Every chunk is used again: a reader that stops sees the whole pool turn over. */
  const uint8_t *seen[MSGQ_POOL_MAX_CHUNKS];
  uint32_t distinct = 0;
  for (uint64_t seq = 11; seq < 11u + pub.pool.num_chunks; seq++) {
    CHECK(send_seq(&pub, seq, BIG) == 0);
  }
  const uint8_t *p;
  uint32_t n;
  while (msgq_subscriber_peek(&sub, &p, &n) == 1) {
    bool is_new = true;
    for (uint32_t i = 0; i < distinct; i++) is_new &= seen[i] != p;
    if (is_new && distinct < MSGQ_POOL_MAX_CHUNKS) seen[distinct++] = p;
    CHECK(msgq_subscriber_release_view(&sub) == 1);
  }
  CHECK(distinct == pub.pool.num_chunks);
  odd = 0;
  for (uint32_t g = 0; g < q.ring.pool_granules; g++) odd += atomic_load(&q.ring.pool_seq[g]) & 1u;
  CHECK(odd == 0); /* every chunk written again, the dead write's too */
  CHECK(pub.pool.free_count + pub.pool.fifo_count == pub.pool.num_chunks);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_reader_killed_holding_a_view(void) {
  /* A reader dies pinning a chunk and behind every message since: the publisher never
   * waits for it, and its sweep frees the slot and the pin, after which a reader that
   * keeps up gets the most recently freed chunk again (no laps). */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_publisher_init(&pub, &q.ring);
  msgq_subscriber live;
  CHECK(msgq_subscriber_init(&live, &q.ring, false) == 0);
  CHECK(send_seq(&pub, 1, BIG) == 0);
  static uint8_t buf[BIG];
  CHECK(whole(buf, receive(&live, buf, sizeof buf), BIG) == 1);
  int status;
  /* A child that pins a message and is killed while holding the view. */
  int pipefd[2];
  CHECK(pipe(pipefd) == 0);
  pid_t child = fork();
  if (child == 0) {
    msgq_subscriber sub;
    if (msgq_subscriber_init(&sub, &q.ring, false) != 0) _exit(2);
    if (write(pipefd[1], "r", 1) != 1) _exit(2);
    const uint8_t *p;
    uint32_t n;
    while (msgq_subscriber_peek(&sub, &p, &n) != 1) sched_yield();
    if (write(pipefd[1], "v", 1) != 1) _exit(2);
    for (;;) pause();
  }
  char c;
  CHECK(read(pipefd[0], &c, 1) == 1 && c == 'r');
  CHECK(send_seq(&pub, 2, BIG) == 0);
  CHECK(read(pipefd[0], &c, 1) == 1 && c == 'v');
  CHECK(whole(buf, receive(&live, buf, sizeof buf), BIG) == 2);
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  close(pipefd[0]);
  close(pipefd[1]);
  int pinned = 0;
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++)
    pinned += atomic_load(&q.ring.header->readers[i].pinned_chunk) != 0;
  CHECK(pinned == 1);
  /* The dead reader is behind: sends lap rather than wait. */
  for (uint64_t seq = 3; seq < 3u + 2u * pub.pool.num_chunks; seq++) {
    CHECK(send_seq(&pub, seq, BIG) == 0);
    CHECK(whole(buf, receive(&live, buf, sizeof buf), BIG) == seq);
  }
  CHECK(pub.pool.laps > 0);
  CHECK(msgq_publisher_sweep(&pub) >= 1);
  pinned = 0;
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++)
    pinned += atomic_load(&q.ring.header->readers[i].pinned_chunk) != 0;
  CHECK(pinned == 0);
  uint64_t laps = pub.pool.laps;
  for (uint64_t seq = 100; seq < 200; seq++) {
    CHECK(send_seq(&pub, seq, BIG) == 0);
    CHECK(whole(buf, receive(&live, buf, sizeof buf), BIG) == seq);
  }
  CHECK(pub.pool.laps == laps);
  msgq_subscriber_release(&live);
  free_queue(&q);
}

/* --- threaded stress: pooled messages, copying and viewing readers ------------------ */

#if defined(__SANITIZE_THREAD__)
#define STRESS_MESSAGES 600 /* every access is instrumented: keep the run to seconds */
#else
#define STRESS_MESSAGES 3000
#endif
#define STRESS_READERS 3

/* The in-place reader's use of a message (the intended race, named in tsan.supp):
 * checks it where it lies, with a pause so the writer gets a chance to lap it. */
__attribute__((noinline)) static uint64_t view_looks_whole(const uint8_t *p, uint32_t n) {
  uint64_t seq = whole(p, n, n);
  for (int i = 0; i < 256; i++) os_cpu_relax();
  return seq && whole(p, n, n) == seq ? seq : 0;
}

static void *stress_reader_main(void *arg) {
  stress_reader *r = arg;
  msgq_subscriber sub;
  if (msgq_subscriber_init(&sub, r->ring, false) != 0) return NULL;
  atomic_store(&r->ready, 1);
  uint8_t *buf = malloc(BIG);
  uint64_t last = 0;
  for (;;) {
    uint64_t seq = 0;
    if (r->views) {
      const uint8_t *p;
      uint32_t n;
      if (msgq_subscriber_peek(&sub, &p, &n) != 1) {
        if (atomic_load(r->done)) break;
        msgq_subscriber_wait(&sub, 1000000);
        continue;
      }
      seq = view_looks_whole(p, n);
      if (msgq_subscriber_release_view(&sub) != 1) {
        r->overwritten_views++;
        continue;
      }
      if (seq == 0) r->torn++;
    } else {
      long n = receive(&sub, buf, BIG);
      if (n < 0) {
        if (atomic_load(r->done)) {
          if (receive(&sub, buf, BIG) < 0) break;
          continue;
        }
        msgq_subscriber_wait(&sub, 1000000);
        continue;
      }
      seq = whole(buf, n, (uint32_t)n);
      if (seq == 0) r->torn++;
    }
    if (seq && seq <= last) r->out_of_order++;
    if (seq) last = seq;
    r->received++;
  }
  free(buf);
  r->resets = (long)sub.resets;
  msgq_subscriber_release(&sub);
  return NULL;
}

static void test_threaded_stress(void) {
  test_queue q = make_pooled(SEGMENT);
  _Atomic int done = 0;
  stress_reader readers[STRESS_READERS];
  pthread_t threads[STRESS_READERS];
  start_stress_readers(readers, threads, STRESS_READERS, &q.ring, &done, stress_reader_main);
  msgq_publisher pub;
  msgq_publisher_init(&pub, &q.ring);
  unsigned seed = 5;
  for (uint64_t seq = 1; seq <= STRESS_MESSAGES; seq++) {
    uint32_t len = 98304u + 8u * ((uint32_t)rand_r(&seed) % 4096u);
    CHECK(send_seq(&pub, seq, len) == 0);
    if (rand_r(&seed) % 64 == 0) {
      wait_for_readers(&pub, 50000000);
    }
  }
  atomic_store(&done, 1);
  long total, overwritten;
  join_stress_readers(readers, threads, STRESS_READERS, true, &total, &overwritten);
  printf("     pool stress: %ld messages received by %d readers (copies and views), 0 torn; "
         "%ld views reported overwritten, %llu chunks taken from behind readers\n",
         total, STRESS_READERS, overwritten, (unsigned long long)pub.pool.laps);
  free_queue(&q);
}

int main(void) {
  RUN(test_geometry_and_header);
  RUN(test_round_trip_and_lifo_reuse);
  RUN(test_recut_keeps_messages_in_flight);
  RUN(test_lapped_reader_is_reset_never_torn);
  RUN(test_pinned_view_is_not_lapped);
  RUN(test_every_chunk_pinned_never_blocks);
  RUN(test_checksummed_pool);
  RUN(test_damaged_pool_metadata);
  RUN(test_publisher_killed_mid_chunk);
  RUN(test_reader_killed_holding_a_view);
  RUN(test_threaded_stress);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
