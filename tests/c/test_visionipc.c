/* C unit tests of VisionIPC's wire formats (visionipc/src): the packet, the handshake
 * request and replies, and the buffer geometry, checked against the byte layouts of
 * docs/visionipc.md (the same bytes visionipc/packet.py and handshake.py produce).
 * Prints "N passed, N failed"; exits non-zero on any failure. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "vipc_errors.h"
#include "vipc_handshake.h"
#include "vipc_layout.h"
#include "vipc_packet.h"

#include "check.h"

#define PAGE 4096u

static void test_packet_bytes_and_round_trip(void) {
  vipc_frame_packet p = {0x1122334455667788ull, 7, 3, 42, 1000, 2000, 1};
  uint8_t b[VIPC_PACKET_SIZE];
  vipc_packet_encode(&p, b);
  /* struct.pack("<4sHHQQIIQQ", b"VIPF", 1, 1, id, 7, 3, 42, 1000, 2000) */
  CHECK(!memcmp(b, "VIPF\x01\x00\x01\x00\x88\x77\x66\x55\x44\x33\x22\x11", 16));
  CHECK(b[16] == 7 && b[24] == 3 && b[28] == 42 && b[32] == 0xe8 && b[33] == 0x03);
  vipc_frame_packet q;
  CHECK(vipc_packet_parse(b, sizeof b, &q) == 0);
  CHECK(q.server_id == p.server_id && q.sequence == 7 && q.buffer_index == 3 &&
        q.frame_id == 42 && q.timestamp_sof == 1000 && q.timestamp_eof == 2000 && q.valid);
  p.valid = 0;
  vipc_packet_encode(&p, b);
  CHECK(vipc_packet_parse(b, sizeof b, &q) == 0 && q.valid == 0);
}

static void test_packet_rejects(void) {
  vipc_frame_packet p = {5, 1, 0, 0, 0, 0, 1}, q;
  uint8_t b[VIPC_PACKET_SIZE + 1];
  vipc_packet_encode(&p, b);
  CHECK(vipc_packet_parse(b, VIPC_PACKET_SIZE - 1, &q) == VIPC_EBADPACKET);
  CHECK(vipc_packet_parse(b, VIPC_PACKET_SIZE + 1, &q) == VIPC_EBADPACKET);
  CHECK(vipc_packet_parse(NULL, VIPC_PACKET_SIZE, &q) == VIPC_EBADPACKET);
  const size_t fields[][2] = {{0, 'X'}, {4, 2}, {6, 2}, {7, 1}};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    vipc_packet_encode(&p, b);
    b[fields[i][0]] = (uint8_t)fields[i][1];
    CHECK(vipc_packet_parse(b, VIPC_PACKET_SIZE, &q) == VIPC_EBADPACKET);
  }
  p.server_id = 0;
  vipc_packet_encode(&p, b);
  CHECK(vipc_packet_parse(b, VIPC_PACKET_SIZE, &q) == VIPC_EBADPACKET);
  p.server_id = 5;
  p.sequence = 0;
  vipc_packet_encode(&p, b);
  CHECK(vipc_packet_parse(b, VIPC_PACKET_SIZE, &q) == VIPC_EBADPACKET);
}

