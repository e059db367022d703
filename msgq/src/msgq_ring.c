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
_Static_assert(MSGQ_POOL_MAX_CHUNKS <= 65536, "chunk indices are 16-bit");
_Static_assert(MSGQ_POOL_MIN_SEGMENT / 8u >= 3u * (MSGQ_POOL_DESCRIPTOR_SIZE + 16u),
               "the ring of a pooled segment holds descriptors");

/* Before a subscriber sleeps on the futex it looks for data a little longer, because a
 * futex sleep and wake costs tens of microseconds on a virtual machine:
 *  - busy-polling with a pause hint, for MSGQ_SPIN_NS, only when this process may run on
 *    more than one CPU (on one CPU the publisher cannot run while we spin);
 *  - then yielding the CPU (sched_yield) until MSGQ_YIELD_NS have passed: a runnable
 *    publisher gets the CPU at once, and with nothing else to run the wait stays cheap.
 * Past that the subscriber sleeps. The budget bounds the CPU an idle subscriber burns per
 * wait; MSGQ_WAIT_SPIN_US in the environment overrides the total (0: sleep at once). */
#define MSGQ_SPIN_NS 2000
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
/* A function of its own under TSan, so that tests/c/tsan.supp can name exactly this
 * load (it races with the publisher by design and is checked by region_intact). */
#define PREFIX_LOAD_FUNCTION __attribute__((noinline)) static
#else
#define PREFIX_LOAD_FUNCTION static inline
#endif
PREFIX_LOAD_FUNCTION uint64_t load_prefix(const uint8_t *at) {
  uint64_t v;
  memcpy(&v, at, sizeof v);
  return v;
}
static inline void store_prefix(uint8_t *at, uint64_t v) { memcpy(at, &v, sizeof v); }

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

static inline uint64_t align64(uint64_t n) { return (n + 63u) & ~(uint64_t)63u; }

/* The one split of a pooled segment of `segment` bytes (P1): the ring keeps at least an
 * eighth, the rest is a sequence word per granule and the granules. Returns 0 when the
 * segment is too small for a pool. Format and attach both use it, so a header whose pool
 * fields disagree with it is refused. */
static int pool_geometry(uint64_t segment, uint32_t *ring_capacity, uint32_t *granules,
                         uint32_t *shift) {
  if (segment < MSGQ_POOL_MIN_SEGMENT || segment > MSGQ_MAX_SEGMENT_SIZE) return 0;
  uint64_t rest = segment - segment / 8u;
  uint32_t sh = MSGQ_POOL_MIN_GRANULE_SHIFT;
  while ((rest >> sh) > MSGQ_POOL_MAX_GRANULES) sh++;
  if (sh > MSGQ_POOL_MAX_GRANULE_SHIFT) return 0;
  uint64_t n = rest >> sh;
  while (n > 0 && align64(n * 8u) + (n << sh) > rest) n--;
  if (n < 2) return 0;
  *ring_capacity = (uint32_t)(segment - align64(n * 8u) - (n << sh));
  *granules = (uint32_t)n;
  *shift = sh;
  return 1;
}

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
  h->ring_capacity = (uint32_t)capacity;
  if ((flags & MSGQ_FLAG_POOL) &&
      !pool_geometry(capacity, &h->ring_capacity, &h->pool_granules, &h->granule_shift))
    flags &= ~MSGQ_FLAG_POOL; /* too small for a pool: a plain ring */
  h->flags = flags;
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
  if (h->flags & MSGQ_FLAG_POOL) {
    uint32_t ring_capacity, granules, shift;
    if (!pool_geometry(h->capacity, &ring_capacity, &granules, &shift) ||
        h->ring_capacity != ring_capacity || h->pool_granules != granules ||
        h->granule_shift != shift)
      return MSGQ_EGEOMETRY;
  } else if (h->ring_capacity != h->capacity || h->pool_granules || h->granule_shift) {
    return MSGQ_EGEOMETRY;
  }
  return 0;
}

