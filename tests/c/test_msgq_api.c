/* C unit tests of the public API (msgq/src/msgq.h) on real queue files in a private
 * MSGQ_SHM_DIR: the life cycle, argument errors, takeover, reserve/commit/abort, the
 * in-place view and its overwrite check, checksums, readers, poll, conflate, following a
 * replaced file (also under handles that hold their mappings), reader-slot exhaustion,
 * fork, and a threaded run. Nothing read from the shared segment is asserted with
 * assert(): every check is a CHECK that counts a failure. Prints "N passed, N failed";
 * exits non-zero on any failure. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "msgq.h"
#include "msgq_ring.h"

#include "check.h"

#define SMALL 4096u /* a small ring: laps quickly */

static msgq_pub *open_pub(const char *endpoint, uint64_t size, unsigned flags) {
  msgq_pub *pub = NULL;
  int r;
  while ((r = msgq_pub_open(endpoint, size, flags, &pub)) == -EAGAIN) {
  }
  CHECK(r == 0 && pub != NULL);
  return pub;
}

static msgq_sub *open_sub(const char *endpoint, uint64_t size, unsigned flags) {
  msgq_sub *sub = NULL;
  int r;
  while ((r = msgq_sub_open(endpoint, size, flags, &sub)) == -EAGAIN) {
  }
  CHECK(r == 0 && sub != NULL);
  return sub;
}

static void test_round_trip(void) {
  msgq_sub *sub = open_sub("round_trip", SMALL, 0);
  msgq_pub *pub = open_pub("round_trip", SMALL, 0);
  if (!sub || !pub) return;
  CHECK(strcmp(msgq_pub_endpoint(pub), "round_trip") == 0);
  CHECK(msgq_pub_segment_size(pub) == SMALL && msgq_sub_segment_size(sub) == SMALL);
  CHECK(msgq_pub_max_message_size(pub) < SMALL / 3);
  char buf[64];
  size_t n = 99;
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 0); /* nothing yet, no wait */
  CHECK(msgq_pub_send(pub, "hello", 5) == 0);
  CHECK(msgq_pub_send(pub, "", 0) == 0);
  CHECK(msgq_pub_send(pub, "0123456789", 10) == 0);
  CHECK(msgq_sub_has_data(sub) == 1);
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, -1) == 1 && n == 5 && !memcmp(buf, "hello", 5));
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 0);
  /* Too small a buffer: the size is reported and the message stays queued. */
  CHECK(msgq_sub_recv(sub, buf, 4, &n, 0) == MSGQ_EBUFFER && n == 10);
  void *data = NULL;
  CHECK(msgq_sub_recv_alloc(sub, &data, &n, 0) == 1 && n == 10 &&
        data && !memcmp(data, "0123456789", 10));
  free(data);
  CHECK(msgq_sub_has_data(sub) == 0);
  /* A timeout is honoured (and not cut short by the core's bounded sleeps). */
  int64_t start = msgq_now_ns();
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 30000000) == 0);
  CHECK(msgq_now_ns() - start >= 30000000);
  CHECK(msgq_pub_send(pub, buf, (size_t)msgq_pub_max_message_size(pub) + 1) == MSGQ_ETOOLARGE);
  msgq_sub_close(sub);
  msgq_pub_close(pub);
  msgq_pub_close(NULL); /* O1: close accepts NULL */
  msgq_sub_close(NULL);
}

