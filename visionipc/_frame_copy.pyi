"""Typing stub of the extension ``msgq.visionipc._frame_copy`` (visionipc/_frame_copy.pyx):
VisionIPC's frame copy with streaming stores for large frames."""

#: Whether this CPU and build can copy with non-temporal (streaming) stores.
CAN_STREAM: bool

def copy_frame(dst: memoryview | bytearray, src: bytes | bytearray | memoryview,
               streaming: bool) -> None:
    """Copies ``src`` into ``dst`` (C-contiguous bytes of equal length), with streaming
    stores when ``streaming`` and CAN_STREAM."""
