"""Typing stub of the extension ``msgq.visionipc._native`` (visionipc/_native.pyx): the
binding of visionipc.h, the C server and client that ``server.py`` and ``client.py``
wrap."""

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
