/* A publisher of a capnp-free raw service in C: waits (up to 10 s) for a subscriber,
 * sends COUNT messages "<endpoint> <i>" (or SIZE-byte messages whose bytes are
 * (i + j) mod 251), then waits until every subscriber has read them.
 *
 *   raw_publisher ENDPOINT COUNT [SIZE]
 *   gcc raw_publisher.c $(python -m msgq.cflags --cflags --libs) -o raw_publisher
 *
 * Any Python subscriber receives them: msgq.sub_sock(ENDPOINT).receive(). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msgq.h"

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s ENDPOINT COUNT [SIZE]\n", argv[0]);
    return 2;
  }
  const char *endpoint = argv[1];
  long count = atol(argv[2]);
  long size = argc > 3 ? atol(argv[3]) : -1;

  msgq_pub *pub;
  int r;
  while ((r = msgq_pub_open(endpoint, 0, 0, &pub)) == -EAGAIN) {
  } /* another process holds the queue file's lock for a moment: try again */
  if (r < 0) {
    fprintf(stderr, "raw_publisher: %s: %s\n", endpoint, msgq_strerror(r));
    return 1;
  }
  for (int waited = 0; msgq_pub_num_readers(pub) == 0; waited++) {
    if (waited == 10000) {
      fprintf(stderr, "raw_publisher: %s: no subscriber after 10 s\n", endpoint);
      msgq_pub_close(pub);
      return 1;
    }
    sleep_ms(1);
  }

  char text[160];
  for (long i = 0; i < count; i++) {
    if (size < 0) {
      int n = snprintf(text, sizeof text, "%s %ld", endpoint, i);
      r = msgq_pub_send(pub, text, (size_t)n);
    } else {
      /* Zero copies: the message is written straight into the ring. */
      void *slot;
      r = msgq_pub_reserve(pub, (size_t)size, &slot);
      if (r == 0) {
        for (long j = 0; j < size; j++) ((unsigned char *)slot)[j] = (unsigned char)((i + j) % 251);
        r = msgq_pub_commit(pub);
      }
    }
    if (r < 0) {
      fprintf(stderr, "raw_publisher: %s: send %ld: %s\n", endpoint, i, msgq_strerror(r));
      msgq_pub_close(pub);
      return 1;
    }
  }
  for (int waited = 0; !msgq_pub_all_readers_updated(pub) && waited < 10000; waited++)
    sleep_ms(1);
  printf("sent %ld\n", count);
  msgq_pub_close(pub);
  return 0;
}
