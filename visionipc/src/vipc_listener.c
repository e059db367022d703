/* The listener of a VisionIPC server (visionipc.h V4-V6): the socket, and one thread
 * running a poll loop that serves one request per connection. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "queue_file.h"
#include "vipc_names.h"
#include "vipc_handshake.h"
#include "vipc_server_internal.h"

#define LISTEN_BACKLOG 1024
#define MAX_PENDING 256
#define ACCEPT_BATCH 64

typedef struct {
  int fd;
  bool allowed;
  int64_t deadline_ns;
} pending_conn;

typedef struct {
  vipc_server *srv;
  pending_conn pending[MAX_PENDING]; /* oldest first: deadlines in order */
  int num_pending;
} loop_state;

static void count(vipc_server *srv, uint64_t *counter) {
  pthread_mutex_lock(&srv->lock);
  (*counter)++;
  pthread_mutex_unlock(&srv->lock);
}

static bool peer_allowed(vipc_server *srv, int fd) {
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
static int send_reply(vipc_server *srv, int fd, const uint8_t *data, size_t len,
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

static void reply_status(vipc_server *srv, int fd, uint16_t status) {
  uint8_t out[VIPC_REPLY_HEADER_SIZE];
  vipc_status_reply_encode(srv->server_id, status, out);
  send_reply(srv, fd, out, sizeof out, NULL, 0);
}

/* Reads the connection's request and answers it (then closes the connection): 1, or 0
 * when nothing has arrived yet (the connection stays open). */
static int serve(vipc_server *srv, int fd, bool allowed) {
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
      for (size_t i = 0; i < srv->num_streams && k < VIPC_MAX_STREAMS; i++)
        ids[k++] = srv->streams[i].id;
      pthread_mutex_unlock(&srv->lock);
      size_t len = vipc_list_reply_encode(srv->server_id, ids, k, out);
      if (send_reply(srv, fd, out, len, NULL, 0)) count(srv, &srv->stats.served);
    } else {
      uint8_t out[VIPC_BUFFERS_REPLY_SIZE];
      int fds[VIPC_MAX_BUFFERS];
      uint32_t num_fds = 0;
      size_t len = 0;
      pthread_mutex_lock(&srv->lock);
      for (size_t i = 0; i < srv->num_streams; i++) {
        vipc_stream *s = &srv->streams[i];
        if (s->id != r.stream) continue;
        num_fds = s->num_buffers;
        memcpy(fds, s->fds, num_fds * sizeof fds[0]);
        len = vipc_buffers_reply_encode(srv->server_id, s->id, s->num_buffers, &s->geometry,
                                        s->map_size, out);
      }
      pthread_mutex_unlock(&srv->lock);
      /* The fds stay open until vipc_server_close, which joins this thread first. */
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

static void drop_pending(loop_state *st, int i) {
  memmove(&st->pending[i], &st->pending[i + 1],
          (size_t)(st->num_pending - i - 1) * sizeof st->pending[0]);
  st->num_pending--;
}

/* Makes room for one more waiting connection: the oldest is answered if its request has
 * arrived meanwhile, else dropped (only silent clients are ever evicted). */
static void make_room(loop_state *st) {
  pending_conn oldest = st->pending[0];
  drop_pending(st, 0);
  if (!serve(st->srv, oldest.fd, oldest.allowed)) {
    count(st->srv, &st->srv->stats.evicted);
    close(oldest.fd);
  }
}

static void accept_batch(loop_state *st, int listen_fd) {
  vipc_server *srv = st->srv;
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
    while (st->num_pending >= MAX_PENDING) make_room(st);
    st->pending[st->num_pending++] = (pending_conn){fd, allowed,
                                                     msgq_now_ns() + srv->handshake_timeout_ns};
  }
}

void *vipc_listener_main(void *arg) {
  loop_state *st = calloc(1, sizeof *st);
  vipc_server *srv = arg;
  if (!st) return NULL;
  st->srv = srv;
  struct pollfd fds[MAX_PENDING + 2];
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
    if (fds[0].revents) break; /* vipc_server_close */
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
  free(st);
  return NULL;
}

int vipc_server_start_listener(vipc_server *srv) {
  if (srv->listening) return 0;
  int r = vipc_socket_path(srv->name, 1, srv->socket_path, sizeof srv->socket_path);
  if (r < 0) {
    srv->socket_path[0] = '\0';
    return r;
  }
  size_t n = strlen(srv->socket_path);
  struct stat st;
  if (lstat(srv->socket_path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return -EEXIST;
    unlink(srv->socket_path); /* a crashed server's socket, or an older server's (V6) */
  }
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  memcpy(addr.sun_path, srv->socket_path, n + 1);
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
      chmod(srv->socket_path, msgq_queue_file_mode()) != 0 ||
      lstat(srv->socket_path, &st) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
    r = -errno;
    close(fd);
    return r;
  }
  srv->socket_dev = st.st_dev;
  srv->socket_ino = st.st_ino;
  if (pipe2(srv->wake_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    r = -errno;
    close(fd);
    unlink(srv->socket_path);
    return r;
  }
  srv->listen_fd = fd;
  r = pthread_create(&srv->thread, NULL, vipc_listener_main, srv);
  if (r != 0) return -r; /* close() cleans up the socket */
  srv->listening = true;
  return 0;
}
