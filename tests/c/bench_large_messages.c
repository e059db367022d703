/* What bounds a stream of 1 MiB messages from one CPU to another: a table of messages per
 * second for msgq's ring (the real protocol) beside models of the other ways to lay the
 * bytes out, with the same two copies a Python publisher and subscriber make (the
 * publisher copies its buffer in; the subscriber copies each message out into a freshly
 * allocated buffer, as `receive()` does into a new `bytes`). The publisher stays at most
 * WINDOW messages ahead of the subscriber, as in `python -m msgq.bench`.
 *
 * Rows of the real protocol: the ring alone (a queue created with MSGQ_POOL=0) and the
 * ring with chunks (MSGQ_FLAG_POOL: 1 MiB messages go into chunks of the ring, docs/ring.md P1),
 * each twice: with the subscriber's copy, and with a subscriber that reads each message's
 * first and last bytes where it lies (the view rows of `python -m msgq.bench`: one copy).
 *
 * Models (plain memory, no protocol, so they show the bound the memory system sets):
 *   FIFO slots   the ring's access pattern: every message on the bytes written a whole
 *                ring ago (the ring `python -m msgq.bench` makes for 1 MiB: 25 MiB); the
 *                model of msgq/bench/src/cache_bound.c, which `python -m msgq.bench` runs
 *                with 4 slots as its cache bound;
 *   LIFO pool    a pool of chunks where the publisher takes the chunk freed last (the
 *                pattern of iceoryx2's sample pool): the bytes in use stay cache-warm;
 *   4 slots      a 4-message ring with a window of 2: the cache bound, not a design
 *                (a stalled reader would have two messages of buffering);
 *   2 slots      the one-copy bound of the view rows: the publisher copies each message
 *                into the slot it did not just publish, the subscriber reads the ends.
 * and two ways to copy: non-temporal stores for the publisher's copy (x86 with AVX2),
 * `rep movsb` for the subscriber's (x86).
 *
 * Built by `scons bench` (build/plain/bench_large_messages); not a test. Needs 2 CPUs:
 * the two threads are pinned to the first two this process may use. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cache_bound.h"
#include "msgq_ring.h"

#define SIZE (1u << 20)
#define WINDOW 16
#define MESSAGES 8000
#define RUNS 5
#define POOL_CHUNKS (WINDOW + 16 + 2)
#define MAX_CHUNKS 64

typedef void (*copy_fn)(void *dst, const void *src, size_t n);

static void copy_memcpy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }

#if defined(__x86_64__)
static void copy_rep_movsb(void *dst, const void *src, size_t n) {
  __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

/* Non-temporal stores: the destination's lines are written to memory without being read
 * into this CPU's cache first. `dst` must be 32-byte aligned, `n` a multiple of 128. */
__attribute__((target("avx2"))) static void copy_streaming(void *dst, const void *src,
                                                          size_t n) {
  char *d = dst;
  const char *s = src;
  for (size_t i = 0; i < n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
    __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
    __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
    _mm256_stream_si256((__m256i *)(d + i), a);
    _mm256_stream_si256((__m256i *)(d + i + 32), b);
    _mm256_stream_si256((__m256i *)(d + i + 64), c);
    _mm256_stream_si256((__m256i *)(d + i + 96), e);
  }
  _mm_sfence();
}
#endif

enum layout { RING, FIFO, LIFO };

struct run {
  enum layout layout;
  msgq_bound *model; /* FIFO rows: the cache bound's model (cache_bound.h) */
  unsigned slots, window;
  copy_fn pub_copy, sub_copy;
  /* shared between the two threads */
  _Atomic long published, consumed;
  _Atomic int chunk_of[MAX_CHUNKS]; /* LIFO: the chunk of message i % MAX_CHUNKS */
  _Atomic int freed[MAX_CHUNKS];    /* LIFO: chunks the subscriber gave back, in order */
  _Atomic long freed_count;
  uint8_t *chunks;
  uint32_t ring_flags; /* RING rows: MSGQ_FLAG_POOL or 0 */
  msgq_ring ring;
  msgq_publisher pub;
  msgq_subscriber sub;
  int cpu[2];
};

