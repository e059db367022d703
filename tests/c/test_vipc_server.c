/* C unit tests of the VisionIPC server (visionipc.h) with a client written here from the
 * wire format: buffers and their seals, the handshake (list, buffers with fds, unknown
 * stream, bad and refused requests, silent clients timing out), frames through the
 * packet queue and the trailer, and the socket takeover rule. Queues and sockets live in
 * a private MSGQ_SHM_DIR. Prints "N passed, N failed"; exits non-zero on any failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "msgq.h"
#include "vipc_handshake.h"
#include "vipc_packet.h"
#include "visionipc.h"

#include "check.h"

static int connect_to(const char *path) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends `len` bytes as one message and reads the reply (up to 2 s) with its fds. */
static ssize_t exchange(const char *path, const void *req, size_t len, uint8_t *reply,
                        size_t cap, int *fds, size_t *num_fds) {
  *num_fds = 0;
  int fd = connect_to(path);
  if (fd < 0) return -1;
  if (len && send(fd, req, len, MSG_NOSIGNAL) != (ssize_t)len) {
    close(fd);
    return -1;
  }
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, 2000) != 1) {
    close(fd);
    return -1;
  }
  union {
    char buf[CMSG_SPACE(sizeof(int) * VIPC_MAX_BUFFERS)];
    struct cmsghdr align;
  } control;
  struct iovec iov = {reply, cap};
  struct msghdr msg = {0};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.buf;
  msg.msg_controllen = sizeof control.buf;
  ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      memcpy(fds + *num_fds, CMSG_DATA(c), k * sizeof(int));
      *num_fds += k;
    }
  close(fd);
  return n;
}

static void close_all(int *fds, size_t n) {
  for (size_t i = 0; i < n; i++) close(fds[i]);
}

