#include "vipc_handshake.h"

#include <stdlib.h>
#include <string.h>

#include "vipc_errors.h"
#include "vipc_wire.h"

static const uint8_t REQUEST_MAGIC[4] = {'V', 'I', 'P', 'Q'};
static const uint8_t REPLY_MAGIC[4] = {'V', 'I', 'P', 'R'};

static int fail(const char **why, const char *reason) {
  if (why) *why = reason;
  return VIPC_EPROTOCOL;
}

void vipc_request_encode(uint16_t kind, uint32_t stream, uint8_t out[VIPC_REQUEST_SIZE]) {
  memcpy(out, REQUEST_MAGIC, 4);
  vipc_store16(out + 4, VIPC_PROTOCOL_VERSION);
  vipc_store16(out + 6, kind);
  vipc_store32(out + 8, stream);
  vipc_store32(out + 12, 0);
}

int vipc_request_parse(const void *data, size_t len, vipc_request *out, const char **why) {
  if (why) *why = NULL;
  if (data == NULL || len != VIPC_REQUEST_SIZE)
    return fail(why, "request of the wrong length (16 bytes expected)");
  const uint8_t *b = data;
  if (memcmp(b, REQUEST_MAGIC, 4) != 0) return fail(why, "request without the VisionIPC magic");
  if (vipc_load16(b + 4) != VIPC_PROTOCOL_VERSION)
    return fail(why, "request of another protocol version");
  uint16_t kind = vipc_load16(b + 6);
  uint32_t stream = vipc_load32(b + 8);
  if (kind != VIPC_KIND_LIST && kind != VIPC_KIND_BUFFERS)
    return fail(why, "unknown request kind");
  if (vipc_load32(b + 12) != 0 || (kind == VIPC_KIND_LIST && stream != 0))
    return fail(why, "request with nonzero reserved fields");
  out->kind = kind;
  out->stream = stream;
  return 0;
}

static void reply_header(uint64_t server_id, uint16_t status, uint8_t *out) {
  memcpy(out, REPLY_MAGIC, 4);
  vipc_store16(out + 4, VIPC_PROTOCOL_VERSION);
  vipc_store16(out + 6, status);
  vipc_store64(out + 8, server_id);
}

size_t vipc_status_reply_encode(uint64_t server_id, uint16_t status,
                                uint8_t out[VIPC_REPLY_HEADER_SIZE]) {
  reply_header(server_id, status, out);
  return VIPC_REPLY_HEADER_SIZE;
}

static int by_id(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

size_t vipc_list_reply_encode(uint64_t server_id, const uint32_t *streams, uint32_t count,
                              uint8_t out[VIPC_MAX_REPLY_SIZE]) {
  uint32_t sorted[VIPC_MAX_STREAMS];
  if (count > VIPC_MAX_STREAMS) count = VIPC_MAX_STREAMS;
  if (count) memcpy(sorted, streams, count * sizeof sorted[0]);
  qsort(sorted, count, sizeof sorted[0], by_id);
  reply_header(server_id, VIPC_STATUS_OK, out);
  vipc_store32(out + VIPC_REPLY_HEADER_SIZE, count);
  for (uint32_t i = 0; i < count; i++)
    vipc_store32(out + VIPC_REPLY_HEADER_SIZE + 4 + 4 * i, sorted[i]);
  return VIPC_REPLY_HEADER_SIZE + 4u + 4u * count;
}

size_t vipc_buffers_reply_encode(uint64_t server_id, uint32_t stream, uint32_t num_buffers,
                                 const vipc_geometry *g, uint64_t map_size,
                                 uint8_t out[VIPC_BUFFERS_REPLY_SIZE]) {
  reply_header(server_id, VIPC_STATUS_OK, out);
  vipc_store32(out + 16, stream);
  vipc_store32(out + 20, num_buffers);
  vipc_store32(out + 24, g->width);
  vipc_store32(out + 28, g->height);
  vipc_store32(out + 32, g->stride);
  vipc_store32(out + 36, g->uv_offset);
  vipc_store64(out + 40, g->size);
  vipc_store64(out + 48, map_size);
  return VIPC_BUFFERS_REPLY_SIZE;
}

int vipc_reply_parse(const void *data, size_t len, size_t num_fds, uint16_t kind,
                     uint32_t stream, uint64_t page_size, vipc_reply *out,
                     uint32_t *streams, const char **why) {
  if (why) *why = NULL;
  if (data == NULL || len < VIPC_REPLY_HEADER_SIZE)
    return fail(why, "reply shorter than its header");
  if (len > VIPC_MAX_REPLY_SIZE) return fail(why, "oversized reply");
  const uint8_t *b = data;
  if (memcmp(b, REPLY_MAGIC, 4) != 0)
    return fail(why, "reply without the VisionIPC magic (not a VisionIPC server?)");
  if (vipc_load16(b + 4) != VIPC_PROTOCOL_VERSION)
    return fail(why, "server speaks another protocol version");
  uint64_t server_id = vipc_load64(b + 8);
  if (server_id == 0) return fail(why, "reply with server id 0");
  uint16_t status = vipc_load16(b + 6);
  memset(out, 0, sizeof *out);
  out->server_id = server_id;
  if (status == VIPC_STATUS_NOT_ALLOWED) {
    if (why) *why = "the server does not serve this process's uid";
    return VIPC_ENOTALLOWED;
  }
  if (status == VIPC_STATUS_UNKNOWN_STREAM) {
    if (why) *why = "the server has no such stream (yet)";
    return VIPC_EUNKNOWNSTREAM;
  }
  if (status != VIPC_STATUS_OK) return fail(why, "server answered with an error status");
  const uint8_t *body = b + VIPC_REPLY_HEADER_SIZE;
  const size_t body_len = len - VIPC_REPLY_HEADER_SIZE;

  if (kind == VIPC_KIND_LIST) {
    if (num_fds) return fail(why, "list reply carried file descriptors");
    if (body_len < 4) return fail(why, "list reply without a count");
    uint32_t count = vipc_load32(body);
    if (count > VIPC_MAX_STREAMS || body_len != 4u + 4u * (size_t)count)
      return fail(why, "list reply does not hold the ids it counts");
    for (uint32_t i = 0; i < count; i++) streams[i] = vipc_load32(body + 4 + 4 * i);
    out->count = count;
    return 0;
  }
  if (kind != VIPC_KIND_BUFFERS) return fail(why, "reply to an unknown request kind");
  if (body_len != VIPC_BUFFERS_REPLY_SIZE - VIPC_REPLY_HEADER_SIZE)
    return fail(why, "buffers reply body of the wrong length (40 bytes expected)");
  if (vipc_load32(body) != stream) return fail(why, "the server answered for another stream");
  uint32_t n = vipc_load32(body + 4);
  if (n < 1 || n > VIPC_MAX_BUFFERS) return fail(why, "buffer count out of range (1 .. 128)");
  if (num_fds != n) return fail(why, "buffer count and descriptors received differ");
  vipc_geometry g = {vipc_load32(body + 8), vipc_load32(body + 12), vipc_load32(body + 16),
                     vipc_load32(body + 20), vipc_load64(body + 24)};
  const char *geometry_why;
  if (vipc_geometry_validate(&g, &geometry_why) != 0)
    return fail(why, "the server announced an impossible geometry");
  uint64_t map_size = vipc_load64(body + 32);
  if (map_size != vipc_map_size(&g, page_size))
    return fail(why, "the server's map_size is not this client's layout");
  out->stream = stream;
  out->num_buffers = n;
  out->geometry = g;
  out->map_size = map_size;
  return 0;
}