static const uint8_t *source;

static uint8_t *chunk(struct run *r, int k) { return r->chunks + (size_t)k * (SIZE + 64u); }

static void *publisher(void *arg) {
  struct run *r = arg;
  msgq_bound_pin(r->cpu[0]);
  int stack[MAX_CHUNKS], top = 0;
  long taken_back = 0;
  for (int k = (int)r->slots - 1; k >= 0; k--) stack[top++] = k;
  for (long i = 0; i < MESSAGES; i++) {
    while (i - atomic_load_explicit(&r->consumed, memory_order_acquire) >= r->window)
      msgq_bound_pause();
    if (r->layout == RING) {
      void *payload;
      if (msgq_publisher_reserve(&r->pub, SIZE, &payload) != 0) exit(3);
      r->pub_copy(payload, source, SIZE);
      if (msgq_publisher_commit(&r->pub) != 0) exit(3);
    } else {
      long freed = atomic_load_explicit(&r->freed_count, memory_order_acquire);
      for (; taken_back < freed; taken_back++)
        stack[top++] = atomic_load_explicit(&r->freed[taken_back % MAX_CHUNKS],
                                            memory_order_relaxed);
      if (top == 0) exit(4); /* the window keeps chunks free */
      int k = stack[--top];
      r->pub_copy(chunk(r, k), source, SIZE);
      atomic_store_explicit(&r->chunk_of[i % MAX_CHUNKS], k, memory_order_relaxed);
    }
    atomic_store_explicit(&r->published, i + 1, memory_order_release);
  }
  return NULL;
}

static void *subscriber(void *arg) {
  struct run *r = arg;
  msgq_bound_pin(r->cpu[1]);
  volatile uint8_t sink = 0;
  for (long i = 0; i < MESSAGES; i++) {
    while (atomic_load_explicit(&r->published, memory_order_acquire) <= i)
      msgq_bound_pause();
    uint8_t *out = malloc(SIZE + 64u); /* like the new bytes object of receive() */
    if (!out) exit(5);
    if (r->layout == RING) {
      const uint8_t *payload;
      uint32_t size;
      if (msgq_subscriber_peek(&r->sub, &payload, &size) != 1 || size != SIZE) exit(6);
      r->sub_copy(out, payload, size);
      if (msgq_subscriber_consume(&r->sub, out) != 1) exit(6); /* overwritten: a bug here */
    } else {
      int k = atomic_load_explicit(&r->chunk_of[i % MAX_CHUNKS], memory_order_relaxed);
      r->sub_copy(out, chunk(r, k), SIZE);
      long n = atomic_load_explicit(&r->freed_count, memory_order_relaxed);
      atomic_store_explicit(&r->freed[n % MAX_CHUNKS], k, memory_order_relaxed);
      atomic_store_explicit(&r->freed_count, n + 1, memory_order_release);
    }
    sink ^= out[0] ^ out[SIZE - 1];
    free(out);
    atomic_store_explicit(&r->consumed, i + 1, memory_order_release);
  }
  (void)sink;
  return NULL;
}

