/* visionipc.h — the public C API of a VisionIPC server: a native camera driver allocates
 * frame buffers once, hands their file descriptors to clients (Python
 * msgq.visionipc.VisionIpcClient, or any client of the protocol) over a Unix socket, and
 * announces every filled buffer with a 48-byte packet on a msgq queue. The wire formats
 * are those of docs/visionipc.md (vipc_packet.h, vipc_handshake.h, vipc_layout.h).
 *
 *   vipc_server *srv;
 *   vipc_server_open("camerad", &srv);
 *   vipc_server_create_buffers(srv, 0, 4, 1928, 1208);   // NV12, stream 0 (road)
 *   vipc_server_start_listener(srv);
 *   vipc_buffer buf;
 *   vipc_server_get_buffer(srv, 0, &buf);                 // zero copy: fill buf.data ...
 *   vipc_server_send(srv, 0, buf.idx, frame_id, sof_ns, eof_ns, 1);
 *   vipc_server_close(srv);
 *
 * Link with -lvisionipc -lmsgq (-lpthread). The client half (vipc_client_*) is below.
 *
 * Names. A server name makes the msgq endpoints "visionipc_<name>_<stream>" (upstream's
 * naming) and the socket "visionipc_<name>.sock" in msgq's queue folder ($MSGQ_SHM_DIR,
 * default /dev/shm, plus the $MSGQ_PREFIX / $OPENPILOT_PREFIX folder): letters, digits,
 * '_', '-', '.', at most 79 characters, and a socket path of at most 107 bytes. Stream ids
 * are opaque uint32 numbers.
 *
 * Invariants and ownership.
 *  V1 Buffers: one memfd per buffer, map_size bytes (vipc_layout.h), pages reserved
 *     (posix_fallocate) and sealed F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL before any
 *     client sees it, so no holder of an fd can make another's mapping fault. The server
 *     maps each once, read-write; the memory is the server's until close.
 *  V2 Trailer protocol: get_buffer stores sequence 0, then frame_id
 *     VIPC_FRAME_ID_WRITING, in the buffer's trailer; send stores frame_id, then (release)
 *     the sequence, then publishes the packet. A client that finds its packet's sequence in
 *     the trailer after reading the frame read an untouched frame.
 *  V3 Buffers are handed out round robin: a buffer is refilled num_buffers get_buffer
 *     calls after it was last handed out. Sequences count 1, 2, ... per stream.
 *  V4 The listener (one thread, poll loop, non-blocking sockets) serves one request per
 *     connection: it never blocks on a client, closes a connection that sent nothing
 *     within the handshake timeout (1 s), keeps at most 256 waiting (dropping the oldest
 *     silent one), reads requests without room for passed fds, answers a peer whose uid
 *     the policy refuses with "not allowed" only, and anything but a valid request with
 *     "bad request". Peer uids come from SO_PEERCRED.
 *  V5 Uid policy: $MSGQ_VISIONIPC_ALLOW_UIDS ("1000,1001", or "*" / "any") read at
 *     vipc_server_open, else only the server's effective uid; vipc_server_allow_uids
 *     replaces it. The socket file gets msgq's queue file mode ($MSGQ_SHM_MODE).
 *  V6 A new server of the same name takes the socket path over (a stale or live older
 *     server's); close removes the socket only while the path is still this server's
 *     (same inode).
 *  V7 One thread at a time may call a server (the listener thread is internal and only
 *     reads the stream table, under a lock). Not for use across fork().
 *
 * Errors: negative codes, -errno or VIPC_E* (vipc_errors.h) or MSGQ_E* (msgq.h) from the
 * packet queue; vipc_strerror / msgq_strerror name them. */
#ifndef VISIONIPC_H
#define VISIONIPC_H

#include <stddef.h>
#include <stdint.h>

#include "vipc_errors.h"
#include "vipc_layout.h"
#include "vipc_packet.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VIPC_MAX_NAME_LEN 79
#define VIPC_MAX_BUFFERS_PER_STREAM 128 /* = VIPC_MAX_BUFFERS of the handshake */

typedef struct vipc_server vipc_server;

