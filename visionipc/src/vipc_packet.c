#include "vipc_packet.h"

#include <string.h>

#include "vipc_errors.h"
#include "vipc_wire.h"

static const uint8_t PACKET_MAGIC[4] = {'V', 'I', 'P', 'F'};

void vipc_packet_encode(const vipc_frame_packet *p, uint8_t out[VIPC_PACKET_SIZE]) {
  memcpy(out, PACKET_MAGIC, 4);
  vipc_store16(out + 4, VIPC_PACKET_VERSION);
  vipc_store16(out + 6, p->valid ? VIPC_PACKET_FLAG_VALID : 0);
  vipc_store64(out + 8, p->server_id);
  vipc_store64(out + 16, p->sequence);
  vipc_store32(out + 24, p->buffer_index);
  vipc_store32(out + 28, p->frame_id);
  vipc_store64(out + 32, p->timestamp_sof);
  vipc_store64(out + 40, p->timestamp_eof);
}

int vipc_packet_parse(const void *data, size_t len, vipc_frame_packet *out) {
  if (data == NULL || len != VIPC_PACKET_SIZE) return VIPC_EBADPACKET;
  const uint8_t *b = data;
  if (memcmp(b, PACKET_MAGIC, 4) != 0 || vipc_load16(b + 4) != VIPC_PACKET_VERSION)
    return VIPC_EBADPACKET;
  uint16_t flags = vipc_load16(b + 6);
  if (flags & ~VIPC_PACKET_FLAG_VALID) return VIPC_EBADPACKET;
  uint64_t server_id = vipc_load64(b + 8), sequence = vipc_load64(b + 16);
  if (server_id == 0 || sequence == 0) return VIPC_EBADPACKET;
  out->server_id = server_id;
  out->sequence = sequence;
  out->buffer_index = vipc_load32(b + 24);
  out->frame_id = vipc_load32(b + 28);
  out->timestamp_sof = vipc_load64(b + 32);
  out->timestamp_eof = vipc_load64(b + 40);
  out->valid = (flags & VIPC_PACKET_FLAG_VALID) != 0;
  return 0;
}
