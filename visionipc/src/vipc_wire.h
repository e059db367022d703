/* Little-endian loads and stores at any alignment: the byte order of every VisionIPC
 * wire format, whatever the CPU's. Internal to visionipc/src. */
#ifndef VISIONIPC_WIRE_H
#define VISIONIPC_WIRE_H

#include <stdint.h>

static inline uint16_t vipc_load16(const uint8_t *p) {
  return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}
static inline uint32_t vipc_load32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t vipc_load64(const uint8_t *p) {
  return (uint64_t)vipc_load32(p) | (uint64_t)vipc_load32(p + 4) << 32;
}
static inline void vipc_store16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void vipc_store32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void vipc_store64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

#endif
