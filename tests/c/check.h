/* The C unit tests' harness, one copy for every test program. CHECK counts a failure of
 * the test that is running and goes on (never assert(): a check on what a queue or a
 * socket holds must not abort the run), RUN runs one test function and reports it, and
 * the program prints "N passed, N failed" from `passed` and `failed` at the end. */
#ifndef MSGQ_TESTS_CHECK_H
#define MSGQ_TESTS_CHECK_H

#include <stdio.h>

static int passed, failed, failed_here;
static const char *current_test;

#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: %s: check failed: %s\n", __FILE__, __LINE__, \
              current_test, #cond);                                         \
      failed_here = 1;                                                      \
    }                                                                       \
  } while (0)

#define RUN(fn)                          \
  do {                                   \
    current_test = #fn;                  \
    failed_here = 0;                     \
    fn();                                \
    if (failed_here) {                   \
      failed++;                          \
      fprintf(stderr, "FAIL %s\n", #fn); \
    } else {                             \
      passed++;                          \
      printf("ok   %s\n", #fn);          \
    }                                    \
  } while (0)

#endif
