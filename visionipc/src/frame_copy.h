/* The one copy of VisionIPC's copying send: a frame into a shared buffer. */
#ifndef VISIONIPC_FRAME_COPY_H
#define VISIONIPC_FRAME_COPY_H

#include <stddef.h>

/* Copies n bytes from src to dst (they must not overlap). With streaming != 0 (and on
 * x86-64) the destination is written with non-temporal stores: a large frame then goes
 * to memory without first reading every destination line into the cache and evicting
 * the source, about twice the bandwidth of memcpy once frame and buffers exceed the
 * last-level cache. Returns after all stores are ordered before any later store (sfence),
 * so the trailer and the packet that announce the frame are seen after its bytes. */
void vipc_copy_frame(void *dst, const void *src, size_t n, int streaming);

/* 1 when vipc_copy_frame can stream on this build, else 0 (it then always uses memcpy). */
int vipc_copy_can_stream(void);

#endif
