#define _GNU_SOURCE
#include "msgq_ring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "msgq_errors.h"
#include "os_wait.h"

_Static_assert(sizeof(msgq_reader_slot) == MSGQ_CACHE_LINE, "reader slot is one line");
_Static_assert(sizeof(msgq_header) == MSGQ_CACHE_LINE * (3 + MSGQ_READER_SLOTS),
               "header layout");
_Static_assert(MSGQ_READER_SLOTS <= 64, "waiting_readers is a 64-bit mask");
_Static_assert(MSGQ_POOL_THRESHOLD > 8u + MSGQ_POOL_DESCRIPTOR_SIZE,
               "a chunk record is larger than a descriptor");

/* Before a subscriber sleeps on the futex it looks for data a little longer, because a
 * futex sleep and wake costs tens of microseconds on a virtual machine:
 *  - busy-polling with a pause hint, for MSGQ_SPIN_NS, only when this process may run on
 *    more than one CPU (on one CPU the publisher cannot run while we spin);
 *  - then yielding the CPU (sched_yield) until MSGQ_YIELD_NS have passed: a runnable
 *    publisher gets the CPU at once, and with nothing else to run the wait stays cheap.
 * Past that the subscriber sleeps. The budget bounds the CPU an idle subscriber burns per
 * wait; MSGQ_WAIT_SPIN_US in the environment overrides the total (0: sleep at once).
 * The look is only worth it on a stream whose data comes within the budget: a wait whose
 * last one (on any of its queues) took MSGQ_SLOW_WAITS budgets or longer sleeps at once.
 * A 100 Hz control loop then spends no budget per tick (15 us of its ~200 measured), and
 * a stream that speeds up spins again after one wait, since a sleep adds only the
 * wake-up's tens of microseconds to the time measured.
 * After a large message the default budget grows to MSGQ_SPIN_NS_PER_KIB per KiB of it
 * (at most the slow-stream threshold): a publisher of such messages needs a copy of one
 * (about 20 us a MiB here) between two sends, so the next one comes after about that
 * long, which the 10 us budget missed at 1 MiB: the subscriber slept, woke to a backlog
 * and held the publisher back (view rows of 1 MiB at 0.72-0.76 of the one-copy bound,
 * 0.94-0.95 without the sleeps; docs/ring.md "Waiting"). A slow stream of large
 * messages (a camera at 20 Hz) still sleeps at once: the threshold is the base budget's. */
#define MSGQ_SPIN_NS 2000
#define MSGQ_SLOW_WAITS 10
/* Two copies of a KiB at about 50 GB/s (a 1 MiB message: 41 us). */
#define MSGQ_SPIN_NS_PER_KIB 40
/* Longest single futex sleep of a wait (see msgq_poll). */
#define MSGQ_MAX_SLEEP_NS 100000000LL
#define MSGQ_YIELD_NS 10000

static inline uint32_t position_cycle(uint64_t p) { return (uint32_t)(p >> 32); }
static inline uint32_t position_offset(uint64_t p) { return (uint32_t)p; }
static inline uint64_t make_position(uint32_t cycle, uint32_t offset) {
  return ((uint64_t)cycle << 32) | offset;
}
static inline uint64_t align8(uint64_t n) { return (n + 7u) & ~(uint64_t)7u; }

/* Message prefixes are 8-byte fields in host order (the ring is only shared on one
 * machine), read and written with memcpy (offsets are 8-aligned anyway): the payload
 * size in the low 32 bits, its CRC32C (checksummed queues) in the high 32 bits. */
#if defined(__SANITIZE_THREAD__)
/* Functions of their own under TSan, so that tests/c/tsan.supp can name exactly these
 * accesses: the load races with the publisher by design and is checked by region_intact;
 * the store writes ring bytes (prefixes, chunk descriptors) that a lapped reader may be
 * copying, which that reader's region_intact check then discards. When TSan cannot
 * restore the reader's stack (a long stress run overflows its history), only the
 * writer's side can say which race it is. */
#define PREFIX_LOAD_FUNCTION __attribute__((noinline)) static
#define PREFIX_STORE_FUNCTION __attribute__((noinline)) static
#else
#define PREFIX_LOAD_FUNCTION static inline
#define PREFIX_STORE_FUNCTION static inline
#endif
PREFIX_LOAD_FUNCTION uint64_t load_prefix(const uint8_t *at) {
  uint64_t v;
  memcpy(&v, at, sizeof v);
  return v;
}
PREFIX_STORE_FUNCTION void store_prefix(uint8_t *at, uint64_t v) { memcpy(at, &v, sizeof v); }

/* --- Segment ---------------------------------------------------------------------- */

int64_t msgq_ring_capacity_for(uint64_t segment_size) {
  if (segment_size < MSGQ_MIN_SEGMENT_SIZE || segment_size > MSGQ_MAX_SEGMENT_SIZE)
    return MSGQ_EBADSIZE;
  return (int64_t)align8(segment_size);
}

uint32_t msgq_ring_max_message_size(uint32_t capacity) {
  /* A message with its prefix may take a third of the ring less the 8 reserved bytes. */
  uint64_t per_message = ((uint64_t)capacity - 8u) / 3u;
  per_message &= ~(uint64_t)7u;
  return per_message >= 8u ? (uint32_t)(per_message - 8u) : 0u;
}

uint32_t msgq_ring_max_message(const msgq_ring *ring) { return ring->max_message; }

/* A publisher identity that differs between publishers, also within one process. */
static uint64_t random_token(void) {
  static _Atomic uint64_t counter = 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t t = (uint64_t)os_monotonic_ns() ^ ((uint64_t)getpid() << 40) ^
               ((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ULL) ^
               ((atomic_fetch_add(&counter, 1) + 1) * 0xBF58476D1CE4E5B9ULL);
  return t == 0 ? 1 : t;
}

int msgq_ring_format(void *mem, size_t size, uint32_t flags) {
  if (size < (size_t)MSGQ_HEADER_SIZE + MSGQ_MIN_SEGMENT_SIZE) return MSGQ_EBADSIZE;
  uint64_t capacity = size - MSGQ_HEADER_SIZE;
  if (capacity > MSGQ_MAX_SEGMENT_SIZE || capacity % 8u != 0) return MSGQ_EBADSIZE;
  if (flags & ~MSGQ_KNOWN_FLAGS) return MSGQ_EBADSIZE;
  msgq_header *h = mem;
  memset(h, 0, sizeof *h);
  h->layout_version = MSGQ_LAYOUT_VERSION;
  h->header_size = MSGQ_HEADER_SIZE;
  h->total_size = size;
  h->capacity = (uint32_t)capacity;
  h->num_reader_slots = MSGQ_READER_SLOTS;
  h->created_ns = (uint64_t)os_monotonic_ns();
  h->creator_pid = (int32_t)getpid();
  h->ring_capacity = (uint32_t)capacity; /* chunks live in the ring (P1) */
  h->flags = flags;
  /* I2: the complement of write_reserve 0. */
  atomic_store_explicit(&h->write_reserve_check, ~(uint64_t)0, memory_order_relaxed);
  /* release: an opener that sees the magic sees the whole header above. */
  atomic_store_explicit(&h->magic, MSGQ_MAGIC, memory_order_release);
  return 0;
}

/* Checks the immutable header of a mapping of `size` bytes against this build and the
 * size, reading nothing past `size`. Shared by attach and inspect, so both judge a file
 * the same way. */
static int validate_header(const msgq_header *h, size_t size) {
  if (size < sizeof(uint64_t)) return MSGQ_EBADMAGIC;
  /* acquire: pairs with the release store of magic in format; the fields below were
   * written before it. */
  if (atomic_load_explicit(&h->magic, memory_order_acquire) != MSGQ_MAGIC)
    return MSGQ_EBADMAGIC;
  if (size < offsetof(msgq_header, layout_version) + sizeof(uint32_t))
    return MSGQ_EGEOMETRY;
  if (h->layout_version != MSGQ_LAYOUT_VERSION) return MSGQ_EVERSION;
  if (size < MSGQ_HEADER_SIZE) return MSGQ_EGEOMETRY;
  if (h->header_size != MSGQ_HEADER_SIZE || h->num_reader_slots != MSGQ_READER_SLOTS)
    return MSGQ_EGEOMETRY;
  if (h->total_size != size || (uint64_t)h->header_size + h->capacity != size)
    return MSGQ_EGEOMETRY;
  if (h->capacity < MSGQ_MIN_SEGMENT_SIZE || h->capacity % 8u != 0) return MSGQ_EGEOMETRY;
  if (h->flags & ~MSGQ_KNOWN_FLAGS) return MSGQ_EGEOMETRY;
  if (h->ring_capacity != h->capacity || h->pool_granules || h->granule_shift)
    return MSGQ_EGEOMETRY;
  return 0;
}

void msgq_ring_mark_superseded(msgq_header *h) {
  atomic_store_explicit(&h->superseded, 1u, memory_order_seq_cst);
  atomic_fetch_add_explicit(&h->notify_seq, 1u, memory_order_release);
  os_wake_all(&h->notify_seq);
}

/* Whether the file behind this mapping is to be left for the endpoint's new one (I6):
 * marked superseded, or its immutable header damaged since we attached (then we mark it,
 * for the other processes on it). */
static bool ring_superseded(const msgq_ring *ring) {
  if (atomic_load_explicit(&ring->header->superseded, memory_order_relaxed)) return true;
  if (validate_header(ring->header, ring->map_size) == 0) return false;
  msgq_ring_mark_superseded(ring->header);
  return true;
}

int msgq_ring_attach(msgq_ring *ring, void *mem, size_t size) {
  memset(ring, 0, sizeof *ring);
  msgq_header *h = mem;
  int r = validate_header(h, size);
  if (r < 0) return r;
  ring->header = h;
  ring->data = (uint8_t *)mem + h->header_size;
  ring->capacity = h->capacity;
  ring->flags = h->flags;
  ring->map_size = size;
  ring->segment_size = h->capacity;
  ring->max_message = msgq_ring_max_message_size(h->capacity);
  /* A fresh chunk (record and descriptor) stays within the third a message may take. */
  ring->max_chunked = ring->max_message > MSGQ_POOL_FRESH_OVERHEAD
                          ? (ring->max_message - MSGQ_POOL_FRESH_OVERHEAD) & ~7u
                          : 0u;
  return 0;
}

int msgq_ring_live_readers(const msgq_ring *ring) {
  const msgq_header *h = ring->header;
  int live = 0;
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    int32_t pid = atomic_load_explicit(&h->readers[i].owner_pid, memory_order_relaxed);
    if (pid > 0 && os_process_alive(pid)) live++;
  }
  return live;
}