int msgq_ring_attach(msgq_ring *ring, void *mem, size_t size) {
  memset(ring, 0, sizeof *ring);
  msgq_header *h = mem;
  int r = validate_header(h, size);
  if (r < 0) return r;
  ring->header = h;
  ring->data = (uint8_t *)mem + h->header_size;
  ring->capacity = h->ring_capacity;
  ring->flags = h->flags;
  ring->map_size = size;
  ring->segment_size = h->capacity;
  ring->max_message = msgq_ring_max_message_size(h->capacity);
  ring->max_inline = msgq_ring_max_message_size(h->ring_capacity);
  if (h->flags & MSGQ_FLAG_POOL) {
    /* validate_header checked that ring, table and granules fill the segment exactly. */
    ring->pool_granules = h->pool_granules;
    ring->granule_shift = h->granule_shift;
    ring->pool_seq = (_Atomic uint64_t *)(ring->data + h->ring_capacity);
    ring->pool_data = ring->data + h->ring_capacity + align64((uint64_t)h->pool_granules * 8u);
    ring->pool_size = (uint64_t)h->pool_granules << h->granule_shift;
  }
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

void msgq_publisher_init(msgq_publisher *pub, const msgq_ring *ring) {
  memset(pub, 0, sizeof *pub);
  pub->ring = *ring;
  pub->token = random_token();
  pub->pid = (int32_t)getpid();
  msgq_header *h = ring->header;
  atomic_store_explicit(&h->publisher_pid, pub->pid, memory_order_relaxed);
  atomic_store_explicit(&h->publisher_token, pub->token, memory_order_seq_cst);
  uint64_t wp = atomic_load_explicit(&h->write_pointer, memory_order_acquire);
  uint64_t reserve = atomic_load_explicit(&h->write_reserve, memory_order_acquire);
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
      atomic_store_explicit(&h->write_reserve, wp, memory_order_release);
      atomic_store_explicit(&h->write_pointer, wp, memory_order_release);
    }
  } else if (!position_in_range(wp, ring->capacity)) {
    wp = make_position(position_cycle(wp) + 2u, 0);
    pub->reserve_high = wp;
    atomic_store_explicit(&h->write_reserve, wp, memory_order_release);
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
  /* The pool is cut at the first pooled send (pool_cut), which also moves every
   * granule's sequence on: descriptors a previous publisher left (and a chunk it died
   * writing) never pass their check again (P6). */
  pub->pool.reserved_chunk = -1;
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
  atomic_store_explicit(&pub->ring.header->write_reserve, pub->reserve_high,
                        memory_order_relaxed);
  /* release fence (seqlock writer): the reserve store is ordered before every store of
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

/* Whether this send should go to offset 0 before the ring's end (I7): far enough in that
 * reusing the start pays, the marker at `offset` stays clear of the `total` bytes about
 * to be written at 0 (so a reader that reads the marker finds it intact), and every
 * reader has caught up. The slots are looked at only every MSGQ_EARLY_WRAP_RETRY_BYTES
 * while a reader is behind, so a stalled reader costs the sends nothing measurable. */
static bool wrap_early(msgq_publisher *pub, uint32_t offset, uint32_t total) {
  if (offset < pub->early_wrap_check || offset < total) return false;
  if (!readers_all_at(pub->ring.header, pub->write_pointer)) {
    pub->early_wrap_check = (uint64_t)offset + pub->early_wrap_retry;
    return false;
  }
  pub->early_wraps++;
  return true;
}

/* Reserves `size` bytes in the ring (inline message or descriptor) and returns where
 * they go. The caller checked ownership and size. */
static int ring_reserve(msgq_publisher *pub, uint32_t size, void **payload) {
  msgq_ring *ring = &pub->ring;
  const uint32_t total = 8u + (uint32_t)align8(size);
  uint32_t cycle = position_cycle(pub->write_pointer);
  uint32_t offset = position_offset(pub->write_pointer);

  if ((uint64_t)offset + total + 8u > ring->capacity || wrap_early(pub, offset, total)) {
    /* Not enough room before the end (keeping 8 bytes for the marker), or every reader
     * is here and the ring's start is warm (I7): the rest of this cycle is skipped. The
     * reserve covers the marker and the message after the wrap. */
    announce_reserve(pub, make_position(cycle + 1u, total));
    store_prefix(ring->data + offset, MSGQ_WRAP_MARKER);
    /* relaxed: published by the write_pointer store below (release), like the marker. */
    atomic_store_explicit(&ring->header->last_wrap, pub->write_pointer, memory_order_relaxed);
    pub->early_wrap_check = pub->early_wrap_from;
    int r = publish_write_pointer(pub, make_position(cycle + 1u, 0));
    if (r < 0) return r;
    cycle += 1u;
    offset = 0;
  } else {
    announce_reserve(pub, make_position(cycle, offset + total));
  }
  *payload = ring->data + offset + 8u;
  return 0;
}

/* Publishes the ring message reserved at write_pointer with this prefix, wakes
 * sleepers, sweeps on schedule. `ring_size` is its size in the ring. */
static int ring_commit(msgq_publisher *pub, uint64_t prefix, uint32_t ring_size) {
  msgq_ring *ring = &pub->ring;
  msgq_header *h = ring->header;
  const uint32_t cycle = position_cycle(pub->write_pointer);
  const uint32_t offset = position_offset(pub->write_pointer);
  store_prefix(ring->data + offset, prefix);
  /* relaxed: published by the write_pointer store below (release). */
  atomic_store_explicit(&h->last_message, pub->write_pointer, memory_order_relaxed);

  int r = publish_write_pointer(pub,
                                make_position(cycle, offset + 8u + (uint32_t)align8(ring_size)));
  if (r < 0) return r;

  bool woke = false;
  if (atomic_load_explicit(&h->waiting_readers, memory_order_seq_cst) != 0) {
    atomic_fetch_add_explicit(&h->notify_seq, 1u, memory_order_release);
    os_wake_all(&h->notify_seq);
    woke = true;
  }
  maybe_sweep(pub, woke);
  return 0;
}

/* --- Chunk pool: the publisher's side (P1-P6 in docs/ring.md) ---------------------- */

/* A sequence word (P2): a write counter (31 bits) above the message size (32 bits)
 * above the "being written" bit. Each write of any chunk gets the next counter, so a
 * descriptor matches only the one write it was made for, in its own chunk. */
#define POOL_COUNTER_MASK ((UINT64_C(1) << 31) - 1u)
static inline uint64_t pool_sequence(uint64_t counter, uint32_t size) {
  return (counter << 33) | ((uint64_t)size << 1);
}

static inline uint32_t chunk_granule(const msgq_pool_publisher *pool, uint32_t chunk) {
  return chunk * pool->chunk_granules;
}

/* Granules a message of `size` bytes spans (at least one). */
static inline uint32_t granules_spanned(const msgq_ring *ring, uint32_t size) {
  uint64_t n = ((uint64_t)size + ((uint64_t)1 << ring->granule_shift) - 1u) >> ring->granule_shift;
  return n ? (uint32_t)n : 1u;
}

/* Cuts the granules into chunks of at least `size` bytes (P3): a quarter more than the
 * chunks so far, so that a stream of growing messages is re-cut a few times only, and
 * no more than MSGQ_POOL_MAX_CHUNKS of them. Nothing in shared memory changes: every
 * write marks each granule it covers (P2), so a descriptor of the old cut fails its
 * check once any byte of it is rewritten, and not before. The chunks that overlap
 * messages still in flight go to the bottom of the free stack, so readers keep them as
 * long as the pool allows. The first cut of a publisher (also after a takeover, P6)
 * starts the write counter past every value in the table. */
static void pool_cut(msgq_publisher *pub, uint32_t size) {
  msgq_ring *ring = &pub->ring;
  msgq_pool_publisher *pool = &pub->pool;
  const uint64_t granule = (uint64_t)1 << ring->granule_shift;
  uint64_t want = size;
  if (pool->chunk_size) want = want > pool->chunk_size + pool->chunk_size / 4u
                                   ? want
                                   : pool->chunk_size + pool->chunk_size / 4u;
  uint64_t floor = ring->pool_size / MSGQ_POOL_MAX_CHUNKS;
  if (want < floor) want = floor;
  uint64_t granules = (want + granule - 1u) >> ring->granule_shift;
  /* At least two chunks (always possible for a message up to msgq_ring_max_message). */
  if (granules > ring->pool_granules / 2u) granules = ring->pool_granules / 2u;

  uint64_t in_flight[MSGQ_POOL_MAX_GRANULES / 64u] = {0};
  if (pool->chunk_size) {
    pool->recuts++;
    for (uint32_t k = 0; k < pool->fifo_count; k++) {
      uint32_t first = chunk_granule(pool, pool->fifo_chunk[(pool->fifo_head + k) %
                                                            MSGQ_POOL_MAX_CHUNKS]);
      for (uint32_t g = first; g < first + pool->chunk_granules; g++)
        in_flight[g / 64u] |= UINT64_C(1) << (g % 64u);
    }
  } else {
    uint64_t highest = 0;
    for (uint32_t g = 0; g < ring->pool_granules; g++) {
      uint64_t c = atomic_load_explicit(&ring->pool_seq[g], memory_order_relaxed) >> 33;
      if (c > highest) highest = c;
    }
    pool->next_counter = (highest + 1u) & POOL_COUNTER_MASK;
  }
  pool->chunk_granules = (uint32_t)granules;
  pool->chunk_size = (uint32_t)(granules << ring->granule_shift);
  pool->num_chunks = ring->pool_granules / (uint32_t)granules;
  if (pool->num_chunks > MSGQ_POOL_MAX_CHUNKS) pool->num_chunks = MSGQ_POOL_MAX_CHUNKS;
  pool->free_count = 0;
  for (int pass = 0; pass < 2; pass++) {
    /* Pass 0 stacks the chunks over in-flight messages (bottom), pass 1 the others, the
     * first chunk on top. */
    for (uint32_t c = pool->num_chunks; c-- > 0;) {
      bool busy = false;
      for (uint32_t g = c * pool->chunk_granules; g < (c + 1u) * pool->chunk_granules; g++)
        busy |= (in_flight[g / 64u] >> (g % 64u)) & 1u;
      if (busy == (pass == 0)) pool->free_stack[pool->free_count++] = (uint16_t)c;
    }
  }
  pool->fifo_head = 0;
  pool->fifo_count = 0;
}

/* Whether a message goes to the pool: the queue has one, and the message is too large
 * for the ring, or at least MSGQ_POOL_THRESHOLD and not tiny beside the chunks cut for
 * earlier messages (a 20 KiB message in a pool cut for 4 MiB ones would take a whole
 * chunk: it stays inline, where it fits). */
static bool goes_to_pool(const msgq_publisher *pub, uint32_t size) {
  if (!pub->ring.pool_granules) return false;
  if (size > pub->ring.max_inline) return true;
  return size >= MSGQ_POOL_THRESHOLD && size >= pub->pool.chunk_size / 4u;
}

/* Moves the in-flight chunks that every reader has read past to the free stack, oldest
 * first, so that the newest-freed is on top (P3). A reader's progress is its slot's
 * report (a claimed slot of a dead reader counts as behind until the sweep frees it);
 * a report that is ahead of us or more than a cycle behind is damage and counts as
 * behind, which can only make us lap (P5), never free a chunk someone is reading. */
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
    if (position_before(wp, rp) || wp - rp >= ((uint64_t)1 << 32)) return;
    if (position_before(rp, laggard)) laggard = rp;
  }
  while (pool->fifo_count) {
    uint32_t at = pool->fifo_head;
    if (position_before(laggard, pool->fifo_end[at])) break;
    pool->free_stack[pool->free_count++] = pool->fifo_chunk[at];
    pool->fifo_head = (at + 1u) % MSGQ_POOL_MAX_CHUNKS;
    pool->fifo_count--;
  }
}

