#define _GNU_SOURCE
#include "vipc_buffer.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vipc_errors.h"

int vipc_buffer_create(const char *label, uint64_t map_size) {
  int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -errno;
  int r = 0;
  if (ftruncate(fd, (off_t)map_size) != 0) r = -errno;
  if (r == 0) {
    int fr = posix_fallocate(fd, 0, (off_t)map_size);
    if (fr != 0 && fr != EOPNOTSUPP && fr != EINVAL) r = -fr; /* EOPNOTSUPP: nothing to reserve */
  }
  if (r == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    r = -errno;
  if (r < 0) {
    close(fd);
    return r;
  }
  return fd;
}

static int refuse(const char **why, const char *reason) {
  if (why) *why = reason;
  return VIPC_EGEOMETRY;
}

int vipc_buffer_check(int fd, uint64_t map_size, const char **why) {
  struct stat st;
  if (why) *why = NULL;
  if (fstat(fd, &st) != 0) return refuse(why, "cannot be inspected");
  if (!S_ISREG(st.st_mode)) return refuse(why, "is not a shared memory file");
  if ((uint64_t)st.st_size < map_size)
    return refuse(why, "is smaller than the stream's buffers need");
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return refuse(why, "is not sealed against shrinking; mapping it would let the server "
                       "crash this process");
  return 0;
}
