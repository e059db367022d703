/* The public C API (msgq.h) over the ring (msgq_ring.c) and the queue files
 * (queue_file.c). Handles own a process-local copy of the ring's geometry; nothing here
 * reads shared memory except through those two files, which bound-check it. */
#define _GNU_SOURCE
#include "msgq.h"

#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "msgq_errors.h"
#include "msgq_ring.h"
#include "os_wait.h"
#include "queue_file.h"

_Static_assert(MSGQ_ENDPOINT_PATH_MAX == MSGQ_MAX_PATH_LEN, "msgq.h and queue_file.h agree");
_Static_assert(MSGQ_ENDPOINT_NAME_MAX == MSGQ_MAX_NAME_LEN, "msgq.h and queue_file.h agree");

#define KNOWN_OPEN_FLAGS (MSGQ_OPEN_CONFLATE | MSGQ_OPEN_CHECKSUM | MSGQ_OPEN_NO_CHECKSUM)
/* How often one call follows a replaced file before giving up: view/recv then report
 * "none yet", send/reserve MSGQ_ESUPERSEDED (only a process replacing or damaging the
 * file in a loop gets there; three follows were reached under the chaos test's writes). */
#define MAX_FOLLOWS 8

/* A mapping given up while its handle held its mappings (msgq_pub_hold_mappings): still
 * mapped, unmapped when the hold ends. */
typedef struct kept_mapping {
  msgq_ring ring;
  struct kept_mapping *next;
} kept_mapping;

struct msgq_pub {
  msgq_publisher core;
  bool open;            /* core.ring is mapped and core is initialised */
  pid_t owner_pid;      /* process that opened it (O4) */
  bool hold;            /* mappings given up are kept (O8) */
  kept_mapping *kept;   /* ... here, until the hold ends */
  uint64_t segment_size; /* arguments of the last open, for following (O6) */
  unsigned open_flags;
  char endpoint[MSGQ_MAX_NAME_LEN + 1];
};

struct msgq_sub {
  msgq_subscriber core;
  bool open;
  bool viewing; /* a view is out: msgq_sub_view_end is due */
  _Atomic int waiters; /* threads inside a wait or poll on this handle (O6) */
  pid_t owner_pid;
  bool hold; /* as msgq_pub's */
  kept_mapping *kept;
  uint64_t segment_size;
  unsigned open_flags;
  char endpoint[MSGQ_MAX_NAME_LEN + 1];
};

/* Gives up the mapping of ring (a close, a reopen or a follow of O6): unmapped, or, while
 * the handle holds its mappings (O8), put on *kept. When even the note of it cannot be
 * allocated it stays mapped for the life of the process: never unmapped under a holder. */
static void give_up_mapping(msgq_ring *ring, bool hold, kept_mapping **kept) {
  if (!hold) {
    msgq_queue_unmap(ring);
    return;
  }
  kept_mapping *k = malloc(sizeof *k);
  if (k != NULL) {
    k->ring = *ring;
    k->next = *kept;
    *kept = k;
  }
  memset(ring, 0, sizeof *ring);
}

/* Forgets the kept mappings, unmapping them when unmap (else they stay mapped for the
 * life of the process). */
static void drop_kept(kept_mapping **kept, bool unmap) {
  while (*kept != NULL) {
    kept_mapping *k = *kept;
    *kept = k->next;
    if (unmap) msgq_queue_unmap(&k->ring);
    free(k);
  }
}

/* The MSGQ_FLAG_* of a queue an open creates. */
static int create_flags(unsigned open_flags, uint32_t *out) {
  if (open_flags & ~KNOWN_OPEN_FLAGS) return -EINVAL;
  bool yes = open_flags & MSGQ_OPEN_CHECKSUM, no = open_flags & MSGQ_OPEN_NO_CHECKSUM;
  if (yes && no) return -EINVAL;
  if (!yes && !no) {
    /* $MSGQ_CHECKSUM: 1/true/yes (any case, surrounding blanks ignored). */
    const char *env = getenv("MSGQ_CHECKSUM");
    char word[8] = {0};
    size_t n = 0;
    if (env) {
      while (isspace((unsigned char)*env)) env++;
      while (*env && !isspace((unsigned char)*env) && n < sizeof word - 1)
        word[n++] = (char)tolower((unsigned char)*env++);
      while (isspace((unsigned char)*env)) env++;
      if (*env) n = 0; /* more than one word, or too long: not a yes */
      word[n] = '\0';
    }
    yes = !strcmp(word, "1") || !strcmp(word, "true") || !strcmp(word, "yes");
  }
  *out = yes ? MSGQ_FLAG_CHECKSUM : 0;
  return 0;
}

