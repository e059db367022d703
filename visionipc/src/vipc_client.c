/* VisionIPC client in C (visionipc.h C1-C4): the handshake over the server's Unix
 * socket, the checks of everything received, the read-only mappings, and frames from
 * the packet queue. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "msgq.h"
#include "vipc_buffer.h"
#include "vipc_handshake.h"
#include "vipc_names.h"
#include "vipc_packet.h"
#include "visionipc.h"

#define RETRY_PAUSE_NS 20000000LL     /* connect: pause between tries while nobody answers */
#define REHANDSHAKE_PAUSE_NS 50000000LL /* recv: at most one restart handshake per 50 ms */
#define DROPPED_PAUSE_NS 500000LL       /* a connection closed unanswered: try again after */
#define DEFAULT_HANDSHAKE_TIMEOUT_NS 2000000000LL
#define DEAD_SERVERS_KEPT 16

typedef struct {
  uint64_t server_id;
  uint32_t num_buffers;
  vipc_geometry geometry;
  uint64_t map_size;
  const uint8_t *maps[VIPC_MAX_BUFFERS];
  int fds[VIPC_MAX_BUFFERS]; /* kept open with VIPC_CLIENT_CALLER_RECEIVES, else -1 */
} vipc_mapping;

struct vipc_client {
  char name[VIPC_MAX_NAME_LEN + 1];
  uint32_t stream;
  unsigned flags;
  msgq_sub *packets; /* NULL with VIPC_CLIENT_CALLER_RECEIVES */
  bool connected;
  vipc_mapping m;
  uint64_t generation;
  uint64_t dead[DEAD_SERVERS_KEPT]; /* instances known to be gone (C3) */
  unsigned dead_next;
  int64_t next_handshake_ns;
  int64_t handshake_timeout_ns;
  int last_error;
  const char *last_detail;
  vipc_client_stats stats;
};

static void close_fds(const int *fds, size_t n) {
  for (size_t i = 0; i < n; i++) close(fds[i]);
}

static void unmap_all(vipc_mapping *m) {
  for (uint32_t i = 0; i < m->num_buffers; i++) {
    if (m->maps[i]) munmap((void *)m->maps[i], m->map_size);
    if (m->fds[i] >= 0) close(m->fds[i]);
  }
  memset(m, 0, sizeof *m);
  for (uint32_t i = 0; i < VIPC_MAX_BUFFERS; i++) m->fds[i] = -1;
}

/* C2: the server process runs as our uid, root, or a uid the environment lists. */
static int server_trusted(int fd) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -errno;
  if (cred.uid == geteuid() || cred.uid == 0) return 0;
  bool any;
  uint32_t *uids;
  size_t n;
  int r = vipc_uids_from_env(&any, &uids, &n);
  int ok = r > 0 && any;
  for (size_t i = 0; r > 0 && i < n && !ok; i++) ok = uids[i] == (uint32_t)cred.uid;
  free(uids);
  return ok ? 0 : -EPERM;
}

static int64_t left_ns(int64_t deadline) {
  if (deadline < 0) return -1;
  int64_t left = deadline - msgq_now_ns();
  return left > 0 ? left : 0;
}

/* One exchange: connect, check the server, send the request, read the reply and its fds.
 * Returns the reply's length, -ECONNREFUSED (nobody there yet: worth another try),
 * -ECONNRESET (the server closed the connection unanswered, as when shedding load), or
 * an error. *num_fds fds are the caller's (also on errors after they arrived: closed
 * here). */
