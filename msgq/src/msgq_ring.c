#define _GNU_SOURCE
#include "msgq_ring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "msgq_errors.h"
#include "os_wait.h"

_Static_assert(sizeof(msgq_reader_slot) == MSGQ_CACHE_LINE, "reader slot is one line");
_Static_assert(sizeof(msgq_header) == MSGQ_CACHE_LINE * (3 + MSGQ_READER_SLOTS),
               "header layout");
_Static_assert(MSGQ_READER_SLOTS <= 64, "active_readers is a 64-bit mask");

/* Before a subscriber sleeps on the futex it looks for data a little longer, because a
 * futex sleep and wake costs tens of microseconds on a virtual machine:
 *  - busy-polling with a pause hint, for MSGQ_SPIN_NS, only when this process may run on
 *    more than one CPU (on one CPU the publisher cannot run while we spin);
 *  - then yielding the CPU (sched_yield) until MSGQ_YIELD_NS have passed: a runnable
 *    publisher gets the CPU at once, and with nothing else to run the wait stays cheap.
 * Past that the subscriber sleeps. The budget bounds the CPU an idle subscriber burns per
 * wait; MSGQ_WAIT_SPIN_US in the environment overrides the total (0: sleep at once). */
#define MSGQ_SPIN_NS 2000
#define MSGQ_YIELD_NS 10000

static inline uint32_t position_cycle(uint64_t p) { return (uint32_t)(p >> 32); }
static inline uint32_t position_offset(uint64_t p) { return (uint32_t)p; }
static inline uint64_t make_position(uint32_t cycle, uint32_t offset) {
  return ((uint64_t)cycle << 32) | offset;
}
static inline uint64_t align8(uint64_t n) { return (n + 7u) & ~(uint64_t)7u; }

/* Sizes travel as 8-byte little-endian fields; the ring is only shared on one machine,
 * so host order is used, read and written with memcpy (offsets are 8-aligned anyway). */
static inline int64_t load_size_field(const uint8_t *at) {
  int64_t v;
  memcpy(&v, at, sizeof v);
  return v;
}
static inline void store_size_field(uint8_t *at, int64_t v) { memcpy(at, &v, sizeof v); }

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

int msgq_ring_format(void *mem, size_t size) {
  if (size < (size_t)MSGQ_HEADER_SIZE + MSGQ_MIN_SEGMENT_SIZE) return MSGQ_EBADSIZE;
  uint64_t capacity = size - MSGQ_HEADER_SIZE;
  if (capacity > MSGQ_MAX_SEGMENT_SIZE || capacity % 8u != 0) return MSGQ_EBADSIZE;
  msgq_header *h = mem;
  memset(h, 0, sizeof *h);
  h->layout_version = MSGQ_LAYOUT_VERSION;
  h->header_size = MSGQ_HEADER_SIZE;
  h->total_size = size;
  h->capacity = (uint32_t)capacity;
  h->num_reader_slots = MSGQ_READER_SLOTS;
  h->created_ns = (uint64_t)os_monotonic_ns();
  h->creator_pid = (int32_t)getpid();
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
  return 0;
}

int msgq_ring_attach(msgq_ring *ring, void *mem, size_t size) {
  memset(ring, 0, sizeof *ring);
  msgq_header *h = mem;
  int r = validate_header(h, size);
  if (r < 0) return r;
  ring->header = h;
  ring->data = (uint8_t *)mem + h->header_size;
  ring->capacity = h->capacity;
  ring->map_size = size;
  return 0;
}

int msgq_ring_live_readers(const msgq_ring *ring) {
  const msgq_header *h = ring->header;
  uint64_t mask = atomic_load_explicit(&h->active_readers, memory_order_acquire);
  int live = 0;
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    if (!(mask & (1ULL << i))) continue;
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
  /* The mutable fields are a snapshot: each load is atomic, together they are not (the
   * queue keeps running). Relaxed loads suffice for a report; nothing is dereferenced. */
  out->write_pointer = atomic_load_explicit(&h->write_pointer, memory_order_relaxed);
  out->publisher_pid = atomic_load_explicit(&h->publisher_pid, memory_order_relaxed);
  out->publisher_alive = out->publisher_pid > 0 && os_process_alive(out->publisher_pid);
  out->num_waiters = atomic_load_explicit(&h->num_waiters, memory_order_relaxed);
  out->active_readers = atomic_load_explicit(&h->active_readers, memory_order_relaxed);
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    int32_t pid = atomic_load_explicit(&h->readers[i].owner_pid, memory_order_relaxed);
    /* Any owned slot counts, active bit or not: a subscriber dies between clearing its
     * bit and its pid in release, and a live one sets its bit only after claiming. */
    if (pid <= 0) continue;
    out->reader_pids[i] = pid;
    out->readers_claimed++;
    out->reader_alive[i] = (uint8_t)os_process_alive(pid);
    out->readers_live += out->reader_alive[i];
  }
  return 0;
}