/* A buffer handed out by vipc_server_get_buffer: `data` is writable, `size` bytes, until
 * the buffer comes round again (V3) or the server closes. */
typedef struct {
  uint8_t *data;
  uint64_t size;
  uint32_t idx; /* pass to vipc_server_send */
  uint32_t width, height, stride, uv_offset;
} vipc_buffer;

/* Counters of the listener. */
typedef struct {
  uint64_t served, refused, bad_requests, unknown_stream, timeouts, evicted, disconnects,
      errors;
} vipc_listener_stats;

/* A server named name (no socket yet). 0 with *out, -EINVAL (bad name, malformed
 * $MSGQ_VISIONIPC_ALLOW_UIDS) or -ENOMEM. */
int vipc_server_open(const char *name, vipc_server **out);

/* Flags of vipc_server_open_flags, for a binding that brings its own packet transport
 * (the Python VisionIpcServer publishes packets on whichever msgq backend is selected)
 * and its own uid policy:
 *  VIPC_SERVER_CALLER_PUBLISHES  no packet publisher per stream: vipc_server_commit
 *                                hands the packet to the caller, vipc_server_send and
 *                                vipc_server_send_copy return -ENOTSUP;
 *  VIPC_SERVER_NO_ENV_UIDS       $MSGQ_VISIONIPC_ALLOW_UIDS is not read: only the
 *                                effective uid until vipc_server_allow_uids. */
#define VIPC_SERVER_CALLER_PUBLISHES 1u
#define VIPC_SERVER_NO_ENV_UIDS 2u
int vipc_server_open_flags(const char *name, unsigned flags, vipc_server **out);

/* The uids served (V5): any != 0 serves every uid; else uids[0..n). */
int vipc_server_allow_uids(vipc_server *srv, const uint32_t *uids, size_t n, int any);
/* How long a connected client may take to send its request (default 1 s). */
void vipc_server_set_handshake_timeout(vipc_server *srv, int64_t timeout_ns);

/* num_buffers (1..128) NV12 buffers of width x height for stream (stride = width,
 * uv_offset = width * height, size = width * height * 3 / 2), and the stream's packet
 * publisher. -EEXIST when the stream has buffers, VIPC_EGEOMETRY, -EINVAL, or an error of
 * memfd/mmap/msgq. */
int vipc_server_create_buffers(vipc_server *srv, uint32_t stream, uint32_t num_buffers,
                               uint32_t width, uint32_t height);
/* The same with any valid geometry (vipc_geometry_validate). */
int vipc_server_create_buffers_with_geometry(vipc_server *srv, uint32_t stream,
                                             uint32_t num_buffers, const vipc_geometry *g);

/* Binds the socket and starts the listener thread (idempotent). -ENAMETOOLONG (socket
 * path over 107 bytes), -EEXIST (the path is not a socket), or -errno. */
int vipc_server_start_listener(vipc_server *srv);

/* The next buffer of stream to fill (V2, V3). -ENOENT when the stream has no buffers. */
int vipc_server_get_buffer(vipc_server *srv, uint32_t stream, vipc_buffer *out);

/* Announces buffer idx of stream (filled after get_buffer) as frame frame_id.
 * -ENOENT, -EINVAL (idx out of range), or an error of the packet queue. */
int vipc_server_send(vipc_server *srv, uint32_t stream, uint32_t idx, uint32_t frame_id,
                     uint64_t timestamp_sof, uint64_t timestamp_eof, int valid);

/* Records buffer idx of stream (filled after get_buffer) as frame frame_id (V2: the
 * trailer's frame_id, then its sequence, the stream's next) and writes the packet that
 * announces it into packet, for the caller to publish. 1.. (the frame's sequence),
 * -ENOENT or -EINVAL (idx out of range). vipc_server_send is this plus the publish. */
int64_t vipc_server_commit(vipc_server *srv, uint32_t stream, uint32_t idx, uint32_t frame_id,
                           uint64_t timestamp_sof, uint64_t timestamp_eof, int valid,
                           uint8_t packet[VIPC_PACKET_SIZE]);

/* A stream's geometry, buffer count, mapping size and buffer fds (the server's: open
 * until close), for a binding that maps the buffers itself. 0 or -ENOENT. */
