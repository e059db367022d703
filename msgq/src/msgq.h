/* msgq.h — the public C API of msgq: publishers and subscribers of named queues in
 * shared memory, the same queues the Python package (msgq.pub_sock / msgq.sub_sock)
 * uses, under the same naming, prefix and locking rules.
 *
 *   msgq_pub *pub;  msgq_pub_open("camera", 0, 0, &pub);
 *   msgq_sub *sub;  msgq_sub_open("camera", 0, 0, &sub);
 *   msgq_pub_send(pub, "hi", 2);
 *   char buf[64]; size_t n;
 *   if (msgq_sub_recv(sub, buf, sizeof buf, &n, 1000000000) == 1) ... ;
 *   msgq_sub_close(sub); msgq_pub_close(pub);
 *
 * Build: `python -m msgq.cflags --cflags --libs` (or `msgq config --cflags --libs`)
 * prints the flags; link with -lmsgq (shared) or libmsgq.a. Linux only.
 *
 * Errors. Every function that can fail returns a negative code: -errno when the OS said
 * no, or an MSGQ_E* code (msgq_errors.h) when the queue or the caller's input is wrong.
 * msgq_strerror() names both. A function never aborts the process on bad input, on a
 * damaged queue or on a full disk.
 *
 * Names. An endpoint is 1..100 characters from [A-Za-z0-9_.-], not "." or ".."
 * (MSGQ_EBADNAME otherwise). Its queue is the file "msgq_<endpoint>" in $MSGQ_SHM_DIR
 * (default /dev/shm), inside the folder named by $MSGQ_PREFIX (else $OPENPILOT_PREFIX)
 * when one is set; new files get mode $MSGQ_SHM_MODE (octal, default 0600). The
 * environment is read at every open, as in Python.
 *
 * Segment size (bytes of the data ring; 0: the existing size, or
 * MSGQ_DEFAULT_SEGMENT_SIZE for a new queue) is fixed when the queue file is created. A
 * subscriber asking for another size adopts the existing one; a publisher asking for
 * another size re-creates the queue when no live process uses it, adopts it when it is
 * at least as large, and fails with MSGQ_ESIZEMISMATCH otherwise. The largest message
 * is a third of the segment size (msgq_pub_max_message_size).
 *
 * Ownership and lifetime.
 *  O1 A handle belongs to the caller from a successful open until its close; close
 *     accepts NULL. Handles are not thread-safe: one thread at a time per handle (two
 *     handles may be used from two threads at once, also on the same endpoint), with one
 *     exception: threads may wait or poll on a subscriber (msgq_sub_wait, msgq_sub_poll,
 *     msgq_sub_poll_until) while one other thread receives from it.
 *  O2 One publisher per endpoint: opening a publisher takes the endpoint over, and the
 *     previous publisher's next send fails with MSGQ_ENOTOWNER. Subscribers already
 *     connected stay connected and keep receiving.
 *  O3 A subscriber holds one of the queue's MSGQ_READER_SLOTS reader slots from open to
 *     close; it receives every message sent after its open (or only the newest, with
 *     MSGQ_OPEN_CONFLATE). Slots of dead processes are reclaimed; live ones never are, so
 *     a 65th live subscriber gets MSGQ_ENOSLOT.
 *  O4 After fork() the child may use or close an inherited handle, but close (and
 *     reopen) in the child only unmaps: the parent's reader slot and publisher
 *     ownership stay the parent's.
 *  O5 Memory handed out by the library: a reserved payload (msgq_pub_reserve) is
 *     writable until commit/abort or the next call on that publisher; a view
 *     (msgq_sub_view) is readable until msgq_sub_view_end or the next call on that
 *     subscriber; a message from msgq_sub_recv_alloc is the caller's to free() (never
 *     NULL, also for an empty message).
 *  O6 A queue file replaced under its name (damaged, foreign, or re-made by a publisher
 *     with another size) is followed transparently: send, reserve, view and recv re-open
 *     the endpoint with the arguments of the last open and go on there. That re-open
 *     can fail like an open (and returns -EAGAIN like one, see below; also while
 *     another thread waits or polls on the same subscriber: a replaced file wakes it at
 *     once, and the re-open never unmaps a ring under a sleeper: call again); when it fails
 *     after the old queue was given up, the handle is closed-state: every call returns
 *     MSGQ_ECLOSED until msgq_*_reopen succeeds or the handle is closed.
 *  O7 Opening waits at most 50 ms for another process holding the queue file's lock
 *     (creating or registering); then it returns -EAGAIN: call it again (a C program
 *     simply loops; the Python binding checks for Ctrl-C in between).
 *  O8 A handle may hold its mappings (msgq_pub_hold_mappings, msgq_sub_hold_mappings):
 *     while held, a queue it gives up (a follow of O6, a reopen) stays mapped, so that
 *     memory of O5 the caller still points into (a reservation or view kept past its
 *     end) stays valid: stale or unpublished bytes of a replaced file, never unmapped
 *     memory. Ending the hold unmaps them; closing a held handle leaves every mapping it
 *     had mapped for the life of the process. Not held by default; nothing is kept on
 *     the send and receive paths, only where a queue is given up.
 *
 * Safety of received bytes. The ring is a seqlock (docs/ring.md, invariants I1-I7 in
 * msgq_ring.h): the publisher may overwrite a message while a slow subscriber reads it.
 * A copy (msgq_sub_recv, msgq_sub_recv_alloc) is checked after it was taken and is only
 * returned when intact: no call of this API ever returns overwritten bytes as a message.
 * A view points into the ring itself: read what you need, then msgq_sub_view_end tells
 * whether what you read was intact (1) or must be discarded (0). Data derived from a
 * view before view_end returned 1 must be treated as untrusted. In a checksummed queue
 * (MSGQ_OPEN_CHECKSUM) a message whose bytes do not match their CRC32C is dropped and
 * counted (msgq_sub_stats.checksum_errors).
 *
 * Large messages. A message of 256 KiB or more is written into a chunk, a region of the
 * ring reused most recently freed first once every reader has read it, and the ring
 * carries a small descriptor of it (docs/ring.md, "Chunks"); send, reserve, recv and
 * view work the same, with the same size limits and checks. On by default; a queue
 * created while $MSGQ_POOL=0 keeps every message inline.
 *
 * Blocking. Timeouts are in nanoseconds; a negative timeout waits forever, 0 does not
 * wait. Waiting calls return early with -EINTR when a signal arrives, so a program can
 * honour Ctrl-C; nothing in msgq installs a signal handler or sends a signal. */