/* --- Publisher -------------------------------------------------------------------- */

void msgq_publisher_init(msgq_publisher *pub, const msgq_ring *ring) {
  memset(pub, 0, sizeof *pub);
  pub->ring = *ring;
  pub->token = random_token();
  msgq_header *h = ring->header;
  atomic_store_explicit(&h->publisher_pid, (int32_t)getpid(), memory_order_relaxed);
  atomic_store_explicit(&h->publisher_token, pub->token, memory_order_seq_cst);
  uint64_t wp = atomic_load_explicit(&h->write_pointer, memory_order_acquire);
  /* A value left by a dead or hostile writer: restart at the beginning of the next
   * cycle, which invalidates every reader still behind (they reset, never misread). */
  if (position_offset(wp) > ring->capacity - 8u || position_offset(wp) % 8u != 0) {
    wp = make_position(position_cycle(wp) + 2u, 0);
    atomic_store_explicit(&h->write_pointer, wp, memory_order_release);
  }
  pub->write_pointer = wp;
  /* Unknown positions: force a reload on first use by pretending they are two cycles
   * behind (never "safe" under the cycle test below). */
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++)
    pub->known_read_pointer[i] = make_position(position_cycle(wp) - 2u, 0);
}

void msgq_publisher_release(msgq_publisher *pub) {
  msgq_header *h = pub->ring.header;
  if (atomic_load_explicit(&h->publisher_token, memory_order_acquire) == pub->token)
    atomic_store_explicit(&h->publisher_pid, 0, memory_order_relaxed);
}

/* Clears the valid bit of every reader whose unread bytes lie in [start, start + len)
 * of the writer's current cycle (I3). Readers in the current cycle are behind the writer
 * and cannot be there; readers in the previous cycle at or past start + len are not
 * reached yet. Cached positions avoid touching the readers' cache lines on most sends. */
static void invalidate_overtaken_readers(msgq_publisher *pub, uint32_t cycle,
                                         uint32_t start, uint32_t len) {
  msgq_header *h = pub->ring.header;
  uint64_t mask = atomic_load_explicit(&h->active_readers, memory_order_acquire);
  const uint64_t end = (uint64_t)start + len;
  bool cleared_any = false;
  while (mask) {
    unsigned i = (unsigned)__builtin_ctzll(mask);
    mask &= mask - 1;
    uint64_t known = pub->known_read_pointer[i];
    if (position_cycle(known) == cycle) continue;
    if (position_cycle(known) == cycle - 1u && position_offset(known) >= end) continue;

    msgq_reader_slot *slot = &h->readers[i];
    /* Bounded: a reader resets only when it is behind, so two tries are the normal
     * most; the bound only matters against a process scribbling on the slot. */
    for (int attempt = 0; attempt < 64; attempt++) {
      /* seq_cst: pairs with the seq_cst store of valid_word in reader_reset (I6): if we
       * still see the old word, the reader's reset will see our last commit. */
      uint32_t word = atomic_load_explicit(&slot->valid_word, memory_order_seq_cst);
      uint64_t rp = atomic_load_explicit(&slot->read_pointer, memory_order_acquire);
      /* Invalid: it resets to a write_pointer at or past this send's start (I6). The
       * cached lower bound stays as it is: still a lower bound, so nothing is assumed. */
      if (!(word & 1u)) break;
      uint32_t rc = position_cycle(rp), ro = position_offset(rp);
      if (rc == cycle || (rc == cycle - 1u && ro >= end)) {
        pub->known_read_pointer[i] = rp;
        break;
      }
      /* Overtaken (or nonsense): invalidate, but only the epoch we looked at (I4). */
      if (atomic_compare_exchange_strong_explicit(&slot->valid_word, &word, word & ~1u,
                                                  memory_order_seq_cst,
                                                  memory_order_seq_cst)) {
        cleared_any = true;
        break;
      }
      /* The reader changed epoch meanwhile (it reset): look at it again. */
    }
  }
  if (cleared_any) {
    /* The clears must be visible before the payload bytes that overwrite the reader's
     * data (seqlock writer side; pairs with the acquire fence in consume). */
    atomic_thread_fence(memory_order_release);
  }
}