static void test_argument_errors(void) {
  msgq_pub *pub = (msgq_pub *)1;
  msgq_sub *sub = (msgq_sub *)1;
  char long_name[120];
  memset(long_name, 'a', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  const char *bad[] = {"", ".", "..", "a/b", "../x", "sp ace", long_name};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK(msgq_pub_open(bad[i], 0, 0, &pub) == MSGQ_EBADNAME && pub == NULL);
    CHECK(msgq_sub_open(bad[i], 0, 0, &sub) == MSGQ_EBADNAME && sub == NULL);
    CHECK(msgq_endpoint_valid(bad[i]) == MSGQ_EBADNAME);
  }
  CHECK(msgq_pub_open(NULL, 0, 0, &pub) == MSGQ_EBADNAME);
  CHECK(msgq_pub_open("ok", 0, 0, NULL) == -EINVAL);
  CHECK(msgq_pub_open("ok", 0, 0x100, &pub) == -EINVAL);
  CHECK(msgq_sub_open("ok", 0, MSGQ_OPEN_CHECKSUM | MSGQ_OPEN_NO_CHECKSUM, &sub) == -EINVAL);
  CHECK(msgq_pub_open("ok", 1ull << 40, 0, &pub) == MSGQ_EBADSIZE);
  CHECK(msgq_sub_poll(NULL, 1, 0, NULL) == -EINVAL);
  CHECK(msgq_endpoint_valid("camera-front_1.v2") == 0);
  char path[MSGQ_ENDPOINT_PATH_MAX];
  CHECK(msgq_endpoint_path("cam", path, sizeof path) == 0 && strstr(path, "msgq_cam"));
  CHECK(strcmp(msgq_strerror(MSGQ_ECLOSED), msgq_strerror(MSGQ_EBADNAME)) != 0);
  CHECK(strlen(msgq_strerror(-EAGAIN)) > 0);
}

static void test_takeover(void) {
  msgq_sub *sub = open_sub("takeover", SMALL, 0);
  msgq_pub *first = open_pub("takeover", SMALL, 0);
  msgq_pub *second = open_pub("takeover", SMALL, 0);
  if (!sub || !first || !second) return;
  CHECK(msgq_pub_send(first, "x", 1) == MSGQ_ENOTOWNER);
  CHECK(msgq_pub_send(second, "y", 1) == 0);
  char buf[8];
  size_t n;
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 1 && buf[0] == 'y');
  msgq_pub_close(first); /* not the owner any more: leaves the second alone */
  CHECK(msgq_pub_send(second, "z", 1) == 0);
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && buf[0] == 'z');
  msgq_pub_close(second);
  msgq_sub_close(sub);
}

static void test_reserve_commit_abort(void) {
  msgq_sub *sub = open_sub("reserve", SMALL, 0);
  msgq_pub *pub = open_pub("reserve", SMALL, 0);
  if (!sub || !pub) return;
  void *slot = NULL;
  CHECK(msgq_pub_commit(pub) == MSGQ_ENORESERVE);
  CHECK(msgq_pub_reserve(pub, 4, &slot) == 0 && slot != NULL);
  CHECK(msgq_pub_send(pub, "no", 2) == -EBUSY);      /* one reservation at a time */
  CHECK(msgq_pub_reserve(pub, 4, &slot) == -EBUSY);
  memcpy(slot, "drop", 4);
  msgq_pub_abort(pub);
  CHECK(msgq_sub_has_data(sub) == 0);
  CHECK(msgq_pub_reserve(pub, 4, &slot) == 0);
  memcpy(slot, "keep", 4);
  CHECK(msgq_sub_has_data(sub) == 0); /* nothing visible before commit */
  CHECK(msgq_pub_commit(pub) == 0);
  char buf[8];
  size_t n;
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 4 && !memcmp(buf, "keep", 4));
  CHECK(msgq_pub_reserve(pub, SMALL, &slot) == MSGQ_ETOOLARGE);
  msgq_pub_close(pub);
  msgq_sub_close(sub);
}