/* Messages per second of one run. */
static double measure(struct run *r) {
  if (r->layout == FIFO) {
    double rate = msgq_bound_rate(r->model, r->window, MESSAGES, r->cpu[0], r->cpu[1],
                                  r->pub_copy, r->sub_copy);
    if (rate < 0) exit(2);
    return rate;
  }
  atomic_store(&r->published, 0);
  atomic_store(&r->consumed, 0);
  atomic_store(&r->freed_count, 0);
  pthread_t p, s;
  double start = msgq_bound_now_s();
  if (pthread_create(&s, NULL, subscriber, r) || pthread_create(&p, NULL, publisher, r))
    exit(2);
  pthread_join(p, NULL);
  pthread_join(s, NULL);
  return MESSAGES / (msgq_bound_now_s() - start);
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The ring `python -m msgq.bench` makes for 1 MiB messages: one and a half windows,
 * rounded up to whole MiB. */
static uint32_t bench_ring_capacity(void) {
  uint64_t bytes = (uint64_t)(1.5 * WINDOW * (SIZE + 64u));
  return (uint32_t)((bytes + (1u << 20) - 1u) / (1u << 20) * (1u << 20));
}

static void open_ring(struct run *r) {
  const size_t total = MSGQ_HEADER_SIZE + bench_ring_capacity();
  void *mem = aligned_alloc(4096, total);
  if (!mem) exit(2);
  memset(mem, 0, total);
  if (msgq_ring_format(mem, total, r->ring_flags) != 0 ||
      msgq_ring_attach(&r->ring, mem, total) != 0)
    exit(2);
  msgq_publisher_init(&r->pub, &r->ring);
  if (msgq_subscriber_init(&r->sub, &r->ring, false) != 0) exit(2);
}

static void open_chunks(struct run *r) {
  r->chunks = aligned_alloc(4096, (size_t)r->slots * (SIZE + 64u));
  if (!r->chunks) exit(2);
  memset(r->chunks, 0, (size_t)r->slots * (SIZE + 64u));
}

struct row {
  char layout[48];
  const char *pub_copy, *sub_copy;
  struct run run;
  double rates[RUNS];
};

static struct row rows[12];
static int n_rows;

static void add_row(const char *layout, enum layout kind, unsigned slots, unsigned window,
                    const char *pub_name, copy_fn pub_copy, const char *sub_name,
                    copy_fn sub_copy, const int cpu[2]) {
  struct row *row = &rows[n_rows++];
  snprintf(row->layout, sizeof row->layout, "%s", layout);
  row->pub_copy = pub_name;
  row->sub_copy = sub_name;
  struct run *r = &row->run;
  r->layout = kind;
  r->slots = slots;
  r->window = window;
  r->pub_copy = pub_copy;
  r->sub_copy = sub_copy;
  r->cpu[0] = cpu[0];
  r->cpu[1] = cpu[1];
  if (kind == RING) {
    r->ring_flags = slots; /* for RING rows, `slots` carries the format flags */
    r->slots = 0;
    open_ring(r);
  } else if (kind == FIFO) {
    r->model = msgq_bound_open(SIZE, slots);
    if (!r->model) exit(2);
  } else {
    open_chunks(r);
  }
}

int main(void) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) {
    fprintf(stderr, "bench_large_messages: needs 2 CPUs\n");
    return 1;
  }
  int cpu[2], found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
    if (CPU_ISSET(c, &allowed)) cpu[found++] = c;
  uint8_t *src = aligned_alloc(64, SIZE);
  if (!src) return 2;
  for (uint32_t i = 0; i < SIZE; i++) src[i] = (uint8_t)(i * 13u);
  source = src;

  const unsigned ring_slots = bench_ring_capacity() / (SIZE + 64u);
  char name[48], ring_name[48], chunks_name[48];
  snprintf(ring_name, sizeof ring_name, "msgq ring, %u MiB", bench_ring_capacity() >> 20);
  snprintf(chunks_name, sizeof chunks_name, "msgq ring + chunks, %u MiB",
           bench_ring_capacity() >> 20);
  add_row(ring_name, RING, 0, WINDOW, "memcpy", copy_memcpy, "memcpy", copy_memcpy, cpu);
  add_row(chunks_name, RING, MSGQ_FLAG_POOL, WINDOW, "memcpy", copy_memcpy, "memcpy",
          copy_memcpy,
          cpu);
  snprintf(name, sizeof name, "model: FIFO slots, %u x 1 MiB", ring_slots);
  add_row(name, FIFO, ring_slots, WINDOW, "memcpy", copy_memcpy, "memcpy", copy_memcpy, cpu);
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2"))
    add_row(name, FIFO, ring_slots, WINDOW, "non-temporal", copy_streaming, "memcpy",
            copy_memcpy, cpu);
  add_row(name, FIFO, ring_slots, WINDOW, "memcpy", copy_memcpy, "rep movsb",
          copy_rep_movsb, cpu);