#ifndef MSGQ_H
#define MSGQ_H

#include <errno.h> /* the -E* codes the functions return */
#include <stddef.h>
#include <stdint.h>

#include "msgq_errors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MSGQ_API_VERSION 1

typedef struct msgq_pub msgq_pub;
typedef struct msgq_sub msgq_sub;

/* open_flags of msgq_pub_open / msgq_sub_open (bitwise or). */
#define MSGQ_OPEN_CONFLATE 1u    /* subscriber: only the newest message is delivered */
#define MSGQ_OPEN_CHECKSUM 2u    /* a queue this open creates carries a CRC32C per message */
#define MSGQ_OPEN_NO_CHECKSUM 4u /* ... or does not; neither flag: $MSGQ_CHECKSUM (1/true/yes) */
/* A publisher whose checksum choice differs from an unused queue's re-creates it; a
 * queue in use keeps what it has (msgq_pub_checksum / msgq_sub_checksum tell). */

/* --- Publisher ------------------------------------------------------------------- */

/* Opens (creating when needed) the queue of endpoint and becomes its publisher (O2).
 * Returns 0 with *out set, or MSGQ_EBADNAME, MSGQ_EBADSIZE, MSGQ_ESIZEMISMATCH,
 * MSGQ_EBADMAGIC/EVERSION/EGEOMETRY (a file we must not replace), -EAGAIN (O7), -EPERM
 * (file or prefix folder of another user), -ENOMEM, -EINVAL (bad flags) or -errno. */
int msgq_pub_open(const char *endpoint, uint64_t segment_size, unsigned open_flags,
                  msgq_pub **out);

/* Moves pub to endpoint (which may be its own) with new arguments. The new queue is
 * opened first: when that fails pub is unchanged and still usable. Then, under the new
 * file's lock, the old queue is given up and the new one taken (any open reservation is
 * abandoned). Returns what msgq_pub_open returns. */
int msgq_pub_reopen(msgq_pub *pub, const char *endpoint, uint64_t segment_size,
                    unsigned open_flags);

/* Gives up ownership (O4: only in the process that opened it), unmaps (not while held,
 * O8), frees. */
void msgq_pub_close(msgq_pub *pub);
/* O8: hold != 0 keeps every queue pub gives up mapped from now on; 0 unmaps the ones
 * kept (not the current one) and stops keeping them. NULL is ignored. */
void msgq_pub_hold_mappings(msgq_pub *pub, int hold);

