/* A camera producer in C: a VisionIPC server that any Python VisionIpcClient reads.
 *
 *   camera_producer NAME STREAM WIDTH HEIGHT COUNT [NUM_BUFFERS]
 *   gcc camera_producer.c $(python -m msgq.cflags --cflags --libs --visionipc) -o camera
 *
 * Creates NUM_BUFFERS (default 4) NV12 buffers of WIDTH x HEIGHT for STREAM, starts the
 * listener, prints "ready", waits (up to 10 s) for a client, then sends COUNT frames:
 * frame i has frame_id i, timestamps 1000 + i and 2000 + i, and byte j of the buffer is
 * (i + j) mod 251. Even frames are written in place (zero copy), odd ones copied from a
 * frame in this process's memory. It waits until the client has read every packet, and
 * for a line on stdin (or its end) before it closes, so the client can still read the
 * last frames. On the Python side:
 *
 *   client = VisionIpcClient(NAME, STREAM, conflate=False); client.connect(True)
 *   buf = client.recv(timeout_ms=1000); client.frame_id, bytes(buf.data) */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msgq.h"
#include "visionipc.h"

static void fill(uint8_t *frame, uint64_t size, uint32_t i) {
  for (uint64_t j = 0; j < size; j++) frame[j] = (uint8_t)((i + j) % 251);
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static int fail(const char *what, int r) {
  fprintf(stderr, "camera_producer: %s: %s\n", what,
          r <= -3000 && r > -4000 ? vipc_strerror(r) : msgq_strerror(r));
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s NAME STREAM WIDTH HEIGHT COUNT [NUM_BUFFERS]\n", argv[0]);
    return 2;
  }
  const char *name = argv[1];
  uint32_t stream = (uint32_t)strtoul(argv[2], NULL, 10);
  uint32_t width = (uint32_t)strtoul(argv[3], NULL, 10);
  uint32_t height = (uint32_t)strtoul(argv[4], NULL, 10);
  uint32_t count = (uint32_t)strtoul(argv[5], NULL, 10);
  uint32_t num_buffers = argc > 6 ? (uint32_t)strtoul(argv[6], NULL, 10) : 4;

  vipc_server *srv;
  int r = vipc_server_open(name, &srv);
  if (r < 0) return fail("open", r);
  if ((r = vipc_server_create_buffers(srv, stream, num_buffers, width, height)) < 0)
    return fail("create_buffers", r);
  if ((r = vipc_server_start_listener(srv)) < 0) return fail("start_listener", r);
  printf("ready %s\n", vipc_server_socket_path(srv));
  fflush(stdout);

  for (int waited = 0; vipc_server_num_clients(srv, stream) < 1; waited++) {
    if (waited == 10000) return fail("no client after 10 s", -110);
    sleep_ms(1);
  }
  vipc_buffer buf;
  vipc_server_get_buffer(srv, stream, &buf); /* learn the frame size */
  uint64_t size = buf.size;
  uint8_t *own = malloc(size);
  if (!own) return fail("malloc", -12);
  for (uint32_t i = 0; i < count; i++) {
    if (i % 2 == 0) {
      if (i) vipc_server_get_buffer(srv, stream, &buf);
      fill(buf.data, size, i); /* straight into the shared buffer */
      r = vipc_server_send(srv, stream, buf.idx, i, 1000u + i, 2000u + i, 1);
    } else {
      fill(own, size, i);
      r = vipc_server_send_copy(srv, stream, own, size, i, 1000u + i, 2000u + i, 1);
    }
    if (r < 0) return fail("send", r);
  }
  printf("sent %u\n", count);
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) line[0] = '\0'; /* the client is done */
  free(own);
  vipc_server_close(srv);
  return 0;
}