/* Whether a live reader slot pins a message overlapping granules [g, g + n) (P4). */
static bool chunk_pinned(const msgq_header *h, uint32_t g, uint32_t n) {
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    const msgq_reader_slot *slot = &h->readers[i];
    if (atomic_load_explicit(&slot->owner_pid, memory_order_relaxed) == 0) continue;
    uint32_t pin = atomic_load_explicit(&slot->pinned_chunk, memory_order_relaxed);
    if (pin == 0) continue;
    uint32_t first = (pin & 0xFFFFu) - 1u, count = pin >> 16;
    if (first < g + n && g < first + count) return true;
  }
  return false;
}

/* Starts writing a `size`-byte message into chunk c (P2, P4): every granule of the chunk
 * gets the odd word of this write (the next counter, the size, the "being written" bit);
 * then, behind a seq_cst fence, the pins are looked at. A pinned chunk (only looked for
 * when `may_skip`) gets its old words back and 0 is returned; else the odd word, after a
 * release fence that orders it before every byte written into the chunk. */
static uint64_t chunk_begin_write(msgq_publisher *pub, uint32_t c, uint32_t size,
                                  bool may_skip) {
  msgq_pool_publisher *pool = &pub->pool;
  _Atomic uint64_t *words = &pub->ring.pool_seq[chunk_granule(pool, c)];
  const uint32_t n = pool->chunk_granules;
  uint64_t saved[MSGQ_POOL_MAX_GRANULES / 2u];
  const uint64_t odd = pool_sequence(pool->next_counter, size) | 1u;
  for (uint32_t i = 0; i < n; i++) {
    saved[i] = atomic_load_explicit(&words[i], memory_order_relaxed);
    atomic_store_explicit(&words[i], odd, memory_order_relaxed);
  }
  /* seq_cst fence: our word stores before the pin loads; pairs with the fence between a
   * reader's pin store and its word loads (peek): one side sees the other. */
  atomic_thread_fence(memory_order_seq_cst);
  if (may_skip && chunk_pinned(pub->ring.header, chunk_granule(pool, c), n)) {
    /* Nothing was written: the words go back, and a reader that saw the odd ones
     * meanwhile took its message for overwritten (a lost message, never a torn one). */
    for (uint32_t i = 0; i < n; i++)
      atomic_store_explicit(&words[i], saved[i], memory_order_relaxed);
    return 0;
  }
  pool->next_counter = (pool->next_counter + 1u) & POOL_COUNTER_MASK;
  atomic_thread_fence(memory_order_release);
  return odd;
}