static ssize_t exchange(const char *path, uint16_t kind, uint32_t stream, int64_t deadline,
                        uint8_t *reply, int *fds, size_t *num_fds) {
  *num_fds = 0;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
  ssize_t r = 0;
  while (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    if (errno == EAGAIN && left_ns(deadline) != 0) { /* accept queue full */
      struct timespec pause = {0, 500000};
      nanosleep(&pause, NULL);
      continue;
    }
    r = errno == ENOENT || errno == ECONNREFUSED || errno == EAGAIN ? -ECONNREFUSED : -errno;
    break;
  }
  if (r == 0) r = server_trusted(fd);
  if (r == 0) {
    uint8_t req[VIPC_REQUEST_SIZE];
    vipc_request_encode(kind, stream, req);
    /* A refusal may already be waiting, with the connection closed: read on anyway. */
    (void)send(fd, req, sizeof req, MSG_NOSIGNAL);
    int64_t left = left_ns(deadline);
    struct pollfd p = {fd, POLLIN, 0};
    int ready = poll(&p, 1, left < 0 ? -1 : (int)((left + 999999) / 1000000));
    if (ready < 0) r = -errno;
    else if (ready == 0) r = -ETIMEDOUT;
  }
  if (r == 0) {
    union {
      char buf[CMSG_SPACE(sizeof(int) * VIPC_MAX_BUFFERS)];
      struct cmsghdr align;
    } control;
    struct iovec iov = {reply, VIPC_MAX_REPLY_SIZE + 1};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r < 0) r = -errno;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); r >= 0 && c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      if (k > VIPC_MAX_BUFFERS - *num_fds) k = VIPC_MAX_BUFFERS - *num_fds;
      memcpy(fds + *num_fds, CMSG_DATA(c), k * sizeof(int));
      *num_fds += k;
    }
    if (r == 0) r = -ECONNRESET; /* closed without answering (shedding load) */
    else if (r > 0 && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) r = VIPC_EPROTOCOL;
  }
  close(fd);
  if (r < 0) {
    close_fds(fds, *num_fds);
    *num_fds = 0;
  }
  return r;
}

/* C2: each fd is a regular file of at least map_size bytes sealed against shrinking;
 * then all are mapped read-only. The fds are closed (mappings keep the memory) unless
 * keep_fds, and on failure. */
static int import_buffers(const vipc_reply *reply, const int *fds, bool keep_fds,
                          vipc_mapping *out) {
  int r = 0;
  memset(out, 0, sizeof *out);
  for (uint32_t i = 0; i < VIPC_MAX_BUFFERS; i++) out->fds[i] = -1;
  out->map_size = reply->map_size;
  for (uint32_t i = 0; i < reply->num_buffers && r == 0; i++) {
    if (vipc_buffer_check(fds[i], reply->map_size, NULL) != 0) {
      r = VIPC_EPROTOCOL;
      break;
    }
    void *m = mmap(NULL, reply->map_size, PROT_READ, MAP_SHARED | MAP_POPULATE, fds[i], 0);
    if (m == MAP_FAILED) {
      r = -errno;
      break;
    }
    out->maps[i] = m;
    out->num_buffers = i + 1;
  }
  if (r < 0 || !keep_fds) close_fds(fds, reply->num_buffers);
  if (r < 0) {
    unmap_all(out);
    return r;
  }
  if (keep_fds) memcpy(out->fds, fds, reply->num_buffers * sizeof *fds);
  out->server_id = reply->server_id;
  out->num_buffers = reply->num_buffers;
  out->geometry = reply->geometry;
  return 0;
}

/* An exchange, tried again while the server closes the connection unanswered and time
 * is left (then -ECONNREFUSED). */
static ssize_t exchange_until(const char *path, uint16_t kind, uint32_t stream,
                              int64_t deadline, uint8_t *reply, int *fds, size_t *num_fds) {
  for (;;) {
    ssize_t n = exchange(path, kind, stream, deadline, reply, fds, num_fds);
    if (n != -ECONNRESET) return n;
    if (left_ns(deadline) == 0) return -ECONNREFUSED;
    struct timespec pause = {0, DROPPED_PAUSE_NS};
    nanosleep(&pause, NULL);
  }
}

/* One handshake for the client's stream; on success *m holds the new mappings. A reply
 * that breaks the protocol leaves its reason in *why. */
