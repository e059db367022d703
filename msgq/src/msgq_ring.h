/* The msgq ring: one publisher, many subscribers, one shared-memory segment.
 *
 * Layout of a queue (all offsets from the start of the mapping):
 *
 *   0      struct msgq_header      magic, version, geometry, flags (immutable after
 *                                  creation), then the publisher line, the wake line,
 *                                  and MSGQ_READER_SLOTS reader slots, each on its own
 *                                  cache line.
 *   header_size                    the data ring, `capacity` bytes.
 *
 * Messages in the ring are an 8-byte prefix, then the payload padded to 8 bytes. The
 * prefix holds the payload size in its low 32 bits and, in a queue created with
 * MSGQ_FLAG_CHECKSUM, the CRC32C of the payload in its high 32 bits (else 0). A prefix
 * of all ones is the wrap marker: the next message starts at offset 0. The writer always
 * leaves 8 bytes at the end of the ring so the marker fits.
 *
 * Positions (write_pointer, write_reserve, read positions) pack a 32-bit cycle count
 * above a 32-bit byte offset so both change in one atomic 64-bit store.
 *
 * Invariants the code relies on:
 *  I1 write_pointer only moves forward; everything in [read position, write_pointer) of
 *     a reader is complete, because the payload and its prefix are stored before the
 *     release store of write_pointer that covers them.
 *  I2 Before the publisher writes a byte (payload, prefix or wrap marker) it stores
 *     write_reserve = the position just past the last byte of that send, then its
 *     complement in write_reserve_check, then a release fence (seqlock writer side).
 *     write_reserve >= write_pointer, and the bytes of cycle c at offsets below
 *     offset(write_reserve) may have been overwritten by cycle c + 1 once
 *     cycle(write_reserve) == c + 1. Whoever reads the reserve takes the later of the
 *     two copies (load_reserve), so damage to one copy can only make it later: readers
 *     judge more bytes overwritten and lose messages, never take overwritten bytes for
 *     intact ones.
 *  I3 A reader owns its position (process memory; the copy in its slot is only a report
 *     for the publisher and tools). After reading a prefix, and again after copying a
 *     payload, it issues an acquire fence and reloads write_reserve: the bytes
 *     [start, end) it read in cycle rc are intact when write_reserve is in cycle rc, or
 *     in cycle rc + 1 at an offset <= start. Otherwise they may be overwritten: the copy
 *     is discarded and the reader jumps to write_pointer. No other field (slot, mask,
 *     wake line) takes part in that decision, so no damage to them can make a reader
 *     deliver overwritten bytes (seqlock reader side; pairs with I2's fence); a write
 *     into write_reserve alone cannot either (I2: the later copy counts).
 *  I4 A subscriber sleeps only after setting its bit in waiting_readers (seq_cst) and
 *     re-checking for data; the publisher stores write_pointer (seq_cst) before it loads
 *     waiting_readers. One of them sees the other, so no wake-up is lost. A publisher
 *     that wakes takes every bit (exchange to 0) before it bumps notify_seq: a reader
 *     whose bit it took loaded notify_seq before setting the bit, so its sleep ends; one
 *     that sets its bit after the exchange sees the new write_pointer (the Dekker pair
 *     above). A bit belongs to a slot, so a subscriber that dies asleep leaves its own
 *     bit set and nothing else, until the next wake takes it or the slot is reclaimed.
 *  I5 A slot is reclaimed only by a process that first takes it over with a
 *     compare-exchange of owner_pid (from a dead pid, or 0 for a stray waiting bit), so a
 *     live subscriber never loses its slot, nor its waiting bit but to a wake. The publisher sweeps the
 *     slots for dead owners at most every MSGQ_SWEEP_INTERVAL_NS, checking the clock only
 *     every MSGQ_SWEEP_CHECK_SENDS sends or on a send that wakes sleepers, so the cost
 *     per send stays bounded however many subscribers die.
 *  I6 superseded != 0 says this file was replaced under its name (queue_file.c): the
 *     publisher stops sending into it (MSGQ_ESUPERSEDED) and a subscriber that has read
 *     everything in it reports MSGQ_ESUPERSEDED, so both re-open the endpoint. A live
 *     process whose mapping's immutable header no longer validates sets it too (the
 *     publisher at its sweep, a subscriber when it has read everything): the next
 *     opener replaces such a file, and may not recognise it as ours to mark it.
 *  I7 The publisher may wrap early (a wrap marker before the end of the ring) when every
 *     claimed reader slot reports the current write_pointer: nobody is reading or holds
 *     a view, so the ring's start can be reused while it is still in the cache. The
 *     marker's position is also stored in last_wrap before write_pointer moves to the
 *     next cycle: a reader that finds the marker overwritten while it stands exactly at
 *     last_wrap goes on at the next cycle's start, so a reader that falls behind right
 *     after an early wrap keeps a whole ring of buffering. Safety does not depend on the
 *     reports or on last_wrap (I3 decides alone); a false value only costs a reader
 *     messages, as being overtaken does.
 *     docs/ring.md has the argument and the crash windows.
 *
 * Chunks for large messages (MSGQ_FLAG_POOL; docs/ring.md has the argument and crash
 * windows). A chunk is a region of the ring itself, reserved at the write position like
 * any message, so the ring keeps its whole segment and a queue that never carries a large
 * message is exactly the plain ring:
 *  P1 A descriptor is a ring message of MSGQ_POOL_DESCRIPTOR_SIZE bytes whose prefix has
 *     MSGQ_POOL_DESCRIPTOR_BIT set: the chunk's ring position and its sequence word. A
 *     chunk record is a ring record with that bit and a larger size: a sequence word,
 *     then the chunk's bytes; readers step over it. Words are trusted only after I3 and
 *     range checks.
 *  P2 A chunk is written fresh (record and descriptor in one ring reservation, I2 covers
 *     both) or reused: the publisher stores an odd sequence word (counter | size | 1),
 *     then a release fence, then the bytes, then a release fence and the even word,
 *     then the descriptor. A reader's copy or view is intact when, after an acquire
 *     fence, the chunk's word is still the descriptor's and the chunk's ring bytes are
 *     intact by I3 (the ring writer has not come round to them).
 *  P3 Only the publisher hands chunks out and takes them back (process memory: a LIFO
 *     free stack, a FIFO in flight). A chunk is reused only once every claimed reader
 *     slot reports a position past its last descriptor; with none free, the message gets
 *     a fresh chunk at the write position.
 *  P4 A reader pins the chunk it is reading in its slot, then a seq_cst fence, then
 *     checks the word; a publisher reusing a chunk stores its odd word, then a seq_cst
 *     fence, then reads the pins, and restores the word when the chunk is pinned.
 *  P5 The publisher never waits: a chunk it is about to overwrite by the ring walk is
 *     simply forgotten (its readers find it lapped, as any ring message). A chunk is
 *     reused only while the writer's reservation (with the new descriptor) is less than
 *     a quarter ring past its record (MSGQ_POOL_REUSE_SPAN_DIVISOR), so every message
 *     stays intact until the writer has written at least 3/4 of a ring after it (a
 *     whole ring for a fresh chunk or an inline message, as in the plain ring).
 *  P6 A new publisher starts with no chunks: it reuses only chunks it wrote fresh, whose
 *     ring reservation already made every older chunk over those bytes fail I3.
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
#define MSGQ_LAYOUT_VERSION 6u
#define MSGQ_READER_SLOTS 64u
#define MSGQ_CACHE_LINE 64u

#define MSGQ_DEFAULT_SEGMENT_SIZE (10u * 1024u * 1024u)
/* Smallest ring: room for three empty messages plus the wrap marker, with margin. */
#define MSGQ_MIN_SEGMENT_SIZE 64u
/* Largest ring the 32-bit offsets can address (a multiple of 8). */
#define MSGQ_MAX_SEGMENT_SIZE 0xFFFFFFF8u

