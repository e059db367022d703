/* The VisionIPC handshake's wire format on the server's Unix socket (SOCK_SEQPACKET: one
 * whole message per request and per reply; one exchange per connection). All integers
 * little-endian. docs/visionipc.md and visionipc/handshake.py describe the same bytes.
 *
 * Request, client to server, exactly VIPC_REQUEST_SIZE (16) bytes:
 *    0 4 magic "VIPQ" | 4 2 version 1 | 6 2 kind (1 list, 2 buffers)
 *    8 4 stream (kind 2; 0 for kind 1) | 12 4 reserved 0
 *
 * Reply, server to client: a 16-byte header
 *    0 4 magic "VIPR" | 4 2 version 1 | 6 2 status | 8 8 server_id (nonzero)
 * then, for status ok, a body: to "list", count (u32, <= VIPC_MAX_STREAMS) and count
 * stream ids (u32, sorted); to "buffers", 40 bytes
 *   16 4 stream | 20 4 num_buffers (1..VIPC_MAX_BUFFERS) | 24 4 width | 28 4 height
 *   32 4 stride | 36 4 uv_offset | 40 8 size | 48 8 map_size
 * with one fd per buffer in SCM_RIGHTS (the fds are not this file's business: the
 * caller passes how many arrived, and owns and closes them).
 *
 * Parsers read only the len bytes they are given, never trust a count or size in them,
 * and accept exactly the shapes above; *why (when not NULL) receives a static sentence
 * naming what was wrong. */
#ifndef VISIONIPC_HANDSHAKE_H
#define VISIONIPC_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "vipc_layout.h"

#define VIPC_PROTOCOL_VERSION 1u
#define VIPC_REQUEST_SIZE 16u
#define VIPC_REPLY_HEADER_SIZE 16u
#define VIPC_BUFFERS_REPLY_SIZE 56u
#define VIPC_MAX_BUFFERS 128u
#define VIPC_MAX_STREAMS 1024u
#define VIPC_MAX_REPLY_SIZE (VIPC_REPLY_HEADER_SIZE + 4u + 4u * VIPC_MAX_STREAMS)

enum vipc_request_kind { VIPC_KIND_LIST = 1, VIPC_KIND_BUFFERS = 2 };
enum vipc_status {
  VIPC_STATUS_OK = 0,
  VIPC_STATUS_BAD_REQUEST = 1,
  VIPC_STATUS_UNKNOWN_STREAM = 2,
  VIPC_STATUS_NOT_ALLOWED = 3,
};

typedef struct {
  uint16_t kind;   /* VIPC_KIND_* */
  uint32_t stream; /* 0 for VIPC_KIND_LIST */
} vipc_request;

/* Writes the 16-byte request. */
void vipc_request_encode(uint16_t kind, uint32_t stream, uint8_t out[VIPC_REQUEST_SIZE]);

/* The server's check of a request: 0 with *out, or VIPC_EPROTOCOL (wrong length, magic,
 * version, unknown kind, nonzero reserved field or a stream in a list request). */
int vipc_request_parse(const void *data, size_t len, vipc_request *out, const char **why);

/* Reply encoders; each returns the bytes written. A status reply (errors) is the header
 * alone (16 bytes). A list reply needs VIPC_REPLY_HEADER_SIZE + 4 + 4 * count bytes;
 * count above VIPC_MAX_STREAMS is cut to it, and the ids are written sorted. */
size_t vipc_status_reply_encode(uint64_t server_id, uint16_t status,
                                uint8_t out[VIPC_REPLY_HEADER_SIZE]);
size_t vipc_list_reply_encode(uint64_t server_id, const uint32_t *streams, uint32_t count,
                              uint8_t out[VIPC_MAX_REPLY_SIZE]);
size_t vipc_buffers_reply_encode(uint64_t server_id, uint32_t stream, uint32_t num_buffers,
                                 const vipc_geometry *g, uint64_t map_size,
                                 uint8_t out[VIPC_BUFFERS_REPLY_SIZE]);

typedef struct {
  uint64_t server_id;
  /* A buffers reply: */
  uint32_t stream;
  uint32_t num_buffers;
  vipc_geometry geometry; /* validated (vipc_geometry_validate) */
  uint64_t map_size;      /* equal to vipc_map_size(geometry, page_size) */
  /* A list reply: count ids copied to the caller's array. */
  uint32_t count;
} vipc_reply;

/* The client's check of the reply to a request of `kind` for `stream`, which arrived
 * with num_fds descriptors, on a machine of page_size. Returns 0 with *out filled (and,
 * for a list reply, the ids in streams[0..count), an array of VIPC_MAX_STREAMS), or
 * VIPC_ENOTALLOWED / VIPC_EUNKNOWNSTREAM (the server said so; server_id is set), or
 * VIPC_EPROTOCOL: short or oversized, wrong magic or version, server id 0, another status,
 * a body of the wrong length, a list with fds or more than VIPC_MAX_STREAMS ids, a
 * buffers reply for another stream, a buffer count out of range or unlike num_fds, an
 * impossible geometry, or a map_size other than this layout's. */
int vipc_reply_parse(const void *data, size_t len, size_t num_fds, uint16_t kind,
                     uint32_t stream, uint64_t page_size, vipc_reply *out,
                     uint32_t *streams, const char **why);

#endif