static int handshake(vipc_client *c, int64_t deadline, vipc_mapping *m, const char **why) {
  char path[VIPC_SOCKET_PATH_MAX + 1];
  int r = vipc_socket_path(c->name, 0, path, sizeof path);
  if (r < 0) return r;
  static _Thread_local uint8_t reply[VIPC_MAX_REPLY_SIZE + 1];
  int fds[VIPC_MAX_BUFFERS];
  size_t num_fds;
  ssize_t n =
      exchange_until(path, VIPC_KIND_BUFFERS, c->stream, deadline, reply, fds, &num_fds);
  if (n < 0) return (int)n;
  vipc_reply parsed;
  uint32_t unused[1];
  r = vipc_reply_parse(reply, (size_t)n, num_fds, VIPC_KIND_BUFFERS, c->stream,
                       (uint64_t)sysconf(_SC_PAGESIZE), &parsed, unused, why);
  if (r < 0) {
    close_fds(fds, num_fds);
    return r;
  }
  r = import_buffers(&parsed, fds, (c->flags & VIPC_CLIENT_CALLER_RECEIVES) != 0, m);
  if (r == VIPC_EPROTOCOL) *why = "sent a buffer that is not a sealed memfd of the reply's size";
  return r;
}

/* Replaces the mapped buffers by m. */
static void adopt(vipc_client *c, vipc_mapping *m) {
  unmap_all(&c->m);
  c->m = *m;
  c->connected = true;
  c->generation++;
}

int vipc_client_open_flags(const char *name, uint32_t stream, unsigned flags,
                           vipc_client **out) {
  if (out == NULL || vipc_validate_name(name) < 0) return -EINVAL;
  *out = NULL;
  vipc_client *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  strcpy(c->name, name);
  c->stream = stream;
  c->flags = flags;
  c->handshake_timeout_ns = DEFAULT_HANDSHAKE_TIMEOUT_NS;
  for (uint32_t i = 0; i < VIPC_MAX_BUFFERS; i++) c->m.fds[i] = -1;
  int r = 0;
  if (!(flags & VIPC_CLIENT_CALLER_RECEIVES)) {
    char endpoint[MSGQ_ENDPOINT_NAME_MAX + 2];
    unsigned sub_flags = flags & VIPC_CLIENT_CONFLATE ? MSGQ_OPEN_CONFLATE : 0;
    r = vipc_endpoint_name(name, stream, endpoint, sizeof endpoint);
    while (r == 0 && (r = msgq_sub_open(endpoint, VIPC_PACKET_SEGMENT_SIZE, sub_flags,
                                        &c->packets)) == -EAGAIN) {
    }
  }
  if (r < 0) {
    free(c);
    return r;
  }
  *out = c;
  return 0;
}

int vipc_client_open(const char *name, uint32_t stream, int conflate, vipc_client **out) {
  return vipc_client_open_flags(name, stream, conflate ? VIPC_CLIENT_CONFLATE : 0, out);
}

void vipc_client_set_handshake_timeout(vipc_client *c, int64_t timeout_ns) {
  if (timeout_ns > 0) c->handshake_timeout_ns = timeout_ns;
}

int vipc_client_handshake(vipc_client *c, int64_t timeout_ns) {
  int64_t deadline = timeout_ns < 0 ? -1 : msgq_now_ns() + timeout_ns;
  vipc_mapping m;
  const char *why = NULL;
  int r = handshake(c, deadline, &m, &why);
  c->last_error = r;
  c->last_detail = why;
  if (r == 0) adopt(c, &m);
  return r;
}

int vipc_client_connect(vipc_client *c, int64_t timeout_ns) {
  int64_t deadline = timeout_ns < 0 ? -1 : msgq_now_ns() + timeout_ns;
  for (;;) {
    int r = vipc_client_handshake(c, left_ns(deadline));
    if (r == 0) return 0;
    if (r != -ECONNREFUSED && r != VIPC_EUNKNOWNSTREAM) return r;
    int64_t left = left_ns(deadline);
    if (left == 0) return -ETIMEDOUT;
    int64_t pause_ns = left < 0 || left > RETRY_PAUSE_NS ? RETRY_PAUSE_NS : left;
    struct timespec pause = {0, (long)pause_ns};
    if (nanosleep(&pause, NULL) != 0 && errno == EINTR) return -EINTR;
  }
}