static void test_view_and_overwrite_check(void) {
  msgq_sub *sub = open_sub("view", SMALL, 0);
  msgq_pub *pub = open_pub("view", SMALL, 0);
  if (!sub || !pub) return;
  const void *data;
  size_t n;
  CHECK(msgq_sub_view_end(sub, NULL) == MSGQ_ENORESERVE);
  CHECK(msgq_sub_view(sub, &data, &n) == 0);
  CHECK(msgq_pub_send(pub, "in place", 8) == 0);
  CHECK(msgq_sub_view(sub, &data, &n) == 1 && n == 8);
  int same = n == 8 && !memcmp(data, "in place", 8);
  CHECK(msgq_sub_view_end(sub, NULL) == 1 && same);
  /* A view the publisher laps while it is held: view_end says discard it. */
  CHECK(msgq_pub_send(pub, "first", 5) == 0);
  CHECK(msgq_sub_view(sub, &data, &n) == 1);
  char filler[512] = {0};
  for (int i = 0; i < 3 * (int)(SMALL / sizeof filler); i++)
    CHECK(msgq_pub_send(pub, filler, sizeof filler) == 0);
  CHECK(msgq_sub_view_end(sub, NULL) == 0);
  msgq_sub_stats stats;
  msgq_sub_get_stats(sub, &stats);
  CHECK(stats.resets >= 1);
  /* After the reset the subscriber is at the write position again. */
  CHECK(msgq_pub_send(pub, "after", 5) == 0);
  char buf[16];
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 5 && !memcmp(buf, "after", 5));
  msgq_pub_close(pub);
  msgq_sub_close(sub);
}

static void test_checksum_detects_damage(void) {
  msgq_sub *sub = open_sub("checksummed", SMALL, MSGQ_OPEN_CHECKSUM);
  msgq_pub *pub = open_pub("checksummed", SMALL, MSGQ_OPEN_CHECKSUM);
  if (!sub || !pub) return;
  CHECK(msgq_pub_checksum(pub) == 1 && msgq_sub_checksum(sub) == 1);
  CHECK(msgq_pub_send(pub, "payload", 7) == 0);
  const void *data;
  size_t n;
  CHECK(msgq_sub_view(sub, &data, &n) == 1 && n == 7);
  /* A hostile writer flips a byte in the ring (the mapping is writable). */
  if (n == 7) ((volatile char *)data)[3] ^= 0x20;
  CHECK(msgq_sub_view_end(sub, NULL) == 0);
  msgq_sub_stats stats;
  msgq_sub_get_stats(sub, &stats);
  CHECK(stats.checksum_errors == 1);
  /* The copying receive drops a damaged message as well, and goes on to the next. */
  CHECK(msgq_pub_send(pub, "damaged", 7) == 0);
  CHECK(msgq_pub_send(pub, "good", 4) == 0);
  CHECK(msgq_sub_view(sub, &data, &n) == 1);
  if (n == 7) ((volatile char *)data)[0] ^= 1;
  char buf[16];
  /* view without view_end, then recv: recv starts again from the same message. */
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 4 && !memcmp(buf, "good", 4));
  msgq_sub_get_stats(sub, &stats);
  CHECK(stats.checksum_errors == 2);
  msgq_pub_close(pub);
  msgq_sub_close(sub);
}

static void test_readers_and_all_updated(void) {
  msgq_pub *pub = open_pub("readers", SMALL, 0);
  if (!pub) return;
  CHECK(msgq_pub_num_readers(pub) == 0);
  CHECK(msgq_pub_all_readers_updated(pub) == 0); /* no reader: not "all updated" */
  msgq_sub *a = open_sub("readers", 0, 0), *b = open_sub("readers", 0, 0);
  if (!a || !b) return;
  CHECK(msgq_sub_segment_size(a) == SMALL); /* a subscriber adopts the existing size */
  CHECK(msgq_pub_num_readers(pub) == 2);
  CHECK(msgq_pub_all_readers_updated(pub) == 1);
  CHECK(msgq_pub_send(pub, "m", 1) == 0);
  CHECK(msgq_pub_all_readers_updated(pub) == 0);
  char buf[4];
  size_t n;
  CHECK(msgq_sub_recv(a, buf, sizeof buf, &n, 0) == 1);
  CHECK(msgq_pub_all_readers_updated(pub) == 0);
  CHECK(msgq_sub_recv(b, buf, sizeof buf, &n, 0) == 1);
  CHECK(msgq_pub_all_readers_updated(pub) == 1);
  msgq_sub_close(b);
  CHECK(msgq_pub_num_readers(pub) == 1);
  msgq_sub_close(a);
  msgq_pub_close(pub);
}

