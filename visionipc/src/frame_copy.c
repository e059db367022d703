/* Frame copy for VisionIPC (see frame_copy.h). */
#include "frame_copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h> /* SSE2: part of every x86-64 CPU, no runtime dispatch needed */
#define VIPC_CAN_STREAM 1
#else
#define VIPC_CAN_STREAM 0
#endif

int vipc_copy_can_stream(void) { return VIPC_CAN_STREAM; }

void vipc_copy_frame(void *dst, const void *src, size_t n, int streaming) {
#if VIPC_CAN_STREAM
  if (streaming && n >= 256) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    /* _mm_stream_si128 needs a 16-byte aligned destination; shared buffers are page
     * aligned, so the head is empty there. */
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t lines = n / 64;
    for (size_t i = 0; i < lines; i++) {
      __m128i a = _mm_loadu_si128((const __m128i *)s);
      __m128i b = _mm_loadu_si128((const __m128i *)s + 1);
      __m128i c = _mm_loadu_si128((const __m128i *)s + 2);
      __m128i e = _mm_loadu_si128((const __m128i *)s + 3);
      _mm_stream_si128((__m128i *)d, a);
      _mm_stream_si128((__m128i *)d + 1, b);
      _mm_stream_si128((__m128i *)d + 2, c);
      _mm_stream_si128((__m128i *)d + 3, e);
      d += 64;
      s += 64;
    }
    memcpy(d, s, n - lines * 64);
    /* Non-temporal stores are weakly ordered: fence them before the caller's stores of
     * the buffer's trailer and of the packet (release order for the readers). */
    _mm_sfence();
    return;
  }
#else
  (void)streaming;
#endif
  memcpy(dst, src, n);
}
