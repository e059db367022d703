#define _GNU_SOURCE
#include "queue_file.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "msgq_errors.h"
#include "os_wait.h"

/* Longest one call waits for another opener's lock before returning -EAGAIN. */
#define LOCK_WAIT_NS 50000000LL
/* Internal: the file was removed (by `msgq queues --clean`) between our open and our
 * lock; open the path again. Never returned to callers (outside the errno and MSGQ_E*
 * ranges). */
#define QUEUE_FILE_REMOVED (-3001)
/* Internal: the file at the path must be replaced by a new queue (open_locked). */
#define QUEUE_FILE_REPLACE (-3002)

int msgq_validate_name(const char *name) {
  if (name == NULL) return MSGQ_EBADNAME;
  size_t len = strnlen(name, MSGQ_MAX_NAME_LEN + 1);
  if (len == 0 || len > MSGQ_MAX_NAME_LEN) return MSGQ_EBADNAME;
  if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) return MSGQ_EBADNAME;
  for (size_t i = 0; i < len; i++) {
    char c = name[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_' || c == '-' || c == '.';
    if (!ok) return MSGQ_EBADNAME;
  }
  return 0;
}

static const char *shm_base_dir(void) {
  const char *dir = getenv("MSGQ_SHM_DIR");
  return (dir && dir[0]) ? dir : "/dev/shm";
}

const char *msgq_namespace_prefix(void) {
  const char *p = getenv("MSGQ_PREFIX");
  if (p && p[0]) return p;
  p = getenv("OPENPILOT_PREFIX");
  return (p && p[0]) ? p : NULL;
}

mode_t msgq_queue_file_mode(void) {
  const char *m = getenv("MSGQ_SHM_MODE");
  if (!m || !m[0]) return 0600;
  char *end = NULL;
  long v = strtol(m, &end, 8);
  if (*end != '\0' || v < 0 || v > 0777) return 0600;
  return (mode_t)v;
}

int msgq_queue_dir(char *out, size_t out_len) {
  const char *prefix = msgq_namespace_prefix();
  int n;
  if (prefix) {
    if (msgq_validate_name(prefix) < 0) return MSGQ_EBADNAME;
    n = snprintf(out, out_len, "%s/%s", shm_base_dir(), prefix);
  } else {
    n = snprintf(out, out_len, "%s", shm_base_dir());
  }
  if (n < 0 || (size_t)n >= out_len) return -ENAMETOOLONG;
  return 0;
}

int msgq_queue_path(const char *endpoint, char *out, size_t out_len) {
  if (msgq_validate_name(endpoint) < 0) return MSGQ_EBADNAME;
  char dir[MSGQ_MAX_PATH_LEN];
  int r = msgq_queue_dir(dir, sizeof dir);
  if (r < 0) return r;
  int n = snprintf(out, out_len, "%s/" MSGQ_QUEUE_FILE_PREFIX "%s", dir, endpoint);
  if (n < 0 || (size_t)n >= out_len) return -ENAMETOOLONG;
  return 0;
}

/* Files and folders made by another user are accepted only when MSGQ_SHM_MODE shares
 * queues beyond their owner; otherwise another local user could pre-create a queue (or
 * point the prefix folder elsewhere) and read or forge our messages. */
static int foreign_owner_refused(uid_t owner) {
  return owner != geteuid() && (msgq_queue_file_mode() & 0066) == 0;
}

int msgq_ensure_queue_dir(char *dir, size_t dir_len) {
  int r = msgq_queue_dir(dir, dir_len);
  if (r < 0 || !msgq_namespace_prefix()) return r;
  mode_t mode = msgq_queue_file_mode();
  /* Search permission for whoever may read or write the files. */
  mode_t dir_mode = 0700 | ((mode & 0060) ? 0070 & (mode | 0010) : 0) |
                    ((mode & 0006) ? 0007 & (mode | 0001) : 0);
  if (mkdir(dir, dir_mode) != 0 && errno != EEXIST) return -errno;
  /* An existing prefix "folder" must be a real folder (not a symlink out of the shm
   * folder) owned by us, unless queues are shared across users. */
  struct stat st;
  if (lstat(dir, &st) != 0) return -errno;
  if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
  if (foreign_owner_refused(st.st_uid)) return -EPERM;
  return 0;
}

