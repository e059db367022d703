/* The operating-system layer of the msgq core: futex wait/wake on words in shared
 * memory, a monotonic clock and a liveness check for process ids.
 *
 * Nothing above this file contains a platform #ifdef. On Linux the wait primitives are
 * futexes (FUTEX_WAIT / FUTEX_WAKE on shared, not private, words; futex_waitv for a
 * Poller over many queues where the kernel has it). Elsewhere, and where futex_waitv is
 * missing, waits are a bounded sleep-and-recheck loop: correct, with at most
 * OS_WAIT_FALLBACK_SLICE_NS of added latency. No signals are ever sent. */
#ifndef MSGQ_OS_WAIT_H
#define MSGQ_OS_WAIT_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

/* Longest single sleep of the fallback wait loops. */
#define OS_WAIT_FALLBACK_SLICE_NS 200000LL

/* Most words one os_wait_any() call can wait on (the kernel's futex_waitv limit). */
#define OS_WAIT_MAX_WORDS 128

/* Nanoseconds on CLOCK_MONOTONIC. */
int64_t os_monotonic_ns(void);

/* Sleeps while *word == expected, for at most timeout_ns (< 0: no limit).
 * Returns 0 when woken or when *word differed, -ETIMEDOUT, or -EINTR when a signal
 * arrived (the caller checks for Python signals and decides whether to go on). */
int os_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns);

/* Wakes every process sleeping in os_wait()/os_wait_any() on word. */
void os_wake_all(_Atomic uint32_t *word);

/* Sleeps until any words[i] != expected[i], a wake, the timeout or a signal, as
 * os_wait(). n must be 1..OS_WAIT_MAX_WORDS. */
int os_wait_any(_Atomic uint32_t *const *words, const uint32_t *expected, int n,
                int64_t timeout_ns);

/* 1 when a process with this id exists (even one owned by another user), else 0. */
int os_process_alive(pid_t pid);

/* One pause instruction where the CPU has it: a spin-wait hint. */
void os_cpu_relax(void);

/* Gives the CPU to another runnable thread, if any (sched_yield). */
void os_yield(void);

/* How many CPUs this process may run on (its affinity mask; at least 1). Cached for a
 * second: it is asked on every wait, and a 100 Hz loop must not pay a system call for it
 * at every tick (an affinity change is seen within a second). */
int os_cpus_available(void);

#endif