/* Copies endpoint into a name buffer (it may alias the handle's own). */
static int copy_endpoint(const char *endpoint, char out[MSGQ_MAX_NAME_LEN + 1]) {
  if (endpoint == NULL) return MSGQ_EBADNAME;
  size_t n = strnlen(endpoint, MSGQ_MAX_NAME_LEN + 1);
  if (n > MSGQ_MAX_NAME_LEN) return MSGQ_EBADNAME;
  memcpy(out, endpoint, n + 1);
  return 0;
}

/* --- Publisher ------------------------------------------------------------------- */

static void pub_disconnect(msgq_pub *pub) {
  if (!pub->open) return;
  msgq_publisher_abort(&pub->core);
  if (getpid() == pub->owner_pid) msgq_publisher_release(&pub->core);
  give_up_mapping(&pub->core.ring, pub->hold, &pub->kept);
  pub->open = false;
}

/* The start every (re)open shares: the endpoint checked and copied into name, the
 * create flags worked out, and the queue file opened (or created) and left locked for
 * the caller to claim its place under the lock (queue_file.h). */
static int open_locked(const char *endpoint, uint64_t segment_size, unsigned open_flags,
                       enum msgq_role role, char *name, msgq_ring *ring, int *locked_fd) {
  int r = copy_endpoint(endpoint, name);
  if (r < 0) return r;
  uint32_t flags;
  r = create_flags(open_flags & ~MSGQ_OPEN_CONFLATE, &flags);
  if (r < 0) return r;
  return msgq_queue_open(name, segment_size, flags, role, ring, locked_fd);
}

int msgq_pub_reopen(msgq_pub *pub, const char *endpoint, uint64_t segment_size,
                    unsigned open_flags) {
  char name[MSGQ_MAX_NAME_LEN + 1];
  if (pub == NULL) return -EINVAL;
  msgq_ring ring;
  int locked_fd;
  int r = open_locked(endpoint, segment_size, open_flags, MSGQ_ROLE_PUBLISHER, name, &ring,
                      &locked_fd);
  if (r < 0) return r;
  /* Under the new file's lock: nobody re-creates it between our open and our claim. */
  pub_disconnect(pub);
  msgq_publisher_init(&pub->core, &ring);
  msgq_queue_unlock(locked_fd);
  pub->open = true;
  pub->owner_pid = getpid();
  pub->segment_size = segment_size;
  pub->open_flags = open_flags;
  memcpy(pub->endpoint, name, sizeof name);
  return 0;
}

int msgq_pub_open(const char *endpoint, uint64_t segment_size, unsigned open_flags,
                  msgq_pub **out) {
  if (out == NULL) return -EINVAL;
  *out = NULL;
  msgq_pub *pub = calloc(1, sizeof *pub);
  if (pub == NULL) return -ENOMEM;
  int r = msgq_pub_reopen(pub, endpoint, segment_size, open_flags);
  if (r < 0) {
    free(pub);
    return r;
  }
  *out = pub;
  return 0;
}

void msgq_pub_close(msgq_pub *pub) {
  if (pub == NULL) return;
  pub_disconnect(pub);
  drop_kept(&pub->kept, !pub->hold);
  free(pub);
}

void msgq_pub_hold_mappings(msgq_pub *pub, int hold) {
  if (pub == NULL) return;
  pub->hold = hold != 0;
  if (!hold) drop_kept(&pub->kept, true);
}

