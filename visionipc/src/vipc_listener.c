/* The listener of a VisionIPC server (vipc_listener.h; visionipc.h V4-V6): the socket,
 * and one thread running a poll loop that serves one request per connection. */
#define _GNU_SOURCE
#include "vipc_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "msgq.h"
#include "vipc_handshake.h"
#include "vipc_names.h"

#define LISTEN_BACKLOG 1024
#define ACCEPT_BATCH 64
#define MAX_PENDING_LIMIT 4096

typedef struct {
  uint32_t id;
  vipc_geometry geometry;
  uint64_t map_size;
  uint32_t num_fds;
  int fds[VIPC_MAX_BUFFERS];
} export_entry;

typedef struct {
  int fd;
  bool allowed;
  int64_t deadline_ns;
} pending_conn;

struct vipc_listener {
  pthread_mutex_t lock; /* guards uids, exports and stats against the thread */
  bool any_uid;
  uint32_t *uids;
  size_t num_uids;
  export_entry *exports;
  size_t num_exports, cap_exports;
  vipc_listener_stats stats;

  uint64_t server_id;
  int64_t handshake_timeout_ns;
  int max_pending;
  pending_conn *pending; /* oldest first: deadlines in order (thread only) */
  int num_pending;
  struct pollfd *pollfds;

  char path[VIPC_SOCKET_PATH_MAX + 1];
  dev_t dev;
  ino_t ino;
  int listen_fd;
  int wake_fds[2];
  pthread_t thread;
  bool thread_started;
  _Atomic bool running;
  pid_t owner_pid;
};

static void count(vipc_listener *srv, uint64_t *counter) {
  pthread_mutex_lock(&srv->lock);
  (*counter)++;
  pthread_mutex_unlock(&srv->lock);
}

static bool peer_allowed(vipc_listener *srv, int fd) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred)
    return false;
  bool ok = false;
  pthread_mutex_lock(&srv->lock);
  ok = srv->any_uid;
  for (size_t i = 0; i < srv->num_uids && !ok; i++) ok = srv->uids[i] == (uint32_t)cred.uid;
  pthread_mutex_unlock(&srv->lock);
  return ok;
}

/* Sends a reply (and fds) without waiting: a fresh connection's send buffer is empty.
 * 1 when sent, 0 when the peer is gone or the buffer full (counted). */
static int send_reply(vipc_listener *srv, int fd, const uint8_t *data, size_t len,
                      const int *fds, uint32_t num_fds) {
  struct iovec iov = {(void *)data, len};
  struct msghdr msg = {0};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  union {
    char buf[CMSG_SPACE(sizeof(int) * VIPC_MAX_BUFFERS)];
    struct cmsghdr align;
  } control;
  if (num_fds) {
    memset(&control, 0, sizeof control);
    msg.msg_control = control.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * num_fds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * num_fds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * num_fds);
  }
  if (sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)len) return 1;
  count(srv, errno == EPIPE || errno == ECONNRESET ? &srv->stats.disconnects : &srv->stats.errors);
  return 0;
}

static void reply_status(vipc_listener *srv, int fd, uint16_t status) {
  uint8_t out[VIPC_REPLY_HEADER_SIZE];
  vipc_status_reply_encode(srv->server_id, status, out);
  send_reply(srv, fd, out, sizeof out, NULL, 0);
}

/* Reads the connection's request and answers it (then closes the connection): 1, or 0
 * when nothing has arrived yet (the connection stays open). */
static int serve(vipc_listener *srv, int fd, bool allowed) {
  uint8_t req[VIPC_REQUEST_SIZE + 1];
  struct iovec iov = {req, sizeof req};
  struct msghdr msg = {0};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1; /* no room for ancillary data: passed fds are discarded */
  ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (n < 0) {
    count(srv, &srv->stats.errors);
  } else if (n == 0) {
    count(srv, &srv->stats.disconnects);
  } else if (!allowed) {
    count(srv, &srv->stats.refused);
    reply_status(srv, fd, VIPC_STATUS_NOT_ALLOWED);
  } else {
    vipc_request r;
    if ((msg.msg_flags & MSG_TRUNC) || vipc_request_parse(req, (size_t)n, &r, NULL) != 0) {
      count(srv, &srv->stats.bad_requests);
      reply_status(srv, fd, VIPC_STATUS_BAD_REQUEST);
    } else if (r.kind == VIPC_KIND_LIST) {
      static _Thread_local uint8_t out[VIPC_MAX_REPLY_SIZE];
      uint32_t ids[VIPC_MAX_STREAMS];
      pthread_mutex_lock(&srv->lock);
      uint32_t k = 0;
      for (size_t i = 0; i < srv->num_exports && k < VIPC_MAX_STREAMS; i++)
        ids[k++] = srv->exports[i].id;
      pthread_mutex_unlock(&srv->lock);
      size_t len = vipc_list_reply_encode(srv->server_id, ids, k, out);
      if (send_reply(srv, fd, out, len, NULL, 0)) count(srv, &srv->stats.served);
    } else {
      uint8_t out[VIPC_BUFFERS_REPLY_SIZE];
      int fds[VIPC_MAX_BUFFERS];
      uint32_t num_fds = 0;
      size_t len = 0;
      pthread_mutex_lock(&srv->lock);
      for (size_t i = 0; i < srv->num_exports; i++) {
        export_entry *e = &srv->exports[i];
        if (e->id != r.stream) continue;
        num_fds = e->num_fds;
        memcpy(fds, e->fds, num_fds * sizeof fds[0]);
        len = vipc_buffers_reply_encode(srv->server_id, e->id, e->num_fds, &e->geometry,
                                        e->map_size, out);
      }
      pthread_mutex_unlock(&srv->lock);
      /* The fds stay open until their owner stops the listener (joining this thread). */
      if (len == 0) {
        count(srv, &srv->stats.unknown_stream);
        reply_status(srv, fd, VIPC_STATUS_UNKNOWN_STREAM);
      } else if (send_reply(srv, fd, out, len, fds, num_fds)) {
        count(srv, &srv->stats.served);
      }
    }
  }
  close(fd);
  return 1;
}

