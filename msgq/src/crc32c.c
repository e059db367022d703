#define _GNU_SOURCE
#include "crc32c.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

/* Reflected Castagnoli polynomial. */
#define CRC32C_POLY 0x82F63B78u

static uint32_t table[8][256];
static atomic_int table_ready;

static void build_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1u)));
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
  /* release: a thread that sees table_ready sees the whole table. Two threads may both
   * build it; they write the same values. */
  atomic_store_explicit(&table_ready, 1, memory_order_release);
}

uint32_t msgq_crc32c_portable(const void *data, size_t len) {
  if (!atomic_load_explicit(&table_ready, memory_order_acquire)) build_table();
  const uint8_t *p = data;
  uint32_t crc = 0xFFFFFFFFu;
  /* Slicing by 8 (little-endian hosts; the byte loop below is exact everywhere). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  while (len >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    v ^= crc;
    crc = table[7][v & 0xFF] ^ table[6][(v >> 8) & 0xFF] ^ table[5][(v >> 16) & 0xFF] ^
          table[4][(v >> 24) & 0xFF] ^ table[3][(v >> 32) & 0xFF] ^
          table[2][(v >> 40) & 0xFF] ^ table[1][(v >> 48) & 0xFF] ^ table[0][v >> 56];
    p += 8;
    len -= 8;
  }
#endif
  while (len--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(const void *data, size_t len) {
  const uint8_t *p = data;
  uint64_t crc = 0xFFFFFFFFu;
  while (len >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    crc = _mm_crc32_u64(crc, v);
    p += 8;
    len -= 8;
  }
  uint32_t c = (uint32_t)crc;
  while (len--) c = _mm_crc32_u8(c, *p++);
  return ~c;
}
static int hw_available(void) { return __builtin_cpu_supports("sse4.2"); }
static const char *hw_name = "sse4.2";
#elif defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
#include <arm_acle.h>
__attribute__((target("+crc"))) static uint32_t crc32c_hw(const void *data, size_t len) {
  const uint8_t *p = data;
  uint32_t crc = 0xFFFFFFFFu;
  while (len >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    crc = __crc32cd(crc, v);
    p += 8;
    len -= 8;
  }
  while (len--) crc = __crc32cb(crc, *p++);
  return ~crc;
}
static int hw_available(void) { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
static const char *hw_name = "armv8-crc";
#endif

/* -1 unknown, 0 portable, 1 hardware. Relaxed: every thread computes the same answer. */
static atomic_int use_hw = -1;

static int hardware(void) {
  int v = atomic_load_explicit(&use_hw, memory_order_relaxed);
  if (v < 0) {
#ifdef HAVE_HW_CRC
    v = hw_available() ? 1 : 0;
#else
    v = 0;
#endif
    atomic_store_explicit(&use_hw, v, memory_order_relaxed);
  }
  return v;
}

uint32_t msgq_crc32c(const void *data, size_t len) {
#ifdef HAVE_HW_CRC
  if (hardware()) return crc32c_hw(data, len);
#else
  (void)hardware();
#endif
  return msgq_crc32c_portable(data, len);
}

const char *msgq_crc32c_implementation(void) {
#ifdef HAVE_HW_CRC
  if (hardware()) return hw_name;
#endif
  return "portable";
}