int msgq_ring_inspect(const void *mem, size_t size, msgq_queue_info *out) {
  memset(out, 0, sizeof *out);
  out->file_size = size;
  const msgq_header *h = mem;
  if (size >= sizeof(uint64_t))
    out->magic = atomic_load_explicit(&h->magic, memory_order_acquire);
  if (out->magic == MSGQ_MAGIC &&
      size >= offsetof(msgq_header, layout_version) + sizeof(uint32_t))
    out->layout_version = h->layout_version;
  out->status = validate_header(h, size);
  out->unfinished = out->status == MSGQ_EBADMAGIC &&
                    (size == 0 || (size >= sizeof(uint64_t) && out->magic == 0));
  if (out->status < 0) return out->status;
  out->capacity = h->capacity;
  out->created_ns = h->created_ns;
  out->creator_pid = h->creator_pid;
  out->flags = h->flags;
  /* The mutable fields are a snapshot: each load is atomic, together they are not (the
   * queue keeps running). Relaxed loads suffice for a report; nothing is dereferenced. */
  out->write_pointer = atomic_load_explicit(&h->write_pointer, memory_order_relaxed);
  out->superseded = atomic_load_explicit(&h->superseded, memory_order_relaxed) != 0;
  out->publisher_pid = atomic_load_explicit(&h->publisher_pid, memory_order_relaxed);
  out->publisher_alive = out->publisher_pid > 0 && os_process_alive(out->publisher_pid);
  out->num_waiters = (uint32_t)__builtin_popcountll(
      atomic_load_explicit(&h->waiting_readers, memory_order_relaxed));
  out->wakes = atomic_load_explicit(&h->notify_seq, memory_order_relaxed);
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    int32_t pid = atomic_load_explicit(&h->readers[i].owner_pid, memory_order_relaxed);
    if (pid <= 0) continue;
    out->reader_pids[i] = pid;
    out->readers_claimed++;
    out->reader_alive[i] = (uint8_t)os_process_alive(pid);
    out->readers_live += out->reader_alive[i];
  }
  return 0;
}

/* --- Publisher -------------------------------------------------------------------- */

/* Whether position a is before b (cycle-aware: positions are compared by their
 * distance, so a 32-bit cycle count that wraps keeps its order). */
static inline bool position_before(uint64_t a, uint64_t b) { return (int64_t)(a - b) < 0; }

/* A position this ring can hold: 8-aligned and leaving room for the wrap marker. */
static inline bool position_in_range(uint64_t p, uint32_t capacity) {
  return position_offset(p) <= capacity - 8u && position_offset(p) % 8u == 0;
}

/* Stores write_reserve and its complement (I2); the caller's fence orders them. */
static inline void store_reserve(msgq_header *h, uint64_t reserve, memory_order order) {
  atomic_store_explicit(&h->write_reserve, reserve, order);
  atomic_store_explicit(&h->write_reserve_check, ~reserve, order);
}

/* write_reserve as everyone reads it: the later of its two copies (I2). While the
 * publisher is between its two stores, the later is the new value; a write into one copy
 * can only make the result later, which costs readers messages, never an overwritten
 * message. */
static inline uint64_t load_reserve(const msgq_header *h, memory_order order) {
  uint64_t reserve = atomic_load_explicit(&h->write_reserve, order);
  uint64_t check = ~atomic_load_explicit(&h->write_reserve_check, order);
  return position_before(reserve, check) ? check : reserve;
}

void msgq_publisher_init(msgq_publisher *pub, const msgq_ring *ring) {
  memset(pub, 0, sizeof *pub);
  pub->ring = *ring;
  pub->token = random_token();
  pub->pid = (int32_t)getpid();
  msgq_header *h = ring->header;
  atomic_store_explicit(&h->publisher_pid, pub->pid, memory_order_relaxed);
  atomic_store_explicit(&h->publisher_token, pub->token, memory_order_seq_cst);
  uint64_t wp = atomic_load_explicit(&h->write_pointer, memory_order_acquire);
  uint64_t reserve = load_reserve(h, memory_order_acquire);
  /* A send left half-done by a dead publisher (or an abandoned reservation) leaves
   * write_reserve ahead of write_pointer: we go on from write_pointer (nothing past it
   * was published) and never announce less than that reserve, so readers still judge
   * the bytes it may have overwritten as overwritten (I2, I3). Values no publisher can
   * have left (out of range, reserve behind wp or more than a cycle ahead) come from a
   * hostile writer: restart two cycles past both, so that every reader is at least two
   * cycles behind (never intact) and jumps forward instead of misreading. */
  pub->reserve_high = wp;
  if (reserve != wp) {
    bool sane = position_in_range(wp, ring->capacity) &&
                position_offset(reserve) <= ring->capacity &&
                !position_before(reserve, wp) && reserve - wp <= ((uint64_t)2 << 32);
    if (sane) {
      pub->reserve_high = reserve;
    } else {
      uint32_t cycle = position_cycle(wp);
      if ((uint32_t)(position_cycle(reserve) - cycle) < 0x80000000u)
        cycle = position_cycle(reserve);
      wp = make_position(cycle + 2u, 0);
      pub->reserve_high = wp;
      /* The reserve first (I2): a reader that sees the new wp sees it too. */
      store_reserve(h, wp, memory_order_release);
      atomic_store_explicit(&h->write_pointer, wp, memory_order_release);
    }
  } else if (!position_in_range(wp, ring->capacity)) {
    wp = make_position(position_cycle(wp) + 2u, 0);
    pub->reserve_high = wp;
    store_reserve(h, wp, memory_order_release);
    atomic_store_explicit(&h->write_pointer, wp, memory_order_release);
  }
  pub->write_pointer = wp;
  pub->sends_to_clock_check = MSGQ_SWEEP_CHECK_SENDS;
  pub->next_sweep_ns = 0; /* the first check sweeps */
  pub->early_wrap_from = ring->capacity / 4u < MSGQ_EARLY_WRAP_BYTES ? ring->capacity / 4u
                                                                     : MSGQ_EARLY_WRAP_BYTES;
  pub->early_wrap_retry = ring->capacity / 16u < MSGQ_EARLY_WRAP_RETRY_BYTES
                              ? ring->capacity / 16u
                              : MSGQ_EARLY_WRAP_RETRY_BYTES;
  pub->early_wrap_check = pub->early_wrap_from;
  /* No chunks yet (P6): this publisher reuses only chunks it writes fresh. The counter
   * starts anywhere; every write of one chunk gets its own value. */
  pub->pool.next_counter = (pub->token >> 7) & ((UINT64_C(1) << 31) - 1u);
}

void msgq_publisher_release(msgq_publisher *pub) {
  msgq_header *h = pub->ring.header;
  if (atomic_load_explicit(&h->publisher_token, memory_order_acquire) == pub->token)
    atomic_store_explicit(&h->publisher_pid, 0, memory_order_relaxed);
}

/* Announces that the bytes up to `end` (a position) may be written now (I2). Never
 * lower than an earlier announcement: an aborted reservation may have written further
 * than the next one will. */
static inline void announce_reserve(msgq_publisher *pub, uint64_t end) {
  if (end > pub->reserve_high) pub->reserve_high = end;
  store_reserve(pub->ring.header, pub->reserve_high, memory_order_relaxed);
  /* release fence (seqlock writer): the reserve stores are ordered before every store of
   * ring bytes that follows; pairs with the acquire fence in region_intact. */
  atomic_thread_fence(memory_order_release);
}

/* Takes slot i over from `expected` (a dead pid, or 0) and frees it with its waiting
 * bit (I5). Returns 1 when it did. */
