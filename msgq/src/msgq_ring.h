/* The msgq ring: one publisher, many subscribers, one shared-memory segment.
 *
 * Layout of a queue (all offsets from the start of the mapping):
 *
 *   0      struct msgq_header      magic, version, geometry (immutable after creation),
 *                                  then the publisher line, the wake line, and
 *                                  MSGQ_READER_SLOTS reader slots, each on its own
 *                                  cache line.
 *   header_size                    the data ring, `capacity` bytes.
 *
 * Messages in the ring are an 8-byte little-endian signed size, then the payload padded
 * to 8 bytes. A size of -1 is the wrap marker: the next message starts at offset 0. The
 * writer always leaves 8 bytes at the end of the ring so the marker fits.
 *
 * Positions (write_pointer, read_pointer) pack a 32-bit cycle count above a 32-bit byte
 * offset so both change in one atomic 64-bit store.
 *
 * Invariants the code relies on:
 *  I1 write_pointer only moves forward; everything in [read position, write_pointer) of a
 *     valid reader is complete, because the payload and its size are stored before the
 *     release store of write_pointer that covers them.
 *  I2 A reader position only moves forward (a reset jumps to the current write_pointer).
 *  I3 Before overwriting bytes that a reader in the previous cycle has not read yet, the
 *     writer clears that reader's valid bit; the reader re-checks the bit after copying a
 *     message and discards the copy when it was cleared (seqlock pattern).
 *  I4 valid_word carries an epoch above the valid bit. A reader that resets bumps the
 *     epoch, and the writer clears the bit only with a compare-exchange against the
 *     word it observed, so an invalidation decided from an old read position can never
 *     hit a reader that has since reset or a new subscriber that took the slot.
 *  I5 A subscriber sleeps only after counting itself in num_waiters (seq_cst) and
 *     re-checking for data; the publisher stores write_pointer (seq_cst) before it loads
 *     num_waiters. One of them sees the other, so no wake-up is lost.
 *  I6 A reset stores its new epoch (seq_cst), then reloads write_pointer (seq_cst); the
 *     publisher loads valid_word seq_cst. A send that still saw the old word started at
 *     or before the position the reset reader settles on, so it never overwrites what
 *     that reader will read. docs/ring.md has the full argument and the crash windows.
 *
 * Every value read from the segment is untrusted: offsets, sizes and the header are
 * bounds-checked, and a bad value resets the reader instead of reading out of bounds. */
#ifndef MSGQ_RING_H
#define MSGQ_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MSGQ_MAGIC 0x31474e5251475351ULL /* "QSGQRNG1" little-endian */
#define MSGQ_LAYOUT_VERSION 1u
#define MSGQ_READER_SLOTS 64u
#define MSGQ_CACHE_LINE 64u

#define MSGQ_DEFAULT_SEGMENT_SIZE (10u * 1024u * 1024u)
/* Smallest ring: room for three empty messages plus the wrap marker, with margin. */
#define MSGQ_MIN_SEGMENT_SIZE 64u
/* Largest ring the 32-bit offsets can address (a multiple of 8). */
#define MSGQ_MAX_SEGMENT_SIZE 0xFFFFFFF8u

#define MSGQ_WRAP_MARKER ((int64_t)-1)

typedef struct {
  /* Written by the subscriber that owns the slot; read by the publisher. */
  _Atomic uint64_t read_pointer;
  /* epoch << 1 | valid. The subscriber sets it; the publisher clears the valid bit
   * with a compare-exchange (I4). */
  _Atomic uint32_t valid_word;
  /* Process id of the subscriber holding the slot; 0 = free. */
  _Atomic int32_t owner_pid;
  /* 1 while the subscriber sleeps in a wait (counted in num_waiters). */
  _Atomic uint32_t waiting;
  uint8_t pad[MSGQ_CACHE_LINE - 20];
} msgq_reader_slot;

