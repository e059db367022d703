/* What the server and its listener share (internal to visionipc/src). */
#ifndef VISIONIPC_SERVER_INTERNAL_H
#define VISIONIPC_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "msgq.h"
#include "visionipc.h"

typedef struct {
  uint32_t id;
  vipc_geometry geometry;
  uint64_t map_size;
  uint32_t num_buffers;
  int fds[VIPC_MAX_BUFFERS_PER_STREAM];
  uint8_t *maps[VIPC_MAX_BUFFERS_PER_STREAM];
  msgq_pub *pub; /* NULL when the caller publishes */
  uint32_t next_index;
  uint64_t sequence;
} vipc_stream;

struct vipc_server {
  char name[VIPC_MAX_NAME_LEN + 1];
  uint64_t server_id;
  /* Uid policy (V5). */
  bool any_uid;
  uint32_t *uids;
  size_t num_uids;
  int64_t handshake_timeout_ns;
  bool caller_publishes; /* VIPC_SERVER_CALLER_PUBLISHES: streams have no pub */
  /* Streams: the listener reads them under `lock`; only the server thread adds. */
  pthread_mutex_t lock;
  vipc_stream *streams;
  size_t num_streams, cap_streams;
  /* The listener (vipc_listener.c), once started. */
  struct vipc_listener *listener;
  char socket_path[128];
};

#endif
