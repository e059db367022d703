/* Fuzz target for the ring: the input is an untrusted queue segment plus a script of
 * operations. Built two ways by SConstruct:
 *   - with clang and -fsanitize=fuzzer (scons fuzz): a coverage-guided libFuzzer binary;
 *   - otherwise with a main() that runs the target on seeded random inputs (part of
 *     `scons test`, under ASan/UBSan in the sanitizer variant).
 * Whatever the bytes, attaching must either fail with an error code or succeed, and every
 * later operation must stay inside the mapping (the sanitizers check that). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msgq_ring.h"

#define FUZZ_CAPACITY 1024u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const size_t total = MSGQ_HEADER_SIZE + FUZZ_CAPACITY;
  uint8_t *mem = aligned_alloc(64, total);
  if (!mem) return 0;
  memset(mem, 0, total);
  msgq_ring_format(mem, total, size && data[0] % 2 ? MSGQ_FLAG_CHECKSUM : 0);

  /* First byte: how much of the input overwrites the segment (header and ring alike);
   * the rest is the operation script. */
  size_t overlay = size ? (size_t)data[0] * 8u : 0;
  if (size) {
    data++;
    size--;
  }
  if (overlay > size) overlay = size;
  if (overlay > total) overlay = total;
  /* Keep the magic most of the time so the protocol code gets exercised too. */
  memcpy(mem + 8, data, overlay > 8 ? overlay - 8 : 0);
  data += overlay;
  size -= overlay;

  msgq_ring ring;
  if (msgq_ring_attach(&ring, mem, total) != 0) {
    free(mem);
    return 0;
  }
  msgq_publisher pub;
  msgq_subscriber subs[2];
  int live[2] = {0, 0};
  msgq_publisher_init(&pub, &ring);
  for (int i = 0; i < 2; i++) live[i] = msgq_subscriber_init(&subs[i], &ring, i == 1) == 0;

  static uint8_t payload[FUZZ_CAPACITY];
  uint8_t out[FUZZ_CAPACITY];
  for (size_t pc = 0; pc + 2 < size; pc += 3) {
    uint8_t op = data[pc] % 4, a = data[pc + 1], b = data[pc + 2];
    if (op == 0) {
      if (msgq_publisher_send(&pub, payload, (uint32_t)a * 2u) != 0) {
        atomic_store(&ring.header->superseded, 0);
        msgq_publisher_init(&pub, &ring);
      }
    } else if (op == 1 || op == 2) {
      msgq_subscriber *sub = &subs[op - 1];
      if (!live[op - 1]) continue;
      const uint8_t *p;
      uint32_t n;
      if (msgq_subscriber_peek(sub, &p, &n) == 1) {
        if (n <= sizeof out) memcpy(out, p, n);
        msgq_subscriber_consume(sub, n <= sizeof out ? out : NULL);
      }
    } else {
      /* Scribble one byte anywhere in the live part of the segment. */
      size_t at = offsetof(msgq_header, write_pointer) +
                  ((size_t)a << 8 | b) % (total - offsetof(msgq_header, write_pointer));
      mem[at] ^= (uint8_t)(a + b + 1);
    }
  }
  free(mem);
  return 0;
}

#ifndef MSGQ_LIBFUZZER
int main(int argc, char **argv) {
  unsigned runs = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 20000u;
  unsigned seed = 2024;
  static uint8_t input[4096];
  for (unsigned r = 0; r < runs; r++) {
    size_t len = (size_t)rand_r(&seed) % sizeof input;
    for (size_t i = 0; i < len; i++) input[i] = (uint8_t)rand_r(&seed);
    if (len) input[0] %= 16; /* mostly short overlays: keep headers attachable */
    LLVMFuzzerTestOneInput(input, len);
  }
  printf("fuzz_ring: %u random inputs, no crash\n", runs);
  return 0;
}
#endif