static void test_poll(void) {
  msgq_sub *subs[3] = {open_sub("poll_a", SMALL, 0), open_sub("poll_b", SMALL, 0),
                       open_sub("poll_c", SMALL, 0)};
  msgq_pub *pub = open_pub("poll_b", SMALL, 0);
  if (!subs[0] || !subs[1] || !subs[2] || !pub) return;
  uint8_t ready[3] = {9, 9, 9};
  CHECK(msgq_sub_poll(subs, 3, 0, ready) == 0);
  int64_t start = msgq_now_ns();
  CHECK(msgq_sub_poll(subs, 3, 20000000, ready) == 0);
  CHECK(msgq_now_ns() - start >= 20000000);
  CHECK(msgq_pub_send(pub, "b", 1) == 0);
  CHECK(msgq_sub_poll(subs, 3, -1, ready) == 1);
  CHECK(ready[0] == 0 && ready[1] == 1 && ready[2] == 0);
  CHECK(msgq_sub_wait(subs[1], 0) == 1);
  msgq_sub *with_null[2] = {subs[0], NULL};
  CHECK(msgq_sub_poll(with_null, 2, 0, ready) == -EINVAL);
  msgq_pub_close(pub);
  for (int i = 0; i < 3; i++) msgq_sub_close(subs[i]);
}

static void test_conflate(void) {
  msgq_sub *sub = open_sub("conflate", SMALL, MSGQ_OPEN_CONFLATE);
  msgq_pub *pub = open_pub("conflate", SMALL, 0);
  if (!sub || !pub) return;
  CHECK(msgq_sub_conflate(sub) == 1);
  for (char c = 'a'; c <= 'e'; c++) CHECK(msgq_pub_send(pub, &c, 1) == 0);
  char buf[4];
  size_t n;
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 1 && buf[0] == 'e');
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 0);
  msgq_pub_close(pub);
  msgq_sub_close(sub);
}

/* Marks the endpoint's current file superseded, as if damage had been found in it: the
 * next opener replaces it and every handle on it must follow (O6). */
static void mark_file_superseded(const char *endpoint) {
  char path[MSGQ_ENDPOINT_PATH_MAX];
  CHECK(msgq_endpoint_path(endpoint, path, sizeof path) == 0);
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0);
  if (fd < 0) return;
  msgq_header *h = mmap(NULL, sizeof *h, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(h != MAP_FAILED);
  if (h != MAP_FAILED) {
    atomic_store(&h->superseded, 1u);
    munmap(h, sizeof *h);
  }
  close(fd);
}

/* Subscribers of the queue asleep in a wait (their bits in the header's waiting_readers:
 * set just before the futex wait, cleared after it). */
static int sleepers_of(const char *endpoint) {
  char path[MSGQ_ENDPOINT_PATH_MAX];
  if (msgq_endpoint_path(endpoint, path, sizeof path) != 0) return -1;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  msgq_header *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (h == MAP_FAILED) return -1;
  int n = __builtin_popcountll(atomic_load(&h->waiting_readers));
  munmap(h, sizeof *h);
  return n;
}

static void *wait_long(void *arg) {
  msgq_sub_wait(arg, 5000000000LL); /* returns once the replaced file counts as data */
  return NULL;
}

