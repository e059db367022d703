/* The per-frame packet a VisionIPC server publishes on a stream's msgq endpoint
 * (visionipc_<name>_<stream>): one fixed 48-byte little-endian record per frame.
 *
 *   offset size field
 *        0    4 magic          "VIPF"
 *        4    2 version        1
 *        6    2 flags          bit 0: valid; other bits must be 0
 *        8    8 server_id      random, nonzero, per server instance
 *       16    8 sequence       the stream's publish counter: 1, 2, 3, ... (nonzero)
 *       24    4 buffer_index   which of the stream's buffers holds the frame
 *       28    4 frame_id
 *       32    8 timestamp_sof
 *       40    8 timestamp_eof
 *
 * The bytes come from a queue anyone with access to the namespace can write: the parser
 * accepts exactly this shape and nothing else, reads only the len bytes it is given, and
 * leaves the buffer_index range check to the caller (who knows the stream's buffer
 * count). */
#ifndef VISIONIPC_PACKET_H
#define VISIONIPC_PACKET_H

#include <stddef.h>
#include <stdint.h>

#define VIPC_PACKET_SIZE 48u
#define VIPC_PACKET_VERSION 1u
#define VIPC_PACKET_FLAG_VALID 1u
/* Ring size of a stream's endpoint (publisher and subscribers ask for the same). */
#define VIPC_PACKET_SEGMENT_SIZE (256u * 1024u)

typedef struct {
  uint64_t server_id;
  uint64_t sequence;
  uint32_t buffer_index;
  uint32_t frame_id;
  uint64_t timestamp_sof;
  uint64_t timestamp_eof;
  int valid; /* 0 or 1 */
} vipc_frame_packet;

/* Writes the 48 bytes announcing p into out. */
void vipc_packet_encode(const vipc_frame_packet *p, uint8_t out[VIPC_PACKET_SIZE]);

/* Parses len bytes at data. Returns 0 with *out filled, or VIPC_EBADPACKET (wrong size,
 * magic, version, unknown flags, server_id or sequence 0) leaving *out untouched. */
int vipc_packet_parse(const void *data, size_t len, vipc_frame_packet *out);

#endif