/* O6: the file was replaced under its name; go on in the endpoint's current one. */
static int pub_follow(msgq_pub *pub) {
  return msgq_pub_reopen(pub, pub->endpoint, pub->segment_size, pub->open_flags);
}

int msgq_pub_send(msgq_pub *pub, const void *data, size_t size) {
  if (!pub->open) return MSGQ_ECLOSED;
  if (pub->core.reserved) return -EBUSY;
  if (size > UINT32_MAX) return MSGQ_ETOOLARGE;
  for (int attempt = 0;; attempt++) {
    int r = msgq_publisher_send(&pub->core, data, (uint32_t)size);
    if (r != MSGQ_ESUPERSEDED || attempt == MAX_FOLLOWS) return r;
    r = pub_follow(pub);
    if (r < 0) return r;
  }
}

int msgq_pub_reserve(msgq_pub *pub, size_t size, void **payload) {
  if (!pub->open) return MSGQ_ECLOSED;
  if (pub->core.reserved) return -EBUSY;
  if (size > UINT32_MAX) return MSGQ_ETOOLARGE;
  for (int attempt = 0;; attempt++) {
    int r = msgq_publisher_reserve(&pub->core, (uint32_t)size, payload);
    if (r != MSGQ_ESUPERSEDED || attempt == MAX_FOLLOWS) return r;
    r = pub_follow(pub);
    if (r < 0) return r;
  }
}

int msgq_pub_commit(msgq_pub *pub) {
  if (!pub->open) return MSGQ_ECLOSED;
  return msgq_publisher_commit(&pub->core);
}

void msgq_pub_abort(msgq_pub *pub) {
  if (pub->open) msgq_publisher_abort(&pub->core);
}

int msgq_pub_num_readers(const msgq_pub *pub) {
  return pub->open ? msgq_ring_live_readers(&pub->core.ring) : 0;
}

int msgq_pub_all_readers_updated(const msgq_pub *pub) {
  return pub->open ? msgq_publisher_all_readers_updated(&pub->core) : 0;
}

uint64_t msgq_pub_reclaimed_slots(const msgq_pub *pub) { return pub->core.reclaimed_slots; }
uint64_t msgq_pub_early_wraps(const msgq_pub *pub) { return pub->core.early_wraps; }
uint32_t msgq_pub_segment_size(const msgq_pub *pub) { return pub->core.ring.segment_size; }
uint32_t msgq_pub_max_message_size(const msgq_pub *pub) {
  return pub->open ? msgq_ring_max_message(&pub->core.ring) : 0;
}
int msgq_pub_checksum(const msgq_pub *pub) {
  return (pub->core.ring.flags & MSGQ_FLAG_CHECKSUM) != 0;
}
const char *msgq_pub_endpoint(const msgq_pub *pub) { return pub->endpoint; }
int msgq_pub_is_open(const msgq_pub *pub) { return pub != NULL && pub->open; }

/* --- Subscriber ------------------------------------------------------------------ */

static void sub_disconnect_mapped(msgq_sub *sub, bool unmap) {
  if (!sub->open) return;
  if (getpid() == sub->owner_pid) msgq_subscriber_release(&sub->core);
  if (unmap) give_up_mapping(&sub->core.ring, sub->hold, &sub->kept);
  sub->open = false;
  sub->viewing = false;
}

static void sub_disconnect(msgq_sub *sub) { sub_disconnect_mapped(sub, true); }

int msgq_sub_reopen(msgq_sub *sub, const char *endpoint, uint64_t segment_size,
                    unsigned open_flags) {
  char name[MSGQ_MAX_NAME_LEN + 1];
  if (sub == NULL) return -EINVAL;
  msgq_ring ring;
  int locked_fd;
  int r = open_locked(endpoint, segment_size, open_flags, MSGQ_ROLE_SUBSCRIBER, name, &ring,
                      &locked_fd);
  if (r < 0) return r;
  /* The slot is claimed under the file lock: a publisher re-creating an unused queue
   * sees it (queue_file.h). */
  sub_disconnect(sub);
  r = msgq_subscriber_init(&sub->core, &ring, (open_flags & MSGQ_OPEN_CONFLATE) != 0);
  msgq_queue_unlock(locked_fd);
  if (r < 0) {
    msgq_queue_unmap(&ring);
    return r; /* closed-state (O6) */
  }
  sub->open = true;
  sub->viewing = false;
  sub->owner_pid = getpid();
  sub->segment_size = segment_size;
  sub->open_flags = open_flags;
  memcpy(sub->endpoint, name, sizeof name);
  return 0;
}