#define MSGQ_WRAP_MARKER UINT64_MAX

/* Header flags, chosen at creation. */
#define MSGQ_FLAG_CHECKSUM 1u /* every message carries the CRC32C of its payload */
/* Large messages go into chunks in the ring (P1-P6; docs/ring.md). Chosen at format time
 * ($MSGQ_POOL, default on); openers compare flags without it. A chunk takes ring bytes
 * like the message it carries, so the file, the ring and the largest message are the
 * same with and without it. */
#define MSGQ_FLAG_POOL 2u
#define MSGQ_KNOWN_FLAGS (MSGQ_FLAG_CHECKSUM | MSGQ_FLAG_POOL)

/* Whether new queues get chunks unless $MSGQ_POOL says (queue_file.c). */
#ifndef MSGQ_POOL_DEFAULT
#define MSGQ_POOL_DEFAULT 1
#endif
/* Chunks a publisher keeps track of for reuse (free and in flight together). */
#define MSGQ_POOL_MAX_CHUNKS 64u
/* A chunk is reused only while the ring writer is less than this fraction of a ring past
 * its record (P5): a message in a reused chunk then stays intact while the writer writes
 * the other 3/4 of a ring after it, as a message of the plain ring does for a whole ring. */
#define MSGQ_POOL_REUSE_SPAN_DIVISOR 4u
/* Messages of at least this many bytes go into chunks. Smaller ones stay inline: 64 KiB
 * messages in chunks measured 0.5-0.9x the ring's copy rate and 1.5-1.7x its round trip
 * between two CPUs (docs/benchmarks.md), and they cost the ring little to walk. */
