/* The geometry of a stream's buffers and the layout of each buffer's memfd, as the
 * Python side (visionipc/buffer.py) and docs/visionipc.md define them:
 *
 *   0                  size               trailer_offset = size rounded up to 64
 *   | frame (size bytes) | padding (0..63) | trailer (64 bytes) | padding to a page |
 *
 * The trailer holds frame_id (u64 LE; VIPC_FRAME_ID_WRITING while the server refills the
 * buffer) and sequence (u64 LE; 0 while refilling), then 48 reserved bytes. */
#ifndef VISIONIPC_LAYOUT_H
#define VISIONIPC_LAYOUT_H

#include <stdint.h>

#define VIPC_MAX_BUFFER_SIZE (1ull << 30) /* largest frame (bytes) */
#define VIPC_MAX_DIMENSION (1u << 16)      /* largest width, height and stride */
#define VIPC_TRAILER_ALIGN 64u
#define VIPC_TRAILER_SIZE 64u
#define VIPC_FRAME_ID_WRITING UINT64_MAX

typedef struct {
  uint32_t width;
  uint32_t height;
  uint32_t stride;    /* bytes between rows of the Y plane */
  uint32_t uv_offset; /* start of the interleaved UV plane */
  uint64_t size;      /* bytes of a frame */
} vipc_geometry;

/* 0 when g describes a buffer: width and height 1..VIPC_MAX_DIMENSION, width <= stride
 * <= VIPC_MAX_DIMENSION, size 1..VIPC_MAX_BUFFER_SIZE, the Y plane inside size, and
 * uv_offset <= size. Else VIPC_EGEOMETRY with *why (may be NULL) saying which rule. */
int vipc_geometry_validate(const vipc_geometry *g, const char **why);

/* Tightly packed NV12 as upstream lays it out (stride = width, uv_offset = width *
 * height, size = width * height * 3 / 2). Validate it before use. */
vipc_geometry vipc_geometry_nv12(uint32_t width, uint32_t height);

/* Offset of the trailer and bytes of each buffer's memfd for a valid geometry, with
 * page_size a power of two (sysconf(_SC_PAGESIZE)). */
uint64_t vipc_trailer_offset(const vipc_geometry *g);
uint64_t vipc_map_size(const vipc_geometry *g, uint64_t page_size);

/* 1 when an NV12 UV plane (height / 2 rows of width bytes from uv_offset, stride apart)
 * lies inside the buffer after the Y plane, else 0. */
int vipc_geometry_has_uv_plane(const vipc_geometry *g);

#endif