typedef struct {
  vipc_geometry geometry;
  uint64_t map_size;
  uint32_t num_buffers;
  const int *fds;
} vipc_stream_info;
int vipc_server_stream_info(vipc_server *srv, uint32_t stream, vipc_stream_info *out);

/* Copies size bytes (exactly the stream's buffer size, else -EINVAL and nothing is
 * sent) into the next buffer and announces it. */
int vipc_server_send_copy(vipc_server *srv, uint32_t stream, const void *data, size_t size,
                          uint32_t frame_id, uint64_t timestamp_sof, uint64_t timestamp_eof,
                          int valid);

/* Subscribers of stream's packet queue (clients connected to the stream), or < 0. */
int vipc_server_num_clients(vipc_server *srv, uint32_t stream);
uint64_t vipc_server_id(const vipc_server *srv);
/* The socket path (valid after open; the file exists while the listener runs). */
const char *vipc_server_socket_path(const vipc_server *srv);
void vipc_server_get_listener_stats(vipc_server *srv, vipc_listener_stats *out);

/* Stops the listener, removes the socket (V6), unmaps and closes every buffer, closes
 * the publishers, frees. NULL is accepted. */
void vipc_server_close(vipc_server *srv);

/* --- Client ------------------------------------------------------------------------
 *
 *   vipc_client *c;
 *   vipc_client_open("camerad", 0, 0, &c);          // subscribes to the stream's packets
 *   vipc_client_connect(c, 2000000000);             // handshake: maps the buffers
 *   vipc_frame f;
 *   if (vipc_client_recv(c, &f, 100000000) == 1) {  // read f.data (read-only) ...
 *     if (vipc_client_frame_current(c, &f)) ...      // ... then: was it left untouched?
 *   }
 *   vipc_client_close(c);
 *
 *  C1 The client subscribes to the packet queue at open, before any handshake, so no
 *     frame announced after vipc_client_connect returns is missed.
 *  C2 Before mapping anything it checks the server (SO_PEERCRED: its own uid, root, or
 *     a uid in $MSGQ_VISIONIPC_ALLOW_UIDS), the reply (vipc_reply_parse) and every fd: a
 *     regular file of at least map_size bytes sealed against shrinking, so no mapping can
 *     fault. Any failure closes every fd received. Buffers are mapped read-only.
 *  C3 Packets are untrusted: anything not a well-formed packet of a known server with a
 *     buffer index in range, or announcing a frame its buffer never held (the trailer
 *     holds an older sequence: a server fills before it announces), is skipped and
 *     counted (bad_packets). A packet of another server id (a restarted server) makes the
 *     client handshake again (at most every 50 ms, within the receive's time and the
 *     handshake timeout); when the server now answering has that id, the old buffers are
 *     unmapped (frames from them must no longer be read) and the new ones mapped; packets
 *     of ids no server answers to are skipped (stale_packets), and the last 16 such ids
 *     are not asked about again. A failed handshake is kept (vipc_client_last_error).
 *  C4 A frame's data may be refilled by the server once it is num_buffers frames old:
 *     vipc_client_frame_current after reading says whether the buffer still holds it. A
 *     packet whose buffer was already refilled when it was received is returned and
 *     counted (recycled_frames), or with VIPC_CLIENT_SKIP_RECYCLED skipped and counted
 *     (skipped_frames). */

typedef struct vipc_client vipc_client;

typedef struct {
  const uint8_t *data; /* read-only, size bytes; valid until the next connect/close */
  uint64_t size;
  uint32_t idx;
  uint32_t frame_id;
  uint64_t sequence;
  uint64_t timestamp_sof;
  uint64_t timestamp_eof;
  int valid;
  uint32_t width, height, stride, uv_offset;
} vipc_frame;

typedef struct {
  uint64_t bad_packets, stale_packets, reconnects, recycled_frames, skipped_frames;
} vipc_client_stats;

/* Opens the client of stream of server name and subscribes to its packets (C1).
 * conflate: only the newest frame. 0, -EINVAL (bad name) or an msgq error. */