#define MSGQ_POOL_THRESHOLD (256u * 1024u)
/* Bit of a ring prefix's size field marking a chunk descriptor (size exactly
 * MSGQ_POOL_DESCRIPTOR_SIZE: the chunk's ring position and sequence word; its CRC32C, if
 * any, covers the payload in the chunk) or a chunk record (any larger size: a sequence
 * word, then the chunk's bytes). Ring messages are below 2 GiB, so the bit is free. */
#define MSGQ_POOL_DESCRIPTOR_BIT 0x80000000u
#define MSGQ_POOL_DESCRIPTOR_SIZE 16u
/* Ring bytes a fresh chunk costs beyond the message inline: the record's sequence word
 * and the descriptor with its prefix. */
#define MSGQ_POOL_FRESH_OVERHEAD 32u

/* Early wrap (I7): looked at once the write offset reaches MSGQ_EARLY_WRAP_BYTES (a
 * quarter of a smaller ring), then at most once per MSGQ_EARLY_WRAP_RETRY_BYTES (a
 * sixteenth of a smaller ring) written while some reader is behind. */
#define MSGQ_EARLY_WRAP_BYTES (256u * 1024u)
#define MSGQ_EARLY_WRAP_RETRY_BYTES (64u * 1024u)

/* Dead-subscriber sweep of the publisher (I5). */
#define MSGQ_SWEEP_INTERVAL_NS 20000000LL /* 20 ms */
#define MSGQ_SWEEP_CHECK_SENDS 64u

typedef struct {
  /* Written by the subscriber that owns the slot (a report of how far it has read, for
   * all_readers_updated, the publisher's early wrap (I7) and tools; never used to decide
   * what is safe to read). */
  _Atomic uint64_t read_pointer;
  /* Process id of the subscriber holding the slot; 0 = free. */
  _Atomic int32_t owner_pid;
  /* 1 + the ring offset / 8 of the chunk this subscriber is reading (P4), 0: none. Lives
   * and dies with the slot, so a dead reader's pin goes with its slot (I5). */
  _Atomic uint32_t pinned_chunk;
  uint8_t pad[MSGQ_CACHE_LINE - 16];
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
  uint32_t flags; /* MSGQ_FLAG_* */
  /* The ring is always the whole data area: ring_capacity == capacity; the other two are
   * 0 (chunks live in the ring, P1). Checked at attach. */
  uint32_t ring_capacity;
  uint32_t pool_granules;
  uint32_t granule_shift;
  uint32_t reserved1;

  /* Publisher line. */
  _Atomic uint64_t write_pointer;
  /* End of the bytes the publisher may be writing right now (I2). */
  _Atomic uint64_t write_reserve;
  /* Token of the publisher that owns the queue; a new publisher overwrites it. */
  _Atomic uint64_t publisher_token;
  _Atomic int32_t publisher_pid;
  /* Non-zero once the file was replaced under its name (I6). */
  _Atomic uint32_t superseded;
  /* Position of the newest published message (a hint for conflating readers, which
   * jump straight to it; it is checked like any other position). */
  _Atomic uint64_t last_message;
  /* Where the newest wrap marker was written (the end of that cycle, I7): a reader that
   * stands exactly there may go on at the next cycle's start even when the marker itself
   * was overwritten already. A hint like last_message: what is read there is checked. */
  _Atomic uint64_t last_wrap;
  /* ~write_reserve, stored right after it (I2). Away from write_reserve on the line, so
   * no single write reaches both. */
  _Atomic uint64_t write_reserve_check;
  uint8_t pad1[MSGQ_CACHE_LINE - 56];

  /* Wake line: subscribers sleep on notify_seq; the publisher bumps it and wakes them
   * only while a waiting bit is set, so a send with nobody asleep makes no syscall. */
  _Atomic uint32_t notify_seq;
  uint32_t reserved0;
  /* Bit i set while the subscriber in slot i sleeps (I4). */
  _Atomic uint64_t waiting_readers;
  uint8_t pad2[MSGQ_CACHE_LINE - 16];

  msgq_reader_slot readers[MSGQ_READER_SLOTS];
} msgq_header;