/* Takes a chunk for a new message: the most recently freed one that no reader pins;
 * when none is free (a reader is behind by the whole pool), the oldest in-flight chunk
 * that no reader pins (that reader is lapped, P5); when every one is pinned, the oldest
 * anyway (its view then reads as overwritten, as a lapped view of the ring does). Never
 * waits. Returns the chunk, its odd sequence word in *seq_out. */
static uint32_t pool_take(msgq_publisher *pub, uint32_t size, uint64_t *seq_out) {
  msgq_pool_publisher *pool = &pub->pool;
  pool_retire(pub);
  /* Free chunks first, from the top; a pinned one (a reader of a message the last
   * re-cut left there) moves to the bottom. */
  for (uint32_t tries = pool->free_count; tries > 0; tries--) {
    uint32_t c = pool->free_stack[--pool->free_count];
    uint64_t odd = chunk_begin_write(pub, c, size, true);
    if (odd) {
      *seq_out = odd;
      return c;
    }
    memmove(&pool->free_stack[1], &pool->free_stack[0],
            pool->free_count * sizeof pool->free_stack[0]);
    pool->free_stack[0] = (uint16_t)c;
    pool->free_count++;
  }
  pool->laps++;
  for (uint32_t k = 0; k < pool->fifo_count; k++) {
    uint32_t at = (pool->fifo_head + k) % MSGQ_POOL_MAX_CHUNKS;
    uint32_t c = pool->fifo_chunk[at];
    const bool last = k + 1u == pool->fifo_count && pool->free_count == 0;
    uint64_t odd = chunk_begin_write(pub, c, size, !last);
    if (!odd) continue;
    /* Out of the FIFO: the entries before it move up by one. */
    for (uint32_t j = k; j > 0; j--) {
      uint32_t to = (pool->fifo_head + j) % MSGQ_POOL_MAX_CHUNKS;
      uint32_t from = (pool->fifo_head + j - 1u) % MSGQ_POOL_MAX_CHUNKS;
      pool->fifo_chunk[to] = pool->fifo_chunk[from];
      pool->fifo_end[to] = pool->fifo_end[from];
    }
    pool->fifo_head = (pool->fifo_head + 1u) % MSGQ_POOL_MAX_CHUNKS;
    pool->fifo_count--;
    *seq_out = odd;
    return c;
  }
  /* Every chunk pinned, and the free ones too: the top free one anyway. */
  uint32_t c = pool->free_stack[--pool->free_count];
  *seq_out = chunk_begin_write(pub, c, size, false);
  return c;
}

