"""Names of VisionIPC things: server names, stream ids, the msgq endpoint of a stream and
the path of a server's Unix socket."""

from __future__ import annotations

import os

from msgq.queues import queue_dir, validate_endpoint

__all__ = [
    "MAX_STREAM_ID",
    "SOCKET_PATH_MAX",
    "get_endpoint_name",
    "socket_path",
    "validate_name",
    "validate_stream",
]

#: Stream ids are opaque unsigned 32-bit numbers.
MAX_STREAM_ID = 2**32 - 1

#: Bytes of a Unix socket path, without its terminating NUL (sizeof(sun_path) - 1 on Linux).
SOCKET_PATH_MAX = 107

ENDPOINT_PREFIX = "visionipc_"
SOCKET_FILE_PREFIX = "visionipc_"
SOCKET_FILE_SUFFIX = ".sock"


def validate_stream(stream: object) -> int:
    """``stream`` as an int; TypeError unless it is an integer, ValueError unless it is an
    unsigned 32-bit number."""
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(f"stream id must be an int, not {type(stream).__name__}")
    if not 0 <= stream <= MAX_STREAM_ID:
        raise ValueError(f"stream id {stream} is out of range: use 0 .. {MAX_STREAM_ID}")
    return int(stream)


def get_endpoint_name(name: str, stream: int) -> str:
    """The msgq endpoint on which server ``name`` announces the frames of ``stream``
    (``visionipc_<name>_<stream>``, the upstream naming)."""
    return f"{ENDPOINT_PREFIX}{name}_{validate_stream(stream)}"


def validate_name(name: object) -> str:
    """``name`` if it can name a VisionIPC server: a str that, in the endpoint of its
    largest stream id, is a valid msgq endpoint name (letters, digits, ``_ - .``, at most
    100 characters with the ``visionipc_`` prefix and stream suffix). ValueError otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"server name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("server name must not be empty")
    try:
        validate_endpoint(get_endpoint_name(name, MAX_STREAM_ID))
    except ValueError as e:
        raise ValueError(
            f"server name {name!r} is not usable: it must consist of letters, digits, "
            f"'_', '-' and '.' and be short enough for the endpoint names ({e})"
        ) from None
    return name


def socket_path(name: str, create_dir: bool = False) -> str:
    """The path of server ``name``'s Unix socket: ``visionipc_<name>.sock`` in the queue
    folder of the namespace (``$MSGQ_SHM_DIR or /dev/shm``, plus the ``MSGQ_PREFIX`` /
    ``OPENPILOT_PREFIX`` folder). ValueError when the path is longer than a Unix socket
    path may be."""
    validate_name(name)
    folder = queue_dir(create=create_dir)
    path = os.path.join(folder, f"{SOCKET_FILE_PREFIX}{name}{SOCKET_FILE_SUFFIX}")
    length = len(os.fsencode(path))
    if length > SOCKET_PATH_MAX:
        raise ValueError(
            f"VisionIPC socket path {path!r} is {length} bytes, more than the "
            f"{SOCKET_PATH_MAX} a Unix socket path may have: use a shorter server name, "
            "a shorter MSGQ_PREFIX/OPENPILOT_PREFIX or a shorter MSGQ_SHM_DIR"
        )
    return path
