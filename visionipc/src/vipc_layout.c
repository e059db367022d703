#include "vipc_layout.h"

#include <stddef.h>

#include "vipc_errors.h"

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* End of the Y plane: the last row's start plus its width. Only for a geometry whose
 * dimensions are in range (no overflow: all below 2^16, so the product is below 2^32). */
static uint64_t y_plane_end(const vipc_geometry *g) {
  return (uint64_t)g->stride * (g->height - 1u) + g->width;
}

int vipc_geometry_validate(const vipc_geometry *g, const char **why) {
  const char *reason = NULL;
  if (g->width < 1 || g->width > VIPC_MAX_DIMENSION || g->height < 1 ||
      g->height > VIPC_MAX_DIMENSION)
    reason = "width and height must be 1 .. 65536";
  else if (g->stride < g->width || g->stride > VIPC_MAX_DIMENSION)
    reason = "stride must be >= width and at most 65536";
  else if (g->size < 1 || g->size > VIPC_MAX_BUFFER_SIZE)
    reason = "buffer size must be 1 .. 2^30 bytes";
  else if (y_plane_end(g) > g->size)
    reason = "the Y plane does not fit in the buffer";
  else if (g->uv_offset > g->size)
    reason = "uv_offset is outside the buffer";
  if (why) *why = reason;
  return reason ? VIPC_EGEOMETRY : 0;
}

vipc_geometry vipc_geometry_nv12(uint32_t width, uint32_t height) {
  vipc_geometry g = {width, height, width, 0, 0};
  uint64_t plane = (uint64_t)width * height;
  g.uv_offset = plane > UINT32_MAX ? UINT32_MAX : (uint32_t)plane;
  g.size = plane * 3u / 2u;
  return g;
}

uint64_t vipc_trailer_offset(const vipc_geometry *g) {
  return align_up(g->size, VIPC_TRAILER_ALIGN);
}

uint64_t vipc_map_size(const vipc_geometry *g, uint64_t page_size) {
  return align_up(vipc_trailer_offset(g) + VIPC_TRAILER_SIZE, page_size);
}

int vipc_geometry_has_uv_plane(const vipc_geometry *g) {
  uint32_t rows = g->height / 2u;
  if (rows == 0) return 0;
  return g->uv_offset >= y_plane_end(g) &&
         (uint64_t)g->uv_offset + (uint64_t)g->stride * (rows - 1u) + g->width <= g->size;
}
