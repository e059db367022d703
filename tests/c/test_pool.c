/* C unit tests of the chunks of the msgq ring (docs/ring.md, P1-P6): layout and limits,
 * a queue of small messages byte for byte the plain ring, small-message buffering never
 * below the plain ring's, LIFO reuse, readers attached before and after the first chunk,
 * lapped readers, a reader a few messages behind while the ring comes round, pinned
 * views, the ring writer coming round to chunks, damaged chunk metadata, a publisher
 * killed mid-chunk (fresh and reused), readers killed holding views, a threaded
 * stress run with copies and views, and the longer look before sleeping after a large
 * message. Prints "N passed, N failed"; run plain, under ASan
 * and TSan. */
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
/* A ring whose quarter (the reuse span of a chunk, P5) holds several chunks. */
#define LARGE_SEGMENT (8u * 1024u * 1024u)
/* A message that goes into a chunk. */
#define BIG 327680u

/* A queue in a shared anonymous mapping (so forked children share it). */
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

static uint32_t position_cycle_of(uint64_t p) { return (uint32_t)(p >> 32); }
static uint32_t position_offset_of(uint64_t p) { return (uint32_t)p; }

/* Message `seq` of `len` bytes (len >= 16, a multiple of 8): every 8-byte word holds
 * seq * 1000003 + its index, so any mix of two messages (a torn one) is seen. These are
 * the payload writes the readers' checks are about (the intended race): not instrumented
 * under TSan, which would otherwise report, and then suppress (tsan.supp), every word
 * of every message a view overlaps, its list of racy addresses growing with each: the
 * chunk stress took 10 minutes that way. */
__attribute__((noinline)) MSGQ_TEST_NO_TSAN static void fill_chunk_payload(uint8_t *msg,
                                                                           uint64_t seq,
                                                                           uint32_t len) {
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
  fill_chunk_payload(dst, seq, len);
  return msgq_publisher_commit(pub);
}

/* Whether `p`, a payload peek handed out, lies in a chunk (its record's word and prefix
 * before it, the descriptor bit on the prefix). */
static bool in_chunk(const uint8_t *p) {
  uint64_t prefix;
  memcpy(&prefix, p - 16, 8);
  return (prefix & MSGQ_POOL_DESCRIPTOR_BIT) && prefix != MSGQ_WRAP_MARKER &&
         ((uint32_t)prefix & ~MSGQ_POOL_DESCRIPTOR_BIT) > MSGQ_POOL_DESCRIPTOR_SIZE;
}

static void test_layout_and_limits(void) {
  test_queue q = make_pooled(SEGMENT), plain = make_queue_flags(SEGMENT, 0);
  const msgq_ring *r = &q.ring;
  CHECK(r->flags & MSGQ_FLAG_POOL);
  /* The ring is the whole segment, and the largest message is the plain ring's. */
  CHECK(r->capacity == SEGMENT && r->segment_size == SEGMENT);
  CHECK(msgq_ring_max_message(r) == msgq_ring_max_message(&plain.ring));
  CHECK(r->max_chunked == msgq_ring_max_message(r) - MSGQ_POOL_FRESH_OVERHEAD);
  /* Pool geometry fields of another layout are refused. */
  msgq_header *h = q.mem;
  msgq_ring other;
  h->pool_granules = 2;
  CHECK(msgq_ring_attach(&other, q.mem, q.size) == MSGQ_EGEOMETRY);
  h->pool_granules = 0;
  h->ring_capacity -= 8u;
  CHECK(msgq_ring_attach(&other, q.mem, q.size) == MSGQ_EGEOMETRY);
  h->ring_capacity += 8u;
  CHECK(msgq_ring_attach(&other, q.mem, q.size) == 0);
  /* A 1 MiB segment takes a chunk of the threshold. */
  test_queue small = make_pooled(1024u * 1024u);
  CHECK(small.ring.max_chunked >= MSGQ_POOL_THRESHOLD);
  free_queue(&small);
  free_queue(&plain);
  free_queue(&q);
}

