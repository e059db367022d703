"""VisionIPC: large frame buffers shared by file descriptor, announced over msgq.

A :class:`VisionIpcServer` allocates each stream's buffers once (memfd), hands their file
descriptors to clients over a Unix socket and announces every filled buffer with a small
packet on the msgq endpoint ``get_endpoint_name(name, stream)``. A
:class:`VisionIpcClient` maps the buffers read-only and gets each frame without a copy.
Design, wire formats and limits: ``docs/visionipc.md``.

Layer: a service (``msgq.visionipc``) — over the package's sockets (the per-frame
packets travel on msgq), the queue namespace (names, file modes), the errors and numpy.
"""

from __future__ import annotations

from enum import IntEnum

from .buffer import FRAME_ID_WRITING, BufferGeometry, VisionBuf
from .client import VisionIpcClient, available_streams
from .handshake import HandshakeError, NotAllowedError
from .names import get_endpoint_name
from .peers import ALLOW_UIDS_ENV, PeerCredentials, PeerPolicy
from .server import VisionIpcServer

__all__ = [
    "ALLOW_UIDS_ENV",
    "FRAME_ID_WRITING",
    "BufferGeometry",
    "HandshakeError",
    "NotAllowedError",
    "PeerCredentials",
    "PeerPolicy",
    "VisionBuf",
    "VisionIpcClient",
    "VisionIpcServer",
    "VisionStreamType",
    "available_streams",
    "get_endpoint_name",
]


class VisionStreamType(IntEnum):
    """The stream ids openpilot's camera daemons use (upstream names). Any other unsigned
    32-bit number is a stream id too."""

    VISION_STREAM_ROAD = 0
    VISION_STREAM_DRIVER = 1
    VISION_STREAM_WIDE_ROAD = 2
    VISION_STREAM_MAP = 3
