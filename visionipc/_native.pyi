"""Typing stub of the extension ``msgq.visionipc._native`` (visionipc/_native.pyx and the
files it includes): VisionIPC's C code. The wire formats (frame packet, handshake,
buffer layout) that ``packet.py``, ``handshake.py`` and ``buffer.py`` use, the frame copy
of ``frame_copy.py``, and the binding of visionipc.h, the C server and client that
``server.py`` and ``client.py`` wrap."""

from collections.abc import Iterable

Buffer = bytes | bytearray | memoryview
#: (width, height, stride, uv_offset, size) of a stream's buffers.
Geometry = tuple[int, int, int, int, int]

PROTOCOL_ERROR: int
NOT_ALLOWED: int
UNKNOWN_STREAM: int
#: Codes that mean "no server (with that stream) answers yet": worth another try.
UNAVAILABLE: tuple[int, int, int]
NOT_TRUSTED: int
SOCKET_DENIED: int
MAX_STREAMS_LISTED: int
PACKET_SIZE: int
#: Whether this CPU and build can copy with non-temporal (streaming) stores.
CAN_STREAM: bool

def error_text(code: int) -> str: ...

class Server:
    """A vipc_server whose caller publishes the packets."""

    name: str

    def __init__(self, name: str) -> None: ...
    @property
    def server_id(self) -> int: ...
    @property
    def socket_path(self) -> str: ...
    def allow_uids(self, uids: Iterable[int], any_uid: bool) -> None: ...
    def set_handshake_timeout(self, seconds: float) -> None: ...
    def create_buffers(self, stream: int, num_buffers: int, width: int, height: int,
                       stride: int, uv_offset: int, size: int) -> tuple[int, tuple[int, ...]]:
        """Allocates the stream's buffers (sealed memfds): (map_size, fds)."""
    def start_listener(self) -> None: ...
    def get_buffer(self, stream: int) -> int:
        """The index of the stream's next buffer, now marked as being refilled."""
    def commit(self, stream: int, idx: int, frame_id: int, timestamp_sof: int,
               timestamp_eof: int, valid: bool) -> tuple[int, bytes]:
        """Records the frame in buffer idx's trailer: (sequence, the packet to publish)."""
    @property
    def listener_stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...

class Client:
    """A vipc_client whose caller receives the packets."""

    name: str

    def __init__(self, name: str, stream: int, conflate: bool, skip_recycled: bool,
                 handshake_timeout_s: float) -> None: ...
    def handshake(self, timeout_s: float) -> int:
        """One handshake (the GIL released): 0, or the C error code."""
    def take_packet(self, data: Buffer, timeout_s: float
                    ) -> tuple[int, int, int, int, int, bool] | None:
        """(idx, frame_id, sequence, sof, eof, valid) of the frame a packet announces, or
        None when it was skipped."""
    @property
    def server_id(self) -> int: ...
    @property
    def generation(self) -> int: ...
    def buffers(self) -> tuple[Geometry, tuple[int, ...]]:
        """(geometry, fds) of the buffers now held."""
    @property
    def stats(self) -> dict[str, int]: ...
    def last_error(self) -> tuple[int, str | None]: ...
    def close(self) -> None: ...

def available_streams(name: str, timeout_s: float) -> tuple[int, tuple[int, ...]]:
    """(code, stream ids) of server name's streams: code 0 with the ids, else the C error
    code and ()."""

# --- the wire formats (_wire.pxi) ---

def pack_packet(server_id: int, sequence: int, buffer_index: int, frame_id: int,
                timestamp_sof: int, timestamp_eof: int, valid: bool) -> bytes:
    """The 48 bytes of a frame packet."""

def parse_packet(data: Buffer) -> tuple[int, int, int, int, int, int, bool] | None:
    """(server_id, sequence, buffer_index, frame_id, sof, eof, valid) of a well-formed
    packet, else None."""

def encode_request(kind: int, stream: int) -> bytes: ...
def decode_request(data: Buffer) -> tuple[int, int] | tuple[None, str]:
    """(kind, stream), or (None, why) for a malformed request."""

def encode_status_reply(server_id: int, status: int) -> bytes: ...
def encode_list_reply(server_id: int, streams: Iterable[int]) -> bytes:
    """The ok reply to a list request (ids sorted; at most VIPC_MAX_STREAMS)."""

def encode_buffers_reply(server_id: int, stream: int, num_buffers: int, width: int,
                         height: int, stride: int, uv_offset: int, size: int,
                         map_size: int) -> bytes: ...
def decode_reply(data: Buffer, num_fds: int, kind: int, stream: int, page_size: int
                 ) -> tuple[int, str | None, int, tuple[int, ...] | None]:
    """(code, why, server_id, fields): code 0 with the buffers reply's fields or the list
    reply's stream ids; else the error code, why, and server_id."""

def geometry_layout(width: int, height: int, stride: int, uv_offset: int, size: int,
                    page_size: int) -> tuple[str | None, int, int, bool]:
    """(why the geometry describes no buffer, or None; trailer offset; map size; whether
    an NV12 UV plane fits)."""

# --- the frame copy (_frame_copy.pxi) ---

def copy_frame(dst: memoryview | bytearray, src: bytes | bytearray | memoryview,
               streaming: bool) -> None:
    """Copies ``src`` into ``dst`` (C-contiguous bytes of equal length), with streaming
    stores when ``streaming`` and CAN_STREAM."""
