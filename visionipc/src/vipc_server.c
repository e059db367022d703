/* VisionIPC server: names, the uid policy, buffers (memfd), sending (visionipc.h). The
 * listener thread is in vipc_listener.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frame_copy.h"
#include "vipc_buffer.h"
#include "vipc_handshake.h"
#include "vipc_listener.h"
#include "vipc_names.h"
#include "vipc_packet.h"
#include "vipc_server_internal.h"

_Static_assert(VIPC_MAX_BUFFERS_PER_STREAM == VIPC_MAX_BUFFERS, "one limit");

/* Copies at least this large use streaming stores (as visionipc/frame_copy.py, whose
 * threshold also depends on the cache size; this is its lower bound). */
#define STREAMING_FROM (1u << 20)

int vipc_server_open(const char *name, vipc_server **out) {
  return vipc_server_open_flags(name, 0, out);
}

int vipc_server_open_flags(const char *name, unsigned flags, vipc_server **out) {
  if (out == NULL) return -EINVAL;
  *out = NULL;
  if (vipc_validate_name(name) < 0) return -EINVAL;
  vipc_server *srv = calloc(1, sizeof *srv);
  if (!srv) return -ENOMEM;
  strcpy(srv->name, name);
  /* Random per instance: clients see a new id after a restart. */
  if (getrandom(&srv->server_id, sizeof srv->server_id, 0) != sizeof srv->server_id)
    srv->server_id = (uint64_t)getpid() << 32 ^ (uint64_t)msgq_now_ns();
  if (srv->server_id == 0) srv->server_id = 1;
  srv->handshake_timeout_ns = 1000000000LL;
  pthread_mutex_init(&srv->lock, NULL);
  srv->caller_publishes = (flags & VIPC_SERVER_CALLER_PUBLISHES) != 0;
  int r = flags & VIPC_SERVER_NO_ENV_UIDS
              ? 0
              : vipc_uids_from_env(&srv->any_uid, &srv->uids, &srv->num_uids);
  if (r == 0) {
    r = vipc_server_allow_uids(srv, (uint32_t[]){(uint32_t)geteuid()}, 1, 0);
  }
  if (r < 0) {
    vipc_server_close(srv);
    return r;
  }
  *out = srv;
  return 0;
}

int vipc_server_allow_uids(vipc_server *srv, const uint32_t *uids, size_t n, int any) {
  uint32_t *copy = NULL;
  if (!any && n) {
    copy = malloc(n * sizeof *copy);
    if (!copy) return -ENOMEM;
    memcpy(copy, uids, n * sizeof *copy);
  }
  free(srv->uids);
  srv->uids = copy;
  srv->num_uids = any ? 0 : n;
  srv->any_uid = any != 0;
  return srv->listener ? vipc_listener_set_uids(srv->listener, uids, n, any) : 0;
}

void vipc_server_set_handshake_timeout(vipc_server *srv, int64_t timeout_ns) {
  if (timeout_ns > 0) srv->handshake_timeout_ns = timeout_ns;
}

static vipc_stream *find_stream(vipc_server *srv, uint32_t stream) {
  for (size_t i = 0; i < srv->num_streams; i++)
    if (srv->streams[i].id == stream) return &srv->streams[i];
  return NULL;
}

static void free_stream(vipc_stream *s) {
  if (s->pub) msgq_pub_close(s->pub);
  for (uint32_t i = 0; i < s->num_buffers; i++) {
    if (s->maps[i]) munmap(s->maps[i], s->map_size);
    if (s->fds[i] >= 0) close(s->fds[i]);
  }
}

/* One buffer (V1): a sealed memfd of map_size bytes and its read-write mapping. */
static int allocate_buffer(const char *label, uint64_t map_size, int *fd_out, uint8_t **map_out) {
  int fd = vipc_buffer_create(label, map_size);
  if (fd < 0) return fd;
  void *map = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) {
    int r = -errno;
    close(fd);
    return r;
  }
  *fd_out = fd;
  *map_out = map;
  return 0;
}