#define MSGQ_HEADER_SIZE ((uint32_t)sizeof(msgq_header))

/* A mapped queue segment (process-local handle). */
typedef struct {
  msgq_header *header;
  uint8_t *data; /* header_size bytes after header */
  uint32_t capacity; /* of the ring: the whole data area */
  uint32_t flags; /* copied at attach: the segment cannot change them later */
  size_t map_size;
  uint32_t segment_size; /* the data area (what openers asked for) */
  /* Set at attach so that a send divides nothing: the largest message of the queue
   * (msgq_ring_max_message), and the largest that may go into a fresh chunk (its record
   * and descriptor stay within a third of the ring; larger ones stay inline). */
  uint32_t max_message;
  uint32_t max_chunked;
} msgq_ring;

/* Formats `size` bytes at mem as an empty queue (size = header + capacity) with the
 * given MSGQ_FLAG_* flags. Returns 0 or MSGQ_EBADSIZE. The magic is stored last, with
 * release. */
int msgq_ring_format(void *mem, size_t size, uint32_t flags);

/* Validates the header of a mapping of `size` bytes and fills ring. Returns 0,
 * MSGQ_EBADMAGIC, MSGQ_EVERSION or MSGQ_EGEOMETRY. Never reads past size. */
int msgq_ring_attach(msgq_ring *ring, void *mem, size_t size);

/* Marks the queue at mem superseded (I6) and wakes its sleepers, so that every process
 * mapping it opens the endpoint again. For the replacer of a file of ours, and for a live
 * process that finds the immutable header of its own mapping damaged (a header that no
 * longer validates would make the next opener replace the file without recognising it as
 * ours: the processes on it must move by themselves). */
void msgq_ring_mark_superseded(msgq_header *h);

/* Capacity of the data ring for a requested segment size: rounded up to 8 bytes.
 * Returns MSGQ_EBADSIZE (negative) when out of range. */
int64_t msgq_ring_capacity_for(uint64_t segment_size);

/* Largest payload a ring of this capacity accepts (a third of the ring, as the protocol
 * requires, less the size prefix). */
uint32_t msgq_ring_max_message_size(uint32_t capacity);
/* Largest payload of an attached queue: msgq_ring_max_message_size of its segment size,
 * with or without chunks. */
uint32_t msgq_ring_max_message(const msgq_ring *ring);

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
  uint32_t flags;           /* MSGQ_FLAG_* */
  int superseded;           /* the file was replaced under its name */
  uint32_t num_waiters;     /* subscribers asleep (bits set in waiting_readers) */
  uint32_t wakes;           /* notify_seq: how many sends woke sleepers (wraps at 2^32) */
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

/* A chunk the publisher knows of (P3): the ring position of its record and how many
 * payload bytes it holds; in flight, the ring position just past its last descriptor. */
typedef struct {
  uint64_t position;
  uint64_t end;
  uint32_t capacity;
} msgq_chunk;

/* The publisher's own bookkeeping of its chunks (process memory: only the publisher
 * hands chunks out and takes them back, P3). A chunk is free (on the LIFO stack), in
 * flight (its descriptor is in the ring, oldest first in the FIFO) or reserved (being
 * written). A chunk the ring writer comes round to is forgotten (P5). */