static int reclaim_slot(msgq_header *h, unsigned i, int32_t expected, int32_t me) {
  msgq_reader_slot *slot = &h->readers[i];
  if (!atomic_compare_exchange_strong_explicit(&slot->owner_pid, &expected, me,
                                               memory_order_acq_rel,
                                               memory_order_relaxed))
    return 0;
  atomic_fetch_and_explicit(&h->waiting_readers, ~(1ULL << i), memory_order_acq_rel);
  atomic_store_explicit(&slot->pinned_chunk, 0u, memory_order_relaxed); /* P4 */
  /* release: the cleared bit is visible before the slot can be claimed again. */
  atomic_store_explicit(&slot->owner_pid, 0, memory_order_release);
  return 1;
}

int msgq_publisher_sweep(msgq_publisher *pub) {
  msgq_header *h = pub->ring.header;
  int freed = 0;
  uint64_t waiting = atomic_load_explicit(&h->waiting_readers, memory_order_relaxed);
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    int32_t pid = atomic_load_explicit(&h->readers[i].owner_pid, memory_order_relaxed);
    if (pid > 0) {
      if (pid != pub->pid && !os_process_alive(pid)) freed += reclaim_slot(h, i, pid, pub->pid);
    } else if (pid == 0 && (waiting & (1ULL << i))) {
      /* A waiting bit without an owner (damage): taking the free slot first makes sure
       * no subscriber is in it while the bit is cleared. */
      reclaim_slot(h, i, 0, pub->pid);
    } else if (pid < 0) {
      freed += reclaim_slot(h, i, pid, pub->pid); /* nonsense owner: free it */
    }
  }
  pub->reclaimed_slots += (uint64_t)freed;
  (void)ring_superseded(&pub->ring); /* a damaged header: the next send re-opens (I6) */
  return freed;
}

/* The bounded share of the sweep each send pays (I5): a counter decrement, and a clock
 * read every MSGQ_SWEEP_CHECK_SENDS sends or on a send that wakes sleepers. */
static inline void maybe_sweep(msgq_publisher *pub, bool woke) {
  if (--pub->sends_to_clock_check != 0 && !woke) return;
  pub->sends_to_clock_check = MSGQ_SWEEP_CHECK_SENDS;
  int64_t now = os_monotonic_ns();
  if (now < pub->next_sweep_ns) return;
  pub->next_sweep_ns = now + MSGQ_SWEEP_INTERVAL_NS;
  msgq_publisher_sweep(pub);
}

static inline int check_owner(msgq_publisher *pub) {
  msgq_header *h = pub->ring.header;
  if (atomic_load_explicit(&h->publisher_token, memory_order_relaxed) != pub->token)
    return MSGQ_ENOTOWNER;
  if (atomic_load_explicit(&h->superseded, memory_order_relaxed)) return MSGQ_ESUPERSEDED;
  return 0;
}

/* Stores our write position. Another publisher that took over changes the token (the
 * caller checked it); a write_pointer that differs from ours while the token is still
 * ours was written by someone else: ours is the truth, so it is stored anyway. */
static inline int publish_write_pointer(msgq_publisher *pub, uint64_t next) {
  msgq_header *h = pub->ring.header;
  uint64_t expected = pub->write_pointer;
  /* seq_cst: publishes the bytes below next (release, I1) and orders this store before
   * the waiting_readers load in commit (I4). */
  if (!atomic_compare_exchange_strong_explicit(&h->write_pointer, &expected, next,
                                               memory_order_seq_cst,
                                               memory_order_relaxed)) {
    if (atomic_load_explicit(&h->publisher_token, memory_order_relaxed) != pub->token)
      return MSGQ_ENOTOWNER;
    atomic_store_explicit(&h->write_pointer, next, memory_order_seq_cst);
  }
  pub->write_pointer = next;
  return 0;
}

/* Whether every claimed reader slot reports `wp` (I7): nobody is reading, holding a view
 * or behind. A slot of a dead subscriber counts as behind until the sweep frees it. The
 * acquire loads order the readers' last reads (before their reports, I3's fence) before
 * the ring bytes this send writes. */
static bool readers_all_at(const msgq_header *h, uint64_t wp) {
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    const msgq_reader_slot *slot = &h->readers[i];
    if (atomic_load_explicit(&slot->owner_pid, memory_order_acquire) == 0) continue;
    if (atomic_load_explicit(&slot->read_pointer, memory_order_acquire) != wp) return false;
  }
  return true;
}

/* How many chunks the publisher keeps track of (P3). */
static inline uint32_t pool_tracked(const msgq_pool_publisher *pool) {
  return pool->free_count + pool->fifo_count + (pool->reserving ? 1u : 0u);
}

static void pool_forget_dead(msgq_publisher *pub, uint64_t reserve);

/* Whether this send should go to offset 0 before the ring's end (I7): far enough in that
 * reusing the start pays, the marker at `offset` stays clear of the `total` bytes about
 * to be written at 0 (so a reader that reads the marker finds it intact), every reader
 * has caught up, and no chunk the publisher may reuse lies where the next cycle would
 * write (chunks are warm already; an early wrap would throw them away). The slots are
 * looked at only every MSGQ_EARLY_WRAP_RETRY_BYTES while a reader is behind, so a
 * stalled reader costs the sends nothing measurable. */
static __attribute__((noinline)) bool wrap_early(msgq_publisher *pub, uint32_t offset, uint32_t total) {
  if (offset < pub->early_wrap_check || offset < total) return false;
  if (pool_tracked(&pub->pool)) pool_forget_dead(pub, pub->reserve_high);
  if (pool_tracked(&pub->pool) || !readers_all_at(pub->ring.header, pub->write_pointer)) {
    pub->early_wrap_check = (uint64_t)offset + pub->early_wrap_retry;
    return false;
  }
  pub->early_wraps++;
  return true;
}

/* The rest of this cycle is skipped: not enough room before the end (keeping 8 bytes
 * for the marker), or every reader is here and the ring's start is warm (I7). The
 * reserve covers the marker and the `total` bytes of the message after the wrap; returns
 * the message's offset (0) or an error. Out of the send's line: once a ring. */
static __attribute__((noinline)) int ring_wrap(msgq_publisher *pub, uint32_t cycle,
                                               uint32_t offset, uint32_t total) {
  msgq_ring *ring = &pub->ring;
  announce_reserve(pub, make_position(cycle + 1u, total));
  store_prefix(ring->data + offset, MSGQ_WRAP_MARKER);
  /* relaxed: published by the write_pointer store below (release), like the marker. */
  atomic_store_explicit(&ring->header->last_wrap, pub->write_pointer, memory_order_relaxed);
  pub->early_wrap_check = pub->early_wrap_from;
  int r = publish_write_pointer(pub, make_position(cycle + 1u, 0));
  return r < 0 ? r : 0;
}

/* Reserves `size` bytes in the ring (inline message, descriptor, or chunk record with its
 * descriptor) and returns where they go. The caller checked ownership and size. An early
 * wrap (I7) is looked at only when `early` (a descriptor's place must be known before it
 * is reserved: descriptor_end). Inlined into each caller: it is most of a small send,
 * and a call costs it a fifth more instructions (tests/c/count_pair.c). */
static inline __attribute__((always_inline)) int ring_reserve(msgq_publisher *pub,
                                                              uint32_t size, void **payload,
                                                              bool early) {
  msgq_ring *ring = &pub->ring;
  const uint32_t total = 8u + (uint32_t)align8(size);
  const uint32_t cycle = position_cycle(pub->write_pointer);
  uint32_t offset = position_offset(pub->write_pointer);

  if (__builtin_expect((uint64_t)offset + total + 8u > ring->capacity, 0) ||
      (early && __builtin_expect(offset >= pub->early_wrap_check, 0) &&
       wrap_early(pub, offset, total))) {
    int r = ring_wrap(pub, cycle, offset, total);
    if (r < 0) return r;
    offset = 0;
  } else {
    announce_reserve(pub, make_position(cycle, offset + total));
  }
  *payload = ring->data + offset + 8u;
  return 0;
}

/* Wakes the readers asleep on the queue (I4). Out of the send's line: a system call.
 * It takes the bits it wakes: until a reader registers again, no send makes a system
 * call. (Leaving them set cost a futex call per send whenever a woken reader could not
 * run yet — on one CPU, every send of the publisher's time slice: 0.24 per message.) */
static __attribute__((noinline)) void wake_readers(msgq_header *h) {
  atomic_exchange_explicit(&h->waiting_readers, 0, memory_order_acq_rel);
  atomic_fetch_add_explicit(&h->notify_seq, 1u, memory_order_release);
  os_wake_all(&h->notify_seq);
}

/* Publishes everything below `next` (the message at `at` the newest), wakes sleepers,
 * sweeps on schedule. Inlined, like ring_reserve. */
static inline __attribute__((always_inline)) int publish_message(msgq_publisher *pub,
                                                                 uint64_t at, uint64_t next) {
  msgq_header *h = pub->ring.header;
  /* relaxed: published by the write_pointer store below (release). */
  atomic_store_explicit(&h->last_message, at, memory_order_relaxed);
  int r = publish_write_pointer(pub, next);
  if (r < 0) return r;

  bool woke = false;
  if (__builtin_expect(atomic_load_explicit(&h->waiting_readers, memory_order_seq_cst) != 0,
                       0)) {
    wake_readers(h);
    woke = true;
  }
  maybe_sweep(pub, woke);
  return 0;
}