int vipc_server_create_buffers_with_geometry(vipc_server *srv, uint32_t stream,
                                             uint32_t num_buffers, const vipc_geometry *g) {
  if (num_buffers < 1 || num_buffers > VIPC_MAX_BUFFERS) return -EINVAL;
  int r = vipc_geometry_validate(g, NULL);
  if (r < 0) return r;
  if (find_stream(srv, stream)) return -EEXIST;
  if (srv->num_streams >= VIPC_MAX_STREAMS) return -ENOSPC;

  vipc_stream s;
  memset(&s, 0, sizeof s);
  s.id = stream;
  s.geometry = *g;
  s.map_size = vipc_map_size(g, (uint64_t)sysconf(_SC_PAGESIZE));
  for (uint32_t i = 0; i < VIPC_MAX_BUFFERS; i++) s.fds[i] = -1;
  for (uint32_t i = 0; i < num_buffers && r == 0; i++) {
    char label[128];
    snprintf(label, sizeof label, "visionipc:%s:%u:%u", srv->name, stream, i);
    r = allocate_buffer(label, s.map_size, &s.fds[i], &s.maps[i]);
    if (r == 0) s.num_buffers = i + 1;
  }
  if (r == 0 && !srv->caller_publishes) {
    char endpoint[MSGQ_ENDPOINT_NAME_MAX + 2];
    r = vipc_endpoint_name(srv->name, stream, endpoint, sizeof endpoint);
    while (r == 0 && (r = msgq_pub_open(endpoint, VIPC_PACKET_SEGMENT_SIZE, 0, &s.pub)) == -EAGAIN) {
    }
  }
  if (r < 0) {
    free_stream(&s);
    return r;
  }
  pthread_mutex_lock(&srv->lock);
  if (srv->num_streams == srv->cap_streams) {
    size_t cap = srv->cap_streams ? srv->cap_streams * 2 : 4;
    vipc_stream *grown = realloc(srv->streams, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&srv->lock);
      free_stream(&s);
      return -ENOMEM;
    }
    srv->streams = grown;
    srv->cap_streams = cap;
  }
  srv->streams[srv->num_streams++] = s;
  pthread_mutex_unlock(&srv->lock);
  /* Exported last: a client served this stream gets its packets. */
  if (srv->listener)
    return vipc_listener_add_stream(srv->listener, stream, &s.geometry, s.map_size, s.fds,
                                    s.num_buffers);
  return 0;
}

int vipc_server_create_buffers(vipc_server *srv, uint32_t stream, uint32_t num_buffers,
                               uint32_t width, uint32_t height) {
  if (width > VIPC_MAX_DIMENSION || height > VIPC_MAX_DIMENSION) return VIPC_EGEOMETRY;
  vipc_geometry g = vipc_geometry_nv12(width, height);
  return vipc_server_create_buffers_with_geometry(srv, stream, num_buffers, &g);
}

/* The trailer's two words (V2). The mapping is page-aligned and the trailer offset a
 * multiple of 64, so both are aligned 8-byte words. */
static _Atomic uint64_t *trailer(vipc_stream *s, uint32_t idx) {
  return (_Atomic uint64_t *)(s->maps[idx] + vipc_trailer_offset(&s->geometry));
}

static void begin_write(vipc_stream *s, uint32_t idx) {
  _Atomic uint64_t *t = trailer(s, idx);
  /* The sequence first: a reader that checks it after reading sees the change before any
   * byte of the new frame (release orders it before the frame's stores). */
  atomic_store_explicit(&t[1], 0, memory_order_relaxed);
  atomic_store_explicit(&t[0], VIPC_FRAME_ID_WRITING, memory_order_release);
  atomic_thread_fence(memory_order_release);
}

int vipc_server_get_buffer(vipc_server *srv, uint32_t stream, vipc_buffer *out) {
  vipc_stream *s = find_stream(srv, stream);
  if (!s) return -ENOENT;
  uint32_t idx = s->next_index;
  s->next_index = (idx + 1) % s->num_buffers;
  begin_write(s, idx);
  out->data = s->maps[idx];
  out->size = s->geometry.size;
  out->idx = idx;
  out->width = s->geometry.width;
  out->height = s->geometry.height;
  out->stride = s->geometry.stride;
  out->uv_offset = s->geometry.uv_offset;
  return 0;
}

/* V2: frame_id, then (release) the stream's next sequence into the trailer; the packet
 * announcing it into bytes. */
static uint64_t commit(vipc_server *srv, vipc_stream *s, uint32_t idx, uint32_t frame_id,
                       uint64_t sof, uint64_t eof, int valid, uint8_t bytes[VIPC_PACKET_SIZE]) {
  uint64_t sequence = ++s->sequence;
  _Atomic uint64_t *t = trailer(s, idx);
  atomic_store_explicit(&t[0], frame_id, memory_order_relaxed);
  /* release: the frame's bytes and frame_id before the sequence (the commit). */
  atomic_store_explicit(&t[1], sequence, memory_order_release);
  vipc_frame_packet p = {srv->server_id, sequence, idx, frame_id, sof, eof, valid != 0};
  vipc_packet_encode(&p, bytes);
  return sequence;
}