/* flock(operation) in non-blocking tries until the monotonic deadline: 0, -EAGAIN once
 * the deadline passed with the lock still held elsewhere, or -errno. Lock holders keep
 * the lock for microseconds (open, validate, register), so a short nap between tries
 * costs little; never blocking keeps callers interruptible behind a stuck holder. */
static int lock_until(int fd, int operation, int64_t deadline_ns) {
  while (flock(fd, operation | LOCK_NB) != 0) {
    int r = -errno;
    if (r != -EWOULDBLOCK && r != -EAGAIN && r != -EINTR) return r;
    if (os_monotonic_ns() >= deadline_ns) return -EAGAIN;
    struct timespec pause = {0, 200000};
    nanosleep(&pause, NULL);
  }
  return 0;
}

/* Maps a queue file shared, read-write. Page tables are filled at once (MAP_POPULATE):
 * a fresh ring otherwise takes a page fault per 4 KiB on its first pass, in every
 * process, which made the first pass over a large ring about 10x slower. */
static void *map_queue(int fd, size_t size) {
  int flags = MAP_SHARED;
#if defined(MAP_POPULATE)
  flags |= MAP_POPULATE;
#endif
  return mmap(NULL, size, PROT_READ | PROT_WRITE, flags, fd, 0);
}

/* Whether a header that failed validation still has this build's layout apart from
 * its magic or flags (a damaged queue of ours, not a foreign file): only then may the
 * replacer write into it (the superseded mark), and its capacity is worth keeping. */
static int ours_shaped(const msgq_header *h, size_t size) {
  return size >= MSGQ_HEADER_SIZE && h->layout_version == MSGQ_LAYOUT_VERSION &&
         h->header_size == MSGQ_HEADER_SIZE && h->total_size == size &&
         (uint64_t)h->header_size + h->capacity == size &&
         h->capacity >= MSGQ_MIN_SEGMENT_SIZE && h->capacity % 8u == 0;
}

static atomic_uint tmp_counter;

/* MSGQ_FLAG_POOL when new queues put large messages into chunks in their ring
 * (docs/ring.md, P1-P6): $MSGQ_POOL=0 turns it off, any other value on, unset gives
 * MSGQ_POOL_DEFAULT (on; read at each creation, like the other variables). */
static uint32_t msgq_pool_flag(void) {
  const char *env = getenv("MSGQ_POOL");
  if (env && env[0]) return strcmp(env, "0") == 0 ? 0u : MSGQ_FLAG_POOL;
  return MSGQ_POOL_DEFAULT ? MSGQ_FLAG_POOL : 0u;
}

/* Makes a complete queue in a new file next to `path`, under a name no endpoint can
 * have (a leading dot), then makes it visible under `path` in one step: rename(2) over
 * the old file when `replace`, else link(2), which fails with EEXIST when another opener
 * created the endpoint first. A half-made queue is therefore never visible under an
 * endpoint's name, and a file that may be mapped is never truncated: a replaced file
 * keeps its inode for whoever still maps it. On success returns 0 with the new file's
 * fd locked (LOCK_EX) in *fd_out and ring attached. Returns QUEUE_FILE_REMOVED when
 * link found the name taken (open it instead), or a negative error. */
