/* The listener of a VisionIPC server: a Unix SEQPACKET socket and one thread running a
 * poll loop that serves one request per connection (visionipc.h V4-V6). Used by the C
 * server (vipc_server.c) and, through msgq.visionipc._listener, by the Python
 * VisionIpcServer: one implementation of the handshake's server side.
 *
 * The listener keeps its own table of the streams it exports (geometry, map size, the
 * buffers' fds). It never closes those fds: their owner must stop the listener before it
 * closes them. Stopping joins the thread, so after vipc_listener_stop returns nothing
 * reads them any more. */
#ifndef VISIONIPC_LISTENER_H
#define VISIONIPC_LISTENER_H

#include <stddef.h>
#include <stdint.h>

#include "visionipc.h"

typedef struct vipc_listener vipc_listener;

/* Binds path (replacing a socket left there, V6; -EEXIST when the path is something
 * else), gives it mode and listens; connections wait in the backlog until
 * vipc_listener_run starts the thread, so the uids and streams set in between apply to
 * the first client too. max_pending: connections that may wait for their request at once
 * (1..4096). 0, -EEXIST, -EINVAL, -ENAMETOOLONG, -errno. */
int vipc_listener_start(const char *path, unsigned mode, uint64_t server_id,
                        int64_t handshake_timeout_ns, int max_pending, vipc_listener **out);

/* Starts the thread that accepts and answers connections (once; 0 or -errno). */
int vipc_listener_run(vipc_listener *l);

/* The uids served (any: every uid). Takes effect for connections accepted afterwards. */
int vipc_listener_set_uids(vipc_listener *l, const uint32_t *uids, size_t n, int any);

/* Exports a stream (its fds are copied as numbers, not duplicated). -EEXIST, -ENOMEM,
 * -EINVAL (more than VIPC_MAX_BUFFERS fds). */
int vipc_listener_add_stream(vipc_listener *l, uint32_t stream, const vipc_geometry *g,
                             uint64_t map_size, const int *fds, uint32_t num_fds);

void vipc_listener_get_stats(vipc_listener *l, vipc_listener_stats *out);

/* 1 while the thread runs. */
int vipc_listener_running(vipc_listener *l);

/* Stops the thread, closes the socket and removes its file while it is still this
 * listener's (same inode), frees. In a process forked after the start, only closes this
 * process's copies of the descriptors (the thread and the socket file are the parent's). */
void vipc_listener_stop(vipc_listener *l);

#endif