static int announce(vipc_server *srv, vipc_stream *s, uint32_t idx, uint32_t frame_id,
                    uint64_t sof, uint64_t eof, int valid) {
  uint8_t bytes[VIPC_PACKET_SIZE];
  commit(srv, s, idx, frame_id, sof, eof, valid, bytes);
  int r;
  while ((r = msgq_pub_send(s->pub, bytes, sizeof bytes)) == -EAGAIN) {
  }
  return r < 0 ? r : 0;
}

int64_t vipc_server_commit(vipc_server *srv, uint32_t stream, uint32_t idx, uint32_t frame_id,
                           uint64_t timestamp_sof, uint64_t timestamp_eof, int valid,
                           uint8_t packet[VIPC_PACKET_SIZE]) {
  vipc_stream *s = find_stream(srv, stream);
  if (!s) return -ENOENT;
  if (idx >= s->num_buffers) return -EINVAL;
  return (int64_t)commit(srv, s, idx, frame_id, timestamp_sof, timestamp_eof, valid, packet);
}

int vipc_server_stream_info(vipc_server *srv, uint32_t stream, vipc_stream_info *out) {
  vipc_stream *s = find_stream(srv, stream);
  if (!s) return -ENOENT;
  out->geometry = s->geometry;
  out->map_size = s->map_size;
  out->num_buffers = s->num_buffers;
  out->fds = s->fds;
  return 0;
}

int vipc_server_send(vipc_server *srv, uint32_t stream, uint32_t idx, uint32_t frame_id,
                     uint64_t timestamp_sof, uint64_t timestamp_eof, int valid) {
  vipc_stream *s = find_stream(srv, stream);
  if (!s) return -ENOENT;
  if (srv->caller_publishes) return -ENOTSUP;
  if (idx >= s->num_buffers) return -EINVAL;
  return announce(srv, s, idx, frame_id, timestamp_sof, timestamp_eof, valid);
}

int vipc_server_send_copy(vipc_server *srv, uint32_t stream, const void *data, size_t size,
                          uint32_t frame_id, uint64_t timestamp_sof, uint64_t timestamp_eof,
                          int valid) {
  vipc_stream *s = find_stream(srv, stream);
  if (!s) return -ENOENT;
  if (srv->caller_publishes) return -ENOTSUP;
  if (size != s->geometry.size) return -EINVAL;
  vipc_buffer buf;
  vipc_server_get_buffer(srv, stream, &buf);
  vipc_copy_frame(buf.data, data, size, size >= STREAMING_FROM);
  return announce(srv, s, buf.idx, frame_id, timestamp_sof, timestamp_eof, valid);
}

int vipc_server_num_clients(vipc_server *srv, uint32_t stream) {
  vipc_stream *s = find_stream(srv, stream);
  if (!s) return -ENOENT;
  return s->pub ? msgq_pub_num_readers(s->pub) : -ENOTSUP;
}

uint64_t vipc_server_id(const vipc_server *srv) { return srv->server_id; }
const char *vipc_server_socket_path(const vipc_server *srv) { return srv->socket_path; }

void vipc_server_get_listener_stats(vipc_server *srv, vipc_listener_stats *out) {
  if (srv->listener) vipc_listener_get_stats(srv->listener, out);
  else memset(out, 0, sizeof *out);
}

int vipc_server_start_listener(vipc_server *srv) {
  if (srv->listener) return 0;
  int r = vipc_socket_path(srv->name, 1, srv->socket_path, sizeof srv->socket_path);
  if (r < 0) {
    srv->socket_path[0] = '\0';
    return r;
  }
  vipc_listener *l;
  r = vipc_listener_start(srv->socket_path, msgq_file_mode(), srv->server_id,
                          srv->handshake_timeout_ns, 256, &l);
  if (r < 0) return r;
  r = vipc_listener_set_uids(l, srv->uids, srv->num_uids, srv->any_uid);
  for (size_t i = 0; i < srv->num_streams && r == 0; i++) {
    vipc_stream *s = &srv->streams[i];
    r = vipc_listener_add_stream(l, s->id, &s->geometry, s->map_size, s->fds, s->num_buffers);
  }
  if (r == 0) r = vipc_listener_run(l); /* only now: no client meets an empty allow list */
  if (r < 0) {
    vipc_listener_stop(l);
    return r;
  }
  srv->listener = l;
  return 0;
}

void vipc_server_close(vipc_server *srv) {
  if (srv == NULL) return;
  /* First: after the listener's thread is joined nothing reads the buffers' fds. */
  vipc_listener_stop(srv->listener);
  for (size_t i = 0; i < srv->num_streams; i++) free_stream(&srv->streams[i]);
  free(srv->streams);
  free(srv->uids);
  pthread_mutex_destroy(&srv->lock);
  free(srv);
}