static int publish_new_queue(const char *path, uint64_t capacity, uint32_t flags,
                             int replace, msgq_ring *ring, int *fd_out) {
  char tmp[MSGQ_MAX_PATH_LEN + 64];
  const char *slash = strrchr(path, '/');
  int dir_len = slash ? (int)(slash - path) : 0;
  int n = snprintf(tmp, sizeof tmp, "%.*s/.msgq-new-%d-%u", dir_len, slash ? path : ".",
                   (int)getpid(), atomic_fetch_add(&tmp_counter, 1u));
  if (n < 0 || (size_t)n >= sizeof tmp) return -ENAMETOOLONG;
  mode_t mode = msgq_queue_file_mode();
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return -errno;
  (void)fchmod(fd, mode); /* exactly the requested mode, whatever the umask */
  (void)flock(fd, LOCK_EX); /* nobody else knows this file yet: never blocks */
  size_t size = (size_t)MSGQ_HEADER_SIZE + capacity;
  int r = 0;
  void *mem = MAP_FAILED;
  if (ftruncate(fd, (off_t)size) != 0) r = -errno;
#if defined(__linux__)
  /* Reserve every page now: a full /dev/shm is then ENOSPC here, not SIGBUS in the
   * middle of a send. */
  if (r == 0) {
    int fr = posix_fallocate(fd, 0, (off_t)size);
    if (fr != 0 && fr != EOPNOTSUPP && fr != EINVAL) r = -fr;
  }
#endif
  if (r == 0) {
    mem = map_queue(fd, size);
    if (mem == MAP_FAILED) r = -errno;
  }
  if (r == 0) r = msgq_ring_format(mem, size, flags | msgq_pool_flag());
  if (r == 0) r = msgq_ring_attach(ring, mem, size);
  if (r == 0) {
    if (replace) {
      if (rename(tmp, path) != 0) r = -errno;
    } else if (link(tmp, path) != 0) {
      r = errno == EEXIST ? QUEUE_FILE_REMOVED : -errno;
    }
  }
  (void)unlink(tmp); /* after rename: already gone; after link: the second name */
  if (r < 0) {
    if (mem != MAP_FAILED) munmap(mem, size);
    memset(ring, 0, sizeof *ring);
    close(fd);
    return r;
  }
  *fd_out = fd;
  return 0;
}

/* Marks a replaced file of ours superseded (I6 of msgq_ring.h) and wakes its sleepers,
 * so that the processes still mapping it re-open the endpoint. mem maps `size` bytes of
 * a file that was validated as ours_shaped (or fully valid). */
static void mark_superseded(void *mem, size_t size) {
  if (ours_shaped(mem, size)) msgq_ring_mark_superseded(mem);
}

/* A live process uses the queue: its publisher, or the owner of any claimed reader slot.
 * The one rule for re-making a queue at another size and for removing it
 * (msgq_queue_remove_unused). */
static int queue_in_use(const msgq_queue_info *info) {
  return info->publisher_alive || info->readers_live > 0;
}

/* Judges the existing file behind the locked fd. Returns 0 with ring attached to it,
 * QUEUE_FILE_REMOVED (open the path again), a negative error, or QUEUE_FILE_REPLACE
 * with *capacity and *flags set for the queue that must take its place. When it returns
 * QUEUE_FILE_REPLACE with *old_mem set, that mapping (*old_size bytes) is the old file,
 * to be marked superseded once the new one is in place. */
static int open_locked(int fd, uint64_t requested, uint32_t want_flags, enum msgq_role role,
                       msgq_ring *ring, uint64_t *capacity, uint32_t *flags,
                       void **old_mem, size_t *old_size) {
  struct stat st;
  *old_mem = NULL;
  if (fstat(fd, &st) != 0) return -errno;
  if (!S_ISREG(st.st_mode)) return MSGQ_EBADMAGIC;
  /* Removed or replaced while we waited for the lock: registering in it would leave us
   * on a file that later openers of the endpoint never see. */
  if (st.st_nlink == 0) return QUEUE_FILE_REMOVED;
  if (foreign_owner_refused(st.st_uid)) return -EPERM;
  *capacity = requested ? requested : MSGQ_DEFAULT_SEGMENT_SIZE;
  *flags = want_flags;

  /* Too small for any header: an unfinished file of an older build, or not ours. */
  if ((size_t)st.st_size < MSGQ_HEADER_SIZE) return QUEUE_FILE_REPLACE;
  size_t size = (size_t)st.st_size;
  /* Not pre-faulted yet: the size comes from a file that may be hostile. Nobody
   * truncates a queue file (they are replaced, never re-sized), so reading the mapping
   * cannot fault past the end. */
  void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return -errno;
  int r = msgq_ring_attach(ring, mem, size);
  if (r < 0 || atomic_load_explicit(&ring->header->superseded, memory_order_relaxed)) {
    /* Damaged (magic, version, geometry), foreign (another program's file under our
     * name), or marked superseded though it still has the name (damage): replace it.
     * A damaged queue of ours keeps its capacity unless a size was asked for. */
    const msgq_header *h = mem;
    if (requested == 0 && ours_shaped(h, size)) *capacity = h->capacity;
    memset(ring, 0, sizeof *ring);
    *old_mem = mem;
    *old_size = size;
    return QUEUE_FILE_REPLACE;
  }
#if defined(MADV_POPULATE_WRITE)
  (void)madvise(mem, size, MADV_POPULATE_WRITE); /* a valid queue: fault it in now */
#endif
  if (role == MSGQ_ROLE_SUBSCRIBER ||
      ((requested == 0 || requested == ring->segment_size) &&
       want_flags == (ring->flags & ~MSGQ_FLAG_POOL)))
    return 0;
  /* A publisher wants another size or other flags: replace an unused queue; adopt a
   * live one that is at least as large (every message it meant to send fits, the flags
   * stay as they are); refuse a smaller live one. */
  msgq_queue_info info;
  (void)msgq_ring_inspect(ring->header, ring->map_size, &info); /* attached: valid */
  if (!queue_in_use(&info)) {
    if (requested == 0) *capacity = ring->segment_size;
    memset(ring, 0, sizeof *ring);
    *old_mem = mem;
    *old_size = size;
    return QUEUE_FILE_REPLACE;
  }
  if (requested == 0 || ring->segment_size >= requested) return 0;
  msgq_queue_unmap(ring);
  return MSGQ_ESIZEMISMATCH;
}

