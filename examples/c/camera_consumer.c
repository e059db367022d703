/* A VisionIPC client in C: reads frames from any VisionIPC server (a Python
 * VisionIpcServer, or camera_producer) without copies.
 *
 *   camera_consumer NAME STREAM COUNT
 *   gcc camera_consumer.c $(python -m msgq.cflags --cflags --libs --visionipc) -o consumer
 *
 * Subscribes, prints "ready", connects (waiting up to 10 s for the server), then prints
 * one line per frame: "<frame_id> <sof> <eof> <size> <fnv1a-64 of the frame, hex>
 * <current>", where current is 1 when the buffer still held the frame after it was
 * hashed (the server had not refilled it meanwhile). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "visionipc.h"

static uint64_t fnv1a(const uint8_t *p, uint64_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s NAME STREAM COUNT\n", argv[0]);
    return 2;
  }
  uint32_t stream = (uint32_t)strtoul(argv[2], NULL, 10);
  long count = atol(argv[3]);
  vipc_client *client;
  int r = vipc_client_open(argv[1], stream, 0, &client);
  if (r < 0) {
    fprintf(stderr, "camera_consumer: open: %s\n", vipc_strerror(r));
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  if ((r = vipc_client_connect(client, 10000000000LL)) < 0) {
    fprintf(stderr, "camera_consumer: connect: %s\n", vipc_strerror(r));
    return 1;
  }
  vipc_geometry g = vipc_client_geometry(client);
  printf("connected %ux%u stride %u uv_offset %u buffers %u\n", g.width, g.height, g.stride,
         g.uv_offset, vipc_client_num_buffers(client));
  fflush(stdout);
  long received = 0;
  while (received < count) {
    vipc_frame f;
    r = vipc_client_recv(client, &f, 10000000000LL);
    if (r <= 0) {
      fprintf(stderr, "camera_consumer: recv: %s\n", r ? vipc_strerror(r) : "timed out");
      break;
    }
    uint64_t hash = fnv1a(f.data, f.size); /* read in place */
    int current = vipc_client_frame_current(client, &f);
    printf("%u %" PRIu64 " %" PRIu64 " %" PRIu64 " %016" PRIx64 " %d\n", f.frame_id,
           f.timestamp_sof, f.timestamp_eof, f.size, hash, current);
    fflush(stdout);
    received++;
  }
  vipc_client_close(client);
  return received == count ? 0 : 1;
}
