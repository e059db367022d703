#define _GNU_SOURCE
#include "os_wait.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

int64_t os_monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static struct timespec relative_timespec(int64_t ns) {
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000LL),
                        .tv_nsec = (long)(ns % 1000000000LL)};
  return ts;
}

/* Sleep-and-recheck used where no futex is available: returns like os_wait_any. */
static int fallback_wait_any(_Atomic uint32_t *const *words, const uint32_t *expected,
                             int n, int64_t timeout_ns) {
  int64_t deadline = timeout_ns < 0 ? INT64_MAX : os_monotonic_ns() + timeout_ns;
  for (;;) {
    for (int i = 0; i < n; i++) {
      if (atomic_load_explicit(words[i], memory_order_acquire) != expected[i]) return 0;
    }
    int64_t now = os_monotonic_ns();
    if (now >= deadline) return -ETIMEDOUT;
    int64_t slice = deadline - now;
    if (slice > OS_WAIT_FALLBACK_SLICE_NS) slice = OS_WAIT_FALLBACK_SLICE_NS;
    struct timespec ts = relative_timespec(slice);
    if (nanosleep(&ts, NULL) != 0 && errno == EINTR) return -EINTR;
  }
}

#if defined(__linux__)

int os_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns) {
  struct timespec ts;
  struct timespec *tsp = NULL;
  if (timeout_ns >= 0) {
    ts = relative_timespec(timeout_ns);
    tsp = &ts;
  }
  /* FUTEX_WAIT (not _PRIVATE): the word lives in a mapping shared between processes. */
  long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, tsp, NULL, 0);
  if (r == 0) return 0;
  if (errno == EAGAIN) return 0; /* the word had already changed */
  if (errno == ETIMEDOUT) return -ETIMEDOUT;
  if (errno == EINTR) return -EINTR;
  return -errno;
}

void os_wake_all(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

struct os_futex_waitv {
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
#define OS_FUTEX2_SIZE_U32 0x02

/* 1 when futex_waitv worked once, -1 when the kernel said ENOSYS, 0 before the first call. */
static _Atomic int futex_waitv_support = 0;

int os_wait_any(_Atomic uint32_t *const *words, const uint32_t *expected, int n,
                int64_t timeout_ns) {
  if (n <= 0 || n > OS_WAIT_MAX_WORDS) return -EINVAL;
  if (n == 1) return os_wait(words[0], expected[0], timeout_ns);
  if (atomic_load_explicit(&futex_waitv_support, memory_order_relaxed) >= 0) {
    struct os_futex_waitv waiters[OS_WAIT_MAX_WORDS];
    memset(waiters, 0, sizeof(waiters[0]) * (size_t)n);
    for (int i = 0; i < n; i++) {
      waiters[i].val = expected[i];
      waiters[i].uaddr = (uint64_t)(uintptr_t)words[i];
      waiters[i].flags = OS_FUTEX2_SIZE_U32; /* shared futex: no FUTEX2_PRIVATE */
    }
    struct timespec deadline;
    struct timespec *dp = NULL;
    if (timeout_ns >= 0) {
      /* futex_waitv takes an absolute CLOCK_MONOTONIC deadline. */
      int64_t abs_ns = os_monotonic_ns() + timeout_ns;
      deadline = relative_timespec(abs_ns);
      dp = &deadline;
    }
    long r = syscall(SYS_futex_waitv, waiters, (unsigned)n, 0u, dp, CLOCK_MONOTONIC);
    if (r >= 0) {
      atomic_store_explicit(&futex_waitv_support, 1, memory_order_relaxed);
      return 0;
    }
    if (errno == EAGAIN) return 0;
    if (errno == ETIMEDOUT) return -ETIMEDOUT;
    if (errno == EINTR) return -EINTR;
    /* ENOSYS, or refused (a seccomp filter's EPERM, …): never try again, fall back.
     * Returning the error instead would make every poll fail at once: a busy loop. */
    atomic_store_explicit(&futex_waitv_support, -1, memory_order_relaxed);
  }
  return fallback_wait_any(words, expected, n, timeout_ns);
}

#else /* no futex: bounded polling */

int os_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns) {
  _Atomic uint32_t *const words[1] = {word};
  return fallback_wait_any(words, &expected, 1, timeout_ns);
}

void os_wake_all(_Atomic uint32_t *word) { (void)word; }

int os_wait_any(_Atomic uint32_t *const *words, const uint32_t *expected, int n,
                int64_t timeout_ns) {
  if (n <= 0 || n > OS_WAIT_MAX_WORDS) return -EINVAL;
  return fallback_wait_any(words, expected, n, timeout_ns);
}

#endif

int os_process_alive(pid_t pid) {
  if (pid <= 0) return 0;
  if (kill(pid, 0) == 0) return 1;
  return errno == EPERM; /* exists, owned by someone else */
}

void os_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void os_yield(void) { sched_yield(); }

int os_cpus_available(void) {
  static _Atomic int cached = 0;
  static _Atomic int64_t cached_at = 0;
  int64_t now = os_monotonic_ns();
  int n = atomic_load_explicit(&cached, memory_order_relaxed);
  if (n > 0 && now - atomic_load_explicit(&cached_at, memory_order_relaxed) < 1000000000)
    return n;
#if defined(__linux__)
  cpu_set_t set;
  n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
#else
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  n = online > 0 ? (int)online : 1;
#endif
  if (n < 1) n = 1;
  atomic_store_explicit(&cached, n, memory_order_relaxed);
  atomic_store_explicit(&cached_at, now, memory_order_relaxed);
  return n;
}