/* A chunk that carries no published message goes back on top of the free stack. */
static void pool_give_back(msgq_pool_publisher *pool, uint32_t c) {
  pool->free_stack[pool->free_count++] = (uint16_t)c;
}

int msgq_publisher_reserve(msgq_publisher *pub, uint32_t size, void **payload) {
  msgq_ring *ring = &pub->ring;
  int r = check_owner(pub);
  if (r < 0) return r;
  if (size > ring->max_message) return MSGQ_ETOOLARGE;
  if (pub->reserved) msgq_publisher_abort(pub); /* a reservation left open is dropped */
  if (goes_to_pool(pub, size)) {
    msgq_pool_publisher *pool = &pub->pool;
    if (size > pool->chunk_size) pool_cut(pub, size);
    uint64_t seq;
    uint32_t c = pool_take(pub, size, &seq);
    if (c != UINT32_MAX) {
      pool->reserved_chunk = (int32_t)c;
      pool->reserved_seq = seq;
      pub->reserved = true;
      pub->reserved_size = size;
      *payload = ring->pool_data + ((uint64_t)chunk_granule(pool, c) << ring->granule_shift);
      return 0;
    }
  }
  r = ring_reserve(pub, size, payload);
  if (r < 0) return r;
  pub->reserved = true;
  pub->reserved_size = size;
  return 0;
}

