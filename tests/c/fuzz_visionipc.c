/* Fuzz target for VisionIPC's parsers: the per-frame packet (vipc_packet_parse), the
 * handshake request (vipc_request_parse) and replies (vipc_reply_parse, list and
 * buffers), and the geometry rules. Built two ways by SConstruct, as fuzz_ring.c:
 *   - with clang and -fsanitize=fuzzer (scons fuzz): build/fuzz/fuzz_visionipc;
 *   - otherwise with a main() that runs the target on seeded inputs: valid messages of
 *     every kind with random fields, then mutated (bytes flipped, truncated, extended),
 *     plus pure noise (part of `scons test`, under ASan/UBSan in that variant).
 * Whatever the bytes, a parser either rejects them or accepts a message that encodes
 * back to exactly the same bytes and satisfies every limit the parser promises; the
 * sanitizers check that nothing is read outside the input. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vipc_errors.h"
#include "vipc_handshake.h"
#include "vipc_layout.h"
#include "vipc_packet.h"

#define PAGE 4096u

static void broken(const char *what) {
  fprintf(stderr, "fuzz_visionipc: %s\n", what);
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A private copy of exactly `size` bytes: ASan flags any read past it. */
  uint8_t *copy = calloc(1, size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);

  vipc_frame_packet packet;
  if (vipc_packet_parse(copy, size, &packet) == 0) {
    uint8_t again[VIPC_PACKET_SIZE];
    vipc_packet_encode(&packet, again);
    if (size != VIPC_PACKET_SIZE || memcmp(again, copy, size) != 0)
      broken("an accepted packet does not encode back to its bytes");
    if (packet.server_id == 0 || packet.sequence == 0) broken("packet with id 0 accepted");
  }

  vipc_request request;
  const char *why = NULL;
  if (vipc_request_parse(copy, size, &request, &why) == 0) {
    uint8_t again[VIPC_REQUEST_SIZE];
    vipc_request_encode(request.kind, request.stream, again);
    if (size != VIPC_REQUEST_SIZE || memcmp(again, copy, size) != 0)
      broken("an accepted request does not encode back to its bytes");
  } else if (why == NULL) {
    broken("a rejected request without a reason");
  }

  /* The reply parsers, with the descriptor count and stream taken from the input. */
  size_t fds = size ? copy[0] % 130u : 0;
  uint32_t stream = size >= 20 ? (uint32_t)copy[16] | (uint32_t)copy[17] << 8 : 0;
  static uint32_t ids[VIPC_MAX_STREAMS];
  vipc_reply reply;
  int r = vipc_reply_parse(copy, size, 0, VIPC_KIND_LIST, 0, PAGE, &reply, ids, &why);
  if (r == 0) {
    if (reply.count > VIPC_MAX_STREAMS || size != VIPC_REPLY_HEADER_SIZE + 4u + 4u * reply.count)
      broken("a list reply accepted with a count its bytes do not hold");
  } else if (r != VIPC_EPROTOCOL && r != VIPC_ENOTALLOWED && r != VIPC_EUNKNOWNSTREAM) {
    broken("unexpected list reply error");
  }
  r = vipc_reply_parse(copy, size, fds, VIPC_KIND_BUFFERS, stream, PAGE, &reply, ids, &why);
  if (r == 0) {
    uint8_t again[VIPC_BUFFERS_REPLY_SIZE];
    vipc_buffers_reply_encode(reply.server_id, reply.stream, reply.num_buffers,
                              &reply.geometry, reply.map_size, again);
    if (size != VIPC_BUFFERS_REPLY_SIZE || memcmp(again, copy, size) != 0)
      broken("an accepted buffers reply does not encode back to its bytes");
    if (reply.num_buffers != fds || reply.num_buffers > VIPC_MAX_BUFFERS)
      broken("a buffers reply accepted with the wrong buffer count");
    if (vipc_geometry_validate(&reply.geometry, NULL) != 0 ||
        reply.map_size < reply.geometry.size + VIPC_TRAILER_SIZE)
      broken("a buffers reply accepted with a geometry that does not fit");
    (void)vipc_geometry_has_uv_plane(&reply.geometry);
  }
  free(copy);
  return 0;
}

#ifndef VIPC_LIBFUZZER
/* A valid message of a random kind with random fields, into buf; returns its length. */
static size_t valid_message(uint8_t *buf, unsigned *seed) {
  uint64_t id = ((uint64_t)rand_r(seed) << 32 | (uint64_t)rand_r(seed)) | 1u;
  switch (rand_r(seed) % 5) {
    case 0: {
      vipc_frame_packet p = {id, (uint64_t)rand_r(seed) + 1u, (uint32_t)rand_r(seed) % 8u,
                             (uint32_t)rand_r(seed), (uint64_t)rand_r(seed),
                             (uint64_t)rand_r(seed), rand_r(seed) & 1};
      vipc_packet_encode(&p, buf);
      return VIPC_PACKET_SIZE;
    }
    case 1:
      vipc_request_encode(rand_r(seed) & 1 ? VIPC_KIND_LIST : VIPC_KIND_BUFFERS, 0, buf);
      return VIPC_REQUEST_SIZE;
    case 2: {
      uint32_t ids[16];
      uint32_t n = (uint32_t)rand_r(seed) % 16u;
      for (uint32_t i = 0; i < n; i++) ids[i] = (uint32_t)rand_r(seed);
      return vipc_list_reply_encode(id, ids, n, buf);
    }
    case 3:
      return vipc_status_reply_encode(id, (uint16_t)(rand_r(seed) % 5), buf);
    default: {
      vipc_geometry g = vipc_geometry_nv12(2u + (uint32_t)rand_r(seed) % 4000u,
                                           2u + (uint32_t)rand_r(seed) % 3000u);
      /* fds = buf[0] % 130 in the target: buf[0] is 'V' (86), so 86 buffers. */
      uint32_t stream = (uint32_t)rand_r(seed) % 65536u;
      return vipc_buffers_reply_encode(id, stream, 86u, &g, vipc_map_size(&g, PAGE), buf);
    }
  }
}

int main(int argc, char **argv) {
  unsigned runs = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 50000u;
  unsigned seed = 2025;
  static uint8_t input[VIPC_MAX_REPLY_SIZE + 64];
  unsigned accepted = 0;
  for (unsigned r = 0; r < runs; r++) {
    size_t len;
    if (rand_r(&seed) % 8 == 0) {
      len = (size_t)rand_r(&seed) % 128u;
      for (size_t i = 0; i < len; i++) input[i] = (uint8_t)rand_r(&seed);
    } else {
      len = valid_message(input, &seed);
      int mutations = rand_r(&seed) % 4;
      for (int m = 0; m < mutations && len; m++) {
        int how = rand_r(&seed) % 4;
        if (how == 0) len = (size_t)rand_r(&seed) % len;                      /* truncate */
        else if (how == 1 && len < sizeof input) input[len++] = (uint8_t)rand_r(&seed);
        else input[(size_t)rand_r(&seed) % len] ^= (uint8_t)(1u << (rand_r(&seed) % 8));
      }
      if (mutations == 0) accepted++;
    }
    LLVMFuzzerTestOneInput(input, len);
  }
  printf("fuzz_visionipc: %u inputs (%u valid messages unmutated), no crash\n", runs, accepted);
  return 0;
}
#endif