static void test_small_messages_are_the_plain_ring(void) {
  /* A publisher that never sends a large message leaves exactly the plain ring's bytes:
   * same positions, same data, wraps at the same places. */
  test_queue q = make_pooled(SEGMENT), plain = make_queue_flags(SEGMENT, 0);
  msgq_publisher pub, pub0;
  msgq_subscriber sub, sub0;
  attach_pair(&q, &pub, &sub);
  attach_pair(&plain, &pub0, &sub0);
  static uint8_t buf[MSGQ_POOL_THRESHOLD];
  unsigned seed = 3;
  for (uint64_t seq = 1; seq <= 3000; seq++) {
    /* Up to 32 KiB, every 50th just under the threshold. */
    uint32_t len = seq % 50 == 0 ? MSGQ_POOL_THRESHOLD - 8u
                                 : 16u + 8u * ((uint32_t)rand_r(&seed) % 4096u);
    CHECK(send_seq(&pub, seq, len) == 0 && send_seq(&pub0, seq, len) == 0);
    if (seq % 7 == 0) { /* the readers keep up now and then (early wraps happen) */
      while (receive(&sub, buf, sizeof buf) >= 0) {
      }
      while (receive(&sub0, buf, sizeof buf) >= 0) {
      }
    }
  }
  CHECK(pub.write_pointer == pub0.write_pointer && pub.early_wraps == pub0.early_wraps);
  CHECK(position_cycle_of(pub.write_pointer) >= 2);
  CHECK(memcmp(q.ring.data, plain.ring.data, SEGMENT) == 0);
  CHECK(pub.pool.sends == 0);
  msgq_subscriber_release(&sub);
  msgq_subscriber_release(&sub0);
  free_queue(&q);
  free_queue(&plain);
}

/* How many messages of the mix below a reader that stops keeps: the publisher sends
 * until it would overtake the reader, then the reader reads them all. */
static long burst_kept(uint32_t flags) {
  test_queue q = make_queue_flags(SEGMENT, flags);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  static uint8_t buf[SEGMENT];
  unsigned seed = 11;
  uint64_t sent = 0;
  for (;;) {
    /* Mostly 1 KiB, every 50th a large one. */
    uint64_t seq = sent + 1u;
    uint32_t len = seq % 50 == 0 ? BIG : 1024u + 8u * ((uint32_t)rand_r(&seed) % 16u);
    uint32_t ring_bytes = len >= MSGQ_POOL_THRESHOLD && (flags & MSGQ_FLAG_POOL)
                              ? 8u + len + MSGQ_POOL_FRESH_OVERHEAD
                              : 8u + len;
    /* The next one would wrap onto the reader's first message. */
    if (position_offset_of(pub.write_pointer) + ring_bytes + 8u > SEGMENT) break;
    CHECK(send_seq(&pub, seq, len) == 0);
    sent = seq;
  }
  long n = 0, got;
  uint64_t last = 0;
  while ((got = receive(&sub, buf, sizeof buf)) >= 0) {
    uint64_t seq = whole(buf, got, (uint32_t)got);
    CHECK(seq == last + 1u);
    last = seq;
    n++;
  }
  CHECK(last == sent && sub.resets == 0);
  msgq_subscriber_release(&sub);
  free_queue(&q);
  return n;
}

static void test_stalled_reader_keeps_the_plain_rings_buffering(void) {
  /* The reason chunks live in the ring: a reader that stops keeps what the plain ring
   * kept for it (a chunk is reused only once every reader read past it), less the 32
   * bytes a fresh chunk costs per large message. A split of the segment into ring and
   * pool (layout 4: an eighth for the ring) kept a fraction of these messages. */
  long pooled = burst_kept(MSGQ_FLAG_POOL), plain = burst_kept(0);
  printf("     stalled reader: keeps %ld messages with chunks, %ld in the plain ring\n",
         pooled, plain);
  CHECK(plain > 200);
  CHECK(pooled * 1000 >= plain * 998);
}