static void drop_pending(vipc_listener *st, int i) {
  memmove(&st->pending[i], &st->pending[i + 1],
          (size_t)(st->num_pending - i - 1) * sizeof st->pending[0]);
  st->num_pending--;
}

/* Makes room for one more waiting connection: the oldest is answered if its request has
 * arrived meanwhile, else dropped (only silent clients are ever evicted). */
static void make_room(vipc_listener *st) {
  pending_conn oldest = st->pending[0];
  drop_pending(st, 0);
  if (!serve(st, oldest.fd, oldest.allowed)) {
    count(st, &st->stats.evicted);
    close(oldest.fd);
  }
}

static void accept_batch(vipc_listener *st, int listen_fd) {
  vipc_listener *srv = st;
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      /* Out of fds, or a connection that died in the queue. */
      count(srv, &srv->stats.errors);
      if (st->num_pending) {
        make_room(st);
      } else {
        struct timespec pause = {0, 10000000};
        nanosleep(&pause, NULL);
      }
      return;
    }
    bool allowed = peer_allowed(srv, fd);
    /* A client that sent its request along with its connect is answered at once. */
    if (serve(srv, fd, allowed)) continue;
    while (st->num_pending >= st->max_pending) make_room(st);
    st->pending[st->num_pending++] = (pending_conn){fd, allowed,
                                                     msgq_now_ns() + srv->handshake_timeout_ns};
  }
}

static void *listener_main(void *arg) {
  vipc_listener *st = arg;
  vipc_listener *srv = st;
  struct pollfd *fds = st->pollfds;
  for (;;) {
    fds[0] = (struct pollfd){srv->wake_fds[0], POLLIN, 0};
    fds[1] = (struct pollfd){srv->listen_fd, POLLIN, 0};
    for (int i = 0; i < st->num_pending; i++)
      fds[2 + i] = (struct pollfd){st->pending[i].fd, POLLIN, 0};
    int timeout_ms = -1;
    if (st->num_pending) {
      int64_t left = st->pending[0].deadline_ns - msgq_now_ns();
      timeout_ms = left <= 0 ? 0 : (int)((left + 999999) / 1000000);
    }
    int n_polled = st->num_pending;
    int r = poll(fds, (nfds_t)(2 + n_polled), timeout_ms);
    if (r < 0 && errno != EINTR) {
      count(srv, &srv->stats.errors);
      continue;
    }
    if (fds[0].revents) break; /* vipc_listener_stop */
    /* Waiting connections that spoke (or hung up), newest first so indexes stay valid. */
    for (int i = n_polled - 1; i >= 0; i--) {
      if (!fds[2 + i].revents) continue;
      pending_conn c = st->pending[i];
      if (serve(srv, c.fd, c.allowed)) drop_pending(st, i);
    }
    if (fds[1].revents & POLLIN) accept_batch(st, srv->listen_fd);
    /* Deadlines: one last look at each expired connection, then hang up. */
    int64_t now = msgq_now_ns();
    while (st->num_pending && st->pending[0].deadline_ns <= now) {
      pending_conn c = st->pending[0];
      drop_pending(st, 0);
      if (!serve(srv, c.fd, c.allowed)) {
        count(srv, &srv->stats.timeouts);
        close(c.fd);
      }
    }
  }
  for (int i = 0; i < st->num_pending; i++) close(st->pending[i].fd);
  st->num_pending = 0;
  atomic_store(&st->running, false);
  return NULL;
}

static void free_listener(vipc_listener *l) {
  if (l->listen_fd >= 0) close(l->listen_fd);
  for (int i = 0; i < 2; i++)
    if (l->wake_fds[i] >= 0) close(l->wake_fds[i]);
  pthread_mutex_destroy(&l->lock);
  free(l->uids);
  free(l->exports);
  free(l->pending);
  free(l->pollfds);
  free(l);
}