static void remember_dead(vipc_client *c, uint64_t server_id) {
  c->dead[c->dead_next] = server_id;
  c->dead_next = (c->dead_next + 1) % DEAD_SERVERS_KEPT;
}

/* C3: a packet of another server instance; timeout_ns bounds the handshake (< 0: the
 * handshake timeout). 1 when the client now follows it. */
static int follow_restart(vipc_client *c, uint64_t server_id, int64_t timeout_ns) {
  for (unsigned i = 0; i < DEAD_SERVERS_KEPT; i++)
    if (c->dead[i] == server_id) return 0;
  int64_t now = msgq_now_ns();
  if (now < c->next_handshake_ns) return 0;
  int64_t timeout = c->handshake_timeout_ns;
  if (timeout_ns >= 0 && timeout_ns < timeout)
    timeout = timeout_ns > REHANDSHAKE_PAUSE_NS ? timeout_ns : REHANDSHAKE_PAUSE_NS;
  vipc_mapping m;
  const char *why = NULL;
  int r = handshake(c, now + timeout, &m, &why);
  if (r != 0) {
    c->last_error = r;
    c->last_detail = why;
    c->next_handshake_ns = msgq_now_ns() + REHANDSHAKE_PAUSE_NS;
    return 0;
  }
  if (m.server_id != server_id) { /* an instance older than the one answering */
    remember_dead(c, server_id);
    uint64_t answering = m.server_id;
    if (answering != c->m.server_id) { /* the one answering is new too: follow it */
      remember_dead(c, c->m.server_id);
      adopt(c, &m);
      c->stats.reconnects++;
    } else {
      unmap_all(&m);
    }
    return 0;
  }
  remember_dead(c, c->m.server_id);
  adopt(c, &m);
  c->stats.reconnects++;
  return 1;
}

/* C3, C4: the frame a packet announces, into *out: 1, or 0 when skipped (counted). */
static int take(vipc_client *c, const void *bytes, size_t size, int64_t timeout_ns,
                vipc_frame *out) {
  vipc_frame_packet p;
  if (vipc_packet_parse(bytes, size, &p) != 0) {
    c->stats.bad_packets++;
    return 0;
  }
  if (p.server_id != c->m.server_id && !follow_restart(c, p.server_id, timeout_ns)) {
    c->stats.stale_packets++;
    return 0;
  }
  if (p.buffer_index >= c->m.num_buffers) {
    c->stats.bad_packets++;
    return 0;
  }
  const vipc_geometry *g = &c->m.geometry;
  const uint8_t *data = c->m.maps[p.buffer_index];
  const _Atomic uint64_t *trailer =
      (const _Atomic uint64_t *)(data + vipc_trailer_offset(g));
  uint64_t held = atomic_load_explicit(&trailer[1], memory_order_acquire);
  if (held != p.sequence) {
    if (held != 0 && held < p.sequence) { /* a frame the buffer never held */
      c->stats.bad_packets++;
      return 0;
    }
    if (c->flags & VIPC_CLIENT_SKIP_RECYCLED) {
      c->stats.skipped_frames++;
      return 0;
    }
    c->stats.recycled_frames++;
  }
  out->data = data;
  out->size = g->size;
  out->idx = p.buffer_index;
  out->frame_id = p.frame_id;
  out->sequence = p.sequence;
  out->timestamp_sof = p.timestamp_sof;
  out->timestamp_eof = p.timestamp_eof;
  out->valid = p.valid;
  out->width = g->width;
  out->height = g->height;
  out->stride = g->stride;
  out->uv_offset = g->uv_offset;
  return 1;
}