int msgq_publisher_reserve(msgq_publisher *pub, uint32_t size, void **payload) {
  msgq_ring *ring = &pub->ring;
  msgq_header *h = ring->header;
  if (atomic_load_explicit(&h->publisher_token, memory_order_relaxed) != pub->token)
    return MSGQ_ENOTOWNER;
  if (size > msgq_ring_max_message_size(ring->capacity)) return MSGQ_ETOOLARGE;

  const uint32_t total = 8u + (uint32_t)align8(size);
  uint32_t cycle = position_cycle(pub->write_pointer);
  uint32_t offset = position_offset(pub->write_pointer);

  if ((uint64_t)offset + total + 8u > ring->capacity) {
    /* Not enough room before the end (keeping 8 bytes for a marker): the rest of this
     * cycle is skipped. Readers of the previous cycle still beyond offset would be two
     * cycles behind after the wrap, so they are invalidated now. */
    invalidate_overtaken_readers(pub, cycle, offset, ring->capacity - offset);
    store_size_field(ring->data + offset, MSGQ_WRAP_MARKER);
    cycle += 1u;
    offset = 0;
    uint64_t wrapped = make_position(cycle, 0);
    uint64_t expected = pub->write_pointer;
    /* release: the marker is visible to a reader that sees the new cycle. */
    if (!atomic_compare_exchange_strong_explicit(&h->write_pointer, &expected, wrapped,
                                                 memory_order_acq_rel,
                                                 memory_order_relaxed))
      return MSGQ_ENOTOWNER;
    pub->write_pointer = wrapped;
  }
  invalidate_overtaken_readers(pub, cycle, offset, total);
  pub->reserved = true;
  pub->reserved_size = size;
  *payload = ring->data + offset + 8u;
  return 0;
}

int msgq_publisher_commit(msgq_publisher *pub) {
  if (!pub->reserved) return MSGQ_ENORESERVE;
  msgq_ring *ring = &pub->ring;
  msgq_header *h = ring->header;
  pub->reserved = false;
  const uint32_t size = pub->reserved_size;
  const uint32_t cycle = position_cycle(pub->write_pointer);
  const uint32_t offset = position_offset(pub->write_pointer);
  store_size_field(ring->data + offset, (int64_t)size);

  uint64_t expected = pub->write_pointer;
  uint64_t next = make_position(cycle, offset + 8u + (uint32_t)align8(size));
  /* seq_cst: publishes the payload and size (release, I1) and orders this store before
   * the num_waiters load below (pairs with the seq_cst increment in subscriber_wait:
   * either we see the waiter, or the waiter sees this write_pointer). The exchange
   * fails only when another publisher moved the pointer: we no longer own the queue. */
  if (!atomic_compare_exchange_strong_explicit(&h->write_pointer, &expected, next,
                                               memory_order_seq_cst,
                                               memory_order_relaxed))
    return MSGQ_ENOTOWNER;
  pub->write_pointer = next;

  if (atomic_load_explicit(&h->num_waiters, memory_order_seq_cst) != 0) {
    atomic_fetch_add_explicit(&h->notify_seq, 1u, memory_order_release);
    os_wake_all(&h->notify_seq);
  }
  return 0;
}

void msgq_publisher_abort(msgq_publisher *pub) { pub->reserved = false; }

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
  uint64_t mask = atomic_load_explicit(&h->active_readers, memory_order_acquire);
  unsigned live = 0;
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) {
    if (!(mask & (1ULL << i))) continue;
    const msgq_reader_slot *slot = &h->readers[i];
    int32_t pid = atomic_load_explicit(&slot->owner_pid, memory_order_relaxed);
    if (pid <= 0 || !os_process_alive(pid)) continue;
    live++;
    uint32_t word = atomic_load_explicit(&slot->valid_word, memory_order_acquire);
    uint64_t rp = atomic_load_explicit(&slot->read_pointer, memory_order_acquire);
    if (!(word & 1u) || rp != wp) return 0;
  }
  /* Upstream's meaning: every reader, and at least one, has read everything. */
  return live > 0;
}

/* --- Subscriber ------------------------------------------------------------------- */

#ifdef MSGQ_TESTING
void (*msgq_test_reset_hook)(void);
#endif

/* Jumps to the current write position with a fresh epoch (seed protocol "reset reader";
 * I2, I4). Messages between the old position and here are lost to this reader. */