typedef struct {
  /* Immutable after creation (magic is stored last, with release). */
  _Atomic uint64_t magic;
  uint32_t layout_version;
  uint32_t header_size;
  uint64_t total_size;
  uint32_t capacity;
  uint32_t num_reader_slots;
  uint64_t created_ns;
  int32_t creator_pid;
  uint8_t pad0[MSGQ_CACHE_LINE - 44];

  /* Publisher line. */
  _Atomic uint64_t write_pointer;
  /* Token of the publisher that owns the queue; a new publisher overwrites it. */
  _Atomic uint64_t publisher_token;
  _Atomic int32_t publisher_pid;
  uint8_t pad1[MSGQ_CACHE_LINE - 20];

  /* Wake line: subscribers sleep on notify_seq; the publisher bumps it and wakes them
   * only while num_waiters > 0, so a send with nobody asleep makes no syscall. */
  _Atomic uint32_t notify_seq;
  _Atomic uint32_t num_waiters;
  /* Bit i set while reader slot i is in use (claimed, possibly by a dead process). */
  _Atomic uint64_t active_readers;
  uint8_t pad2[MSGQ_CACHE_LINE - 16];

  msgq_reader_slot readers[MSGQ_READER_SLOTS];
} msgq_header;

#define MSGQ_HEADER_SIZE ((uint32_t)sizeof(msgq_header))

/* A mapped queue segment (process-local handle). */
typedef struct {
  msgq_header *header;
  uint8_t *data; /* header_size bytes after header */
  uint32_t capacity;
  size_t map_size;
} msgq_ring;

/* Formats `size` bytes at mem as an empty queue (size = header + capacity). Returns 0 or
 * MSGQ_EBADSIZE. The magic is stored last, with release. */
int msgq_ring_format(void *mem, size_t size);

/* Validates the header of a mapping of `size` bytes and fills ring. Returns 0,
 * MSGQ_EBADMAGIC, MSGQ_EVERSION or MSGQ_EGEOMETRY. Never reads past size. */
int msgq_ring_attach(msgq_ring *ring, void *mem, size_t size);

/* Capacity of the data ring for a requested segment size: rounded up to 8 bytes.
 * Returns MSGQ_EBADSIZE (negative) when out of range. */
int64_t msgq_ring_capacity_for(uint64_t segment_size);

/* Largest payload a ring of this capacity accepts (a third of the ring, as the protocol
 * requires, less the size prefix). */
uint32_t msgq_ring_max_message_size(uint32_t capacity);

/* --- Inspection (tools) ----------------------------------------------------------- */

/* What a tool (`msgq queues`) learns from a queue's header without registering in it.
 * Filled by msgq_ring_inspect; every field is a copy, nothing points into the segment. */
typedef struct {
  int status;               /* what msgq_ring_inspect returned: 0 or the damage */
  uint64_t file_size;       /* bytes of the mapping that was inspected */
  uint64_t magic;           /* as found (0: never finished, or not 8 bytes long) */
  uint32_t layout_version;  /* as found, when the magic is msgq's (else 0) */
  /* Empty, or sized with the magic still 0: a creator that died before finishing (or,
   * seen without the file lock, one still at work). Never a queue anyone attached. */
  int unfinished;
  /* The rest is filled only for a header this build accepts (return value 0). */
  uint32_t capacity;        /* segment size of the data ring */
  uint64_t created_ns;      /* creator's CLOCK_MONOTONIC when the queue was formatted */
  int32_t creator_pid;
  int32_t publisher_pid;    /* 0: no publisher (none yet, or it closed cleanly) */
  int publisher_alive;      /* publisher_pid names a process that exists */
  uint64_t write_pointer;   /* cycle << 32 | byte offset */
  uint32_t num_waiters;
  uint64_t active_readers;  /* mask of slots in use */
  uint32_t readers_claimed; /* slots holding a pid (live or dead) */
  uint32_t readers_live;    /* of those, pids of processes that exist */
  int32_t reader_pids[MSGQ_READER_SLOTS];  /* owner of each slot; 0 = free */
  uint8_t reader_alive[MSGQ_READER_SLOTS]; /* 1 where that owner exists */
} msgq_queue_info;

/* Reads a snapshot of the queue in the `size` bytes at mem (which may be mapped
 * read-only): validates the immutable header exactly as msgq_ring_attach does, then copies
 * the publisher, wake and reader-slot fields, and checks which pids are alive
 * (os_process_alive: kill(pid, 0)). Never writes to mem and never reads past size.
 * Returns 0, MSGQ_EBADMAGIC, MSGQ_EVERSION or MSGQ_EGEOMETRY (also in out->status); on
 * an error only status, file_size, magic, layout_version and unfinished are set. */
int msgq_ring_inspect(const void *mem, size_t size, msgq_queue_info *out);

