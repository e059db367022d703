/* Names of VisionIPC things in C (as visionipc/names.py): server names, the msgq endpoint
 * of a stream, the socket path, and the uid policy of $MSGQ_VISIONIPC_ALLOW_UIDS.
 * Internal to visionipc/src. */
#ifndef VISIONIPC_NAMES_H
#define VISIONIPC_NAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VIPC_SOCKET_PATH_MAX 107 /* bytes of a Unix socket path, sizeof(sun_path) - 1 */

/* 0 when name can name a server (the endpoint of its largest stream id is a valid msgq
 * endpoint), else -EINVAL. */
int vipc_validate_name(const char *name);
/* "visionipc_<name>_<stream>" into out. 0 or -EINVAL. */
int vipc_endpoint_name(const char *name, uint32_t stream, char *out, size_t len);
/* "<queue folder>/visionipc_<name>.sock" into out (creating the prefix folder when
 * create_dir). 0, -EINVAL, -ENAMETOOLONG (over VIPC_SOCKET_PATH_MAX), or -errno. */
int vipc_socket_path(const char *name, int create_dir, char *out, size_t len);

/* $MSGQ_VISIONIPC_ALLOW_UIDS: 0 when unset or blank; 1 with *any or a malloc'd list of
 * *n uids in *uids; -EINVAL when malformed; -ENOMEM. */
int vipc_uids_from_env(bool *any, uint32_t **uids, size_t *n);

#endif