int msgq_sub_open(const char *endpoint, uint64_t segment_size, unsigned open_flags,
                  msgq_sub **out) {
  if (out == NULL) return -EINVAL;
  *out = NULL;
  msgq_sub *sub = calloc(1, sizeof *sub);
  if (sub == NULL) return -ENOMEM;
  sub->core.slot = -1;
  int r = msgq_sub_reopen(sub, endpoint, segment_size, open_flags);
  if (r < 0) {
    free(sub);
    return r;
  }
  *out = sub;
  return 0;
}

void msgq_sub_close(msgq_sub *sub) {
  if (sub == NULL) return;
  sub_disconnect(sub);
  drop_kept(&sub->kept, !sub->hold);
  free(sub);
}

void msgq_sub_close_keep_mapping(msgq_sub *sub) {
  if (sub == NULL) return;
  sub_disconnect_mapped(sub, false);
  drop_kept(&sub->kept, false);
  free(sub);
}

void msgq_sub_hold_mappings(msgq_sub *sub, int hold) {
  if (sub == NULL) return;
  sub->hold = hold != 0;
  if (!hold) drop_kept(&sub->kept, true);
}

int msgq_sub_view(msgq_sub *sub, const void **data, size_t *size) {
  if (!sub->open) return MSGQ_ECLOSED;
  for (int follows = 0; follows < MAX_FOLLOWS; follows++) {
    const uint8_t *payload;
    uint32_t n;
    int r = msgq_subscriber_peek(&sub->core, &payload, &n);
    if (r == 1) {
      sub->viewing = true;
      *data = payload;
      *size = n;
      return 1;
    }
    if (r != MSGQ_ESUPERSEDED) return r;
    /* Everything in the replaced file was read: go on in the endpoint's current one —
     * unless another thread sleeps on the old ring right now (a Poller, an event loop's
     * waiter): a replaced file counts as data, so it wakes and lets go, and this call is
     * made again (-EAGAIN, O6). A ring is never unmapped under a sleeper. */
    if (atomic_load_explicit(&sub->waiters, memory_order_acquire) > 0) return -EAGAIN;
    r = msgq_sub_reopen(sub, sub->endpoint, sub->segment_size, sub->open_flags);
    if (r < 0) return r;
  }
  return 0;
}

int msgq_sub_view_end(msgq_sub *sub, const void *copy) {
  if (!sub->open) return MSGQ_ECLOSED;
  if (!sub->viewing) return MSGQ_ENORESERVE;
  sub->viewing = false;
  if (copy) return msgq_subscriber_consume(&sub->core, copy);
  int r = msgq_subscriber_release_view(&sub->core);
  return r == MSGQ_ECHECKSUM ? 0 : r; /* a mismatch is counted in checksum_errors */
}

int msgq_sub_has_data(msgq_sub *sub) {
  if (!sub->open) return MSGQ_ECLOSED;
  return msgq_subscriber_has_data(&sub->core);
}

/* Remaining time of a wait until deadline (< 0: none), 0 when it passed. */
static int64_t remaining_ns(int64_t deadline) {
  if (deadline < 0) return -1;
  int64_t left = deadline - os_monotonic_ns();
  return left > 0 ? left : 0;
}

int msgq_sub_wait(msgq_sub *sub, int64_t timeout_ns) {
  if (!sub->open) return MSGQ_ECLOSED;
  int64_t deadline = timeout_ns < 0 ? -1 : os_monotonic_ns() + timeout_ns;
  atomic_fetch_add_explicit(&sub->waiters, 1, memory_order_acq_rel);
  int r;
  for (;;) {
    /* The core may return 0 early (its sleeps are bounded): loop to our deadline. */
    r = msgq_subscriber_wait(&sub->core, remaining_ns(deadline));
    if (r != 0 || remaining_ns(deadline) == 0) break;
  }
  atomic_fetch_sub_explicit(&sub->waiters, 1, memory_order_acq_rel);
  return r;
}