#endif
  snprintf(name, sizeof name, "model: LIFO pool, %u x 1 MiB", POOL_CHUNKS);
  add_row(name, LIFO, POOL_CHUNKS, WINDOW, "memcpy", copy_memcpy, "memcpy", copy_memcpy,
          cpu);
  add_row("model: 4 slots (cache bound)", FIFO, 4, 2, "memcpy", copy_memcpy, "memcpy",
          copy_memcpy, cpu);
  /* The view rows: the subscriber reads each message's ends where it lies (one copy). */
  add_row(ring_name, RING, 0, WINDOW, "memcpy", copy_memcpy, "read ends",
          msgq_bound_read_ends, cpu);
  add_row(chunks_name, RING, MSGQ_FLAG_POOL, WINDOW, "memcpy", copy_memcpy, "read ends",
          msgq_bound_read_ends, cpu);
  add_row("model: 2 slots (1-copy bound)", FIFO, 2, 1, "memcpy", copy_memcpy, "read ends",
          msgq_bound_read_ends, cpu);

  /* One untimed pass (pages faulted in, caches warm), then the passes in turn, every row
   * in each, so that a slower spell of the machine (a virtual machine's CPUs moved apart
   * on the host) weighs on every row alike. */
  for (int i = 0; i < n_rows; i++) measure(&rows[i].run);
  for (int pass = 0; pass < RUNS; pass++)
    for (int i = 0; i < n_rows; i++) rows[i].rates[pass] = measure(&rows[i].run);

  /* The memory's speed: one memcpy of 1 MiB between two warm buffers on one CPU. */
  uint8_t *warm = aligned_alloc(64, SIZE);
  if (!warm) return 2;
  double memcpy_rate = 0;
  for (int pass = 0; pass < RUNS; pass++) {
    double start = msgq_bound_now_s();
    for (int i = 0; i < 2000; i++) {
      memcpy(warm, source, SIZE);
      __asm__ volatile("" : : "r"(warm) : "memory");
    }
    double rate = 2000 / (msgq_bound_now_s() - start);
    if (rate > memcpy_rate) memcpy_rate = rate;
  }
  free(warm);

  printf("1 MiB messages, publisher on CPU %d, subscriber on CPU %d; median of %d runs of "
         "%d messages (each pass runs every row)\n",
         cpu[0], cpu[1], RUNS, MESSAGES);
  printf("memcpy of 1 MiB, warm buffers, one CPU (best of %d): %.2f us, %.1f k/s, %.1f GB/s\n",
         RUNS, 1e6 / memcpy_rate, memcpy_rate / 1e3, memcpy_rate * SIZE / 1e9);
  printf("%-30s  %-12s  %-10s  %6s  %7s  %8s  %7s  %7s  %6s  %8s\n", "layout", "publisher",
         "subscriber", "window", "us/msg", "k msg/s", "min k", "max k", "x ring", "x memcpy");
  double ring_rate = 0;
  for (int i = 0; i < n_rows; i++) {
    double sorted[RUNS];
    memcpy(sorted, rows[i].rates, sizeof sorted);
    qsort(sorted, RUNS, sizeof sorted[0], by_value);
    const double rate = sorted[RUNS / 2];
    if (i == 0) ring_rate = rate;
    printf("%-30s  %-12s  %-10s  %6u  %7.2f  %8.1f  %7.1f  %7.1f  %6.2f  %8.2f\n",
           rows[i].layout, rows[i].pub_copy, rows[i].sub_copy, rows[i].run.window, 1e6 / rate,
           rate / 1e3, sorted[0] / 1e3, sorted[RUNS - 1] / 1e3, rate / ring_rate,
           rate / memcpy_rate);
  }
  printf("early wraps in the msgq ring: %llu of %d sends; chunks: %llu sends, %llu into "
         "a reused chunk\n",
         (unsigned long long)rows[0].run.pub.early_wraps, (RUNS + 1) * MESSAGES,
         (unsigned long long)rows[1].run.pub.pool.sends,
         (unsigned long long)rows[1].run.pub.pool.reuses);
  return 0;
}
