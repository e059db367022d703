"""The queue namespace: which names an endpoint may have, where its queue file lives, the
namespace prefix rule, the mode of new files, which processes are alive, and reading or
removing queue files without connecting.

The rules themselves are the C core's (``msgq/src/queue_file.c``), so C programs, the
shared-memory backend and everything here agree; this module is the one Python place that
reaches them. The ZMQ backend (its port hashing and names), the fake-event layer,
VisionIPC, lockstep, the CLI and the benchmarks import it rather than the extension.

* :func:`validate_endpoint`, :func:`queue_path`, :func:`queue_dir` — names and paths.
* :func:`namespace_prefix` — ``MSGQ_PREFIX``, else ``OPENPILOT_PREFIX``, else ``""``;
  ValueError when it is not a valid name.
* :func:`queue_file_mode` — ``MSGQ_SHM_MODE`` (default 0o600).
* :func:`process_alive` — the liveness rule of reader slots and publishers.
* :func:`inspect_queue`, :func:`remove_unused_queue` — a queue file's header, read or
  removed under the file lock every opener takes.
* :func:`fnv1a_64` — the name hash (ZMQ ports, fake-event files).

Layer: over the extension (:mod:`msgq.shm_backend`) and :mod:`msgq.errors`; below the
backends and everything else.
"""

from __future__ import annotations

from msgq.shm_backend import (
    DEFAULT_SEGMENT_SIZE,
    LAYOUT_VERSION,
    MAX_SEGMENT_SIZE,
    MIN_SEGMENT_SIZE,
    QUEUE_FILE_PREFIX,
    READER_SLOTS,
    inspect_queue,
    namespace_prefix,
    process_alive,
    queue_dir,
    queue_file_mode,
    queue_path,
    remove_unused_queue,
    validate_endpoint,
)

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "LAYOUT_VERSION",
    "MAX_SEGMENT_SIZE",
    "MIN_SEGMENT_SIZE",
    "QUEUE_FILE_PREFIX",
    "READER_SLOTS",
    "fnv1a_64",
    "inspect_queue",
    "namespace_prefix",
    "process_alive",
    "queue_dir",
    "queue_file_mode",
    "queue_path",
    "remove_unused_queue",
    "validate_endpoint",
]

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def fnv1a_64(data: bytes) -> int:
    """The 64-bit FNV-1a hash of ``data`` (stable across runs, machines and languages)."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h