static void test_round_trip_and_lifo_reuse(void) {
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  const uint32_t max = msgq_ring_max_message(&q.ring) & ~7u;
  const uint32_t sizes[] = {64, MSGQ_POOL_THRESHOLD - 8u, MSGQ_POOL_THRESHOLD, BIG,
                            q.ring.max_chunked, max, 256};
  uint64_t sends = 0;
  for (unsigned i = 0; i < 7; i++) {
    CHECK(send_seq(&pub, i + 1u, sizes[i]) == 0);
    const bool chunked = sizes[i] >= MSGQ_POOL_THRESHOLD && sizes[i] <= q.ring.max_chunked;
    sends += chunked;
    CHECK(pub.pool.sends == sends);
    const uint8_t *payload;
    uint32_t size;
    CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1);
    CHECK(in_chunk(payload) == chunked);
    CHECK(whole(payload, size, sizes[i]) == i + 1u);
    CHECK(msgq_subscriber_release_view(&sub) == 1);
  }
  msgq_subscriber_release(&sub);
  free_queue(&q);
  q = make_pooled(SEGMENT);
  attach_pair(&q, &pub, &sub);
  /* A reader that keeps up gets the chunk it freed last back, message after message:
   * the bytes in use stay one chunk (cache-warm). A reader attached after the first
   * chunks reads the same chunk too. */
  const uint8_t *first = NULL;
  int same = 0, later_same = 0;
  msgq_subscriber later;
  static uint8_t buf[BIG];
  for (uint64_t seq = 10; seq < 110; seq++) {
    CHECK(send_seq(&pub, seq, BIG) == 0);
    const uint8_t *payload;
    uint32_t size;
    CHECK(msgq_subscriber_peek(&sub, &payload, &size) == 1);
    if (!first) first = payload;
    same += payload == first && in_chunk(payload);
    CHECK(whole(payload, size, BIG) == seq);
    CHECK(msgq_subscriber_release_view(&sub) == 1);
    if (seq == 20) CHECK(msgq_subscriber_init(&later, &q.ring, false) == 0);
    if (seq > 20) {
      CHECK(whole(buf, receive(&later, buf, sizeof buf), BIG) == seq);
      later_same++;
    }
  }
  CHECK(same == 100 && later_same == 89);
  CHECK(pub.pool.sends == 100 && pub.pool.reuses == 99 && sub.resets == 0);
  CHECK(later.resets == 0);
  /* The ring moved by 24 bytes a message: one record and 100 descriptors. */
  CHECK(pub.write_pointer == 8u + 8u + BIG + 100u * 24u);
  msgq_subscriber_release(&later);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_reader_behind_gets_fresh_chunks(void) {
  /* A reader a few messages behind holds their chunks: the publisher writes new ones
   * and reuses the freed ones, the most recently freed first; the reader gets every
   * message whole and in order. */
  test_queue q = make_pooled(LARGE_SEGMENT); /* five chunks within its reuse span (P5) */
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  static uint8_t buf[BIG];
  uint64_t next = 1;
  for (uint64_t seq = 1; seq <= 200; seq++) {
    CHECK(send_seq(&pub, seq, BIG) == 0);
    if (seq % 4 == 0) /* reads in bursts, four behind at most */
      while (next <= seq) CHECK(whole(buf, receive(&sub, buf, sizeof buf), BIG) == next++);
  }
  CHECK(sub.resets == 0);
  CHECK(pub.pool.reuses >= 190);
  CHECK(pub.pool.free_count + pub.pool.fifo_count <= 5);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

/* A `BIG` message whose first and last words carry `seq` (the rest is left as it was):
 * cheap enough to send hundreds of thousands of. */
static int send_marked(msgq_publisher *pub, uint64_t seq) {
  uint8_t *dst;
  int r = msgq_publisher_reserve(pub, BIG, (void **)&dst);
  if (r < 0) return r;
  memcpy(dst, &seq, 8);
  memcpy(dst + BIG - 8u, &seq, 8);
  return msgq_publisher_commit(pub);
}

/* The sequence of the next message if both its marks agree and it is intact, else 0. */
static uint64_t receive_marked(msgq_subscriber *sub) {
  const uint8_t *p;
  uint32_t size;
  if (msgq_subscriber_peek(sub, &p, &size) != 1 || size != BIG) return 0;
  uint64_t head, tail;
  memcpy(&head, p, 8);
  memcpy(&tail, p + BIG - 8u, 8);
  return msgq_subscriber_consume(sub, NULL) == 1 && head == tail ? head : 0;
}

static void test_reader_a_few_behind_loses_nothing_as_the_ring_comes_round(void) {
  /* Reused chunks stay where they were written while each message adds only its
   * descriptor to the ring, so over many messages the ring writer comes round to the
   * chunks in use. A chunk is reused only while the writer is less than a quarter ring
   * past it (P5), so a reader three messages behind, far less than a ring, loses nothing
   * while the ring comes round twice; before, it lost the messages in flight in the
   * chunks the writer came round to. */
  test_queue q = make_pooled(LARGE_SEGMENT);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  const uint64_t n = 5u * LARGE_SEGMENT / 4u / (8u + MSGQ_POOL_DESCRIPTOR_SIZE);
  uint64_t next = 1, bad = 0;
  for (uint64_t seq = 1; seq <= n; seq++) {
    CHECK(send_marked(&pub, seq) == 0);
    if (seq > 3 && receive_marked(&sub) != next++) bad++;
  }
  while (next <= n)
    if (receive_marked(&sub) != next++) bad++;
  CHECK(bad == 0 && sub.resets == 0);
  CHECK(position_cycle_of(pub.write_pointer) >= 2u); /* the ring came round twice */
  CHECK(pub.pool.reuses > n * 99u / 100u);             /* and chunks were reused */
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_lapped_reader_is_reset_never_torn(void) {
  /* A reader that stops is lapped by the ring writer (the publisher never waits), and
   * what it then reads is whole and in order. */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  const uint64_t n = 3u * SEGMENT / BIG;
  for (uint64_t seq = 1; seq <= n; seq++) CHECK(send_seq(&pub, seq, BIG) == 0);
  /* The reader held every chunk until the ring writer lapped it; then they were free. */
  CHECK(pub.pool.reuses > 0 && pub.pool.reuses < n - SEGMENT / BIG + 2u);
  static uint8_t buf[BIG];
  uint64_t last = 0;
  long got, count = 0;
  while ((got = receive(&sub, buf, sizeof buf)) >= 0) {
    uint64_t seq = whole(buf, got, BIG);
    CHECK(seq > last);
    last = seq;
    count++;
  }
  CHECK(count == 0 && sub.resets >= 1); /* lapped: it jumped to the writer, as in a ring */
  for (uint64_t seq = n + 1u; seq <= n + 3u; seq++) CHECK(send_seq(&pub, seq, BIG) == 0);
  while ((got = receive(&sub, buf, sizeof buf)) >= 0) {
    uint64_t seq = whole(buf, got, BIG);
    CHECK(seq == last + 1u || (last == 0 && seq == n + 1u));
    last = seq;
    count++;
  }
  CHECK(last == n + 3u && count == 3);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_pinned_view_is_never_reused(void) {
  /* Reader a holds a view and reports (wrongly: damage) that it is past it, so the
   * publisher takes the chunk for free: the pin alone keeps it from being rewritten. */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber a;
  attach_pair(&q, &pub, &a);
  CHECK(send_seq(&pub, 1, BIG) == 0);
  const uint8_t *pa;
  uint32_t size;
  CHECK(msgq_subscriber_peek(&a, &pa, &size) == 1);
  CHECK(atomic_load(&q.ring.header->readers[a.slot].pinned_chunk) != 0);
  for (uint64_t seq = 2; seq <= 50; seq++) {
    atomic_store(&q.ring.header->readers[a.slot].read_pointer, pub.write_pointer);
    CHECK(send_seq(&pub, seq, BIG) == 0);
  }
  CHECK(pub.pool.reuses >= 40);           /* the others were reused... */
  CHECK(whole(pa, size, BIG) == 1);       /* ...never the pinned one */
  CHECK(msgq_subscriber_release_view(&a) == 1);
  CHECK(atomic_load(&q.ring.header->readers[a.slot].pinned_chunk) == 0);
  msgq_subscriber_release(&a);
  free_queue(&q);
}

static void test_ring_writer_comes_round_to_chunks(void) {
  /* Small messages walk the ring round past a chunk: the publisher forgets it, a view of
   * it reads as overwritten (as a lapped view of the ring does), and the next large
   * message gets a fresh chunk. */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber a, b;
  attach_pair(&q, &pub, &a);
  CHECK(msgq_subscriber_init(&b, &q.ring, false) == 0);
  static uint8_t buf[BIG];
  CHECK(send_seq(&pub, 1, BIG) == 0);
  CHECK(whole(buf, receive(&b, buf, sizeof buf), BIG) == 1);
  const uint8_t *pa;
  uint32_t size;
  CHECK(msgq_subscriber_peek(&a, &pa, &size) == 1); /* a holds a view of message 1 */
  for (uint64_t seq = 2; seq < 2u + SEGMENT / 4096u + 8u; seq++) {
    CHECK(send_seq(&pub, seq, 4096) == 0);
    CHECK(whole(buf, receive(&b, buf, sizeof buf), 4096) == seq);
  }
  CHECK(msgq_subscriber_release_view(&a) == 0);
  uint64_t reuses = pub.pool.reuses;
  CHECK(send_seq(&pub, 1000, BIG) == 0);
  CHECK(pub.pool.reuses == reuses && pub.pool.forgotten >= 1);
  CHECK(whole(buf, receive(&b, buf, sizeof buf), BIG) == 1000);
  /* a is a cycle behind: lapped, it jumps to the writer as in a ring, then reads on. */
  CHECK(receive(&a, buf, sizeof buf) == -1 && a.resets >= 2);
  CHECK(send_seq(&pub, 1001, BIG) == 0);
  CHECK(whole(buf, receive(&a, buf, sizeof buf), BIG) == 1001);
  CHECK(whole(buf, receive(&b, buf, sizeof buf), BIG) == 1001);
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
  CHECK(send_seq(&pub, 8, BIG) == 0); /* reused */
  CHECK(pub.pool.reuses == 1);
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
  /* Random values in chunk words, record prefixes, descriptors and pins: a reader never
   * crashes, never reads out of bounds (ASan) and never delivers a torn message. */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  static uint8_t buf[SEGMENT];
  unsigned seed = 7;
  long delivered = 0, torn = 0;
  msgq_header *h = q.ring.header;
  for (uint64_t seq = 1; seq <= 1500; seq++) {
    uint32_t len = MSGQ_POOL_THRESHOLD + 8u * ((uint32_t)rand_r(&seed) % 8192u);
    CHECK(send_seq(&pub, seq, len) == 0);
    uint64_t last = atomic_load(&h->last_message);
    uint8_t *desc = q.ring.data + (uint32_t)last;
    uint64_t prefix, chunk;
    memcpy(&prefix, desc, 8);
    memcpy(&chunk, desc + 8, 8);
    /* Message bytes are not metadata (only a checksum protects them): the descriptor
     * words are scribbled only where the newest message is a descriptor. */
    const bool is_descriptor = (prefix & MSGQ_POOL_DESCRIPTOR_BIT) != 0;
    uint8_t *record = q.ring.data + ((uint32_t)chunk % (SEGMENT - 16u) & ~7u);
    uint64_t v = ((uint64_t)rand_r(&seed) << 33) ^ (uint64_t)rand_r(&seed);
    int what = rand_r(&seed) % 8;
    switch (what) {
      case 0: /* the chunk's word */
        if (is_descriptor) memcpy(record + 8, &v, 8);
        break;
      case 1: /* the descriptor's chunk position */
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
      case 5: /* the chunk record's prefix */
        if (is_descriptor) memcpy(record, &v, 8);
        break;
      case 6: /* the descriptor names an older chunk with a plausible sequence */
        if (is_descriptor) {
          uint64_t older = chunk - 8u * ((uint64_t)rand_r(&seed) % 4096u);
          memcpy(desc + 8, &older, 8);
        }
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
  CHECK(delivered > 500); /* damage costs some messages, not the stream */
  CHECK(pub.pool.reuses > 500);
  printf("     damage: %ld of 1500 delivered whole, %llu corrupt resets\n", delivered,
         (unsigned long long)sub.corrupt_resets);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

/* A child publisher that sends `before` chunked messages (read by a reader of its own
 * when `keep_up`, so that chunks are reused), then dies writing one more. */
static void die_writing_a_chunk(test_queue *q, uint64_t before, bool keep_up) {
  pid_t child = fork();
  if (child == 0) {
    msgq_publisher pub;
    msgq_subscriber own;
    msgq_publisher_init(&pub, &q->ring);
    if (keep_up && msgq_subscriber_init(&own, &q->ring, false) != 0) _exit(2);
    static uint8_t buf[BIG];
    for (uint64_t seq = 1; seq <= before; seq++) {
      send_seq(&pub, seq, BIG);
      if (keep_up) receive(&own, buf, sizeof buf);
    }
    void *dst;
    if (msgq_publisher_reserve(&pub, BIG, &dst) == 0) memset(dst, 0xAB, 30000);
    if (keep_up && (pub.pool.reuses != before - 1u || pub.pool.reserved_fresh)) _exit(3);
    kill(getpid(), SIGKILL);
    _exit(1);
  }
  int status;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  if (!WIFSIGNALED(status)) fprintf(stderr, "child exit %d\n", WEXITSTATUS(status));
}

static void test_publisher_killed_mid_chunk(void) {
  /* A publisher dies with a fresh chunk half written: what it published before is read
   * whole, the half-written one never is, and the next publisher goes on. */
  test_queue q = make_pooled(SEGMENT);
  msgq_subscriber sub;
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  die_writing_a_chunk(&q, 3, false);
  static uint8_t buf[BIG];
  for (uint64_t seq = 1; seq <= 3; seq++)
    CHECK(whole(buf, receive(&sub, buf, sizeof buf), BIG) == seq);
  CHECK(receive(&sub, buf, sizeof buf) == -1); /* the half-written one is not there */
  msgq_publisher pub;
  msgq_publisher_init(&pub, &q.ring);
  for (uint64_t seq = 10; seq < 40; seq++) {
    CHECK(send_seq(&pub, seq, BIG) == 0);
    CHECK(whole(buf, receive(&sub, buf, sizeof buf), BIG) == seq);
  }
  CHECK(pub.pool.reuses == 29 && sub.resets == 0);
  msgq_subscriber_release(&sub);
  free_queue(&q);
  /* The same inside a reused chunk (its word left odd): a reader that joins afterwards
   * and the next publisher never see it; the next publisher's chunks are read whole. */
  q = make_pooled(SEGMENT);
  die_writing_a_chunk(&q, 5, true);
  int odd = 0;
  for (uint32_t off = 0; off + 16u <= SEGMENT; off += 8u) {
    uint64_t prefix, word;
    memcpy(&prefix, q.ring.data + off, 8);
    memcpy(&word, q.ring.data + off + 8, 8);
    if (prefix == ((8u + BIG) | MSGQ_POOL_DESCRIPTOR_BIT)) odd += (int)(word & 1u);
  }
  CHECK(odd == 1);
  msgq_publisher_sweep(&(msgq_publisher){.ring = q.ring, .pid = getpid()});
  CHECK(msgq_subscriber_init(&sub, &q.ring, false) == 0);
  CHECK(receive(&sub, buf, sizeof buf) == -1);
  msgq_publisher_init(&pub, &q.ring);
  for (uint64_t seq = 10; seq < 40; seq++) {
    CHECK(send_seq(&pub, seq, BIG) == 0);
    CHECK(whole(buf, receive(&sub, buf, sizeof buf), BIG) == seq);
  }
  CHECK(pub.pool.reuses == 29 && sub.resets == 0);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

static void test_reader_killed_holding_a_view(void) {
  /* A reader dies pinning a chunk and behind every message since: the publisher never
   * waits for it (it writes fresh chunks meanwhile), and its sweep frees the slot and
   * the pin, after which chunks are reused again. */
  test_queue q = make_pooled(SEGMENT);
  msgq_publisher pub;
  msgq_publisher_init(&pub, &q.ring);
  msgq_subscriber live;
  CHECK(msgq_subscriber_init(&live, &q.ring, false) == 0);
  CHECK(send_seq(&pub, 1, BIG) == 0);
  static uint8_t buf[BIG];
  CHECK(whole(buf, receive(&live, buf, sizeof buf), BIG) == 1);
  int status;
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
  uint64_t reuses = pub.pool.reuses;
  for (uint64_t seq = 3; seq < 6; seq++) { /* less than a ring: the dead one is not lapped */
    CHECK(send_seq(&pub, seq, BIG) == 0);
    CHECK(whole(buf, receive(&live, buf, sizeof buf), BIG) == seq);
  }
  CHECK(pub.pool.reuses == reuses); /* the dead reader is behind: fresh chunks */
  CHECK(msgq_publisher_sweep(&pub) >= 1);
  pinned = 0;
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++)
    pinned += atomic_load(&q.ring.header->readers[i].pinned_chunk) != 0;
  CHECK(pinned == 0);
  for (uint64_t seq = 100; seq < 200; seq++) {
    CHECK(send_seq(&pub, seq, BIG) == 0);
    CHECK(whole(buf, receive(&live, buf, sizeof buf), BIG) == seq);
  }
  CHECK(pub.pool.reuses >= reuses + 99);
  msgq_subscriber_release(&live);
  free_queue(&q);
}

/* --- threaded stress: pooled messages, copying and viewing readers ------------------ */

#define STRESS_MESSAGES 1500
#define STRESS_READERS 3

/* The in-place reader's use of a message (the intended race, named in tsan.supp):
 * checks it where it lies, with a pause so the writer gets a chance to lap it. */
__attribute__((noinline)) MSGQ_TEST_NO_TSAN static uint64_t view_looks_whole(const uint8_t *p,
                                                                           uint32_t n) {
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
  test_queue q = make_pooled(LARGE_SEGMENT); /* readers behind keep chunks reusable (P5) */
  _Atomic int done = 0;
  stress_reader readers[STRESS_READERS];
  pthread_t threads[STRESS_READERS];
  start_stress_readers(readers, threads, STRESS_READERS, &q.ring, &done, stress_reader_main);
  msgq_publisher pub;
  msgq_publisher_init(&pub, &q.ring);
  unsigned seed = 5;
  for (uint64_t seq = 1; seq <= STRESS_MESSAGES; seq++) {
    uint32_t len = MSGQ_POOL_THRESHOLD + 8u * ((uint32_t)rand_r(&seed) % 4096u);
    CHECK(send_seq(&pub, seq, len) == 0);
    if (rand_r(&seed) % 8 == 0) {
      wait_for_readers(&pub, 50000000);
    }
  }
  atomic_store(&done, 1);
  long total, overwritten;
  join_stress_readers(readers, threads, STRESS_READERS, true, &total, &overwritten);
  printf("     chunk stress: %ld messages received by %d readers (copies and views), 0 torn; "
         "%ld views reported overwritten; %llu of %llu sends into reused chunks\n",
         total, STRESS_READERS, overwritten, (unsigned long long)pub.pool.reuses,
         (unsigned long long)pub.pool.sends);
  CHECK(pub.pool.sends == STRESS_MESSAGES);
  free_queue(&q);
}

/* A publisher that commits a message it wrote beforehand LATE_SEND_NS after `go`
 * (busy-waiting that long, so that the message comes then whatever else runs). It says
 * `running` first: a thread's start can take longer than the wait looks (50-100 us
 * under ASan), and go must not count it. */
#define LATE_SEND_NS 25000
typedef struct {
  msgq_publisher *pub;
  _Atomic int running;
  _Atomic int go;
} late_send;

static void *commit_late(void *arg) {
  late_send *l = arg;
  atomic_store(&l->running, 1);
  while (!atomic_load(&l->go)) sched_yield();
  const int64_t start = os_monotonic_ns();
  while (os_monotonic_ns() - start < LATE_SEND_NS) {
  }
  CHECK(msgq_publisher_commit(l->pub) == 0);
  return NULL;
}

/* After a 1 MiB message a wait looks for data for about two copies of one (41 us)
 * before sleeping, not the base 10 us: the next message of a publisher of 1 MiB messages
 * comes a copy (about 20 us) later, and a sleep there cost that publisher a futex wake
 * per message (docs/ring.md, "Waiting"). A wait that found the message 25 us later
 * without sleeping leaves notify_seq as it was (a publisher bumps it only to wake a
 * sleeper, I4). Needs MSGQ_WAIT_SPIN_US unset (it fixes the budget). A busy machine
 * can delay the publisher past the budget, so some of 20 tries must show it. */
static void test_wait_after_a_large_message_looks_longer(void) {
  if (getenv("MSGQ_WAIT_SPIN_US")) {
    printf("     skipped: MSGQ_WAIT_SPIN_US is set\n");
    return;
  }
  test_queue q = make_pooled(LARGE_SEGMENT);
  msgq_publisher pub;
  msgq_subscriber sub;
  attach_pair(&q, &pub, &sub);
  const uint32_t size = 1u << 20;
  CHECK(size <= q.ring.max_chunked);
  uint64_t seq = 1;
  int spun = 0;
  for (int attempt = 0; attempt < 20 && !spun; attempt++, seq++) {
    void *dst;
    CHECK(msgq_publisher_reserve(&pub, size, &dst) == 0);
    fill_chunk_payload(dst, seq, size);
    if (seq == 1) { /* the first message: sent at once, read, so the last size is 1 MiB */
      CHECK(msgq_publisher_commit(&pub) == 0);
      const uint8_t *payload;
      uint32_t got;
      CHECK(msgq_subscriber_peek(&sub, &payload, &got) == 1 && got == size);
      CHECK(msgq_subscriber_release_view(&sub) == 1);
      continue;
    }
    atomic_store(&sub.last_wait_ns, 0); /* not a slow stream, whatever the last try took */
    late_send l = {.pub = &pub};
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, commit_late, &l) == 0);
    while (!atomic_load(&l.running)) sched_yield();
    const uint32_t notified = atomic_load(&q.ring.header->notify_seq);
    atomic_store(&l.go, 1);
    CHECK(msgq_subscriber_wait(&sub, 1000000000) == 1);
    pthread_join(thread, NULL);
    const int64_t waited = atomic_load(&sub.last_wait_ns);
    spun = atomic_load(&q.ring.header->notify_seq) == notified && waited >= 15000;
    const uint8_t *payload;
    uint32_t got;
    CHECK(msgq_subscriber_peek(&sub, &payload, &got) == 1);
    CHECK(whole(payload, got, size) == seq);
    CHECK(msgq_subscriber_release_view(&sub) == 1);
  }
  CHECK(spun);
  msgq_subscriber_release(&sub);
  free_queue(&q);
}

int main(void) {
  RUN(test_layout_and_limits);
  RUN(test_small_messages_are_the_plain_ring);
  RUN(test_stalled_reader_keeps_the_plain_rings_buffering);
  RUN(test_round_trip_and_lifo_reuse);
  RUN(test_reader_behind_gets_fresh_chunks);
  RUN(test_reader_a_few_behind_loses_nothing_as_the_ring_comes_round);
  RUN(test_lapped_reader_is_reset_never_torn);
  RUN(test_pinned_view_is_never_reused);
  RUN(test_ring_writer_comes_round_to_chunks);
  RUN(test_checksummed_pool);
  RUN(test_damaged_pool_metadata);
  RUN(test_publisher_killed_mid_chunk);
  RUN(test_reader_killed_holding_a_view);
  RUN(test_threaded_stress);
  RUN(test_wait_after_a_large_message_looks_longer);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