typedef struct {
  uint32_t free_count;
  msgq_chunk free_stack[MSGQ_POOL_MAX_CHUNKS]; /* top: most recently freed (cache-warm) */
  uint32_t fifo_head;
  uint32_t fifo_count;
  msgq_chunk fifo[MSGQ_POOL_MAX_CHUNKS];
  bool reserving;     /* the open reservation is a chunk */
  bool reserved_fresh; /* ...written fresh at the write position (else reused) */
  msgq_chunk reserved;
  uint64_t reserved_seq; /* the odd sequence the reserved chunk carries while written */
  uint64_t next_counter; /* write counter of the next sequence word (P2) */
  /* Statistics. */
  uint64_t sends;  /* messages sent in chunks */
  uint64_t reuses; /* of those, into a chunk written before (the rest: fresh) */
  uint64_t forgotten; /* chunks the ring writer came round to while tracked */
} msgq_pool_publisher;

typedef struct {
  msgq_ring ring;
  uint64_t token;
  int32_t pid;
  uint64_t write_pointer; /* local copy of the shared one (we are its only writer) */
  uint64_t reserve_high;  /* highest write_reserve announced (I2) */
  /* Reservation in progress: payload size and where its size prefix goes. */
  bool reserved;
  uint32_t reserved_size;
  /* Dead-subscriber sweep (I5): sends left before the next look at the clock, and the
   * monotonic time of the next sweep. */
  uint32_t sends_to_clock_check;
  int64_t next_sweep_ns;
  uint64_t reclaimed_slots; /* statistics: dead subscribers' slots given back */
  /* Early wrap (I7): the write offset at which the reader slots are looked at next, and
   * this ring's first-look offset and retry distance. */
  uint64_t early_wrap_check;
  uint32_t early_wrap_from;
  uint32_t early_wrap_retry;
  uint64_t early_wraps; /* statistics: wraps taken before the end of the ring */
  msgq_pool_publisher pool;
} msgq_publisher;

/* Takes ownership of the ring: later sends of any previous publisher fail with
 * MSGQ_ENOTOWNER. Subscribers already connected keep their place and keep receiving.
 * When the previous publisher died inside a send (write_reserve ahead of
 * write_pointer) or the pointers are out of range, the write position moves two cycles
 * on, so every reader jumps forward instead of reading what that send left half-done. */
void msgq_publisher_init(msgq_publisher *pub, const msgq_ring *ring);
/* Gives up ownership (when still the owner) so the queue no longer counts as in use. */
void msgq_publisher_release(msgq_publisher *pub);

/* Copies size bytes into the ring and publishes them. Returns 0, MSGQ_ETOOLARGE,
 * MSGQ_ENOTOWNER or MSGQ_ESUPERSEDED (the file was replaced: open the endpoint again). */
int msgq_publisher_send(msgq_publisher *pub, const void *data, uint32_t size);

/* Reserves room for a size-byte message and returns where to write it; nothing is
 * visible to subscribers until msgq_publisher_commit(). */
int msgq_publisher_reserve(msgq_publisher *pub, uint32_t size, void **payload);
int msgq_publisher_commit(msgq_publisher *pub);
void msgq_publisher_abort(msgq_publisher *pub);

/* Gives back the slots (and waiting bits) of subscribers whose process is gone, and marks
 * the file superseded when its immutable header no longer validates (I6). Called by sends
 * on their own schedule (I5); callable directly. Returns how many slots it freed. */
int msgq_publisher_sweep(msgq_publisher *pub);

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
  /* Ours alone (I3); atomic (relaxed stores) because a thread that polls this handle
   * reads it while the receiving thread moves it (msgq_subscriber_has_data). */
  _Atomic uint64_t read_pointer;
  uint64_t seen_write_pointer; /* cached; reloaded only when we caught up with it */
  /* The message handed out by peek, committed by consume. */
  uint64_t next_read_pointer;
  uint32_t peeked_size;
  uint32_t peeked_checksum;
  /* The peeked message is in a chunk: the chunk's ring position (pinned in our slot,
   * P4) and the sequence its descriptor named (P2). */
  bool peeked_pool;
  uint64_t peeked_chunk;
  uint64_t peeked_seq;
  /* How long this handle's last wait took until data came (or it timed out); 0 before
   * the first. A long one means a slow stream: the next wait sleeps without spinning
   * (msgq_poll_until). Relaxed atomics: a heuristic, read and written by waiters. */
  _Atomic int64_t last_wait_ns;
  /* The size of the last message peeked: a wait after a large one looks for data for
   * about two copies of it before sleeping (msgq_poll_until). Relaxed, as last_wait_ns. */
  _Atomic uint32_t last_size;
  /* Statistics. */
  uint64_t resets;          /* times this reader was overtaken and jumped forward */
  uint64_t corrupt_resets;  /* resets caused by an out-of-range value in the segment */
  uint64_t checksum_errors; /* messages dropped because their CRC32C did not match */
} msgq_subscriber;

