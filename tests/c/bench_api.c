/* The public C API's own speed, to read the Python binding's overhead off beside it:
 *  - pair: one thread sends a message and receives it back (msgq_pub_send, then
 *    msgq_sub_recv into a buffer; and msgq_sub_view/view_end in place), as the Python
 *    benchmark's send/receive pair does through msgq.pub_sock/sub_sock;
 *  - round trip: two threads ping-pong one message through two queues (each waits in
 *    msgq_sub_recv with spinning, then futex sleep), median of N round trips.
 * Real queue files under a private MSGQ_SHM_DIR. Built by `scons bench`
 * (build/plain/bench_api, linked to libmsgq.a); not a test. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msgq.h"

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void die(const char *what, int r) {
  fprintf(stderr, "bench_api: %s: %s\n", what, msgq_strerror(r));
  exit(1);
}

static uint8_t msg[1 << 20], out[1 << 20];

/* Median ns per send + receive of size-byte messages; in_place: view instead of copy. */
static double pair_ns(msgq_pub *pub, msgq_sub *sub, size_t size, int in_place) {
  const int n = size >= 65536 ? 2000 : 200000;
  double runs[7];
  for (int r = 0; r < 7; r++) {
    int64_t start = msgq_now_ns();
    for (int i = 0; i < n; i++) {
      int rc = msgq_pub_send(pub, msg, size);
      if (rc < 0) die("send", rc);
      size_t got;
      if (in_place) {
        const void *view;
        if (msgq_sub_view(sub, &view, &got) != 1) die("view", 0);
        out[0] = ((const uint8_t *)view)[got ? got - 1 : 0]; /* touch it */
        if (msgq_sub_view_end(sub, NULL) != 1) die("view_end", 0);
      } else if (msgq_sub_recv(sub, out, sizeof out, &got, 0) != 1) {
        die("recv", 0);
      }
    }
    runs[r] = (double)(msgq_now_ns() - start) / n;
  }
  qsort(runs, 7, sizeof runs[0], by_value);
  return runs[3];
}

typedef struct {
  size_t size;
  int count;
} echo_args;

/* The echo side of the round trip: receives on "bench_ping", sends it back on
 * "bench_pong". */
static void *echo_main(void *arg) {
  echo_args *a = arg;
  msgq_sub *sub;
  msgq_pub *pub;
  int r;
  while ((r = msgq_sub_open("bench_ping", 0, 0, &sub)) == -EAGAIN) {
  }
  if (r < 0) die("open ping", r);
  while ((r = msgq_pub_open("bench_pong", 0, 0, &pub)) == -EAGAIN) {
  }
  if (r < 0) die("open pong", r);
  static uint8_t buf[1 << 20];
  for (int i = 0; i < a->count; i++) {
    size_t got;
    r = msgq_sub_recv(sub, buf, sizeof buf, &got, 5000000000LL);
    if (r != 1) die("echo recv", r);
    r = msgq_pub_send(pub, buf, got);
    if (r < 0) die("echo send", r);
  }
  msgq_pub_close(pub);
  msgq_sub_close(sub);
  return NULL;
}

/* p50 and p99 round trip in ns for size-byte messages. */
static void round_trip(size_t size, double *p50, double *p99) {
  enum { N = 20000, WARM = 1000 };
  static double samples[N];
  msgq_pub *ping;
  msgq_sub *pong;
  int r = msgq_pub_open("bench_ping", 0, 0, &ping);
  if (r < 0) die("open ping", r);
  r = msgq_sub_open("bench_pong", 0, 0, &pong);
  if (r < 0) die("open pong", r);
  echo_args args = {size, N + WARM};
  pthread_t echo;
  pthread_create(&echo, NULL, echo_main, &args);
  while (msgq_pub_num_readers(ping) == 0) {
  }
  /* The echo's publisher exists once its first answer arrives; the first ping may be
   * sent before it subscribed to pong, so warm-up pings are retried until one answers. */
  size_t got;
  for (int i = 0; i < N + WARM; i++) {
    int64_t start = msgq_now_ns();
    if ((r = msgq_pub_send(ping, msg, size)) < 0) die("ping", r);
    r = msgq_sub_recv(pong, out, sizeof out, &got, 5000000000LL);
    if (r != 1) die("pong", r);
    if (i >= WARM) samples[i - WARM] = (double)(msgq_now_ns() - start);
  }
  pthread_join(echo, NULL);
  qsort(samples, N, sizeof samples[0], by_value);
  *p50 = samples[N / 2];
  *p99 = samples[N * 99 / 100];
  msgq_sub_close(pong);
  msgq_pub_close(ping);
}

int main(void) {
  char dir[] = "/dev/shm/msgq_bench_api.XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 2;
  }
  setenv("MSGQ_SHM_DIR", dir, 1);
  unsetenv("MSGQ_PREFIX");
  unsetenv("OPENPILOT_PREFIX");
  for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)(i * 7);

  msgq_sub *sub;
  msgq_pub *pub;
  int r = msgq_sub_open("bench_pair", 0, 0, &sub);
  if (r < 0) die("open", r);
  r = msgq_pub_open("bench_pair", 0, 0, &pub);
  if (r < 0) die("open", r);
  const size_t sizes[] = {8, 64, 1024, 65536, 1048576};
  printf("msgq C API, one thread: send + receive pair, median of 7 runs (ns)\n");
  printf("%10s  %12s  %12s\n", "payload", "recv (copy)", "view");
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    printf("%10zu  %12.1f  %12.1f\n", sizes[i], pair_ns(pub, sub, sizes[i], 0),
           pair_ns(pub, sub, sizes[i], 1));
  msgq_pub_close(pub);
  msgq_sub_close(sub);

  printf("\nround trip between two threads (send, echo, receive), ns\n");
  printf("%10s  %10s  %10s\n", "payload", "p50", "p99");
  const size_t rt_sizes[] = {8, 1024, 65536};
  for (size_t i = 0; i < sizeof rt_sizes / sizeof rt_sizes[0]; i++) {
    double p50, p99;
    round_trip(rt_sizes[i], &p50, &p99);
    printf("%10zu  %10.0f  %10.0f\n", rt_sizes[i], p50, p99);
  }
  char cmd[96];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : 1;
}