/* Publishes the ring message reserved at write_pointer with this prefix. `ring_size` is
 * its size in the ring. */
static int ring_commit(msgq_publisher *pub, uint64_t prefix, uint32_t ring_size) {
  const uint64_t at = pub->write_pointer;
  store_prefix(pub->ring.data + position_offset(at), prefix);
  return publish_message(pub, at, at + 8u + align8(ring_size));
}

/* --- Chunks: the publisher's side (P1-P6 in docs/ring.md) -------------------------- */

/* A sequence word (P2): a write counter (31 bits) above the message size (32 bits)
 * above the "being written" bit. Each write of any chunk gets the next counter, so a
 * descriptor matches only the one write it was made for. */
#define POOL_COUNTER_MASK ((UINT64_C(1) << 31) - 1u)
static inline uint64_t pool_sequence(uint64_t counter, uint32_t size) {
  return (counter << 33) | ((uint64_t)size << 1);
}

/* The sequence word and the bytes of the chunk whose record is at ring offset `offset`
 * (8-aligned, so the word is too). */
static inline _Atomic uint64_t *chunk_word(const msgq_ring *ring, uint32_t offset) {
  return (_Atomic uint64_t *)(void *)(ring->data + offset + 8u);
}
/* A reader's load of a chunk's word. The ring writer may be writing plain bytes over it
 * (a fresh message where the chunk was: region_intact tells), so under TSan it is a
 * function of its own that tests/c/tsan.supp names, like load_prefix. */
PREFIX_LOAD_FUNCTION uint64_t chunk_word_load(const msgq_ring *ring, uint32_t offset) {
  return atomic_load_explicit(chunk_word(ring, offset), memory_order_relaxed);
}
/* The publisher's store of a chunk's word. A lapped reader may still be copying an older
 * message whose bytes lay where the word now is (its I3 check discards the copy), so under
 * TSan it is a function of its own that tests/c/tsan.supp names, like store_prefix. */
PREFIX_STORE_FUNCTION void chunk_word_store(const msgq_ring *ring, uint32_t offset,
                                            uint64_t word) {
  atomic_store_explicit(chunk_word(ring, offset), word, memory_order_relaxed);
}
static inline uint8_t *chunk_bytes(const msgq_ring *ring, uint32_t offset) {
  return ring->data + offset + 16u;
}
/* What a reader stores in its slot while it reads the chunk at `offset` (P4). */
static inline uint32_t chunk_pin(uint32_t offset) { return offset / 8u + 1u; }

/* Whether the ring bytes of the chunk whose record is at `position` are still intact
 * once the ring writer's reservation reaches `reserve` (I3, seen from the writer). */
static inline bool chunk_alive(uint64_t position, uint64_t reserve) {
  return !position_before(
      make_position(position_cycle(position) + 1u, position_offset(position)), reserve);
}

/* Where the reservation of a descriptor will end when it is made now (ring_reserve
 * without an early wrap): a chunk reused for it must stay alive up to there. */
static inline uint64_t descriptor_end(const msgq_publisher *pub) {
  const uint32_t total = 8u + MSGQ_POOL_DESCRIPTOR_SIZE;
  const uint32_t cycle = position_cycle(pub->write_pointer);
  const uint32_t offset = position_offset(pub->write_pointer);
  uint64_t end = (uint64_t)offset + total + 8u > pub->ring.capacity
                     ? make_position(cycle + 1u, total)
                     : make_position(cycle, offset + total);
  return position_before(end, pub->reserve_high) ? pub->reserve_high : end;
}

static void free_remove(msgq_pool_publisher *pool, uint32_t i) {
  memmove(&pool->free_stack[i], &pool->free_stack[i + 1u],
          (pool->free_count - 1u - i) * sizeof pool->free_stack[0]);
  pool->free_count--;
}

/* Puts a chunk on top of the free stack; a full stack forgets its bottom (coldest). */
static void free_push(msgq_pool_publisher *pool, msgq_chunk c) {
  if (pool->free_count == MSGQ_POOL_MAX_CHUNKS) free_remove(pool, 0);
  pool->free_stack[pool->free_count++] = c;
}

/* Forgets the free chunks the ring writer has come round to (P5). */
static void pool_forget_dead(msgq_publisher *pub, uint64_t reserve) {
  msgq_pool_publisher *pool = &pub->pool;
  for (uint32_t i = pool->free_count; i-- > 0;) {
    if (chunk_alive(pool->free_stack[i].position, reserve)) continue;
    free_remove(pool, i);
    pool->forgotten++;
  }
  while (pool->fifo_count && !chunk_alive(pool->fifo[pool->fifo_head].position, reserve)) {
    pool->fifo_head = (pool->fifo_head + 1u) % MSGQ_POOL_MAX_CHUNKS;
    pool->fifo_count--;
    pool->forgotten++;
  }
}

/* Whether a message goes into a chunk: the queue wants chunks, the message is at least
 * MSGQ_POOL_THRESHOLD, and a fresh chunk of it stays within a third of the ring. */
static inline bool goes_to_pool(const msgq_publisher *pub, uint32_t size) {
  /* The size first: a small send pays one predicted branch for the chunks. */
  return __builtin_expect(size >= MSGQ_POOL_THRESHOLD, 0) &&
         (pub->ring.flags & MSGQ_FLAG_POOL) && size <= pub->ring.max_chunked;
}

/* Moves the in-flight chunks that every reader has read past to the free stack, oldest
 * first, so that the newest-freed is on top (P3). A reader's progress is its slot's
 * report (a claimed slot of a dead reader counts as behind until the sweep frees it).
 * A report a cycle or more behind belongs to a reader the ring writer has lapped (its
 * next peek resets it), and one ahead of us is damage: neither holds chunks back (a
 * reader still reading one is protected by its pin and the word check, P4). */
static void pool_retire(msgq_publisher *pub) {
  msgq_pool_publisher *pool = &pub->pool;
  if (pool->fifo_count == 0) return;
  const msgq_header *h = pub->ring.header;
  const uint64_t wp = pub->write_pointer;
  uint64_t laggard = wp;
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    const msgq_reader_slot *slot = &h->readers[i];
    if (atomic_load_explicit(&slot->owner_pid, memory_order_relaxed) == 0) continue;
    /* acquire: pairs with the reader's report after its last read of a chunk, so our
     * overwrite of a freed chunk comes after that read. */
    uint64_t rp = atomic_load_explicit(&slot->read_pointer, memory_order_acquire);
    if (position_before(wp, rp) || wp - rp >= ((uint64_t)1 << 32)) continue;
    if (position_before(rp, laggard)) laggard = rp;
  }
  while (pool->fifo_count) {
    uint32_t at = pool->fifo_head;
    if (position_before(laggard, pool->fifo[at].end)) break;
    free_push(pool, pool->fifo[at]);
    pool->fifo_head = (at + 1u) % MSGQ_POOL_MAX_CHUNKS;
    pool->fifo_count--;
  }
}

/* Whether a live reader slot pins the chunk at ring offset `offset` (P4). */
static bool chunk_pinned(const msgq_header *h, uint32_t offset) {
  const uint32_t pin = chunk_pin(offset);
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    const msgq_reader_slot *slot = &h->readers[i];
    if (atomic_load_explicit(&slot->owner_pid, memory_order_relaxed) == 0) continue;
    if (atomic_load_explicit(&slot->pinned_chunk, memory_order_relaxed) == pin) return true;
  }
  return false;
}

/* Starts writing a `size`-byte message into chunk c again (P2, P4): the chunk's word
 * becomes the odd word of this write (the next counter, the size, the "being written"
 * bit); then, behind a seq_cst fence, the pins are looked at. A pinned chunk gets its
 * old word back and 0 is returned; else the odd word, after a release fence that orders
 * it before every byte written into the chunk. */
static uint64_t chunk_begin_reuse(msgq_publisher *pub, msgq_chunk c, uint32_t size) {
  msgq_pool_publisher *pool = &pub->pool;
  const uint32_t offset = position_offset(c.position);
  const uint64_t odd = pool_sequence(pool->next_counter, size) | 1u;
  /* Only the publisher writes the word, so its own load needs no check. */
  const uint64_t saved = atomic_load_explicit(chunk_word(&pub->ring, offset),
                                              memory_order_relaxed);
  chunk_word_store(&pub->ring, offset, odd);
  /* seq_cst fence: our word store before the pin loads; pairs with the fence between a
   * reader's pin store and its word load (peek): one side sees the other. */
  atomic_thread_fence(memory_order_seq_cst);
  if (chunk_pinned(pub->ring.header, offset)) {
    /* Nothing was written: the word goes back, and a reader that saw the odd one
     * meanwhile took its message for overwritten (a lost message, never a torn one). */
    chunk_word_store(&pub->ring, offset, saved);
    return 0;
  }
  pool->next_counter = (pool->next_counter + 1u) & POOL_COUNTER_MASK;
  atomic_thread_fence(memory_order_release);
  return odd;
}