static void test_request(void) {
  uint8_t b[VIPC_REQUEST_SIZE + 1];
  vipc_request r;
  const char *why;
  vipc_request_encode(VIPC_KIND_BUFFERS, 0xdeadbeef, b);
  CHECK(!memcmp(b, "VIPQ\x01\x00\x02\x00\xef\xbe\xad\xde\x00\x00\x00\x00", 16));
  CHECK(vipc_request_parse(b, 16, &r, &why) == 0 && r.kind == 2 && r.stream == 0xdeadbeef);
  CHECK(vipc_request_parse(b, 17, &r, &why) == VIPC_EPROTOCOL && why != NULL);
  CHECK(vipc_request_parse(b, 15, &r, &why) == VIPC_EPROTOCOL);
  vipc_request_encode(VIPC_KIND_LIST, 0, b);
  CHECK(vipc_request_parse(b, 16, &r, &why) == 0 && r.kind == 1 && r.stream == 0);
  vipc_request_encode(VIPC_KIND_LIST, 3, b); /* a stream in a list request */
  CHECK(vipc_request_parse(b, 16, &r, &why) == VIPC_EPROTOCOL);
  vipc_request_encode(3, 0, b);
  CHECK(vipc_request_parse(b, 16, &r, &why) == VIPC_EPROTOCOL);
  vipc_request_encode(VIPC_KIND_BUFFERS, 1, b);
  b[12] = 1; /* reserved */
  CHECK(vipc_request_parse(b, 16, &r, &why) == VIPC_EPROTOCOL);
  vipc_request_encode(VIPC_KIND_BUFFERS, 1, b);
  b[4] = 2; /* version */
  CHECK(vipc_request_parse(b, 16, &r, &why) == VIPC_EPROTOCOL);
}

static void test_list_reply(void) {
  uint8_t b[VIPC_MAX_REPLY_SIZE];
  uint32_t ids[VIPC_MAX_STREAMS];
  vipc_reply r;
  const char *why;
  const uint32_t streams[] = {9, 2, 5};
  size_t n = vipc_list_reply_encode(77, streams, 3, b);
  CHECK(n == 16 + 4 + 12);
  CHECK(vipc_reply_parse(b, n, 0, VIPC_KIND_LIST, 0, PAGE, &r, ids, &why) == 0);
  CHECK(r.server_id == 77 && r.count == 3 && ids[0] == 2 && ids[1] == 5 && ids[2] == 9);
  CHECK(vipc_reply_parse(b, n, 1, VIPC_KIND_LIST, 0, PAGE, &r, ids, &why) == VIPC_EPROTOCOL);
  CHECK(vipc_reply_parse(b, n - 1, 0, VIPC_KIND_LIST, 0, PAGE, &r, ids, &why) == VIPC_EPROTOCOL);
  b[16] = 0xff; /* a count the bytes do not hold */
  CHECK(vipc_reply_parse(b, n, 0, VIPC_KIND_LIST, 0, PAGE, &r, ids, &why) == VIPC_EPROTOCOL);
  n = vipc_status_reply_encode(77, VIPC_STATUS_NOT_ALLOWED, b);
  CHECK(vipc_reply_parse(b, n, 0, VIPC_KIND_LIST, 0, PAGE, &r, ids, &why) == VIPC_ENOTALLOWED);
  n = vipc_status_reply_encode(77, VIPC_STATUS_UNKNOWN_STREAM, b);
  CHECK(vipc_reply_parse(b, n, 0, VIPC_KIND_BUFFERS, 1, PAGE, &r, ids, &why) ==
        VIPC_EUNKNOWNSTREAM);
  n = vipc_status_reply_encode(77, VIPC_STATUS_BAD_REQUEST, b);
  CHECK(vipc_reply_parse(b, n, 0, VIPC_KIND_LIST, 0, PAGE, &r, ids, &why) == VIPC_EPROTOCOL);
  n = vipc_status_reply_encode(0, VIPC_STATUS_OK, b); /* server id 0 */
  CHECK(vipc_reply_parse(b, n, 0, VIPC_KIND_LIST, 0, PAGE, &r, ids, &why) == VIPC_EPROTOCOL);
}

