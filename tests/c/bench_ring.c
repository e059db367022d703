/* Cost of the ring's opt-in checksum: one thread sends a message and receives it back
 * (peek, copy, consume) in a loop, in a queue made without and with MSGQ_FLAG_CHECKSUM,
 * and prints a table of the median nanoseconds per send+receive pair. Built by
 * `scons bench` (build/plain/bench_ring); not a test. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crc32c.h"
#include "msgq_ring.h"

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median ns per send+receive of `size`-byte messages in a fresh 10 MiB queue. */
static double pair_ns(uint32_t size, uint32_t flags) {
  const size_t total = MSGQ_HEADER_SIZE + MSGQ_DEFAULT_SEGMENT_SIZE;
  void *mem = aligned_alloc(4096, total);
  memset(mem, 0, total);
  msgq_ring ring;
  if (msgq_ring_format(mem, total, flags) != 0 || msgq_ring_attach(&ring, mem, total) != 0)
    exit(2);
  msgq_publisher pub;
  msgq_subscriber sub;
  msgq_publisher_init(&pub, &ring);
  if (msgq_subscriber_init(&sub, &ring, false) != 0) exit(2);
  static uint8_t msg[1 << 20], out[1 << 20];
  for (uint32_t i = 0; i < size; i++) msg[i] = (uint8_t)(i * 7);
  const int n = size >= 65536 ? 2000 : 100000;
  double runs[7];
  for (int r = 0; r < 7; r++) {
    double start = now_ns();
    for (int i = 0; i < n; i++) {
      const uint8_t *p;
      uint32_t got;
      msgq_publisher_send(&pub, msg, size);
      if (msgq_subscriber_peek(&sub, &p, &got) == 1) {
        memcpy(out, p, got);
        if (!msgq_subscriber_consume(&sub, out)) exit(3);
      }
    }
    runs[r] = (now_ns() - start) / n;
  }
  qsort(runs, 7, sizeof runs[0], by_value);
  free(mem);
  return runs[3];
}

int main(void) {
  const uint32_t sizes[] = {8, 1024, 65536, 1048576};
  printf("send+receive in one thread, median of 7 runs; CRC32C: %s\n",
         msgq_crc32c_implementation());
  printf("%10s  %12s  %14s  %8s\n", "payload", "plain ns", "checksum ns", "ratio");
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    double plain = pair_ns(sizes[i], 0), sum = pair_ns(sizes[i], MSGQ_FLAG_CHECKSUM);
    printf("%10u  %12.1f  %14.1f  %7.2fx\n", sizes[i], plain, sum, sum / plain);
  }
  return 0;
}
