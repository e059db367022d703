/* A VisionIPC buffer's memfd (visionipc.h V1 and C2): made by the server, checked by a
 * client before it maps one it received. Used by the C server and client and, through
 * msgq.visionipc._wire, by the Python ones. */
#ifndef VISIONIPC_BUFFER_H
#define VISIONIPC_BUFFER_H

#include <stdint.h>

/* A new memfd (close-on-exec) named label, map_size bytes, its pages reserved
 * (posix_fallocate: a full tmpfs fails here, not with SIGBUS mid-frame) and sealed
 * F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL. Returns the fd, or -errno. */
int vipc_buffer_create(const char *label, uint64_t map_size);

/* 0 when fd is a regular file of at least map_size bytes sealed against shrinking (a
 * mapping of it can never fault), else VIPC_EGEOMETRY with *why (may be NULL) naming
 * the problem. Reads nothing but fstat and the seals. */
int vipc_buffer_check(int fd, uint64_t map_size, const char **why);

#endif