int vipc_client_open(const char *name, uint32_t stream, int conflate, vipc_client **out);

/* Flags of vipc_client_open_flags:
 *  VIPC_CLIENT_CONFLATE          as conflate above;
 *  VIPC_CLIENT_SKIP_RECYCLED     skip frames whose buffer was refilled (C4);
 *  VIPC_CLIENT_CALLER_RECEIVES   no packet subscriber: the caller receives the packets
 *                                on its own transport (the Python VisionIpcClient, on any
 *                                msgq backend) and hands each to vipc_client_take_packet;
 *                                vipc_client_recv returns -ENOTSUP; the buffers' fds stay
 *                                open (vipc_client_buffer_fd) for the caller to map. */
#define VIPC_CLIENT_CONFLATE 1u
#define VIPC_CLIENT_SKIP_RECYCLED 2u
#define VIPC_CLIENT_CALLER_RECEIVES 4u
int vipc_client_open_flags(const char *name, uint32_t stream, unsigned flags,
                           vipc_client **out);
/* How long one handshake may take when recv follows a restarted server (default 2 s). */
void vipc_client_set_handshake_timeout(vipc_client *c, int64_t timeout_ns);

/* Handshakes and maps the stream's buffers (C2), retrying every 20 ms while no server
 * answers, up to timeout_ns (< 0: forever). 0, -ETIMEDOUT (nobody answered),
 * VIPC_ENOTALLOWED, VIPC_EPROTOCOL, -EPERM (server uid not trusted), -EACCES (the
 * socket's mode), -EINTR, -errno. */
int vipc_client_connect(vipc_client *c, int64_t timeout_ns);
/* One handshake within timeout_ns (a connection the server closes unanswered is tried
 * again within it): 0, -ECONNREFUSED (no server there), VIPC_EUNKNOWNSTREAM (it has no
 * such stream yet), -ETIMEDOUT (no answer in time), or an error as vipc_client_connect. */
int vipc_client_handshake(vipc_client *c, int64_t timeout_ns);
/* With VIPC_CLIENT_CALLER_RECEIVES: the frame announced by the len bytes at data (C3,
 * C4; a restart handshake may take up to timeout_ns, < 0: the handshake timeout): 1 with
 * *out, 0 when the packet was skipped (and counted), -ENOTCONN before a connect. */
int vipc_client_take_packet(vipc_client *c, const void *data, size_t len, int64_t timeout_ns,
                            vipc_frame *out);
/* The fd of buffer idx (CALLER_RECEIVES; the client's, open until the next handshake
 * that replaces the buffers, or close), else -1. */
int vipc_client_buffer_fd(const vipc_client *c, uint32_t idx);
/* The server instance whose buffers are mapped (0: none), and a count that grows each
 * time the mapped buffers are replaced. */
uint64_t vipc_client_server_id(const vipc_client *c);
uint64_t vipc_client_generation(const vipc_client *c);
/* The error of the last failed handshake (0: none) and, when the reply broke the
 * protocol, a static sentence saying how (else NULL). */
int vipc_client_last_error(const vipc_client *c, const char **detail);
/* The next frame (C3), waiting up to timeout_ns: 1 with *out, 0 on timeout, < 0 on an
 * error (-ENOTCONN before a successful connect). */
int vipc_client_recv(vipc_client *c, vipc_frame *out, int64_t timeout_ns);
/* 1 when frame f's buffer still holds it (C4), else 0. */
int vipc_client_frame_current(const vipc_client *c, const vipc_frame *f);
/* Geometry of the connected stream (zeros before connect) and counters. */
vipc_geometry vipc_client_geometry(const vipc_client *c);
uint32_t vipc_client_num_buffers(const vipc_client *c);
void vipc_client_get_stats(const vipc_client *c, vipc_client_stats *out);
void vipc_client_close(vipc_client *c);

/* The streams server name serves now, into streams[0..cap): their count (>= 0), or an
 * error as vipc_client_connect (one attempt, timeout_ns for the exchange). */
int vipc_available_streams(const char *name, uint32_t *streams, size_t cap, int64_t timeout_ns);

#ifdef __cplusplus
}
#endif

#endif
