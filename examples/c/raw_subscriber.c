/* A subscriber in C: prints "ready" once connected, then one line per message,
 * "<size> <fnv1a-64 of the bytes, hex>", until COUNT messages arrived or none came for
 * TIMEOUT_MS (default 5000). Works with any publisher of the endpoint: a Python
 * PubMaster or msgq.pub_sock, or raw_publisher.
 *
 *   raw_subscriber ENDPOINT COUNT [TIMEOUT_MS]
 *   gcc raw_subscriber.c $(python -m msgq.cflags --cflags --libs) -o raw_subscriber */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "msgq.h"

static uint64_t fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s ENDPOINT COUNT [TIMEOUT_MS]\n", argv[0]);
    return 2;
  }
  const char *endpoint = argv[1];
  long count = atol(argv[2]);
  int64_t timeout_ns = (argc > 3 ? atol(argv[3]) : 5000) * 1000000LL;

  msgq_sub *sub;
  int r;
  while ((r = msgq_sub_open(endpoint, 0, 0, &sub)) == -EAGAIN) {
  }
  if (r < 0) {
    fprintf(stderr, "raw_subscriber: %s: %s\n", endpoint, msgq_strerror(r));
    return 1;
  }
  printf("ready\n");
  fflush(stdout);

  long received = 0;
  while (received < count) {
    void *data;
    size_t size;
    /* One copy into a buffer of our own (malloc); msgq_sub_recv takes a caller's
     * buffer, msgq_sub_view reads in place. */
    r = msgq_sub_recv_alloc(sub, &data, &size, timeout_ns);
    if (r == 0) {
      fprintf(stderr, "raw_subscriber: %s: nothing for %" PRId64 " ms after %ld messages\n",
              endpoint, timeout_ns / 1000000, received);
      break;
    }
    if (r < 0) {
      fprintf(stderr, "raw_subscriber: %s: %s\n", endpoint, msgq_strerror(r));
      break;
    }
    printf("%zu %016" PRIx64 "\n", size, fnv1a(data, size));
    fflush(stdout);
    free(data);
    received++;
  }
  msgq_sub_stats stats;
  msgq_sub_get_stats(sub, &stats);
  msgq_sub_close(sub);
  if (stats.resets) fprintf(stderr, "raw_subscriber: %" PRIu64 " resets\n", stats.resets);
  return received == count ? 0 : 1;
}
