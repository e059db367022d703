"""The copy of the copying send: a frame into a shared buffer.

Small and medium frames go through ``memcpy`` (numpy, or the C helper). Frames from
:data:`STREAMING_FROM` bytes are written with non-temporal stores by the C helper
(``visionipc/src/frame_copy.c``, bound in ``msgq.visionipc._native``): once frame and
buffers exceed the last-level cache, ``memcpy`` spends half its bandwidth reading
destination lines it is about to overwrite and evicting the source; streaming stores go
straight to memory (measured on a 2-vCPU EPYC: 3840x2160 NV12 at 2.0x memcpy's frame
rate, while 1928x1208, which stays in the 32 MiB L3, is faster with memcpy). Without the
C helper (a build without the extension) every copy uses numpy.
"""

from __future__ import annotations

import glob

import numpy as np
import numpy.typing as npt

try:
    from ._native import CAN_STREAM as _CAN_STREAM
    from ._native import copy_frame as _copy_frame
except ImportError:  # extension not built
    _copy_frame = None
    _CAN_STREAM = False

__all__ = ["STREAMING_FROM", "copy_into", "streaming_available"]

#: Assumed last-level cache when sysfs does not tell (bytes).
DEFAULT_LLC = 32 << 20


def _last_level_cache() -> int:
    """Bytes of the largest CPU cache of cpu0, from sysfs (DEFAULT_LLC if unknown)."""
    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or DEFAULT_LLC


#: Frames of at least this many bytes are copied with streaming stores: a quarter of the
#: last-level cache (a few buffers of such frames no longer fit in it).
STREAMING_FROM = max(1 << 20, _last_level_cache() // 4)


def streaming_available() -> bool:
    """True when large frames are copied with streaming stores (C helper built, x86-64)."""
    return _copy_frame is not None and _CAN_STREAM


def copy_into(dst: npt.NDArray[np.uint8], src: npt.NDArray[np.uint8]) -> None:
    """Copies the flat uint8 array ``src`` into ``dst`` (same length), without the GIL."""
    if _copy_frame is not None:
        _copy_frame(dst, src, src.nbytes >= STREAMING_FROM)
    else:
        np.copyto(dst, src)