int vipc_listener_start(const char *path, unsigned mode, uint64_t server_id,
                        int64_t handshake_timeout_ns, int max_pending, vipc_listener **out) {
  *out = NULL;
  if (path == NULL || handshake_timeout_ns <= 0 || max_pending < 1 ||
      max_pending > MAX_PENDING_LIMIT)
    return -EINVAL;
  size_t n = strlen(path);
  if (n > VIPC_SOCKET_PATH_MAX) return -ENAMETOOLONG;
  vipc_listener *l = calloc(1, sizeof *l);
  if (!l) return -ENOMEM;
  pthread_mutex_init(&l->lock, NULL);
  l->listen_fd = -1;
  l->wake_fds[0] = l->wake_fds[1] = -1;
  l->server_id = server_id;
  l->handshake_timeout_ns = handshake_timeout_ns;
  l->max_pending = max_pending;
  l->owner_pid = getpid();
  memcpy(l->path, path, n + 1);
  l->pending = calloc((size_t)max_pending, sizeof *l->pending);
  l->pollfds = calloc((size_t)max_pending + 2, sizeof *l->pollfds);
  if (!l->pending || !l->pollfds) {
    free_listener(l);
    return -ENOMEM;
  }
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      free_listener(l);
      return -EEXIST;
    }
    unlink(path); /* a crashed server's socket, or an older server's (V6) */
  }
  int r = 0;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) r = -errno;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  memcpy(addr.sun_path, path, n + 1);
  if (r == 0 && (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
                 chmod(path, (mode_t)mode) != 0 || lstat(path, &st) != 0 ||
                 listen(fd, LISTEN_BACKLOG) != 0))
    r = -errno;
  if (fd >= 0) l->listen_fd = fd;
  if (r == 0) {
    l->dev = st.st_dev;
    l->ino = st.st_ino;
    if (pipe2(l->wake_fds, O_CLOEXEC | O_NONBLOCK) != 0) r = -errno;
  }
  if (r < 0) {
    if (l->dev || l->ino) unlink(path);
    free_listener(l);
    return r;
  }
  *out = l;
  return 0;
}

int vipc_listener_run(vipc_listener *l) {
  if (l->thread_started) return 0;
  atomic_store(&l->running, true);
  int e = pthread_create(&l->thread, NULL, listener_main, l);
  if (e != 0) {
    atomic_store(&l->running, false);
    return -e;
  }
  l->thread_started = true;
  return 0;
}

int vipc_listener_set_uids(vipc_listener *l, const uint32_t *uids, size_t n, int any) {
  uint32_t *copy = NULL;
  if (!any && n) {
    copy = malloc(n * sizeof *copy);
    if (!copy) return -ENOMEM;
    memcpy(copy, uids, n * sizeof *copy);
  }
  pthread_mutex_lock(&l->lock);
  free(l->uids);
  l->uids = copy;
  l->num_uids = any ? 0 : n;
  l->any_uid = any != 0;
  pthread_mutex_unlock(&l->lock);
  return 0;
}

int vipc_listener_add_stream(vipc_listener *l, uint32_t stream, const vipc_geometry *g,
                             uint64_t map_size, const int *fds, uint32_t num_fds) {
  if (num_fds < 1 || num_fds > VIPC_MAX_BUFFERS) return -EINVAL;
  int r = 0;
  pthread_mutex_lock(&l->lock);
  for (size_t i = 0; i < l->num_exports && r == 0; i++)
    if (l->exports[i].id == stream) r = -EEXIST;
  if (r == 0 && l->num_exports == l->cap_exports) {
    size_t cap = l->cap_exports ? l->cap_exports * 2 : 4;
    export_entry *grown = realloc(l->exports, cap * sizeof *grown);
    if (grown) {
      l->exports = grown;
      l->cap_exports = cap;
    } else {
      r = -ENOMEM;
    }
  }
  if (r == 0) {
    export_entry *e = &l->exports[l->num_exports++];
    e->id = stream;
    e->geometry = *g;
    e->map_size = map_size;
    e->num_fds = num_fds;
    memcpy(e->fds, fds, num_fds * sizeof fds[0]);
  }
  pthread_mutex_unlock(&l->lock);
  return r;
}

void vipc_listener_get_stats(vipc_listener *l, vipc_listener_stats *out) {
  pthread_mutex_lock(&l->lock);
  *out = l->stats;
  pthread_mutex_unlock(&l->lock);
}

int vipc_listener_running(vipc_listener *l) {
  return l->owner_pid == getpid() && atomic_load(&l->running);
}

void vipc_listener_stop(vipc_listener *l) {
  if (l == NULL) return;
  if (getpid() != l->owner_pid) {
    /* A forked copy: the thread and the socket file are the parent's. */
    free_listener(l);
    return;
  }
  if (l->thread_started) {
    /* Wake the loop and wait for it: after the join nothing reads the exports. */
    ssize_t ignored = write(l->wake_fds[1], "x", 1);
    (void)ignored;
    pthread_join(l->thread, NULL);
  }
  close(l->listen_fd);
  l->listen_fd = -1;
  struct stat st;
  /* V6: only while the path is still ours (a newer server may have taken it over). */
  if (lstat(l->path, &st) == 0 && st.st_dev == l->dev && st.st_ino == l->ino) unlink(l->path);
  free_listener(l);
}