int msgq_queue_open(const char *endpoint, uint64_t segment_size, uint32_t create_flags,
                    enum msgq_role role, msgq_ring *ring, int *locked_fd) {
  memset(ring, 0, sizeof *ring);
  if (locked_fd) *locked_fd = -1;
  if (create_flags & ~MSGQ_KNOWN_FLAGS) return MSGQ_EBADSIZE;
  uint64_t requested = 0;
  if (segment_size) {
    int64_t cap = msgq_ring_capacity_for(segment_size);
    if (cap < 0) return (int)cap;
    requested = (uint64_t)cap;
  }
  char path[MSGQ_MAX_PATH_LEN];
  int r = msgq_queue_path(endpoint, path, sizeof path);
  if (r < 0) return r;
  char dir[MSGQ_MAX_PATH_LEN];
  r = msgq_ensure_queue_dir(dir, sizeof dir);
  if (r < 0) return r;

  int64_t give_up = os_monotonic_ns() + LOCK_WAIT_NS;
  for (;;) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) {
      /* A new endpoint: made complete, then linked into place. */
      uint64_t capacity = requested ? requested : MSGQ_DEFAULT_SEGMENT_SIZE;
      r = publish_new_queue(path, capacity, create_flags, 0, ring, &fd);
      if (r == QUEUE_FILE_REMOVED) continue; /* another opener made it first: open it */
      if (r < 0) return r;
    } else if (fd < 0) {
      return -errno;
    } else {
      /* A caller blocked behind a stuck lock holder gets control back (-EAGAIN) to
       * check for signals and try again. */
      r = lock_until(fd, LOCK_EX, give_up);
      if (r < 0) {
        close(fd);
        return r;
      }
      uint64_t capacity = 0;
      uint32_t flags = 0;
      void *old_mem;
      size_t old_size = 0;
      r = open_locked(fd, requested, create_flags, role, ring, &capacity, &flags, &old_mem,
                      &old_size);
      if (r == QUEUE_FILE_REPLACE) {
        /* Still under the old file's lock: every other opener of it waits, then finds
         * it unlinked (st_nlink 0) and opens the path again, reaching the new file. */
        int new_fd = -1;
        r = publish_new_queue(path, capacity, flags, 1, ring, &new_fd);
        if (r == 0 && old_mem) mark_superseded(old_mem, old_size);
        if (old_mem) munmap(old_mem, old_size);
        msgq_queue_unlock(fd);
        if (r < 0) return r;
        fd = new_fd;
      } else if (r == QUEUE_FILE_REMOVED) {
        msgq_queue_unlock(fd);
        /* The next open finds the endpoint's current file; past the deadline the
         * caller gets control back first (-EAGAIN), as when waiting for the lock. */
        if (os_monotonic_ns() >= give_up) return -EAGAIN;
        continue;
      } else if (r < 0) {
        msgq_queue_unlock(fd);
        return r;
      }
    }
    if (locked_fd == NULL) {
      msgq_queue_unlock(fd);
      return 0;
    }
    *locked_fd = fd;
    return 0;
  }
}

