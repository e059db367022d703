# Included by _native.pyx (the extension msgq.visionipc._native): the binding of
# visionipc/src/frame_copy.c, the copy of VisionIPC's copying send (frame_copy.py).

cdef extern from "src/frame_copy.h":
    void vipc_copy_frame(void *dst, const void *src, size_t n, int streaming) nogil
    int vipc_copy_can_stream()

#: True when this build can copy with non-temporal (streaming) stores.
CAN_STREAM = bool(vipc_copy_can_stream())


def copy_frame(unsigned char[::1] dst, const unsigned char[::1] src, bint streaming) -> None:
    """Copies ``src`` into ``dst`` (same length, ValueError otherwise) without the GIL;
    ``streaming`` uses non-temporal stores (for frames larger than the cache)."""
    cdef size_t n = src.shape[0]
    if <size_t>dst.shape[0] != n:
        raise ValueError(f"copy_frame: {src.shape[0]} bytes into {dst.shape[0]}")
    if n == 0:
        return
    with nogil:
        vipc_copy_frame(&dst[0], &src[0], n, streaming)