static void reader_reset(msgq_subscriber *sub) {
  msgq_header *h = sub->ring.header;
  msgq_reader_slot *slot = &h->readers[sub->slot];
  /* acquire: whatever made us reset (a cleared bit) is ordered before the loads below. */
  atomic_thread_fence(memory_order_acquire);
  uint64_t wp = atomic_load_explicit(&h->write_pointer, memory_order_acquire);
#ifdef MSGQ_TESTING
  if (msgq_test_reset_hook) msgq_test_reset_hook(); /* a preemption right here */
#endif
  atomic_store_explicit(&slot->read_pointer, wp, memory_order_relaxed);
  uint32_t epoch = (sub->valid_word >> 1) + 1u;
  sub->valid_word = (epoch << 1) | 1u;
  /* seq_cst store, then seq_cst reload of write_pointer (I6): a publisher send that still
   * saw the old word started after a commit this reload sees, so we start at or past the
   * beginning of what that send overwrites, never inside it. The publisher that sees the
   * new word also sees a read_pointer at least as far as the one stored above. */
  atomic_store_explicit(&slot->valid_word, sub->valid_word, memory_order_seq_cst);
  uint64_t wp_now = atomic_load_explicit(&h->write_pointer, memory_order_seq_cst);
  if (wp_now != wp) {
    wp = wp_now;
    atomic_store_explicit(&slot->read_pointer, wp, memory_order_release);
  }
  sub->read_pointer = wp;
  sub->seen_write_pointer = wp;
}

static bool claim_slot(msgq_header *h, unsigned i, int32_t expected_pid, int32_t me) {
  msgq_reader_slot *slot = &h->readers[i];
  if (!atomic_compare_exchange_strong_explicit(&slot->owner_pid, &expected_pid, me,
                                               memory_order_acq_rel,
                                               memory_order_relaxed))
    return false;
  /* A dead owner may have died asleep: take its share of num_waiters back. */
  if (atomic_exchange_explicit(&slot->waiting, 0u, memory_order_acq_rel))
    atomic_fetch_sub_explicit(&h->num_waiters, 1u, memory_order_acq_rel);
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
    if (pid > 0 && pid != me && !os_process_alive(pid) && claim_slot(h, i, pid, me))
      sub->slot = (int)i;
  }
  if (sub->slot < 0) return MSGQ_ENOSLOT;

  msgq_reader_slot *slot = &h->readers[sub->slot];
  sub->valid_word = atomic_load_explicit(&slot->valid_word, memory_order_relaxed) & ~1u;
  /* The bit first, then the reset: every send that does not look at this slot started
   * before the reset's reload of write_pointer, so we start past what it writes (I6). */
  atomic_fetch_or_explicit(&h->active_readers, 1ULL << sub->slot, memory_order_seq_cst);
  reader_reset(sub);
  sub->resets = 0;
  return 0;
}

void msgq_subscriber_release(msgq_subscriber *sub) {
  if (sub->slot < 0) return;
  msgq_header *h = sub->ring.header;
  msgq_reader_slot *slot = &h->readers[sub->slot];
  atomic_fetch_and_explicit(&h->active_readers, ~(1ULL << sub->slot), memory_order_acq_rel);
  if (atomic_exchange_explicit(&slot->waiting, 0u, memory_order_acq_rel))
    atomic_fetch_sub_explicit(&h->num_waiters, 1u, memory_order_acq_rel);
  atomic_store_explicit(&slot->owner_pid, 0, memory_order_release);
  sub->slot = -1;
}

static inline void store_read_pointer(msgq_subscriber *sub, uint64_t rp) {
  sub->read_pointer = rp;
  /* release: the publisher may reuse bytes behind rp only after our copy is done. */
  atomic_store_explicit(&sub->ring.header->readers[sub->slot].read_pointer, rp,
                        memory_order_release);
}

int msgq_subscriber_has_data(msgq_subscriber *sub) {
  if (sub->read_pointer != sub->seen_write_pointer) return 1;
  sub->seen_write_pointer =
      atomic_load_explicit(&sub->ring.header->write_pointer, memory_order_acquire);
  return sub->read_pointer != sub->seen_write_pointer;
}

static void reset_for_corruption(msgq_subscriber *sub) {
  sub->corrupt_resets++;
  sub->resets++;
  reader_reset(sub);
}