/* Counts subs[0..n) as waited on (+1) or no longer (-1): see msgq_sub_view (O6). */
static void count_waiters(msgq_sub *const *subs, int n, int delta) {
  for (int i = 0; i < n; i++)
    atomic_fetch_add_explicit(&subs[i]->waiters, delta, memory_order_acq_rel);
}

struct msgq_wake {
  msgq_interrupt interrupt;
};

msgq_wake *msgq_wake_new(void) { return calloc(1, sizeof(msgq_wake)); }
void msgq_wake_free(msgq_wake *wake) { free(wake); }
uint32_t msgq_wake_seen(msgq_wake *wake) { return msgq_interrupt_seen(&wake->interrupt); }
void msgq_wake_raise(msgq_wake *wake) { msgq_interrupt_raise(&wake->interrupt); }

/* The ring subscribers of n open handles, into local (64 of them) or a malloc'd array
 * (*cores; free it when it is not local). 0, -EINVAL, MSGQ_ECLOSED or -ENOMEM. */
static int collect_cores(msgq_sub *const *subs, int n, msgq_subscriber **local,
                         msgq_subscriber ***cores) {
  *cores = local;
  if (n > 64) {
    *cores = malloc((size_t)n * sizeof **cores);
    if (*cores == NULL) return -ENOMEM;
  }
  for (int i = 0; i < n; i++) {
    if (subs[i] == NULL || !subs[i]->open) {
      if (*cores != local) free(*cores);
      *cores = local;
      return subs[i] == NULL ? -EINVAL : MSGQ_ECLOSED;
    }
    (*cores)[i] = &subs[i]->core;
  }
  return 0;
}

int msgq_sub_poll_until(msgq_sub *const *subs, int n, int64_t timeout_ns, uint8_t *ready,
                        msgq_wake *wake, uint32_t seen) {
  if (wake == NULL || n < 0 || (n > 0 && (subs == NULL || ready == NULL))) return -EINVAL;
  msgq_subscriber *local[64] = {0};
  msgq_subscriber **cores;
  int r = collect_cores(subs, n, local, &cores);
  if (r == 0) {
    count_waiters(subs, n, 1);
    r = msgq_poll_until(cores, n, timeout_ns, ready, &wake->interrupt, seen);
    count_waiters(subs, n, -1);
  }
  if (cores != local) free(cores);
  return r;
}

int msgq_sub_poll(msgq_sub *const *subs, int n, int64_t timeout_ns, uint8_t *ready) {
  if (subs == NULL || ready == NULL || n < 1) return -EINVAL;
  msgq_subscriber *local[64] = {0};
  msgq_subscriber **cores;
  int r = collect_cores(subs, n, local, &cores);
  if (r == 0) {
    int64_t deadline = timeout_ns < 0 ? -1 : os_monotonic_ns() + timeout_ns;
    count_waiters(subs, n, 1);
    for (;;) {
      r = msgq_poll(cores, n, remaining_ns(deadline), ready);
      if (r != 0 || remaining_ns(deadline) == 0) break;
    }
    count_waiters(subs, n, -1);
  }
  if (cores != local) free(cores);
  return r;
}

/* The copy out of the ring, which may race with the publisher overwriting the bytes
 * (the seqlock's one intended race, I3: the copy is checked afterwards by view_end). A
 * function of its own so that tests/c/tsan.supp names exactly it. */
__attribute__((noinline)) static void copy_out_of_ring(void *dst, const void *src,
                                                       size_t n) {
  if (n) memcpy(dst, src, n);
}

/* Copies the next message into buf when it fits. Returns 1 (copied, intact), 0 (none
 * now), MSGQ_EBUFFER (*size needed, message left queued), or an error. A message found
 * overwritten while copying is looked for again. */