static void test_buffers_handshake_and_frames(void) {
  vipc_server *srv;
  CHECK(vipc_server_open("unit", &srv) == 0);
  if (!srv) return;
  CHECK(vipc_server_create_buffers(srv, 7, 3, 64, 48) == 0);
  CHECK(vipc_server_create_buffers(srv, 7, 3, 64, 48) == -EEXIST);
  CHECK(vipc_server_create_buffers(srv, 8, 0, 64, 48) == -EINVAL);
  CHECK(vipc_server_create_buffers(srv, 8, 2, 0, 48) == VIPC_EGEOMETRY);
  CHECK(vipc_server_start_listener(srv) == 0);
  CHECK(vipc_server_start_listener(srv) == 0); /* idempotent */
  const char *path = vipc_server_socket_path(srv);
  CHECK(strstr(path, "visionipc_unit.sock") != NULL);

  /* The client subscribes to the packets before its handshake. */
  msgq_sub *packets;
  CHECK(msgq_sub_open("visionipc_unit_7", 0, 0, &packets) == 0);
  CHECK(vipc_server_num_clients(srv, 7) == 1);

  uint8_t req[VIPC_REQUEST_SIZE], reply[VIPC_MAX_REPLY_SIZE];
  int fds[VIPC_MAX_BUFFERS];
  size_t num_fds;
  uint32_t ids[VIPC_MAX_STREAMS];
  vipc_reply r;
  const long page = sysconf(_SC_PAGESIZE);

  vipc_request_encode(VIPC_KIND_LIST, 0, req);
  ssize_t n = exchange(path, req, sizeof req, reply, sizeof reply, fds, &num_fds);
  CHECK(vipc_reply_parse(reply, (size_t)n, num_fds, VIPC_KIND_LIST, 0, (uint64_t)page, &r,
                         ids, NULL) == 0);
  CHECK(r.count == 1 && ids[0] == 7 && r.server_id == vipc_server_id(srv));

  vipc_request_encode(VIPC_KIND_BUFFERS, 7, req);
  n = exchange(path, req, sizeof req, reply, sizeof reply, fds, &num_fds);
  CHECK(vipc_reply_parse(reply, (size_t)n, num_fds, VIPC_KIND_BUFFERS, 7, (uint64_t)page, &r,
                         ids, NULL) == 0);
  CHECK(r.num_buffers == 3 && num_fds == 3 && r.geometry.width == 64);
  const uint8_t *maps[3] = {0};
  for (size_t i = 0; i < num_fds && i < 3; i++) {
    CHECK((fcntl(fds[i], F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
          (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    struct stat st;
    CHECK(fstat(fds[i], &st) == 0 && (uint64_t)st.st_size == r.map_size);
    void *m = mmap(NULL, r.map_size, PROT_READ, MAP_SHARED, fds[i], 0);
    CHECK(m != MAP_FAILED);
    maps[i] = m == MAP_FAILED ? NULL : m;
  }

  /* A zero-copy frame and a copied one; the packet names the buffer, the trailer the
   * frame it holds. */
  vipc_buffer buf;
  CHECK(vipc_server_get_buffer(srv, 7, &buf) == 0 && buf.idx == 0 && buf.size == 64 * 48 * 3 / 2);
  memset(buf.data, 0x5a, buf.size);
  CHECK(vipc_server_send(srv, 7, buf.idx, 11, 100, 200, 1) == 0);
  uint8_t frame[64 * 48 * 3 / 2];
  memset(frame, 0x33, sizeof frame);
  CHECK(vipc_server_send_copy(srv, 7, frame, sizeof frame - 1, 12, 0, 0, 1) == -EINVAL);
  CHECK(vipc_server_send_copy(srv, 7, frame, sizeof frame, 12, 101, 201, 0) == 0);
  CHECK(vipc_server_send(srv, 7, 3, 0, 0, 0, 1) == -EINVAL);
  CHECK(vipc_server_send(srv, 9, 0, 0, 0, 0, 1) == -ENOENT);
  for (uint32_t k = 0; k < 2; k++) {
    uint8_t bytes[64];
    size_t size;
    vipc_frame_packet p;
    CHECK(msgq_sub_recv(packets, bytes, sizeof bytes, &size, 1000000000) == 1);
    CHECK(vipc_packet_parse(bytes, size, &p) == 0);
    CHECK(p.server_id == vipc_server_id(srv) && p.sequence == k + 1 && p.buffer_index == k);
    CHECK(p.frame_id == 11 + k && p.timestamp_sof == 100 + k && p.valid == (k == 0));
    const uint8_t *m = maps[k];
    if (!m) continue;
    CHECK(m[0] == (k ? 0x33 : 0x5a) && m[buf.size - 1] == (k ? 0x33 : 0x5a));
    uint64_t trailer[2];
    memcpy(trailer, m + vipc_trailer_offset(&r.geometry), sizeof trailer);
    CHECK(trailer[0] == 11 + k && trailer[1] == k + 1);
  }
  /* get_buffer marks the buffer being refilled before the caller writes into it. */
  CHECK(vipc_server_get_buffer(srv, 7, &buf) == 0 && buf.idx == 2);
  CHECK(vipc_server_get_buffer(srv, 7, &buf) == 0 && buf.idx == 0);
  if (maps[0]) {
    uint64_t trailer[2];
    memcpy(trailer, maps[0] + vipc_trailer_offset(&r.geometry), sizeof trailer);
    CHECK(trailer[0] == VIPC_FRAME_ID_WRITING && trailer[1] == 0);
  }
  for (size_t i = 0; i < 3; i++)
    if (maps[i]) munmap((void *)maps[i], r.map_size);
  close_all(fds, num_fds);

  vipc_request_encode(VIPC_KIND_BUFFERS, 8, req);
  n = exchange(path, req, sizeof req, reply, sizeof reply, fds, &num_fds);
  CHECK(vipc_reply_parse(reply, (size_t)n, num_fds, VIPC_KIND_BUFFERS, 8, (uint64_t)page, &r,
                         ids, NULL) == VIPC_EUNKNOWNSTREAM);
  vipc_listener_stats stats;
  vipc_server_get_listener_stats(srv, &stats);
  CHECK(stats.served == 2 && stats.unknown_stream == 1);
  msgq_sub_close(packets);
  vipc_server_close(srv);
  CHECK(access(path, F_OK) != 0); /* the socket is gone */
}

static void test_hostile_clients(void) {
  vipc_server *srv;
  CHECK(vipc_server_open("hostile", &srv) == 0);
  if (!srv) return;
  vipc_server_set_handshake_timeout(srv, 50000000); /* 50 ms */
  CHECK(vipc_server_create_buffers(srv, 0, 2, 16, 16) == 0);
  CHECK(vipc_server_start_listener(srv) == 0);
  const char *path = vipc_server_socket_path(srv);
  uint8_t reply[VIPC_MAX_REPLY_SIZE];
  int fds[VIPC_MAX_BUFFERS];
  size_t num_fds;
  /* Garbage, a request one byte too long, a list request with a stream: bad request. */
  uint8_t junk[17] = "VIPQ\x01\x00\x02\x00";
  const size_t lengths[] = {3, 17, 16};
  for (size_t i = 0; i < 3; i++) {
    if (i == 2) {
      vipc_request_encode(VIPC_KIND_LIST, 0, junk);
      junk[8] = 5;
    }
    ssize_t n = exchange(path, junk, lengths[i], reply, sizeof reply, fds, &num_fds);
    CHECK(n == VIPC_REPLY_HEADER_SIZE && reply[6] == VIPC_STATUS_BAD_REQUEST && num_fds == 0);
  }
  /* A silent client is hung up on after the handshake timeout. */
  int silent = connect_to(path);
  CHECK(silent >= 0);
  if (silent >= 0) {
    struct pollfd p = {silent, POLLIN, 0};
    CHECK(poll(&p, 1, 2000) == 1);
    char byte;
    CHECK(recv(silent, &byte, 1, 0) == 0);
    close(silent);
  }
  /* A peer whose uid is not served gets "not allowed" and no fds. */
  uint32_t other = (uint32_t)geteuid() + 1;
  CHECK(vipc_server_allow_uids(srv, &other, 1, 0) == 0);
  uint8_t req[VIPC_REQUEST_SIZE];
  vipc_request_encode(VIPC_KIND_BUFFERS, 0, req);
  ssize_t n = exchange(path, req, sizeof req, reply, sizeof reply, fds, &num_fds);
  CHECK(n == VIPC_REPLY_HEADER_SIZE && reply[6] == VIPC_STATUS_NOT_ALLOWED && num_fds == 0);
  close_all(fds, num_fds);
  vipc_listener_stats stats;
  vipc_server_get_listener_stats(srv, &stats);
  CHECK(stats.bad_requests == 3 && stats.timeouts == 1 && stats.refused == 1 &&
        stats.served == 0);
  vipc_server_close(srv);
}

static void test_c_client(void) {
  vipc_server *srv;
  CHECK(vipc_server_open("cclient", &srv) == 0);
  if (!srv) return;
  CHECK(vipc_server_create_buffers(srv, 2, 4, 32, 16) == 0);
  vipc_client *c;
  CHECK(vipc_client_open("cclient", 2, 0, &c) == 0);
  if (!c) return;
  vipc_frame f;
  CHECK(vipc_client_recv(c, &f, 0) == -ENOTCONN);
  CHECK(vipc_client_connect(c, 30000000) == -ETIMEDOUT); /* no listener yet */
  CHECK(vipc_server_start_listener(srv) == 0);
  uint32_t ids[4];
  CHECK(vipc_available_streams("cclient", ids, 4, 1000000000) == 1 && ids[0] == 2);
  CHECK(vipc_client_connect(c, 2000000000) == 0);
  CHECK(vipc_client_num_buffers(c) == 4 && vipc_client_geometry(c).width == 32);
  uint8_t frame[32 * 16 * 3 / 2];
  for (uint32_t i = 0; i < 3; i++) {
    memset(frame, (int)(i + 1), sizeof frame);
    CHECK(vipc_server_send_copy(srv, 2, frame, sizeof frame, 40 + i, i, i, 1) == 0);
  }
  for (uint32_t i = 0; i < 3; i++) {
    CHECK(vipc_client_recv(c, &f, 1000000000) == 1);
    CHECK(f.frame_id == 40 + i && f.size == sizeof frame && f.data[0] == i + 1 &&
          f.data[f.size - 1] == i + 1);
    CHECK(vipc_client_frame_current(c, &f) == 1);
  }
  /* Four more frames recycle every buffer: the first frame's buffer holds another. */
  vipc_frame first = f;
  for (uint32_t i = 0; i < 4; i++) CHECK(vipc_server_send_copy(srv, 2, frame, sizeof frame, 0, 0, 0, 1) == 0);
  CHECK(vipc_client_frame_current(c, &first) == 0);
  for (uint32_t i = 0; i < 4; i++) CHECK(vipc_client_recv(c, &f, 1000000000) == 1);
  CHECK(vipc_client_recv(c, &f, 0) == 0);

  /* A rogue packet on the queue is skipped and counted. */
  msgq_pub *rogue;
  CHECK(msgq_pub_open("visionipc_cclient_2", 0, 0, &rogue) == 0);
  if (rogue) {
    CHECK(msgq_pub_send(rogue, "not a packet", 12) == 0);
    CHECK(vipc_client_recv(c, &f, 0) == 0);
    msgq_pub_close(rogue);
  }
  vipc_client_stats stats;
  vipc_client_get_stats(c, &stats);
  CHECK(stats.bad_packets == 1);

  /* The server restarts (new instance, new buffers): the client follows. */
  uint64_t old_id = vipc_server_id(srv);
  vipc_server_close(srv);
  CHECK(vipc_server_open("cclient", &srv) == 0);
  if (!srv) return;
  CHECK(vipc_server_id(srv) != old_id);
  CHECK(vipc_server_create_buffers(srv, 2, 2, 32, 16) == 0);
  CHECK(vipc_server_start_listener(srv) == 0);
  memset(frame, 0x77, sizeof frame);
  CHECK(vipc_server_send_copy(srv, 2, frame, sizeof frame, 99, 0, 0, 1) == 0);
  CHECK(vipc_client_recv(c, &f, 1000000000) == 1);
  CHECK(f.frame_id == 99 && f.data[0] == 0x77 && vipc_client_num_buffers(c) == 2);
  vipc_client_get_stats(c, &stats);
  CHECK(stats.reconnects == 1);
  vipc_client_close(c);
  vipc_server_close(srv);
}

static void test_names_and_takeover(void) {
  vipc_server *srv = (vipc_server *)1;
  CHECK(vipc_server_open("", &srv) == -EINVAL && srv == NULL);
  CHECK(vipc_server_open("a/b", &srv) == -EINVAL);
  char long_name[81];
  memset(long_name, 'n', 80);
  long_name[80] = '\0';
  CHECK(vipc_server_open(long_name, &srv) == -EINVAL);
  setenv("MSGQ_VISIONIPC_ALLOW_UIDS", "1000, x", 1);
  CHECK(vipc_server_open("env", &srv) == -EINVAL);
  setenv("MSGQ_VISIONIPC_ALLOW_UIDS", " 1000 , 1001 ", 1);
  CHECK(vipc_server_open("env", &srv) == 0);
  vipc_server_close(srv);
  unsetenv("MSGQ_VISIONIPC_ALLOW_UIDS");

  vipc_server *old, *young;
  CHECK(vipc_server_open("takeover", &old) == 0 && vipc_server_open("takeover", &young) == 0);
  if (!old || !young) return;
  CHECK(vipc_server_start_listener(old) == 0);
  CHECK(vipc_server_start_listener(young) == 0); /* takes the path over */
  vipc_server_close(old);                        /* must not remove young's socket */
  CHECK(access(vipc_server_socket_path(young), F_OK) == 0);
  uint8_t req[VIPC_REQUEST_SIZE], reply[VIPC_MAX_REPLY_SIZE];
  int fds[VIPC_MAX_BUFFERS];
  size_t num_fds;
  vipc_request_encode(VIPC_KIND_LIST, 0, req);
  ssize_t n = exchange(vipc_server_socket_path(young), req, sizeof req, reply, sizeof reply,
                       fds, &num_fds);
  CHECK(n == VIPC_REPLY_HEADER_SIZE + 4 && reply[6] == VIPC_STATUS_OK);
  vipc_server_close(young);
}

/* The bindings' mode: the caller publishes and receives the packets (any transport);
 * the library still keeps buffers, trailers, sequences, checks and counters. */
static void test_caller_transport(void) {
  vipc_server *srv;
  CHECK(vipc_server_open_flags("ccaller", VIPC_SERVER_CALLER_PUBLISHES, &srv) == 0);
  if (!srv) return;
  CHECK(vipc_server_create_buffers(srv, 0, 2, 16, 8) == 0);
  CHECK(vipc_server_start_listener(srv) == 0);
  vipc_stream_info info;
  CHECK(vipc_server_stream_info(srv, 0, &info) == 0 && info.num_buffers == 2 &&
        info.fds[0] >= 0 && info.map_size >= 192 + 64);
  CHECK(vipc_server_stream_info(srv, 1, &info) == -ENOENT);
  uint8_t frame[192] = {0};
  CHECK(vipc_server_send_copy(srv, 0, frame, sizeof frame, 1, 0, 0, 1) == -ENOTSUP);
  CHECK(vipc_server_num_clients(srv, 0) == -ENOTSUP);

  vipc_client *c;
  CHECK(vipc_client_open_flags("ccaller", 0,
                               VIPC_CLIENT_CALLER_RECEIVES | VIPC_CLIENT_SKIP_RECYCLED, &c) == 0);
  if (!c) return;
  vipc_frame f;
  uint8_t packet[VIPC_PACKET_SIZE];
  CHECK(vipc_client_recv(c, &f, 0) == -ENOTSUP);
  CHECK(vipc_client_take_packet(c, packet, 0, 0, &f) == -ENOTCONN);
  CHECK(vipc_client_handshake(c, 1000000000) == 0);
  CHECK(vipc_client_generation(c) == 1 && vipc_client_server_id(c) == vipc_server_id(srv));
  CHECK(vipc_client_buffer_fd(c, 0) >= 0 && vipc_client_buffer_fd(c, 2) == -1);

  /* Three frames into two buffers: the first packet's buffer now holds the third. */
  uint8_t packets[3][VIPC_PACKET_SIZE];
  for (uint32_t i = 0; i < 3; i++) {
    vipc_buffer buf;
    CHECK(vipc_server_get_buffer(srv, 0, &buf) == 0 && buf.idx == i % 2);
    memset(buf.data, (int)(i + 1), buf.size);
    CHECK(vipc_server_commit(srv, 0, buf.idx, 10 + i, 0, 0, 1, packets[i]) == (int64_t)(i + 1));
  }
  CHECK(vipc_server_commit(srv, 0, 2, 0, 0, 0, 1, packet) == -EINVAL);
  CHECK(vipc_client_take_packet(c, packets[0], VIPC_PACKET_SIZE, 0, &f) == 0); /* recycled */
  CHECK(vipc_client_take_packet(c, packets[1], VIPC_PACKET_SIZE, 0, &f) == 1 &&
        f.frame_id == 11 && f.data[0] == 2 && vipc_client_frame_current(c, &f) == 1);
  CHECK(vipc_client_take_packet(c, packets[2], VIPC_PACKET_SIZE, 0, &f) == 1 &&
        f.frame_id == 12 && f.sequence == 3 && f.data[0] == 3);
  /* A packet announcing a frame its buffer never held (sequence ahead of the trailer). */
  vipc_frame_packet forged = {vipc_server_id(srv), 9, 0, 0, 0, 0, 1};
  vipc_packet_encode(&forged, packet);
  CHECK(vipc_client_take_packet(c, packet, VIPC_PACKET_SIZE, 0, &f) == 0);
  /* A packet of an instance nobody answers to: stale, and not asked about again. */
  forged.server_id = vipc_server_id(srv) + 1;
  vipc_packet_encode(&forged, packet);
  CHECK(vipc_client_take_packet(c, packet, VIPC_PACKET_SIZE, 0, &f) == 0);
  CHECK(vipc_client_take_packet(c, packet, VIPC_PACKET_SIZE, 0, &f) == 0);
  vipc_client_stats stats;
  vipc_client_get_stats(c, &stats);
  CHECK(stats.skipped_frames == 1 && stats.recycled_frames == 0 && stats.bad_packets == 1 &&
        stats.stale_packets == 2 && stats.reconnects == 0);
  CHECK(vipc_client_generation(c) == 1); /* the same server answered: buffers kept */
  vipc_client_close(c);
  vipc_server_close(srv);
}

int main(void) {
  char dir[] = "/tmp/vipc_server_test.XXXXXX";
  if (!mkdtemp(dir)) return 2;
  setenv("MSGQ_SHM_DIR", dir, 1);
  unsetenv("MSGQ_PREFIX");
  unsetenv("OPENPILOT_PREFIX");
  unsetenv("MSGQ_VISIONIPC_ALLOW_UIDS");
  RUN(test_buffers_handshake_and_frames);
  RUN(test_hostile_clients);
  RUN(test_c_client);
  RUN(test_caller_transport);
  RUN(test_names_and_takeover);
  char cmd[96];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