/* The ring position `bytes` (at most a ring) after `p`, the offset wrapping at the
 * ring's end. The writer also skips the bytes left at the end when it wraps, so it has
 * written at least `bytes` once its reservation is there. */
static inline uint64_t position_after(uint64_t p, uint32_t bytes, uint32_t capacity) {
  const uint64_t offset = (uint64_t)position_offset(p) + bytes;
  return offset >= capacity
             ? make_position(position_cycle(p) + 1u, (uint32_t)(offset - capacity))
             : make_position(position_cycle(p), (uint32_t)offset);
}

/* Takes a free chunk for a `size`-byte message: the most recently freed one that stays
 * alive while the ring writer's reservation goes from `reserve` (where the message's
 * descriptor ends) through the message's keep span (P5), holds the message without
 * being more than twice its size, and that no reader pins. Chunks past their reuse span
 * are forgotten. Returns false when there is none (the message gets a fresh one). */
static bool pool_take_free(msgq_publisher *pub, uint32_t size, uint64_t reserve) {
  msgq_pool_publisher *pool = &pub->pool;
  const uint32_t capacity = pub->ring.capacity;
  const uint64_t kept_until =
      position_after(reserve, capacity - capacity / MSGQ_POOL_REUSE_SPAN_DIVISOR, capacity);
  for (uint32_t i = pool->free_count; i-- > 0;) {
    const msgq_chunk c = pool->free_stack[i];
    if (!chunk_alive(c.position, kept_until)) {
      free_remove(pool, i);
      pool->forgotten++;
      continue;
    }
    if (c.capacity < size || c.capacity / 2u > size) continue;
    const uint64_t odd = chunk_begin_reuse(pub, c, size);
    if (!odd) continue; /* pinned: left where it is */
    free_remove(pool, i);
    pool->reserved = c;
    pool->reserved_seq = odd;
    return true;
  }
  return false;
}

/* Reserves a chunk for a `size`-byte message: a free one, else a fresh one at the write
 * position whose record and descriptor are reserved together (P2). */
static int pool_reserve(msgq_publisher *pub, uint32_t size, void **payload) {
  msgq_ring *ring = &pub->ring;
  msgq_pool_publisher *pool = &pub->pool;
  pool_retire(pub);
  if (pool_take_free(pub, size, descriptor_end(pub))) {
    pool->reserved_fresh = false;
  } else {
    void *at;
    const uint32_t capacity = (uint32_t)align8(size);
    int r = ring_reserve(pub, 8u + capacity + 8u + MSGQ_POOL_DESCRIPTOR_SIZE, &at, true);
    if (r < 0) return r;
    pool->reserved.position = pub->write_pointer;
    pool->reserved.capacity = capacity;
    pool->reserved_seq = pool_sequence(pool->next_counter, size) | 1u;
    pool->next_counter = (pool->next_counter + 1u) & POOL_COUNTER_MASK;
    pool->reserved_fresh = true;
  }
  pool->reserving = true;
  *payload = chunk_bytes(ring, position_offset(pool->reserved.position));
  return 0;
}

/* Publishes the reserved chunk: its word becomes even, then its descriptor goes into
 * the ring as a small message (P1, P2); a fresh chunk's record prefix with it. */
static int pool_commit(msgq_publisher *pub) {
  msgq_ring *ring = &pub->ring;
  msgq_pool_publisher *pool = &pub->pool;
  msgq_chunk c = pool->reserved;
  const uint32_t co = position_offset(c.position);
  const uint32_t size = pub->reserved_size;
  const bool fresh = pool->reserved_fresh;
  pool->reserving = false;
  uint64_t prefix = MSGQ_POOL_DESCRIPTOR_SIZE | MSGQ_POOL_DESCRIPTOR_BIT;
  if (ring->flags & MSGQ_FLAG_CHECKSUM)
    prefix |= (uint64_t)msgq_crc32c(chunk_bytes(ring, co), size) << 32;
  const uint64_t seq = pool->reserved_seq & ~(uint64_t)1u; /* written: even */
  /* release fence: the chunk's bytes before its even word (and before the descriptor,
   * which write_pointer's release publishes). */
  atomic_thread_fence(memory_order_release);
  chunk_word_store(ring, co, seq);
  uint64_t at;
  if (fresh) {
    /* Record and descriptor were reserved together at the write position. */
    store_prefix(ring->data + co, (uint64_t)(8u + c.capacity) | MSGQ_POOL_DESCRIPTOR_BIT);
    at = make_position(position_cycle(c.position), co + 16u + c.capacity);
  } else {
    void *payload;
    int r = check_owner(pub);
    if (r == 0) r = ring_reserve(pub, MSGQ_POOL_DESCRIPTOR_SIZE, &payload, false);
    if (r < 0) {
      free_push(pool, c);
      return r;
    }
    at = pub->write_pointer;
  }
  uint8_t *desc = ring->data + position_offset(at);
  store_prefix(desc + 8u, c.position);
  store_prefix(desc + 16u, seq);
  store_prefix(desc, prefix);
  int r = publish_message(pub, at, at + 8u + MSGQ_POOL_DESCRIPTOR_SIZE);
  if (r < 0) {
    if (!fresh) free_push(pool, c);
    return r;
  }
  if (pool->fifo_count == MSGQ_POOL_MAX_CHUNKS) { /* forget the oldest in flight */
    pool->fifo_head = (pool->fifo_head + 1u) % MSGQ_POOL_MAX_CHUNKS;
    pool->fifo_count--;
    pool->forgotten++;
  }
  c.end = pub->write_pointer;
  pool->fifo[(pool->fifo_head + pool->fifo_count) % MSGQ_POOL_MAX_CHUNKS] = c;
  pool->fifo_count++;
  pool->sends++;
  pool->reuses += !fresh;
  return 0;
}

int msgq_publisher_reserve(msgq_publisher *pub, uint32_t size, void **payload) {
  msgq_ring *ring = &pub->ring;
  int r = check_owner(pub);
  if (r < 0) return r;
  if (size > ring->max_message) return MSGQ_ETOOLARGE;
  if (__builtin_expect(pub->reserved, 0))
    msgq_publisher_abort(pub); /* a reservation left open is dropped */
  r = goes_to_pool(pub, size) ? pool_reserve(pub, size, payload)
                              : ring_reserve(pub, size, payload, true);
  if (r < 0) return r;
  pub->reserved = true;
  pub->reserved_size = size;
  return 0;
}

int msgq_publisher_commit(msgq_publisher *pub) {
  if (!pub->reserved) return MSGQ_ENORESERVE;
  msgq_ring *ring = &pub->ring;
  pub->reserved = false;
  if (__builtin_expect(pub->pool.reserving, 0)) return pool_commit(pub);
  const uint32_t size = pub->reserved_size;
  const uint32_t offset = position_offset(pub->write_pointer);
  uint64_t prefix = size;
  if (ring->flags & MSGQ_FLAG_CHECKSUM)
    prefix |= (uint64_t)msgq_crc32c(ring->data + offset + 8u, size) << 32;
  return ring_commit(pub, prefix, size);
}

void msgq_publisher_abort(msgq_publisher *pub) {
  /* A reused chunk goes back on top (its odd word fails every old descriptor); a fresh
   * one is forgotten: the next send writes over its ring bytes. */
  if (pub->reserved && pub->pool.reserving && !pub->pool.reserved_fresh)
    free_push(&pub->pool, pub->pool.reserved);
  pub->pool.reserving = false;
  pub->reserved = false;
}

int msgq_publisher_send(msgq_publisher *pub, const void *data, uint32_t size) {
  void *dst;
  int r = msgq_publisher_reserve(pub, size, &dst);
  if (r < 0) return r;
  if (size) memcpy(dst, data, size);
  return msgq_publisher_commit(pub);
}

int msgq_publisher_all_readers_updated(const msgq_publisher *pub) {
  const msgq_header *h = pub->ring.header;
  uint64_t wp = atomic_load_explicit(&h->write_pointer, memory_order_acquire);
  unsigned live = 0;
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    const msgq_reader_slot *slot = &h->readers[i];
    int32_t pid = atomic_load_explicit(&slot->owner_pid, memory_order_relaxed);
    if (pid <= 0 || !os_process_alive(pid)) continue;
    live++;
    uint64_t rp = atomic_load_explicit(&slot->read_pointer, memory_order_acquire);
    if (rp != wp) return 0;
  }
  /* Upstream's meaning: every reader, and at least one, has read everything. */
  return live > 0;
}

/* --- Subscriber ------------------------------------------------------------------- */

/* Whether the bytes [start, end) of cycle rc, read before this call, are intact (I3).
 * The acquire fence orders the reads of those bytes before the reload of write_reserve
 * (seqlock reader side; pairs with the release fence in announce_reserve). */
static inline bool region_intact(const msgq_header *h, uint32_t rc, uint32_t start) {
  atomic_thread_fence(memory_order_acquire);
  uint64_t reserve = load_reserve(h, memory_order_relaxed);
  uint32_t ahead = position_cycle(reserve) - rc;
  return ahead == 0 || (ahead == 1 && position_offset(reserve) <= start);
}