/* --- Publisher -------------------------------------------------------------------- */

typedef struct {
  msgq_ring ring;
  uint64_t token;
  uint64_t write_pointer; /* local copy of the shared one (we are its only writer) */
  /* Reservation in progress: payload size and where its size prefix goes. */
  bool reserved;
  uint32_t reserved_size;
  /* Last read position seen per reader slot; positions only move forward (I2), so a
   * reader already seen in the writer's cycle needs no reload until the writer wraps. */
  uint64_t known_read_pointer[MSGQ_READER_SLOTS];
} msgq_publisher;

/* Takes ownership of the ring: later sends of any previous publisher fail with
 * MSGQ_ENOTOWNER. Subscribers already connected keep their place and keep receiving. */
void msgq_publisher_init(msgq_publisher *pub, const msgq_ring *ring);
/* Gives up ownership (when still the owner) so the queue no longer counts as in use. */
void msgq_publisher_release(msgq_publisher *pub);

/* Copies size bytes into the ring and publishes them. */
int msgq_publisher_send(msgq_publisher *pub, const void *data, uint32_t size);

/* Reserves room for a size-byte message and returns where to write it; nothing is
 * visible to subscribers until msgq_publisher_commit(). */
int msgq_publisher_reserve(msgq_publisher *pub, uint32_t size, void **payload);
int msgq_publisher_commit(msgq_publisher *pub);
void msgq_publisher_abort(msgq_publisher *pub);

/* 1 when every live subscriber, and at least one, has read everything sent (upstream's
 * meaning); 0 otherwise, including when no live subscriber is connected. */
int msgq_publisher_all_readers_updated(const msgq_publisher *pub);
/* Number of reader slots held by live processes. */
int msgq_ring_live_readers(const msgq_ring *ring);

/* --- Subscriber ------------------------------------------------------------------- */

typedef struct {
  msgq_ring ring;
  int slot;
  bool conflate;
  uint32_t valid_word; /* what our slot's valid_word holds while we are valid */
  uint64_t read_pointer;
  uint64_t seen_write_pointer; /* cached; reloaded only when we caught up with it */
  /* The message handed out by peek, committed by consume. */
  uint64_t next_read_pointer;
  /* Statistics. */
  uint64_t resets;         /* times this reader was overtaken and jumped forward */
  uint64_t corrupt_resets; /* resets caused by an out-of-range value in the segment */
} msgq_subscriber;

/* Claims a reader slot (a free one, else one whose owner process is dead) and starts
 * reading at the current write position. Returns 0 or MSGQ_ENOSLOT. */
int msgq_subscriber_init(msgq_subscriber *sub, const msgq_ring *ring, bool conflate);
void msgq_subscriber_release(msgq_subscriber *sub);

/* Finds the next message (the newest one when conflating). Returns 1 with *payload and
 * *size pointing into the ring, 0 when there is none. The caller copies the bytes out,
 * then calls msgq_subscriber_consume(). */
int msgq_subscriber_peek(msgq_subscriber *sub, const uint8_t **payload, uint32_t *size);
/* Returns 1 when the copy taken since peek is intact and advances past it; 0 when the
 * publisher overwrote it meanwhile (the reader was reset; discard the copy). */
int msgq_subscriber_consume(msgq_subscriber *sub);
/* 1 when a message is waiting (cheap; no side effects except caching). */
int msgq_subscriber_has_data(msgq_subscriber *sub);

/* Spins briefly, then sleeps until a message may be there, the timeout (< 0: none)
 * or a signal. Returns 1 (data), 0 (timeout) or -EINTR. */
int msgq_subscriber_wait(msgq_subscriber *sub, int64_t timeout_ns);

/* Waits on n subscribers at once. Sets ready[i] and returns how many have data, 0 on
 * timeout, -EINTR on a signal. Past OS_WAIT_MAX_WORDS subscribers it may return 0
 * early (after at most 1 ms): callers loop until their own deadline. */
int msgq_poll(msgq_subscriber *const *subs, int n, int64_t timeout_ns, uint8_t *ready);

#ifdef MSGQ_TESTING
/* Test builds only: called inside a reader reset, between its load of write_pointer and
 * its stores, to replay a reader preempted there. */
extern void (*msgq_test_reset_hook)(void);
#endif

#endif