static void test_follow_waits_for_a_sleeper(void) {
  /* Another thread sleeps on the subscriber when its file is replaced (O1's exception):
   * the follow is refused (-EAGAIN) until that thread let go of the old ring, then it
   * succeeds. Under TSan this is also the check that polling and receiving on one
   * handle do not race. */
  msgq_sub *sub = open_sub("follow_sleeper", SMALL, 0);
  msgq_pub *pub = open_pub("follow_sleeper", SMALL, 0);
  if (!sub || !pub) return;
  pthread_t sleeper;
  pthread_create(&sleeper, NULL, wait_long, sub);
  /* until it is asleep on the queue (not a guessed delay, which a loaded machine
   * outlasts: then the follow below is never refused and the test proves nothing) */
  int64_t deadline = msgq_now_ns() + 10000000000LL;
  while (sleepers_of("follow_sleeper") != 1 && msgq_now_ns() < deadline) usleep(1000);
  CHECK(sleepers_of("follow_sleeper") == 1);
  mark_file_superseded("follow_sleeper");
  const void *data;
  size_t n;
  int r;
  int64_t give_up = msgq_now_ns() + 3000000000LL;
  while ((r = msgq_sub_view(sub, &data, &n)) == -EAGAIN && msgq_now_ns() < give_up) {
  }
  CHECK(r == 0);
  CHECK(msgq_sub_is_open(sub) == 1);
  pthread_join(sleeper, NULL);
  CHECK(msgq_pub_send(pub, "new", 3) == 0);
  char buf[8];
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 1000000000LL) == 1 && n == 3);
  msgq_pub_close(pub);
  msgq_sub_close(sub);
}

static void test_replaced_file_is_followed(void) {
  msgq_sub *sub = open_sub("follow", SMALL, 0);
  msgq_pub *pub = open_pub("follow", SMALL, 0);
  if (!sub || !pub) return;
  CHECK(msgq_pub_send(pub, "old", 3) == 0);
  mark_file_superseded("follow");
  /* What is in the old file is still delivered, then the subscriber follows. */
  char buf[8];
  size_t n;
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 3 && !memcmp(buf, "old", 3));
  CHECK(msgq_sub_has_data(sub) == 1); /* superseded: time to follow */
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 0);
  CHECK(msgq_sub_is_open(sub) == 1);
  /* The publisher's next send finds its file replaced and follows too. */
  CHECK(msgq_pub_send(pub, "new", 3) == 0);
  CHECK(msgq_pub_is_open(pub) == 1);
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 3 && !memcmp(buf, "new", 3));
  CHECK(msgq_pub_num_readers(pub) == 1);
  msgq_pub_close(pub);
  msgq_sub_close(sub);
}

/* Whether the page of p is mapped in this process (msync fails with ENOMEM on a hole). */
static int is_mapped(const void *p) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  return msync((void *)((uintptr_t)p & ~(page - 1)), page, MS_ASYNC) == 0;
}

static void test_held_mappings_survive_a_follow(void) {
  /* O8: a reservation and a view kept past their end point into a queue the handles
   * then give up by following a replaced file (O6); while held, that queue stays mapped
   * (a write through the kept reservation lands in the old file, harmlessly), and
   * ending the hold unmaps it. */
  msgq_sub *sub = open_sub("held", SMALL, 0);
  msgq_pub *pub = open_pub("held", SMALL, 0);
  if (!sub || !pub) return;
  msgq_pub_hold_mappings(NULL, 1); /* ignored, as close(NULL) */
  msgq_sub_hold_mappings(NULL, 1);
  void *slot = NULL;
  CHECK(msgq_pub_reserve(pub, 16, &slot) == 0 && slot != NULL);
  if (slot == NULL) return;
  memcpy(slot, "kept", 4);
  CHECK(msgq_pub_commit(pub) == 0);
  const void *view = NULL;
  size_t n;
  CHECK(msgq_sub_view(sub, &view, &n) == 1 && n == 16);
  if (view == NULL) return;
  CHECK(msgq_sub_view_end(sub, NULL) == 1);
  msgq_pub_hold_mappings(pub, 1);
  msgq_sub_hold_mappings(sub, 1);
  mark_file_superseded("held");
  char buf[8];
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 0); /* follows: a new file */
  CHECK(msgq_pub_send(pub, "new", 3) == 0);                /* follows too */
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 3 && !memcmp(buf, "new", 3));
  CHECK(is_mapped(slot) && is_mapped(view));
  memcpy(slot, "zzzz", 4); /* the old file's bytes, no longer anyone's message */
  CHECK(!memcmp(view, "zzzz", 4)); /* the same old file, mapped twice */
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 0);
  /* The hold ends: the old queue is unmapped (the current one of course is not). */
  msgq_pub_hold_mappings(pub, 0);
  msgq_sub_hold_mappings(sub, 0);
  CHECK(!is_mapped(slot) && !is_mapped(view));
  CHECK(msgq_pub_send(pub, "on", 2) == 0);
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 2 && !memcmp(buf, "on", 2));
  /* Not held: a follow unmaps at once, as before O8. */
  CHECK(msgq_pub_reserve(pub, 16, &slot) == 0);
  msgq_pub_abort(pub);
  mark_file_superseded("held");
  CHECK(msgq_pub_send(pub, "again", 5) == 0);
  CHECK(!is_mapped(slot));
  /* Closing a held handle leaves its mappings mapped for good. */
  CHECK(msgq_pub_reserve(pub, 16, &slot) == 0);
  msgq_pub_abort(pub);
  msgq_pub_hold_mappings(pub, 1);
  mark_file_superseded("held");
  CHECK(msgq_pub_send(pub, "last", 4) == 0);
  void *current = NULL;
  CHECK(msgq_pub_reserve(pub, 16, &current) == 0);
  msgq_pub_abort(pub);
  msgq_pub_close(pub);
  CHECK(is_mapped(slot) && is_mapped(current));
  msgq_sub_close(sub);
}