static void test_buffers_reply(void) {
  uint8_t b[VIPC_BUFFERS_REPLY_SIZE];
  uint32_t ids[VIPC_MAX_STREAMS];
  vipc_reply r;
  const char *why;
  vipc_geometry g = vipc_geometry_nv12(1928, 1208);
  CHECK(vipc_geometry_validate(&g, &why) == 0);
  CHECK(g.size == 1928u * 1208u * 3u / 2u && g.uv_offset == 1928u * 1208u);
  CHECK(vipc_trailer_offset(&g) == (g.size + 63) / 64 * 64);
  CHECK(vipc_map_size(&g, PAGE) % PAGE == 0 && vipc_map_size(&g, PAGE) >= g.size + 64);
  CHECK(vipc_geometry_has_uv_plane(&g));
  uint64_t map = vipc_map_size(&g, PAGE);
  size_t n = vipc_buffers_reply_encode(9, 4, 6, &g, map, b);
  CHECK(n == 56);
  CHECK(vipc_reply_parse(b, n, 6, VIPC_KIND_BUFFERS, 4, PAGE, &r, ids, &why) == 0);
  CHECK(r.stream == 4 && r.num_buffers == 6 && r.geometry.width == 1928 && r.map_size == map);
  CHECK(vipc_reply_parse(b, n, 5, VIPC_KIND_BUFFERS, 4, PAGE, &r, ids, &why) == VIPC_EPROTOCOL);
  CHECK(vipc_reply_parse(b, n, 6, VIPC_KIND_BUFFERS, 5, PAGE, &r, ids, &why) == VIPC_EPROTOCOL);
  CHECK(vipc_reply_parse(b, n, 6, VIPC_KIND_BUFFERS, 4, 2 * PAGE, &r, ids, &why) ==
        VIPC_EPROTOCOL); /* another page size: another map_size */
  vipc_buffers_reply_encode(9, 4, 0, &g, map, b);
  CHECK(vipc_reply_parse(b, n, 0, VIPC_KIND_BUFFERS, 4, PAGE, &r, ids, &why) == VIPC_EPROTOCOL);
  vipc_buffers_reply_encode(9, 4, 129, &g, map, b);
  CHECK(vipc_reply_parse(b, n, 129, VIPC_KIND_BUFFERS, 4, PAGE, &r, ids, &why) ==
        VIPC_EPROTOCOL);
  vipc_geometry bad = g;
  bad.stride = g.width - 1;
  vipc_buffers_reply_encode(9, 4, 6, &bad, map, b);
  CHECK(vipc_reply_parse(b, n, 6, VIPC_KIND_BUFFERS, 4, PAGE, &r, ids, &why) == VIPC_EPROTOCOL);
}

static void test_geometry_rules(void) {
  const char *why;
  vipc_geometry g = {4, 4, 4, 16, 24};
  CHECK(vipc_geometry_validate(&g, &why) == 0 && why == NULL);
  vipc_geometry cases[] = {
      {0, 4, 4, 16, 24},            /* width 0 */
      {4, 70000, 4, 16, 1u << 20},  /* height too large */
      {4, 4, 3, 16, 24},            /* stride < width */
      {4, 4, 4, 16, 0},             /* size 0 */
      {4, 4, 4, 16, (1ull << 30) + 1},
      {4, 4, 8, 16, 24},            /* Y plane (8 * 3 + 4 = 28) past size */
      {4, 4, 4, 25, 24},            /* uv_offset past size */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    CHECK(vipc_geometry_validate(&cases[i], &why) == VIPC_EGEOMETRY && why != NULL);
  vipc_geometry no_uv = {4, 4, 4, 20, 24}; /* UV plane would end at 28 > 24 */
  CHECK(vipc_geometry_validate(&no_uv, NULL) == 0 && !vipc_geometry_has_uv_plane(&no_uv));
  vipc_geometry one_row = {4, 1, 4, 4, 8};
  CHECK(!vipc_geometry_has_uv_plane(&one_row));
  CHECK(strlen(vipc_strerror(VIPC_EPROTOCOL)) > 0 && strlen(vipc_strerror(-2)) > 0);
}

int main(void) {
  RUN(test_packet_bytes_and_round_trip);
  RUN(test_packet_rejects);
  RUN(test_request);
  RUN(test_list_reply);
  RUN(test_buffers_reply);
  RUN(test_geometry_rules);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