/* Claims a reader slot (a free one, else one whose owner process is dead) and starts
 * reading at the current write position. Returns 0 or MSGQ_ENOSLOT. */
int msgq_subscriber_init(msgq_subscriber *sub, const msgq_ring *ring, bool conflate);
void msgq_subscriber_release(msgq_subscriber *sub);

/* Finds the next message (the newest one when conflating). Returns 1 with *payload and
 * *size pointing into the ring, 0 when there is none, MSGQ_ESUPERSEDED when there is
 * none and the file was replaced (open the endpoint again). The caller copies the bytes
 * out, then calls msgq_subscriber_consume() with its copy. */
int msgq_subscriber_peek(msgq_subscriber *sub, const uint8_t **payload, uint32_t *size);
/* Returns 1 when the copy taken since peek is intact and advances past it; 0 when it
 * must be discarded: the publisher may have overwritten it meanwhile (the reader jumped
 * forward, I3), or, in a checksummed queue, `copy` does not match the message's CRC32C
 * (the message is skipped and counted in checksum_errors). `copy` is the caller's copy
 * of the payload (NULL only in a queue without checksums). */
int msgq_subscriber_consume(msgq_subscriber *sub, const void *copy);
/* Ends the use of the message peek() handed out when the caller read it where it lies,
 * without a copy (a view): returns 1 when its bytes were intact for the whole use and
 * advances past it; 0 when the publisher may have overwritten them meanwhile (the
 * reader jumps forward, I3); MSGQ_ECHECKSUM when, in a checksummed queue, the bytes
 * were intact but do not match the message's CRC32C (skipped, counted in
 * checksum_errors). The checksum is computed over the ring's bytes before the overwrite
 * check, so a result of 1 means the bytes the caller used were the message it was sent.
 * Call it after the caller's last access to the payload. */
int msgq_subscriber_release_view(msgq_subscriber *sub);
/* 1 when a message is waiting, or when the file was replaced or its header damaged (I6;
 * so that waits end and the next peek reports it); cheap, and it writes nothing in the handle, so a thread may
 * poll a handle (msgq_poll) while another receives from it. */
int msgq_subscriber_has_data(msgq_subscriber *sub);

/* Spins briefly, then sleeps until a message may be there, the timeout (< 0: none)
 * or a signal. Returns 1 (data), 0 (timeout) or -EINTR. One sleep lasts at most 100 ms
 * (a wake-up lost to a damaged waiting bit costs latency, never a hang), so it may
 * return 0 before the timeout: callers loop until their own deadline. */
int msgq_subscriber_wait(msgq_subscriber *sub, int64_t timeout_ns);

/* Waits on n subscribers at once. Sets ready[i] and returns how many have data, 0 on
 * timeout, -EINTR on a signal. It may return 0 early (after at most 100 ms, or 1 ms
 * past OS_WAIT_MAX_WORDS subscribers): callers loop until their own deadline. */
int msgq_poll(msgq_subscriber *const *subs, int n, int64_t timeout_ns, uint8_t *ready);
/* A word a waiting thread sleeps on besides its subscribers, so that another thread of
 * the process can send it back to its caller (e.g. to wait on a new set of subscribers):
 * take msgq_interrupt_seen() before deciding what to wait on, then msgq_poll_until(); a
 * msgq_interrupt_raise() after that moment ends the wait (returns 0). Process-local. */
typedef struct {
  _Atomic uint32_t word;
} msgq_interrupt;
uint32_t msgq_interrupt_seen(msgq_interrupt *interrupt);
void msgq_interrupt_raise(msgq_interrupt *interrupt);
/* msgq_poll that also returns 0 early once the interrupt was raised after `seen` was
 * taken. At most OS_WAIT_MAX_WORDS - 1 subscribers are slept on at once (more: slices
 * of 1 ms). interrupt may be NULL (then it is msgq_poll); with one, n may be 0 (a thread
 * with nothing to wait on sleeps on the interrupt alone). */
int msgq_poll_until(msgq_subscriber *const *subs, int n, int64_t timeout_ns, uint8_t *ready,
                    msgq_interrupt *interrupt, uint32_t seen);


#endif