/* write_pointer as a reader may use it: acquire (pairs with the release in the
 * publisher's store, I1), and not past write_reserve, which the publisher always
 * stores first (I2). A write_pointer past it was written by someone else: it is
 * ignored (`fallback` is returned) until the publisher's next send stores both again,
 * so a scribbled write_pointer cannot make a reader take unwritten bytes for messages. */
static inline uint64_t load_write_pointer(const msgq_header *h, uint64_t fallback) {
  uint64_t wp = atomic_load_explicit(&h->write_pointer, memory_order_acquire);
  uint64_t reserve = load_reserve(h, memory_order_relaxed);
  return position_before(reserve, wp) ? fallback : wp;
}

/* A write_pointer behind our position by less than two cycles was moved back by
 * someone else (damage): it is treated as our own position, so nothing is delivered
 * twice. One further off (either way) is followed: it is the writer's after a restart
 * (msgq_publisher_init), or garbage that the writer's next send replaces. */
static inline uint64_t not_behind(uint64_t wp, uint64_t rp) {
  if (position_before(wp, rp) && rp - wp < ((uint64_t)2 << 32)) return rp;
  return wp;
}

/* Reloads the write position a reader compares itself with. */
static inline void refresh_write_pointer(msgq_subscriber *sub) {
  sub->seen_write_pointer =
      not_behind(load_write_pointer(sub->ring.header, sub->seen_write_pointer),
                 sub->read_pointer);
}

/* Whether the peeked chunk still holds the message its descriptor named (P2): its word
 * is the descriptor's, and the ring writer has not come round to its bytes (I3). The
 * caller's acquire fence orders what it read before the word load. */
static bool chunk_holds(const msgq_subscriber *sub) {
  const msgq_ring *ring = &sub->ring;
  const uint32_t co = position_offset(sub->peeked_chunk);
  if (chunk_word_load(ring, co) != sub->peeked_seq)
    return false;
  return region_intact(ring->header, position_cycle(sub->peeked_chunk), co);
}

/* Ends this reader's pin of a chunk (P4). release: our reads of the chunk come before. */
static inline void unpin(msgq_subscriber *sub) {
  if (!sub->peeked_pool) return;
  sub->peeked_pool = false;
  atomic_store_explicit(&sub->ring.header->readers[sub->slot].pinned_chunk, 0u,
                        memory_order_release);
}

/* Jumps to the current write position. Messages between the old position and here are
 * lost to this reader. */
static void reader_reset(msgq_subscriber *sub) {
  msgq_header *h = sub->ring.header;
  unpin(sub);
  uint64_t wp = not_behind(load_write_pointer(h, sub->read_pointer), sub->read_pointer);
  atomic_store_explicit(&sub->read_pointer, wp, memory_order_relaxed);
  sub->seen_write_pointer = wp;
  atomic_store_explicit(&h->readers[sub->slot].read_pointer, wp, memory_order_relaxed);
}

static bool claim_slot(msgq_header *h, unsigned i, int32_t expected_pid, int32_t me) {
  msgq_reader_slot *slot = &h->readers[i];
  if (!atomic_compare_exchange_strong_explicit(&slot->owner_pid, &expected_pid, me,
                                               memory_order_acq_rel,
                                               memory_order_relaxed))
    return false;
  /* A dead owner may have died asleep: its waiting bit is ours to clear now (I5), and
   * its pin (P4). */
  atomic_fetch_and_explicit(&h->waiting_readers, ~(1ULL << i), memory_order_acq_rel);
  atomic_store_explicit(&slot->pinned_chunk, 0u, memory_order_release);
  return true;
}

int msgq_subscriber_init(msgq_subscriber *sub, const msgq_ring *ring, bool conflate) {
  memset(sub, 0, sizeof *sub);
  sub->ring = *ring;
  sub->conflate = conflate;
  sub->slot = -1;
  msgq_header *h = ring->header;
  const int32_t me = (int32_t)getpid();

  /* Free slots first; only when none is left, reclaim one whose owner died. A slot
   * held by a live process is never taken. */
  for (unsigned i = 0; i < MSGQ_READER_SLOTS && sub->slot < 0; i++)
    if (claim_slot(h, i, 0, me)) sub->slot = (int)i;
  for (unsigned i = 0; i < MSGQ_READER_SLOTS && sub->slot < 0; i++) {
    int32_t pid = atomic_load_explicit(&h->readers[i].owner_pid, memory_order_relaxed);
    if (pid != 0 && pid != me && (pid < 0 || !os_process_alive(pid)) &&
        claim_slot(h, i, pid, me))
      sub->slot = (int)i;
  }
  if (sub->slot < 0) return MSGQ_ENOSLOT;
  atomic_store_explicit(&sub->read_pointer,
                        atomic_load_explicit(&h->write_pointer, memory_order_acquire),
                        memory_order_relaxed);
  reader_reset(sub);
  return 0;
}

void msgq_subscriber_release(msgq_subscriber *sub) {
  if (sub->slot < 0) return;
  msgq_header *h = sub->ring.header;
  msgq_reader_slot *slot = &h->readers[sub->slot];
  atomic_fetch_and_explicit(&h->waiting_readers, ~(1ULL << sub->slot), memory_order_acq_rel);
  atomic_store_explicit(&slot->pinned_chunk, 0u, memory_order_release);
  int32_t me = (int32_t)getpid();
  /* Only when still ours: a slot taken from us (damage) is left to its new owner. */
  atomic_compare_exchange_strong_explicit(&slot->owner_pid, &me, 0, memory_order_release,
                                          memory_order_relaxed);
  sub->slot = -1;
}

static inline void store_read_pointer(msgq_subscriber *sub, uint64_t rp) {
  atomic_store_explicit(&sub->read_pointer, rp, memory_order_relaxed);
  /* relaxed: a report only (I3); nothing is ever decided from it about safety. */
  atomic_store_explicit(&sub->ring.header->readers[sub->slot].read_pointer, rp,
                        memory_order_relaxed);
}

int msgq_subscriber_has_data(msgq_subscriber *sub) {
  /* Reads only (see the header): the peek's cache of the write pointer is left alone. */
  const msgq_header *h = sub->ring.header;
  uint64_t rp = atomic_load_explicit(&sub->read_pointer, memory_order_relaxed);
  if (not_behind(load_write_pointer(h, rp), rp) != rp) return 1;
  return ring_superseded(&sub->ring);
}

static void reset_for_corruption(msgq_subscriber *sub) {
  sub->corrupt_resets++;
  sub->resets++;
  reader_reset(sub);
}

/* The bytes at the read position were overwritten before their check (I3): the reader
 * jumps to the writer, unless the cycle ended exactly here (I7): the marker was
 * overwritten, and the next cycle's messages may still be intact; they are checked like
 * any others. */
static void peek_overwritten(msgq_subscriber *sub, uint32_t rc) {
  if (atomic_load_explicit(&sub->ring.header->last_wrap, memory_order_relaxed) ==
      sub->read_pointer) {
    store_read_pointer(sub, make_position(rc + 1u, 0));
    return;
  }
  sub->resets++;
  reader_reset(sub);
}

/* A conflating reader skips, without copying, to the newest published message: whether
 * it stepped past the intact message that ends at `next` (the peek goes on). */
static bool conflate_past(msgq_subscriber *sub, uint64_t next) {
  if (next != sub->seen_write_pointer) {
    store_read_pointer(sub, next);
    return true;
  }
  refresh_write_pointer(sub);
  if (next != sub->seen_write_pointer) {
    store_read_pointer(sub, next);
    return true;
  }
  return false;
}

/* The peek of a ring prefix with MSGQ_POOL_DESCRIPTOR_BIT set: a wrap marker, a chunk
 * descriptor (P1: the message is in its chunk), a chunk record (stepped over) or damage.
 * The caller checked the read position's range and cycle. Returns 1 with the chunk's
 * message peeked (pinned, P4), 0 when the peek goes on from the (moved) read position.
 * Out of the small messages' line: they never carry the bit. */