/* Publishes the reserved chunk: its sequence becomes even, then its descriptor goes
 * into the ring as a small message (P1, P2). */
static int pool_commit(msgq_publisher *pub) {
  msgq_ring *ring = &pub->ring;
  msgq_pool_publisher *pool = &pub->pool;
  const uint32_t c = (uint32_t)pool->reserved_chunk;
  const uint32_t g = chunk_granule(pool, c);
  const uint32_t size = pub->reserved_size;
  pool->reserved_chunk = -1;
  const uint8_t *payload = ring->pool_data + ((uint64_t)g << ring->granule_shift);
  uint64_t prefix = MSGQ_POOL_DESCRIPTOR_SIZE | MSGQ_POOL_DESCRIPTOR_BIT;
  if (ring->flags & MSGQ_FLAG_CHECKSUM) prefix |= (uint64_t)msgq_crc32c(payload, size) << 32;
  const uint64_t seq = pool->reserved_seq & ~(uint64_t)1u; /* written: even */
  /* release fence: the chunk's bytes before its even words (and before the descriptor,
   * which write_pointer's release publishes). */
  atomic_thread_fence(memory_order_release);
  for (uint32_t i = 0; i < pool->chunk_granules; i++)
    atomic_store_explicit(&ring->pool_seq[g + i], seq, memory_order_relaxed);
  void *at;
  int r = check_owner(pub);
  if (r == 0) r = ring_reserve(pub, MSGQ_POOL_DESCRIPTOR_SIZE, &at);
  if (r < 0) {
    pool_give_back(pool, c);
    return r;
  }
  store_prefix(at, (uint64_t)g | ((uint64_t)size << 32));
  store_prefix((uint8_t *)at + 8u, seq);
  r = ring_commit(pub, prefix, MSGQ_POOL_DESCRIPTOR_SIZE);
  if (r < 0) {
    pool_give_back(pool, c);
    return r;
  }
  uint32_t tail = (pool->fifo_head + pool->fifo_count) % MSGQ_POOL_MAX_CHUNKS;
  pool->fifo_chunk[tail] = (uint16_t)c;
  pool->fifo_end[tail] = pub->write_pointer;
  pool->fifo_count++;
  pool->sends++;
  return 0;
}