static void test_reader_slots_exhaust(void) {
  msgq_sub *subs[MSGQ_READER_SLOTS];
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) subs[i] = open_sub("slots", SMALL, 0);
  msgq_sub *extra = (msgq_sub *)1;
  CHECK(msgq_sub_open("slots", SMALL, 0, &extra) == MSGQ_ENOSLOT && extra == NULL);
  msgq_sub_close(subs[7]);
  subs[7] = open_sub("slots", SMALL, 0);
  /* A reopen whose slot claim fails leaves the handle closed-state (O6). */
  msgq_sub *elsewhere = open_sub("slots_other", SMALL, 0);
  if (elsewhere) {
    CHECK(msgq_sub_reopen(elsewhere, "slots", SMALL, 0) == MSGQ_ENOSLOT);
    CHECK(msgq_sub_is_open(elsewhere) == 0);
    const void *d;
    size_t n;
    CHECK(msgq_sub_view(elsewhere, &d, &n) == MSGQ_ECLOSED);
    CHECK(msgq_sub_reopen(elsewhere, "slots_other", SMALL, 0) == 0);
    msgq_sub_close(elsewhere);
  }
  for (unsigned i = 0; i < MSGQ_READER_SLOTS; i++) msgq_sub_close(subs[i]);
}

static void test_fork_child_leaves_parent_slot(void) {
  msgq_pub *pub = open_pub("forked", SMALL, 0);
  msgq_sub *sub = open_sub("forked", SMALL, 0);
  if (!pub || !sub) return;
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) {
    msgq_sub_close(sub); /* only unmaps: the slot is the parent's (O4) */
    msgq_pub_close(pub);
    _exit(0);
  }
  int status = 0;
  CHECK(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status));
  CHECK(msgq_pub_num_readers(pub) == 1);
  CHECK(msgq_pub_send(pub, "still", 5) == 0); /* still the owner */
  char buf[8];
  size_t n;
  CHECK(msgq_sub_recv(sub, buf, sizeof buf, &n, 0) == 1 && n == 5);
  msgq_sub_close(sub);
  msgq_pub_close(pub);
}

/* --- Threaded: one publisher, readers receiving with timeouts ----------------------- */

#define THREAD_MESSAGES 30000
#define THREAD_READERS 3

typedef struct {
  msgq_sub *sub;
  _Atomic int *done;
  long received, out_of_order, torn;
} api_reader;