/* Copies size bytes into the ring and publishes them. Returns 0, MSGQ_ETOOLARGE (more
 * than msgq_pub_max_message_size), MSGQ_ENOTOWNER, -EBUSY (a reservation is open),
 * MSGQ_ECLOSED, or an error of the re-open of O6 (-EAGAIN: call again). */
int msgq_pub_send(msgq_pub *pub, const void *data, size_t size);

/* Zero-copy send: reserves room for a size-byte message and sets *payload to it (O5);
 * nothing is visible until msgq_pub_commit. At most one reservation per publisher.
 * Returns 0 or the errors of send (-EBUSY: one is already open). */
int msgq_pub_reserve(msgq_pub *pub, size_t size, void **payload);
/* Publishes the reserved message. Returns 0, MSGQ_ENORESERVE (nothing reserved) or
 * MSGQ_ENOTOWNER (taken over meanwhile: the message is dropped). */
int msgq_pub_commit(msgq_pub *pub);
/* Drops the reservation; subscribers never see it. No effect without one. */
void msgq_pub_abort(msgq_pub *pub);

/* Subscribers connected now (reader slots held by live processes), >= 0. */
int msgq_pub_num_readers(const msgq_pub *pub);
/* 1 when every live subscriber, and at least one, has read everything sent; else 0. */
int msgq_pub_all_readers_updated(const msgq_pub *pub);
/* Reader slots of dead subscribers this publisher gave back (statistics). */
uint64_t msgq_pub_reclaimed_slots(const msgq_pub *pub);
/* Wraps taken before the end of the ring because every subscriber had caught up, so
 * that the ring's start was reused while still cached (docs/ring.md; statistics). */
uint64_t msgq_pub_early_wraps(const msgq_pub *pub);
uint32_t msgq_pub_segment_size(const msgq_pub *pub);
uint32_t msgq_pub_max_message_size(const msgq_pub *pub);
int msgq_pub_checksum(const msgq_pub *pub); /* 1: the queue carries CRC32Cs */
const char *msgq_pub_endpoint(const msgq_pub *pub);
/* 1 while connected; 0 in the closed state of O6. */
int msgq_pub_is_open(const msgq_pub *pub);

/* --- Subscriber ------------------------------------------------------------------ */

/* Opens (creating when needed) the queue of endpoint and takes a reader slot (O3). The
 * subscriber receives what is sent after this call. Returns 0 with *out set, or the
 * codes of msgq_pub_open (but never MSGQ_ESIZEMISMATCH) and MSGQ_ENOSLOT. */
int msgq_sub_open(const char *endpoint, uint64_t segment_size, unsigned open_flags,
                  msgq_sub **out);
/* As msgq_pub_reopen: on an open error sub is unchanged; when taking a slot in the new
 * queue fails (MSGQ_ENOSLOT) the old one is already given up and sub is closed-state. */
int msgq_sub_reopen(msgq_sub *sub, const char *endpoint, uint64_t segment_size,
                    unsigned open_flags);
/* Gives the reader slot back (O4), unmaps (not while held, O8), frees. Any view ends. */
void msgq_sub_close(msgq_sub *sub);
/* msgq_sub_close that leaves the queue mapped for the life of the process: for a
 * subscriber whose messages were read in place by code that may keep raw pointers into
 * them after the view ended (a decoder's readers); stale bytes, never unmapped memory. */
void msgq_sub_close_keep_mapping(msgq_sub *sub);
/* O8: hold != 0 keeps every queue sub gives up mapped from now on; 0 unmaps the ones
 * kept (not the current one) and stops keeping them. NULL is ignored. */
void msgq_sub_hold_mappings(msgq_sub *sub, int hold);

/* Receives the next message into buf (capacity cap), waiting up to timeout_ns.
 * Returns 1 with *size set, 0 when none came in time, MSGQ_EBUFFER when cap is too
 * small (*size says what is needed; the message stays queued), -EINTR, MSGQ_ECLOSED, or
 * an error of the re-open of O6. */
int msgq_sub_recv(msgq_sub *sub, void *buf, size_t cap, size_t *size, int64_t timeout_ns);
/* The same into a buffer from malloc (O5): 1 with *data and *size, 0, -ENOMEM, ... */
int msgq_sub_recv_alloc(msgq_sub *sub, void **data, size_t *size, int64_t timeout_ns);

/* Zero-copy receive, non-blocking: 1 with *data and *size pointing at the next message in
 * the ring (O5), 0 when there is none, or an error as recv. After reading, call
 * msgq_sub_view_end: nothing of the view may be trusted before it returned 1. */
