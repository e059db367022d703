/* The C core's work per message, for instruction counts (scripts/bench-ab.sh runs it
 * under callgrind, whose counts do not depend on the machine's load): one process, one
 * publisher and N subscribers of one queue; each message is sent, then received (copy,
 * or view with "view") by every subscriber, none of them ever waiting. The difference
 * of two runs' counts (COUNT and 3 x COUNT messages) over 2 x COUNT is the instructions
 * per message of send + N receives, start-up and set-up cancelled out.
 *
 *   count_pair SIZE SUBS COUNT [copy|view]
 *
 * Only msgq.h, so that it builds against any revision's C core (bench-ab.sh compiles it
 * with each side's msgq/src). Real queue files under a private MSGQ_SHM_DIR. Not a test. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "msgq.h"

#define MAX_SUBS 16

static void die(const char *what, int r) {
  fprintf(stderr, "count_pair: %s: %s\n", what, msgq_strerror(r));
  exit(1);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: count_pair SIZE SUBS COUNT [copy|view]\n");
    return 2;
  }
  const size_t size = strtoul(argv[1], NULL, 10);
  const int subs = atoi(argv[2]);
  const long count = atol(argv[3]);
  const int view = argc > 4 && strcmp(argv[4], "view") == 0;
  if (size < 8 || subs < 1 || subs > MAX_SUBS || count < 1) {
    fprintf(stderr, "count_pair: SIZE >= 8, 1 <= SUBS <= %d, COUNT >= 1\n", MAX_SUBS);
    return 2;
  }
  char dir[] = "/dev/shm/msgq_count_pair.XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 2;
  }
  setenv("MSGQ_SHM_DIR", dir, 1);
  unsetenv("MSGQ_PREFIX");
  unsetenv("OPENPILOT_PREFIX");
  uint8_t *msg = malloc(size), *out = malloc(size);
  if (!msg || !out) return 2;
  for (size_t i = 0; i < size; i++) msg[i] = (uint8_t)(i * 7);

  msgq_sub *sub[MAX_SUBS];
  msgq_pub *pub;
  int r;
  for (int i = 0; i < subs; i++)
    if ((r = msgq_sub_open("count_pair", 0, 0, &sub[i])) < 0) die("open sub", r);
  if ((r = msgq_pub_open("count_pair", 0, 0, &pub)) < 0) die("open pub", r);
  long checked = 0;
  for (long n = 0; n < count; n++) {
    memcpy(msg, &n, sizeof n); /* each message differs, as in the Python rows */
    if ((r = msgq_pub_send(pub, msg, size)) < 0) die("send", r);
    for (int i = 0; i < subs; i++) {
      size_t got;
      if (view) {
        const void *at;
        if ((r = msgq_sub_view(sub[i], &at, &got)) != 1) die("view", r);
        long seq;
        memcpy(&seq, at, sizeof seq);
        checked += seq == n;
        if ((r = msgq_sub_view_end(sub[i], NULL)) != 1) die("view_end", r);
      } else {
        if ((r = msgq_sub_recv(sub[i], out, size, &got, 0)) != 1) die("recv", r);
        long seq;
        memcpy(&seq, out, sizeof seq);
        checked += seq == n && got == size;
      }
    }
  }
  for (int i = 0; i < subs; i++) msgq_sub_close(sub[i]);
  msgq_pub_close(pub);
  char path[sizeof dir + 32];
  snprintf(path, sizeof path, "%s/msgq_count_pair", dir);
  unlink(path);
  rmdir(dir);
  if (checked != count * subs) {
    fprintf(stderr, "count_pair: %ld of %ld messages wrong\n", count * subs - checked,
            count * subs);
    return 1;
  }
  return 0;
}