static void *api_reader_main(void *arg) {
  api_reader *r = arg;
  uint8_t buf[600];
  uint64_t last = 0;
  for (;;) {
    size_t n;
    int got = msgq_sub_recv(r->sub, buf, sizeof buf, &n, 1000000);
    if (got == 1) {
      uint64_t seq;
      if (n < 8) {
        r->torn++;
        continue;
      }
      memcpy(&seq, buf, 8);
      if (seq <= last) r->out_of_order++;
      last = seq;
      for (size_t k = 8; k < n; k++)
        if (buf[k] != (uint8_t)(seq * 13 + k)) {
          r->torn++;
          break;
        }
      r->received++;
    } else if (got < 0) {
      r->torn++;
      return NULL;
    } else if (atomic_load(r->done)) {
      return NULL;
    }
  }
}

static void test_threaded(void) {
  msgq_pub *pub = open_pub("threaded", 65536, 0);
  if (!pub) return;
  _Atomic int done = 0;
  api_reader readers[THREAD_READERS];
  pthread_t threads[THREAD_READERS];
  for (int i = 0; i < THREAD_READERS; i++) {
    memset(&readers[i], 0, sizeof readers[i]);
    readers[i].sub = open_sub("threaded", 0, 0);
    readers[i].done = &done;
    if (readers[i].sub) pthread_create(&threads[i], NULL, api_reader_main, &readers[i]);
  }
  uint8_t msg[600];
  unsigned seed = 7;
  for (uint64_t seq = 1; seq <= THREAD_MESSAGES; seq++) {
    size_t len = 8 + (size_t)rand_r(&seed) % (sizeof msg - 8);
    memcpy(msg, &seq, 8);
    for (size_t k = 8; k < len; k++) msg[k] = (uint8_t)(seq * 13 + k);
    CHECK(msgq_pub_send(pub, msg, len) == 0);
    if (seq % 16 == 0) {
      /* Less than a ring apart, the readers catch up (at most 50 ms) before the writer
       * goes on: on a loaded machine they would otherwise only ever be lapped. */
      int64_t deadline = msgq_now_ns() + 50000000;
      while (!msgq_pub_all_readers_updated(pub) && msgq_now_ns() < deadline) sched_yield();
    }
  }
  atomic_store(&done, 1);
  long total = 0;
  for (int i = 0; i < THREAD_READERS; i++) {
    if (!readers[i].sub) continue;
    pthread_join(threads[i], NULL);
    CHECK(readers[i].torn == 0);
    CHECK(readers[i].out_of_order == 0);
    CHECK(readers[i].received > 0);
    total += readers[i].received;
    msgq_sub_close(readers[i].sub);
  }
  printf("     threaded: %ld messages received by %d readers, 0 torn\n", total,
         THREAD_READERS);
  msgq_pub_close(pub);
}

static char shm_dir[64];

static void remove_shm_dir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", shm_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", shm_dir);
}

int main(void) {
  /* Queues of this run only: a private shm folder, no prefix. */
  strcpy(shm_dir, access("/dev/shm", W_OK) == 0 ? "/dev/shm/msgq_api_test.XXXXXX"
                                                 : "/tmp/msgq_api_test.XXXXXX");
  if (!mkdtemp(shm_dir)) {
    perror("mkdtemp");
    return 2;
  }
  setenv("MSGQ_SHM_DIR", shm_dir, 1);
  unsetenv("MSGQ_PREFIX");
  unsetenv("OPENPILOT_PREFIX");
  unsetenv("MSGQ_CHECKSUM");
  RUN(test_round_trip);
  RUN(test_argument_errors);
  RUN(test_takeover);
  RUN(test_reserve_commit_abort);
  RUN(test_view_and_overwrite_check);
  RUN(test_checksum_detects_damage);
  RUN(test_readers_and_all_updated);
  RUN(test_poll);
  RUN(test_conflate);
  RUN(test_replaced_file_is_followed);
  RUN(test_follow_waits_for_a_sleeper);
  RUN(test_held_mappings_survive_a_follow);
  RUN(test_reader_slots_exhaust);
  RUN(test_fork_child_leaves_parent_slot);
  RUN(test_threaded);
  remove_shm_dir();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
