"""The frame copy of the copying send: exact bytes on every path (memcpy, streaming
stores, numpy fallback), every length and alignment."""

from __future__ import annotations

import numpy as np
import pytest

from msgq.visionipc import frame_copy


@pytest.mark.parametrize("streaming", [False, True])
def test_copy_frame_exact_for_odd_lengths_and_offsets(streaming: bool) -> None:
    # The extension is part of the product: when it did not build, this fails (no skip).
    from msgq.visionipc._native import copy_frame as copy
    rng = np.random.default_rng(5)
    source = rng.integers(0, 256, 70_000, dtype=np.uint8)
    for n in (1, 15, 16, 63, 64, 255, 256, 257, 4097, 65_537):
        for offset in (0, 1, 7, 16, 33):
            dst = np.zeros(n + 100, np.uint8)
            copy(dst[offset : offset + n], source[3 : 3 + n], streaming)
            assert (dst[offset : offset + n] == source[3 : 3 + n]).all()
            assert not dst[:offset].any() and not dst[offset + n :].any()
    with pytest.raises(ValueError):
        copy(np.zeros(10, np.uint8), source[:11], streaming)
    with pytest.raises((ValueError, TypeError, BufferError)):
        copy(bytes(10), source[:10], streaming)  # read-only destination


def test_copy_into_large_frame_and_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    n = frame_copy.STREAMING_FROM + 12345  # takes the streaming path where there is one
    source = np.random.default_rng(6).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n, np.uint8)
    frame_copy.copy_into(dst, source)
    assert (dst == source).all()
    monkeypatch.setattr(frame_copy, "_copy_frame", None)  # a build without the extension
    dst[:] = 0
    frame_copy.copy_into(dst, source)
    assert (dst == source).all()
    assert not frame_copy.streaming_available()