int msgq_subscriber_peek(msgq_subscriber *sub, const uint8_t **payload, uint32_t *size) {
  msgq_ring *ring = &sub->ring;
  msgq_reader_slot *slot = &ring->header->readers[sub->slot];
  const uint32_t capacity = ring->capacity;

  for (;;) {
    if (!msgq_subscriber_has_data(sub)) return 0;

    /* Seed protocol step 2 before step 1's value is trusted: the valid bit is checked
     * after loading the size so a size from an overwritten region is never used. */
    const uint32_t rc = position_cycle(sub->read_pointer);
    const uint32_t ro = position_offset(sub->read_pointer);
    if (ro > capacity - 8u || ro % 8u != 0) {
      reset_for_corruption(sub);
      continue;
    }
    const int64_t msg_size = load_size_field(ring->data + ro);
    /* acquire: the size load above happens before the valid check below. */
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&slot->valid_word, memory_order_relaxed) != sub->valid_word) {
      sub->resets++;
      reader_reset(sub);
      continue;
    }

    /* A valid reader is in the writer's cycle or the one before (I3). */
    const uint32_t wc = position_cycle(sub->seen_write_pointer);
    if (rc != wc && rc != wc - 1u) {
      reset_for_corruption(sub);
      continue;
    }
    if (msg_size == MSGQ_WRAP_MARKER) {
      store_read_pointer(sub, make_position(rc + 1u, 0));
      continue;
    }
    /* The message and the 8 reserved bytes must fit before the end of the ring, and
     * it must end at or before what the publisher has published in this cycle. */
    if (msg_size < 0 || (uint64_t)msg_size + 16u > (uint64_t)capacity - ro) {
      reset_for_corruption(sub);
      continue;
    }
    const uint64_t next =
        make_position(rc, ro + 8u + (uint32_t)align8((uint64_t)msg_size));
    const uint64_t wp = sub->seen_write_pointer;
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
      sub->seen_write_pointer =
          atomic_load_explicit(&ring->header->write_pointer, memory_order_acquire);
      if (next != sub->seen_write_pointer) {
        store_read_pointer(sub, next);
        continue;
      }
    }
    sub->next_read_pointer = next;
    *payload = ring->data + ro + 8u;
    *size = (uint32_t)msg_size;
    return 1;
  }
}

int msgq_subscriber_consume(msgq_subscriber *sub) {
  msgq_reader_slot *slot = &sub->ring.header->readers[sub->slot];
  /* acquire: the caller's copy (plain loads) happens before this re-check of the valid
   * bit (seed protocol step 5; seqlock reader side). */
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&slot->valid_word, memory_order_relaxed) != sub->valid_word) {
    sub->resets++;
    reader_reset(sub);
    return 0;
  }
  store_read_pointer(sub, sub->next_read_pointer);
  return 1;
}

/* Marks this reader asleep on the queue and returns the notify_seq to sleep on. */
static uint32_t begin_wait(msgq_subscriber *sub) {
  msgq_header *h = sub->ring.header;
  uint32_t seq = atomic_load_explicit(&h->notify_seq, memory_order_acquire);
  /* seq_cst: pairs with the seq_cst write_pointer exchange in commit (Dekker): after
   * this increment, has_data() below sees the new write_pointer or the publisher sees
   * num_waiters > 0 and bumps notify_seq after the value read above. The count goes up
   * before the slot's flag: dying in between leaks one count (a wasted wake syscall),
   * never a missing one (a lost wake-up for another sleeper). */
  atomic_fetch_add_explicit(&h->num_waiters, 1u, memory_order_seq_cst);
  atomic_store_explicit(&h->readers[sub->slot].waiting, 1u, memory_order_release);
  return seq;
}

static void end_wait(msgq_subscriber *sub) {
  msgq_header *h = sub->ring.header;
  if (atomic_exchange_explicit(&h->readers[sub->slot].waiting, 0u, memory_order_acq_rel))
    atomic_fetch_sub_explicit(&h->num_waiters, 1u, memory_order_release);
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
  if (n <= 0) return -EINVAL;
  int count = spin_for_data(subs, n, ready, timeout_ns);
  if (count || timeout_ns == 0) return count;

  /* The kernel waits on at most OS_WAIT_MAX_WORDS words; with more subscribers, sleep on
   * the first ones in slices of at most 1 ms and check all of them after each. */
  int wait_n = n;
  if (n > OS_WAIT_MAX_WORDS) {
    wait_n = OS_WAIT_MAX_WORDS;
    if (timeout_ns < 0 || timeout_ns > 1000000) timeout_ns = 1000000;
  }

  _Atomic uint32_t *words[OS_WAIT_MAX_WORDS] = {0};
  uint32_t expected[OS_WAIT_MAX_WORDS] = {0};
  for (int i = 0; i < wait_n; i++) {
    words[i] = &subs[i]->ring.header->notify_seq;
    expected[i] = begin_wait(subs[i]);
  }
  /* seq_cst: the waiter registrations above come before the write_pointer loads below. */
  atomic_thread_fence(memory_order_seq_cst);
  int r = 0;
  count = check_all(subs, n, ready);
  if (!count) {
    r = os_wait_any(words, expected, wait_n, timeout_ns);
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