int msgq_sub_view(msgq_sub *sub, const void **data, size_t *size);
/* Ends the view taken by msgq_sub_view and moves past its message. copy NULL: checks
 * the view itself (what was read through the pointer); else copy is the caller's copy
 * of all *size bytes and is checked instead (against the CRC32C in a checksummed
 * queue). Returns 1 when what was read is the message as published, 0 when it must be
 * discarded (overwritten meanwhile: the subscriber skipped ahead and counts a reset; or
 * a checksum mismatch), MSGQ_ENORESERVE without a view. */
int msgq_sub_view_end(msgq_sub *sub, const void *copy);

/* 1 when a message is waiting (or the queue file was replaced, O6), else 0. Cheap. */
int msgq_sub_has_data(msgq_sub *sub);
/* Waits until a message may be there: 1, 0 on timeout, -EINTR, MSGQ_ECLOSED. */
int msgq_sub_wait(msgq_sub *sub, int64_t timeout_ns);

/* Waits on n subscribers at once (futex_waitv where the kernel has it). Sets ready[i]
 * to 1 for each subscriber with a message waiting and 0 for the others, and returns how
 * many are ready; 0 on timeout, -EINTR, -EINVAL (n < 1 or a NULL handle) or
 * MSGQ_ECLOSED (a handle is closed-state). */
int msgq_sub_poll(msgq_sub *const *subs, int n, int64_t timeout_ns, uint8_t *ready);

/* A wake word: another thread of the process sends a thread waiting in
 * msgq_sub_poll_until back to its caller (e.g. to wait on a new set of subscribers).
 * Take msgq_wake_seen() before deciding what to wait on; a msgq_wake_raise() after that
 * moment ends the wait. */
typedef struct msgq_wake msgq_wake;
/* A new wake word (NULL when out of memory); msgq_wake_free when no thread uses it. */
msgq_wake *msgq_wake_new(void);
void msgq_wake_free(msgq_wake *wake);
uint32_t msgq_wake_seen(msgq_wake *wake);
void msgq_wake_raise(msgq_wake *wake);
/* msgq_sub_poll that also returns 0 once wake was raised after `seen` was taken; n may
 * be 0 (the thread then sleeps on the wake word alone, up to timeout_ns). One sleep
 * lasts at most 100 ms, so it may return 0 early. */
int msgq_sub_poll_until(msgq_sub *const *subs, int n, int64_t timeout_ns, uint8_t *ready,
                        msgq_wake *wake, uint32_t seen);

typedef struct {
  uint64_t resets;          /* times the subscriber fell a ring behind and skipped ahead */
  uint64_t corrupt_resets;  /* of those, caused by out-of-range values in the segment */
  uint64_t checksum_errors; /* messages dropped for a CRC32C mismatch */
} msgq_sub_stats;

/* Counters since the last (re)open. */
void msgq_sub_get_stats(const msgq_sub *sub, msgq_sub_stats *out);
uint32_t msgq_sub_segment_size(const msgq_sub *sub);
int msgq_sub_checksum(const msgq_sub *sub);
int msgq_sub_conflate(const msgq_sub *sub);
const char *msgq_sub_endpoint(const msgq_sub *sub);
int msgq_sub_is_open(const msgq_sub *sub);

/* --- Misc ------------------------------------------------------------------------ */

/* Longest endpoint name, and a buffer size that always fits msgq_endpoint_path. */
#define MSGQ_ENDPOINT_NAME_MAX 100
#define MSGQ_ENDPOINT_PATH_MAX 512

/* 0 when name is an allowed endpoint (or prefix) name, else MSGQ_EBADNAME. */
int msgq_endpoint_valid(const char *name);
/* The queue file of endpoint under the current environment, into out. 0 or error. */
int msgq_endpoint_path(const char *endpoint, char *out, size_t out_len);
/* The folder of the current namespace ($MSGQ_SHM_DIR or /dev/shm, plus the $MSGQ_PREFIX /
 * $OPENPILOT_PREFIX folder) into out, creating the prefix folder when create (for other
 * shared files of a program, as VisionIPC's sockets). 0 or error. */
int msgq_namespace_dir(char *out, size_t out_len, int create);
/* The mode of new queue files: $MSGQ_SHM_MODE (octal) or 0600. */
unsigned msgq_file_mode(void);
/* Nanoseconds on CLOCK_MONOTONIC (the clock of every msgq timeout). */
int64_t msgq_now_ns(void);

#ifdef __cplusplus
}
#endif

#endif