static __attribute__((noinline)) int peek_marked(msgq_subscriber *sub, uint64_t prefix,
                                                 const uint8_t **payload, uint32_t *size) {
  msgq_ring *ring = &sub->ring;
  const msgq_header *h = ring->header;
  const uint32_t capacity = ring->capacity;
  const uint32_t rc = position_cycle(sub->read_pointer);
  const uint32_t ro = position_offset(sub->read_pointer);
  const uint64_t wp = sub->seen_write_pointer;
  /* A chunk descriptor's two words, read with the prefix so that the one check below
   * covers them too (I3); trusted only after it, and bounded by the ring. A chunk
   * record (the bit with a larger size) is stepped over. */
  uint64_t descriptor[2] = {0, 0};
  const bool marked = prefix != MSGQ_WRAP_MARKER;
  const bool pooled =
      marked && ((uint32_t)prefix & ~MSGQ_POOL_DESCRIPTOR_BIT) == MSGQ_POOL_DESCRIPTOR_SIZE;
  if (pooled && (uint64_t)ro + 8u + 16u + 8u <= capacity) {
    descriptor[0] = load_prefix(ring->data + ro + 8u);
    descriptor[1] = load_prefix(ring->data + ro + 16u);
  }
  /* The prefix is only trusted once the bytes it came from are known intact (I3). */
  if (!region_intact(h, rc, ro)) {
    peek_overwritten(sub, rc);
    return 0;
  }
  if (!marked) {
    store_read_pointer(sub, make_position(rc + 1u, 0));
    return 0;
  }
  const uint32_t msg_size = (uint32_t)prefix & ~MSGQ_POOL_DESCRIPTOR_BIT;
  if ((uint64_t)msg_size + 16u > (uint64_t)capacity - ro ||
      (!(ring->flags & MSGQ_FLAG_CHECKSUM) && (prefix >> 32) != 0) ||
      msg_size < MSGQ_POOL_DESCRIPTOR_SIZE) {
    reset_for_corruption(sub);
    return 0;
  }
  /* A descriptor names a whole message in the ring, with an even sequence (P2), in a
   * chunk before it and less than a cycle back (a live chunk always is: the writer
   * that wrote the descriptor had not come round to the chunk yet). */
  const uint64_t chunk = descriptor[0];
  const uint32_t co = position_offset(chunk);
  const uint32_t pooled_size = (uint32_t)(descriptor[1] >> 1);
  if (pooled && ((descriptor[1] & 1u) || co % 8u != 0 ||
                 pooled_size > msgq_ring_max_message(ring) ||
                 (uint64_t)co + 16u + pooled_size > capacity ||
                 !position_before(chunk, sub->read_pointer) ||
                 sub->read_pointer - chunk >= ((uint64_t)1 << 32))) {
    reset_for_corruption(sub);
    return 0;
  }
  const uint64_t next = make_position(rc, ro + 8u + (uint32_t)align8(msg_size));
  if (position_cycle(wp) == rc && position_offset(next) > position_offset(wp)) {
    reset_for_corruption(sub);
    return 0;
  }
  if (!pooled) {
    /* A chunk record: its bytes are read through the descriptor that follows. */
    store_read_pointer(sub, next);
    return 0;
  }
  if (sub->conflate && conflate_past(sub, next)) return 0;
  sub->next_read_pointer = next;
  sub->peeked_checksum = (uint32_t)(prefix >> 32);
  /* Pin, then check that the chunk still holds this message (P4). The seq_cst fence
   * pairs with the one in chunk_begin_write: either the publisher sees our pin, or we
   * see its odd words. */
  msgq_reader_slot *slot = &sub->ring.header->readers[sub->slot];
  atomic_store_explicit(&slot->pinned_chunk, chunk_pin(co), memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  sub->peeked_pool = true;
  sub->peeked_chunk = chunk;
  sub->peeked_seq = descriptor[1];
  sub->peeked_size = pooled_size;
  atomic_store_explicit(&sub->last_size, pooled_size, memory_order_relaxed);
  if (!chunk_holds(sub)) {
    /* Reused already: this reader was lapped (P5). Only this message is lost; the
     * next descriptors name newer chunks, which may still hold theirs. */
    unpin(sub);
    sub->resets++;
    store_read_pointer(sub, next);
    return 0;
  }
  *payload = chunk_bytes(ring, co);
  *size = pooled_size;
  return 1;
}

int msgq_subscriber_peek(msgq_subscriber *sub, const uint8_t **payload, uint32_t *size) {
  msgq_ring *ring = &sub->ring;
  const msgq_header *h = ring->header;
  const uint32_t capacity = ring->capacity;

  /* Bounded even against a segment rewritten all the time: a conflating reader skips at
   * most every message of two cycles (8 bytes each at least). */
  for (uint32_t step = 0; step < capacity / 4u + 16u; step++) {
    if (sub->read_pointer == sub->seen_write_pointer) {
      refresh_write_pointer(sub);
      if (sub->read_pointer == sub->seen_write_pointer)
        return ring_superseded(ring) ? MSGQ_ESUPERSEDED : 0;
    }
    if (sub->conflate) {
      /* Straight to the newest message when the hint is between us and the writer
       * (also when we were lapped); what is read there is checked as always. */
      uint64_t newest = atomic_load_explicit(&h->last_message, memory_order_relaxed);
      if (position_before(sub->read_pointer, newest) &&
          position_before(newest, sub->seen_write_pointer) &&
          position_in_range(newest, capacity) &&
          sub->seen_write_pointer - newest < ((uint64_t)1 << 32))
        atomic_store_explicit(&sub->read_pointer, newest, memory_order_relaxed);
    }
    const uint32_t rc = position_cycle(sub->read_pointer);
    const uint32_t ro = position_offset(sub->read_pointer);
    const uint64_t wp = sub->seen_write_pointer;
    /* A reader is in the writer's cycle or the one before; anything else is a damaged
     * write_pointer (or ours was reset to one): start again from it. */
    const uint32_t wc = position_cycle(wp);
    if (ro > capacity - 8u || ro % 8u != 0) {
      reset_for_corruption(sub);
      continue;
    }
    if (rc != wc && rc != wc - 1u) {
      /* Two or more cycles behind: lapped (or the writer restarted past a dead send). */
      if (wc - rc < 0x80000000u) {
        sub->resets++;
        reader_reset(sub);
      } else {
        reset_for_corruption(sub);
      }
      continue;
    }
    const uint64_t prefix = load_prefix(ring->data + ro);
    if (__builtin_expect((prefix & MSGQ_POOL_DESCRIPTOR_BIT) != 0, 0)) {
      /* A wrap marker, a chunk descriptor or a chunk record (or damage). */
      if (peek_marked(sub, prefix, payload, size)) return 1;
      continue;
    }
    /* The prefix is only trusted once the bytes it came from are known intact (I3). */
    if (!region_intact(h, rc, ro)) {
      peek_overwritten(sub, rc);
      continue;
    }
    const uint32_t msg_size = (uint32_t)prefix;
    /* The message and the 8 reserved bytes must fit before the end of the ring, and
     * it must end at or before what the publisher has published in this cycle. */
    if ((uint64_t)msg_size + 16u > (uint64_t)capacity - ro ||
        (!(ring->flags & MSGQ_FLAG_CHECKSUM) && (prefix >> 32) != 0)) {
      reset_for_corruption(sub);
      continue;
    }
    const uint64_t next = make_position(rc, ro + 8u + (uint32_t)align8(msg_size));
    if (position_cycle(wp) == rc && position_offset(next) > position_offset(wp)) {
      reset_for_corruption(sub);
      continue;
    }
    if (sub->conflate && conflate_past(sub, next)) continue;
    sub->next_read_pointer = next;
    sub->peeked_checksum = (uint32_t)(prefix >> 32);
    sub->peeked_size = msg_size;
    atomic_store_explicit(&sub->last_size, msg_size, memory_order_relaxed);
    *payload = ring->data + ro + 8u;
    *size = msg_size;
    return 1;
  }
  return 0;
}

/* Whether the peeked chunk still holds the message its descriptor named (P2): the
 * acquire fence orders the caller's reads of the chunk before the sequence reload
 * (seqlock reader side; pairs with the release fence in chunk_begin_write). Unpins. */
static bool chunk_intact(msgq_subscriber *sub) {
  atomic_thread_fence(memory_order_acquire);
  bool intact = chunk_holds(sub);
  unpin(sub);
  return intact;
}

/* Whether what the caller read of the peeked message is intact: in the ring (I3) or in
 * its chunk (P2). */
static bool peeked_intact(msgq_subscriber *sub) {
  if (sub->peeked_pool) return chunk_intact(sub);
  return region_intact(sub->ring.header, position_cycle(sub->read_pointer),
                       position_offset(sub->read_pointer));
}

/* The peeked message was overwritten while the caller used it: in the ring the reader
 * jumps to the writer (I3); a chunk was taken back (P5), so only this message is lost
 * and the reader goes on with the next. */
static void peeked_overwritten(msgq_subscriber *sub, bool was_pooled) {
  sub->resets++;
  if (was_pooled)
    store_read_pointer(sub, sub->next_read_pointer);
  else
    reader_reset(sub);
}

int msgq_subscriber_consume(msgq_subscriber *sub, const void *copy) {
  const bool was_pooled = sub->peeked_pool;
  /* The caller's copy (plain loads) happens before the reload in the check. */
  if (!peeked_intact(sub)) {
    peeked_overwritten(sub, was_pooled);
    return 0;
  }
  store_read_pointer(sub, sub->next_read_pointer);
  if ((sub->ring.flags & MSGQ_FLAG_CHECKSUM) &&
      (copy == NULL || msgq_crc32c(copy, sub->peeked_size) != sub->peeked_checksum)) {
    sub->checksum_errors++;
    return 0;
  }
  return 1;
}

int msgq_subscriber_release_view(msgq_subscriber *sub) {
  const uint32_t ro = position_offset(sub->read_pointer);
  const bool checksummed = (sub->ring.flags & MSGQ_FLAG_CHECKSUM) != 0;
  /* peek checked that the message fits the ring (or the pool), so the payload is inside
   * the mapping. */
  const uint8_t *payload =
      sub->peeked_pool ? chunk_bytes(&sub->ring, position_offset(sub->peeked_chunk))
                       : sub->ring.data + ro + 8u;
  uint32_t crc = checksummed ? msgq_crc32c(payload, sub->peeked_size) : 0;
  /* The caller's reads and the CRC's happen before the reload in the check. */
  const bool was_pooled = sub->peeked_pool;
  if (!peeked_intact(sub)) {
    peeked_overwritten(sub, was_pooled);
    return 0;
  }
  store_read_pointer(sub, sub->next_read_pointer);
  if (checksummed && crc != sub->peeked_checksum) {
    sub->checksum_errors++;
    return MSGQ_ECHECKSUM;
  }
  return 1;
}

/* Marks this reader asleep on the queue and returns the notify_seq to sleep on. */
static uint32_t begin_wait(msgq_subscriber *sub) {
  msgq_header *h = sub->ring.header;
  uint32_t seq = atomic_load_explicit(&h->notify_seq, memory_order_acquire);
  /* seq_cst: pairs with the seq_cst write_pointer store in commit (I4, Dekker): after
   * this, has_data() sees the new write_pointer or the publisher sees our bit and bumps
   * notify_seq after the value read above. */
  atomic_fetch_or_explicit(&h->waiting_readers, 1ULL << sub->slot, memory_order_seq_cst);
  return seq;
}

static void end_wait(msgq_subscriber *sub) {
  msgq_header *h = sub->ring.header;
  atomic_fetch_and_explicit(&h->waiting_readers, ~(1ULL << sub->slot), memory_order_release);
}

static int check_all(msgq_subscriber *const *subs, int n, uint8_t *ready) {
  int count = 0;
  for (int i = 0; i < n; i++) {
    ready[i] = (uint8_t)msgq_subscriber_has_data(subs[i]);
    count += ready[i];
  }
  return count;
}

/* The base budget of the look before sleeping: $MSGQ_WAIT_SPIN_US, else MSGQ_YIELD_NS;
 * *fixed tells whether the environment set it (then it does not grow with the size). */
static int64_t wait_spin_budget_ns(bool *fixed) {
  static _Atomic int64_t budget = -1; /* bit 0 of the stored value: set by the env */
  int64_t b = atomic_load_explicit(&budget, memory_order_relaxed);
  if (b < 0) {
    const char *env = getenv("MSGQ_WAIT_SPIN_US");
    const bool from_env = env && env[0];
    int64_t ns = from_env ? (int64_t)strtoll(env, NULL, 10) * 1000 : MSGQ_YIELD_NS;
    if (ns < 0) ns = 0;
    if (ns > ((int64_t)1 << 60)) ns = (int64_t)1 << 60;
    b = ns * 2 + from_env;
    atomic_store_explicit(&budget, b, memory_order_relaxed);
  }
  *fixed = b & 1;
  return b >> 1;
}

/* The budget of a look after messages of up to `size` bytes: the base, grown to
 * MSGQ_SPIN_NS_PER_KIB per KiB unless the environment fixed it, and never past the
 * slow-stream threshold (a wait that long would sleep at once next time anyway). */
static int64_t spin_budget_for(int64_t base, bool fixed, uint32_t size) {
  if (fixed) return base;
  const int64_t by_size = (int64_t)(size >> 10) * MSGQ_SPIN_NS_PER_KIB;
  const int64_t most = MSGQ_SLOW_WAITS * base;
  return by_size <= base ? base : by_size < most ? by_size : most;
}

/* Whether any of the queues' last waits was short enough for a look before sleeping to
 * have found its data. */
static bool recent_wait_was_short(msgq_subscriber *const *subs, int n, int64_t budget) {
  for (int i = 0; i < n; i++) {
    if (atomic_load_explicit(&subs[i]->last_wait_ns, memory_order_relaxed) <
        MSGQ_SLOW_WAITS * budget)
      return true;
  }
  return false;
}

/* Records how long a wait that began at ``start`` took: for a queue that has data, the
 * time until it came; for the others, at least that long. */
static void record_wait(msgq_subscriber *const *subs, int n, const uint8_t *ready,
                        int64_t start) {
  const int64_t took = os_monotonic_ns() - start;
  for (int i = 0; i < n; i++) {
    int64_t before = atomic_load_explicit(&subs[i]->last_wait_ns, memory_order_relaxed);
    atomic_store_explicit(&subs[i]->last_wait_ns,
                          ready[i] || took > before ? took : before, memory_order_relaxed);
  }
}

/* Looks for data before a sleep (the wait began at ``start``, with none there); the
 * number of queues that have some. */
static int spin_for_data(msgq_subscriber *const *subs, int n, uint8_t *ready,
                         int64_t timeout_ns, int64_t start) {
  int count = 0;
  bool fixed;
  const int64_t base = wait_spin_budget_ns(&fixed);
  if (base == 0 || !recent_wait_was_short(subs, n, base)) return 0;
  uint32_t largest = 0;
  for (int i = 0; i < n; i++) {
    uint32_t s = atomic_load_explicit(&subs[i]->last_size, memory_order_relaxed);
    if (s > largest) largest = s;
  }
  int64_t budget = spin_budget_for(base, fixed, largest);
  if (timeout_ns > 0 && timeout_ns < budget) budget = timeout_ns;
  int64_t spin_until = os_cpus_available() > 1 ? start + MSGQ_SPIN_NS : start;
  if (spin_until > start + budget) spin_until = start + budget;
  for (int64_t now = start; now < spin_until; now = os_monotonic_ns()) {
    for (int k = 0; k < 16; k++) {
      if ((count = check_all(subs, n, ready))) return count;
      os_cpu_relax();
    }
  }
  for (int64_t now = os_monotonic_ns(); now - start < budget; now = os_monotonic_ns()) {
    os_yield();
    if ((count = check_all(subs, n, ready))) return count;
  }
  return 0;
}

int msgq_poll(msgq_subscriber *const *subs, int n, int64_t timeout_ns, uint8_t *ready) {
  return msgq_poll_until(subs, n, timeout_ns, ready, NULL, 0);
}

uint32_t msgq_interrupt_seen(msgq_interrupt *interrupt) {
  return atomic_load_explicit(&interrupt->word, memory_order_acquire);
}

void msgq_interrupt_raise(msgq_interrupt *interrupt) {
  atomic_fetch_add_explicit(&interrupt->word, 1u, memory_order_acq_rel);
  os_wake_all(&interrupt->word);
}

int msgq_poll_until(msgq_subscriber *const *subs, int n, int64_t timeout_ns, uint8_t *ready,
                    msgq_interrupt *interrupt, uint32_t seen) {
  if (n < 0 || (n == 0 && !interrupt)) return -EINVAL;
  int count = n ? check_all(subs, n, ready) : 0;
  if (count || timeout_ns == 0) return count;
  const int64_t start = os_monotonic_ns();
  if (n && (count = spin_for_data(subs, n, ready, timeout_ns, start))) {
    record_wait(subs, n, ready, start);
    return count;
  }

  /* The kernel waits on at most OS_WAIT_MAX_WORDS words (one of them the interrupt word
   * when there is one); with more subscribers, sleep on the first ones in slices of at
   * most 1 ms and check all of them after each. */
  const int max_words = interrupt ? OS_WAIT_MAX_WORDS - 1 : OS_WAIT_MAX_WORDS;
  int wait_n = n;
  if (n > max_words) {
    wait_n = max_words;
    if (timeout_ns < 0 || timeout_ns > 1000000) timeout_ns = 1000000;
  }
  /* A waiting bit cleared by someone else (damage) would hide this sleeper from the
   * publisher: no sleep lasts longer than MSGQ_MAX_SLEEP_NS, so that costs latency at
   * worst, never a hang. */
  if (timeout_ns < 0 || timeout_ns > MSGQ_MAX_SLEEP_NS) timeout_ns = MSGQ_MAX_SLEEP_NS;

  _Atomic uint32_t *words[OS_WAIT_MAX_WORDS] = {0};
  uint32_t expected[OS_WAIT_MAX_WORDS] = {0};
  for (int i = 0; i < wait_n; i++) {
    words[i] = &subs[i]->ring.header->notify_seq;
    expected[i] = begin_wait(subs[i]);
  }
  /* seq_cst: the waiter registrations above come before the write_pointer loads below. */
  atomic_thread_fence(memory_order_seq_cst);
  int r = 0;
  int words_n = wait_n;
  if (interrupt) {
    words[words_n] = &interrupt->word;
    expected[words_n++] = seen;
  }
  count = check_all(subs, n, ready);
  if (!count && !(interrupt && msgq_interrupt_seen(interrupt) != seen)) {
    r = os_wait_any(words, expected, words_n, timeout_ns);
    count = check_all(subs, n, ready);
  }
  for (int i = 0; i < wait_n; i++) end_wait(subs[i]);
  if (n) record_wait(subs, n, ready, start);
  if (count) return count;
  return r == -EINTR ? -EINTR : 0;
}

int msgq_subscriber_wait(msgq_subscriber *sub, int64_t timeout_ns) {
  uint8_t ready;
  msgq_subscriber *const subs[1] = {sub};
  int r = msgq_poll(subs, 1, timeout_ns, &ready);
  return r > 0 ? 1 : r;
}