int vipc_client_take_packet(vipc_client *c, const void *data, size_t len, int64_t timeout_ns,
                            vipc_frame *out) {
  if (!c->connected) return -ENOTCONN;
  return take(c, data, len, timeout_ns, out);
}

int vipc_client_recv(vipc_client *c, vipc_frame *out, int64_t timeout_ns) {
  if (c->packets == NULL) return -ENOTSUP;
  if (!c->connected) return -ENOTCONN;
  int64_t deadline = timeout_ns < 0 ? -1 : msgq_now_ns() + timeout_ns;
  for (;;) {
    uint8_t bytes[VIPC_PACKET_SIZE + 8];
    size_t size;
    int r = msgq_sub_recv(c->packets, bytes, sizeof bytes, &size, left_ns(deadline));
    if (r == MSGQ_EBUFFER) { /* not a packet: too long; take it out of the way */
      void *junk;
      if (msgq_sub_recv_alloc(c->packets, &junk, &size, 0) == 1) free(junk);
      c->stats.bad_packets++;
      continue;
    }
    if (r <= 0) return r;
    if (take(c, bytes, size, left_ns(deadline), out) == 1) return 1;
  }
}

int vipc_client_frame_current(const vipc_client *c, const vipc_frame *f) {
  if (f->idx >= c->m.num_buffers || f->data != c->m.maps[f->idx]) return 0;
  /* acquire: the reads of the frame before this load of the trailer's sequence. */
  atomic_thread_fence(memory_order_acquire);
  const _Atomic uint64_t *trailer =
      (const _Atomic uint64_t *)(f->data + vipc_trailer_offset(&c->m.geometry));
  return atomic_load_explicit(&trailer[1], memory_order_acquire) == f->sequence;
}

vipc_geometry vipc_client_geometry(const vipc_client *c) { return c->m.geometry; }
uint32_t vipc_client_num_buffers(const vipc_client *c) { return c->m.num_buffers; }
void vipc_client_get_stats(const vipc_client *c, vipc_client_stats *out) { *out = c->stats; }

int vipc_client_buffer_fd(const vipc_client *c, uint32_t idx) {
  return idx < c->m.num_buffers ? c->m.fds[idx] : -1;
}

uint64_t vipc_client_server_id(const vipc_client *c) { return c->m.server_id; }
uint64_t vipc_client_generation(const vipc_client *c) { return c->generation; }

int vipc_client_last_error(const vipc_client *c, const char **detail) {
  if (detail) *detail = c->last_detail;
  return c->last_error;
}

void vipc_client_close(vipc_client *c) {
  if (c == NULL) return;
  unmap_all(&c->m);
  if (c->packets) msgq_sub_close(c->packets);
  free(c);
}

int vipc_available_streams(const char *name, uint32_t *streams, size_t cap,
                           int64_t timeout_ns) {
  char path[VIPC_SOCKET_PATH_MAX + 1];
  int r = vipc_socket_path(name, 0, path, sizeof path);
  if (r < 0) return r;
  static _Thread_local uint8_t reply[VIPC_MAX_REPLY_SIZE + 1];
  static _Thread_local uint32_t ids[VIPC_MAX_STREAMS];
  int fds[VIPC_MAX_BUFFERS];
  size_t num_fds;
  int64_t deadline = timeout_ns < 0 ? -1 : msgq_now_ns() + timeout_ns;
  ssize_t n = exchange_until(path, VIPC_KIND_LIST, 0, deadline, reply, fds, &num_fds);
  if (n < 0) return (int)n;
  vipc_reply parsed;
  r = vipc_reply_parse(reply, (size_t)n, num_fds, VIPC_KIND_LIST, 0,
                       (uint64_t)sysconf(_SC_PAGESIZE), &parsed, ids, NULL);
  close_fds(fds, num_fds);
  if (r < 0) return r;
  for (uint32_t i = 0; i < parsed.count && i < cap; i++) streams[i] = ids[i];
  return (int)parsed.count;
}