static int take_copy(msgq_sub *sub, void *buf, size_t cap, size_t *size) {
  for (;;) {
    const void *data;
    size_t n;
    int r = msgq_sub_view(sub, &data, &n);
    if (r != 1) return r;
    if (n > cap) {
      sub->viewing = false; /* not consumed: the next view finds it again */
      *size = n;
      return MSGQ_EBUFFER;
    }
    copy_out_of_ring(buf, data, n);
    if (msgq_sub_view_end(sub, buf) == 1) {
      *size = n;
      return 1;
    }
  }
}

int msgq_sub_recv(msgq_sub *sub, void *buf, size_t cap, size_t *size, int64_t timeout_ns) {
  if (!sub->open) return MSGQ_ECLOSED;
  /* A waiting message is taken without reading the clock. */
  int r = take_copy(sub, buf, cap, size);
  if (r != 0 || timeout_ns == 0) return r;
  int64_t deadline = timeout_ns < 0 ? -1 : os_monotonic_ns() + timeout_ns;
  for (;;) {
    int64_t left = remaining_ns(deadline);
    if (left == 0) return 0;
    r = msgq_subscriber_wait(&sub->core, left);
    if (r < 0) return r;
    r = take_copy(sub, buf, cap, size);
    if (r != 0) return r;
  }
}

int msgq_sub_recv_alloc(msgq_sub *sub, void **data, size_t *size, int64_t timeout_ns) {
  if (!sub->open) return MSGQ_ECLOSED;
  *data = NULL;
  int64_t deadline = INT64_MIN; /* read the clock only when a wait is due */
  for (;;) {
    const void *view;
    size_t n;
    int r = msgq_sub_view(sub, &view, &n);
    if (r == 1) {
      void *copy = malloc(n ? n : 1);
      if (copy == NULL) {
        sub->viewing = false;
        return -ENOMEM;
      }
      copy_out_of_ring(copy, view, n);
      if (msgq_sub_view_end(sub, copy) == 1) {
        *data = copy;
        *size = n;
        return 1;
      }
      free(copy);
      continue;
    }
    if (r < 0) return r;
    if (timeout_ns == 0) return 0;
    if (deadline == INT64_MIN) deadline = timeout_ns < 0 ? -1 : os_monotonic_ns() + timeout_ns;
    int64_t left = remaining_ns(deadline);
    if (left == 0) return 0;
    r = msgq_subscriber_wait(&sub->core, left);
    if (r < 0) return r;
  }
}

void msgq_sub_get_stats(const msgq_sub *sub, msgq_sub_stats *out) {
  out->resets = sub->core.resets;
  out->corrupt_resets = sub->core.corrupt_resets;
  out->checksum_errors = sub->core.checksum_errors;
}
uint32_t msgq_sub_segment_size(const msgq_sub *sub) { return sub->core.ring.segment_size; }
int msgq_sub_checksum(const msgq_sub *sub) {
  return (sub->core.ring.flags & MSGQ_FLAG_CHECKSUM) != 0;
}
int msgq_sub_conflate(const msgq_sub *sub) { return sub->core.conflate; }
const char *msgq_sub_endpoint(const msgq_sub *sub) { return sub->endpoint; }
int msgq_sub_is_open(const msgq_sub *sub) { return sub != NULL && sub->open; }

/* --- Misc ------------------------------------------------------------------------ */

int msgq_endpoint_valid(const char *name) {
  return name ? msgq_validate_name(name) : MSGQ_EBADNAME;
}

int msgq_endpoint_path(const char *endpoint, char *out, size_t out_len) {
  if (endpoint == NULL) return MSGQ_EBADNAME;
  return msgq_queue_path(endpoint, out, out_len);
}

int msgq_namespace_dir(char *out, size_t out_len, int create) {
  return create ? msgq_ensure_queue_dir(out, out_len) : msgq_queue_dir(out, out_len);
}

unsigned msgq_file_mode(void) { return (unsigned)msgq_queue_file_mode(); }

int64_t msgq_now_ns(void) { return os_monotonic_ns(); }