int msgq_publisher_commit(msgq_publisher *pub) {
  if (!pub->reserved) return MSGQ_ENORESERVE;
  msgq_ring *ring = &pub->ring;
  pub->reserved = false;
  if (pub->pool.reserved_chunk >= 0) return pool_commit(pub);
  const uint32_t size = pub->reserved_size;
  const uint32_t offset = position_offset(pub->write_pointer);
  uint64_t prefix = size;
  if (ring->flags & MSGQ_FLAG_CHECKSUM)
    prefix |= (uint64_t)msgq_crc32c(ring->data + offset + 8u, size) << 32;
  return ring_commit(pub, prefix, size);
}

void msgq_publisher_abort(msgq_publisher *pub) {
  if (pub->reserved && pub->pool.reserved_chunk >= 0)
    pool_give_back(&pub->pool, (uint32_t)pub->pool.reserved_chunk);
  pub->pool.reserved_chunk = -1;
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
  uint64_t reserve = atomic_load_explicit(&h->write_reserve, memory_order_relaxed);
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
  uint64_t reserve = atomic_load_explicit(&h->write_reserve, memory_order_relaxed);
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

/* Whether every granule the peeked message spans still carries the sequence word its
 * descriptor named (P2). */
static bool granules_hold(const msgq_subscriber *sub) {
  const msgq_ring *ring = &sub->ring;
  const uint32_t n = granules_spanned(ring, sub->peeked_size);
  for (uint32_t i = 0; i < n; i++)
    if (atomic_load_explicit(&ring->pool_seq[sub->peeked_granule + i], memory_order_relaxed) !=
        sub->peeked_seq)
      return false;
  return true;
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
  return atomic_load_explicit(&h->superseded, memory_order_relaxed) != 0;
}

static void reset_for_corruption(msgq_subscriber *sub) {
  sub->corrupt_resets++;
  sub->resets++;
  reader_reset(sub);
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
        return atomic_load_explicit(&h->superseded, memory_order_relaxed) ? MSGQ_ESUPERSEDED
                                                                            : 0;
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
    /* A chunk descriptor's two words, read with the prefix so that the one check below
     * covers them too (I3); trusted only after it, and bounded by the ring. */
    uint64_t descriptor[2] = {0, 0};
    const bool pooled = (prefix & MSGQ_POOL_DESCRIPTOR_BIT) && prefix != MSGQ_WRAP_MARKER;
    if (pooled && ring->pool_granules && (uint64_t)ro + 8u + 16u + 8u <= capacity) {
      descriptor[0] = load_prefix(ring->data + ro + 8u);
      descriptor[1] = load_prefix(ring->data + ro + 16u);
    }
    /* The prefix is only trusted once the bytes it came from are known intact (I3). */
    if (!region_intact(h, rc, ro)) {
      /* The cycle ended exactly here (I7): the marker was overwritten, the next cycle's
       * messages may still be intact; they are checked like any others. */
      if (atomic_load_explicit(&h->last_wrap, memory_order_relaxed) == sub->read_pointer) {
        store_read_pointer(sub, make_position(rc + 1u, 0));
        continue;
      }
      sub->resets++;
      reader_reset(sub);
      continue;
    }
    if (prefix == MSGQ_WRAP_MARKER) {
      store_read_pointer(sub, make_position(rc + 1u, 0));
      continue;
    }
    const uint32_t msg_size = (uint32_t)prefix & ~MSGQ_POOL_DESCRIPTOR_BIT;
    /* The message and the 8 reserved bytes must fit before the end of the ring, and
     * it must end at or before what the publisher has published in this cycle. */
    if ((uint64_t)msg_size + 16u > (uint64_t)capacity - ro ||
        (!(ring->flags & MSGQ_FLAG_CHECKSUM) && (prefix >> 32) != 0) ||
        (pooled && (!ring->pool_granules || msg_size != MSGQ_POOL_DESCRIPTOR_SIZE))) {
      reset_for_corruption(sub);
      continue;
    }
    /* A descriptor names a whole message inside the pool, with an even sequence (P2). */
    const uint32_t granule = (uint32_t)descriptor[0];
    const uint32_t pooled_size = (uint32_t)(descriptor[0] >> 32);
    if (pooled && (granule >= ring->pool_granules || (descriptor[1] & 1u) ||
                   (uint32_t)(descriptor[1] >> 1) != pooled_size ||
                   pooled_size > msgq_ring_max_message(ring) ||
                   ((uint64_t)granule << ring->granule_shift) + pooled_size > ring->pool_size)) {
      reset_for_corruption(sub);
      continue;
    }
    const uint64_t next = make_position(rc, ro + 8u + (uint32_t)align8(msg_size));
    if (position_cycle(wp) == rc && position_offset(next) > position_offset(wp)) {
      reset_for_corruption(sub);
      continue;
    }

    if (sub->conflate) {
      /* Skip without copying to the newest published message. */
      if (next != sub->seen_write_pointer) {
        store_read_pointer(sub, next);
        continue;
      }
      refresh_write_pointer(sub);
      if (next != sub->seen_write_pointer) {
        store_read_pointer(sub, next);
        continue;
      }
    }
    sub->next_read_pointer = next;
    sub->peeked_checksum = (uint32_t)(prefix >> 32);
    if (pooled) {
      /* Pin, then check that the granules still hold this message (P4). The seq_cst
       * fence pairs with the one in chunk_begin_write: either the publisher sees our
       * pin, or we see its odd words. */
      msgq_reader_slot *slot = &sub->ring.header->readers[sub->slot];
      const uint32_t span = granules_spanned(ring, pooled_size);
      atomic_store_explicit(&slot->pinned_chunk, (span << 16) | (granule + 1u),
                            memory_order_relaxed);
      atomic_thread_fence(memory_order_seq_cst);
      sub->peeked_pool = true;
      sub->peeked_granule = granule;
      sub->peeked_seq = descriptor[1];
      sub->peeked_size = pooled_size;
      if (!granules_hold(sub)) {
        /* Reused already: this reader was lapped (P5). Only this message is lost; the
         * next descriptors name newer chunks, which may still hold theirs. */
        unpin(sub);
        sub->resets++;
        store_read_pointer(sub, next);
        continue;
      }
      *payload = ring->pool_data + ((uint64_t)granule << ring->granule_shift);
      *size = pooled_size;
      return 1;
    }
    sub->peeked_size = msg_size;
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
  bool intact = granules_hold(sub);
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
      sub->peeked_pool
          ? sub->ring.pool_data + ((uint64_t)sub->peeked_granule << sub->ring.granule_shift)
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

static int64_t wait_spin_budget_ns(void) {
  static _Atomic int64_t budget = -1;
  int64_t b = atomic_load_explicit(&budget, memory_order_relaxed);
  if (b < 0) {
    const char *env = getenv("MSGQ_WAIT_SPIN_US");
    b = env && env[0] ? (int64_t)strtoll(env, NULL, 10) * 1000 : MSGQ_YIELD_NS;
    if (b < 0) b = 0;
    atomic_store_explicit(&budget, b, memory_order_relaxed);
  }
  return b;
}

static int spin_for_data(msgq_subscriber *const *subs, int n, uint8_t *ready,
                         int64_t timeout_ns) {
  int count = check_all(subs, n, ready);
  if (count || timeout_ns == 0) return count;
  int64_t budget = wait_spin_budget_ns();
  if (timeout_ns > 0 && timeout_ns < budget) budget = timeout_ns;
  if (budget == 0) return 0;
  const int64_t start = os_monotonic_ns();
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
  int count = n ? spin_for_data(subs, n, ready, timeout_ns) : 0;
  if (count || timeout_ns == 0) return count;

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
  if (count) return count;
  return r == -EINTR ? -EINTR : 0;
}

int msgq_subscriber_wait(msgq_subscriber *sub, int64_t timeout_ns) {
  uint8_t ready;
  msgq_subscriber *const subs[1] = {sub};
  int r = msgq_poll(subs, 1, timeout_ns, &ready);
  return r > 0 ? 1 : r;
}