void msgq_queue_unlock(int locked_fd) {
  if (locked_fd < 0) return;
  flock(locked_fd, LOCK_UN);
  close(locked_fd);
}

void msgq_queue_unmap(msgq_ring *ring) {
  if (ring->header) munmap(ring->header, ring->map_size);
  memset(ring, 0, sizeof *ring);
}

/* --- Inspection and removal (tools) ------------------------------------------------ */

/* Opens a queue file for looking only and takes a flock on it (operation: LOCK_SH or
 * LOCK_EX, waiting at most LOCK_WAIT_NS): read-only (a tool needs no write access and can
 * never scribble), without following a symlink, and O_NONBLOCK so that a FIFO or device
 * that happens to carry a queue's name cannot hang the open. Returns the locked fd with
 * *st filled, MSGQ_EBADMAGIC (also in out->status) for anything but a regular file, or
 * -errno / -EAGAIN. */
static int open_for_inspection(const char *path, int operation, struct stat *st,
                               msgq_queue_info *out) {
  memset(out, 0, sizeof *out);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -errno;
  int r = fstat(fd, st) == 0 ? 0 : -errno;
  if (r == 0 && !S_ISREG(st->st_mode))
    r = out->status = MSGQ_EBADMAGIC; /* not ours to inspect or remove, whatever it is */
  if (r == 0) r = lock_until(fd, operation, os_monotonic_ns() + LOCK_WAIT_NS);
  if (r < 0) {
    close(fd);
    return r;
  }
  return fd;
}

/* Maps the file read-only and inspects it. The caller holds a flock on fd, so no opener
 * can be re-sizing the file (they do that under LOCK_EX only): the size from fstat stays
 * true while mapped, and reading the mapping cannot fault past the end of the file. */
static int inspect_locked(int fd, msgq_queue_info *out) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  size_t size = (size_t)st.st_size;
  if (size == 0) return msgq_ring_inspect(NULL, 0, out); /* nothing to map */
  void *mem = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return -errno;
  int r = msgq_ring_inspect(mem, size, out);
  munmap(mem, size);
  return r;
}

int msgq_queue_inspect(const char *path, msgq_queue_info *out) {
  struct stat st;
  /* A shared lock: it waits only for an opener that holds LOCK_EX right now (creating,
   * re-making or registering), and it delays openers by at most the microseconds it is
   * held plus one of their 200 us naps. */
  int fd = open_for_inspection(path, LOCK_SH, &st, out);
  if (fd < 0) return fd;
  int r = inspect_locked(fd, out);
  close(fd); /* drops the lock */
  return r;
}

/* Unlinks path only when it still names the file st describes: if someone removed ours
 * and a new queue was made meanwhile, that one is left alone (-ENOENT). */
static int unlink_same_file(const char *path, const struct stat *st) {
  struct stat now;
  if (stat(path, &now) != 0) return -errno;
  if (now.st_dev != st->st_dev || now.st_ino != st->st_ino) return -ENOENT;
  return unlink(path) == 0 ? 0 : -errno;
}

int msgq_queue_remove_unused(const char *path, int remove_damaged, msgq_queue_info *out) {
  struct stat st;
  /* Exclusive, like every opener: while we hold it nobody can be half-way through
   * creating the file or registering in it, and an opener that opened the path before
   * our unlink finds the file removed once it gets the lock (st_nlink == 0) and opens
   * the path afresh. */
  int fd = open_for_inspection(path, LOCK_EX, &st, out);
  if (fd < 0) return fd;
  int r = inspect_locked(fd, out);
  if (r == 0 && queue_in_use(out))
    r = -EBUSY;
  else if (r == MSGQ_EBADMAGIC && out->unfinished)
    r = 0; /* its creator died before storing the magic; finishing it needs our lock */
  else if (remove_damaged &&
           (r == MSGQ_EBADMAGIC || r == MSGQ_EVERSION || r == MSGQ_EGEOMETRY))
    r = 0; /* a header we cannot read tells nothing of its users: the caller checked */
  if (r == 0) r = unlink_same_file(path, &st);
  close(fd);
  return r;
}
