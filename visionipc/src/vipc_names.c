#define _GNU_SOURCE
#include "vipc_names.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "msgq.h"
#include "visionipc.h"

int vipc_endpoint_name(const char *name, uint32_t stream, char *out, size_t len) {
  int n = snprintf(out, len, "visionipc_%s_%u", name, stream);
  return n < 0 || (size_t)n >= len ? -EINVAL : 0;
}

int vipc_validate_name(const char *name) {
  char endpoint[MSGQ_ENDPOINT_NAME_MAX + 2];
  if (name == NULL || !*name || strlen(name) > VIPC_MAX_NAME_LEN) return -EINVAL;
  if (vipc_endpoint_name(name, UINT32_MAX, endpoint, sizeof endpoint) < 0) return -EINVAL;
  return msgq_endpoint_valid(endpoint) == 0 ? 0 : -EINVAL;
}

int vipc_socket_path(const char *name, int create_dir, char *out, size_t len) {
  if (vipc_validate_name(name) < 0) return -EINVAL;
  char dir[MSGQ_ENDPOINT_PATH_MAX];
  int r = msgq_namespace_dir(dir, sizeof dir, create_dir);
  if (r < 0) return r == MSGQ_EBADNAME ? -EINVAL : r;
  int n = snprintf(out, len, "%s/visionipc_%s.sock", dir, name);
  if (n < 0 || (size_t)n >= len || n > VIPC_SOCKET_PATH_MAX) return -ENAMETOOLONG;
  return 0;
}

int vipc_uids_from_env(bool *any, uint32_t **uids_out, size_t *n_out) {
  *any = false;
  *uids_out = NULL;
  *n_out = 0;
  const char *text = getenv("MSGQ_VISIONIPC_ALLOW_UIDS");
  if (text == NULL) return 0;
  while (isspace((unsigned char)*text)) text++;
  size_t len = strlen(text);
  while (len && isspace((unsigned char)text[len - 1])) len--;
  if (len == 0) return 0;
  if ((len == 1 && text[0] == '*') || (len == 3 && !strncasecmp(text, "any", 3))) {
    *any = true;
    return 1;
  }
  uint32_t *uids = calloc(len / 2 + 1, sizeof *uids);
  if (!uids) return -ENOMEM;
  size_t n = 0;
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *comma = memchr(p, ',', (size_t)(end - p));
    const char *stop = comma ? comma : end;
    while (p < stop && isspace((unsigned char)*p)) p++;
    const char *last = stop;
    while (last > p && isspace((unsigned char)last[-1])) last--;
    if (last > p) {
      uint64_t uid = 0;
      for (const char *d = p; d < last; d++) {
        if (!isdigit((unsigned char)*d) ||
            (uid = uid * 10u + (uint64_t)(*d - '0')) > UINT32_MAX) {
          free(uids);
          return -EINVAL;
        }
      }
      uids[n++] = (uint32_t)uid;
    }
    p = comma ? comma + 1 : end;
  }
  if (n == 0) {
    free(uids);
    return -EINVAL;
  }
  *uids_out = uids;
  *n_out = n;
  return 1;
}
