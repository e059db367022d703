/* Queue files: endpoint naming, the prefix folder, and creating/opening/mapping the
 * shared-memory segment of a queue.
 *
 * A queue for endpoint E lives at $MSGQ_SHM_DIR (default /dev/shm), then the prefix
 * folder when MSGQ_PREFIX or OPENPILOT_PREFIX is set, then the file "msgq_E". Names
 * (endpoint and prefix) are 1..MSGQ_MAX_NAME_LEN characters from [A-Za-z0-9_.-], and
 * not "." or "..": nothing is ever created outside the shm folder.
 *
 * Files are created with mode $MSGQ_SHM_MODE (octal, default 0600).
 *
 * Segment size rule (the size of the data ring is fixed when the file is created):
 *  - a new queue gets the requested size, or MSGQ_DEFAULT_SEGMENT_SIZE for 0;
 *  - opening an existing queue with 0 or the same size adopts it;
 *  - a subscriber asking for another size adopts the existing size (the publisher's
 *    size wins);
 *  - a publisher asking for another size re-creates the queue at its size when no live
 *    process uses it (no live publisher, no live subscriber); when one does, it adopts
 *    the existing size if that is at least as large, else MSGQ_ESIZEMISMATCH.
 *
 * A queue file is never truncated or re-sized once it has a name: a new queue is made
 * complete in a file with a hidden name and then linked (new endpoint) or renamed
 * (replacing an old file) into place, so no half-made queue is ever visible under an
 * endpoint's name, and a process that still maps a replaced file keeps a valid mapping
 * (no SIGBUS). Validation and replacement happen under flock(LOCK_EX) on the existing
 * file. A file is replaced when its header is damaged or foreign (bad magic, another
 * layout version, inconsistent sizes: another program's file left under our name, a
 * queue whose header was scribbled on), when it is marked superseded, and when a
 * publisher wants another segment size or other flags and no live process uses it. A
 * replaced file of ours is marked superseded and its sleepers are woken, so the
 * processes still on it re-open the endpoint (MSGQ_ESUPERSEDED from send and peek);
 * a foreign file is left untouched. An opener that finds, once it holds the lock, that
 * the file was removed or replaced meanwhile opens the path again. */
#ifndef MSGQ_QUEUE_FILE_H
#define MSGQ_QUEUE_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "msgq_ring.h"

/* Queue files are named MSGQ_QUEUE_FILE_PREFIX + endpoint in the queue folder. */
#define MSGQ_QUEUE_FILE_PREFIX "msgq_"

#define MSGQ_MAX_NAME_LEN 100
#define MSGQ_MAX_PATH_LEN 512

enum msgq_role { MSGQ_ROLE_SUBSCRIBER = 0, MSGQ_ROLE_PUBLISHER = 1 };

/* 0 when name is an allowed endpoint or prefix name, else MSGQ_EBADNAME. */
int msgq_validate_name(const char *name);

/* Writes the queue file path for endpoint into out (honouring the environment).
 * Returns 0, MSGQ_EBADNAME (endpoint or prefix) or -ENAMETOOLONG. */
int msgq_queue_path(const char *endpoint, char *out, size_t out_len);

/* The folder queue files go to (shm folder plus prefix folder). */
int msgq_queue_dir(char *out, size_t out_len);

/* The same, creating the prefix folder when missing (with search permission for whoever
 * MSGQ_SHM_MODE lets use the files). Other shared files of msgq (fake events) use it too. */
int msgq_ensure_queue_dir(char *out, size_t out_len);

/* The namespace prefix: MSGQ_PREFIX, else OPENPILOT_PREFIX, else NULL (unvalidated). */
const char *msgq_namespace_prefix(void);

/* Mode of new queue files: MSGQ_SHM_MODE (octal) or 0600. */
mode_t msgq_queue_file_mode(void);

/* Opens (creating when needed) and maps the queue of endpoint under the segment size
 * rule above. create_flags (MSGQ_FLAG_*) are the flags of a queue this call creates; a
 * publisher whose flags differ from an unused queue's replaces it, a live one is adopted
 * with its flags (ring->flags says which). On success fills ring; release with msgq_queue_unmap(). With locked_fd,
 * the queue file stays locked (its fd in *locked_fd) until msgq_queue_unlock(): the
 * caller registers (claims a reader slot, takes ownership) under the same lock, so a
 * publisher re-creating an unused queue can never miss a process that just opened it. */
int msgq_queue_open(const char *endpoint, uint64_t segment_size, uint32_t create_flags,
                    enum msgq_role role, msgq_ring *ring, int *locked_fd);
/* Besides the codes above it returns -EAGAIN when another opener held the file lock for
 * 50 ms (call again after checking for signals), and -EPERM when the file or the prefix
 * folder belongs to another user while MSGQ_SHM_MODE does not share queues. */
void msgq_queue_unlock(int locked_fd);

void msgq_queue_unmap(msgq_ring *ring);

/* --- Tools: looking at and removing queue files ------------------------------------
 * Both open the file read-only (never O_CREAT, never a symlink), never register in the
 * queue and never write to it. They wait at most 50 ms for another opener's file lock
 * and then return -EAGAIN (the queue is being created or opened right now). */

/* Inspects the queue file at path (msgq_ring_inspect on a read-only mapping, under a
 * shared flock so that the file cannot be re-sized while mapped). Returns 0 with out
 * filled, MSGQ_EBADMAGIC (not a queue, not a regular file, or unfinished: out->magic
 * 0), MSGQ_EVERSION or MSGQ_EGEOMETRY (out partly filled), -EAGAIN, or -errno. */
int msgq_queue_inspect(const char *path, msgq_queue_info *out);

/* Removes the queue file at path when no live process uses it, deciding under the
 * same exclusive flock every opener takes, so nobody can register in between:
 *  - a valid queue: when its publisher pid and every reader pid are dead or unset,
 *    else -EBUSY;
 *  - an unfinished file (empty, or magic still 0: its creator died): always;
 *  - a damaged header (bad magic, other layout version, inconsistent sizes): only with
 *    remove_damaged (the caller has checked that no process has the file open or
 *    mapped), else the MSGQ_E* code of the damage.
 * Not a regular file: MSGQ_EBADMAGIC, never removed. Returns 0 when removed, with out
 * describing what was removed. */
int msgq_queue_remove_unused(const char *path, int remove_damaged, msgq_queue_info *out);

#endif
