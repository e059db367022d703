"""``pub.reserve(n)``: one Reservation, one commit/abort protocol, on every backend (the
shared-memory ring's RingReservation and the ZMQ backend's BufferReservation are both
``msgq._reservation.Reservation``, the backend-neutral base), with and without the fake
layer."""

from __future__ import annotations

import pytest
from helpers import connect_pair

import msgq
from msgq import _reservation, shm_backend


def test_every_backend_hands_out_the_one_reservation(backend: str, fake_layer: bool,
                                                     endpoint: str) -> None:
    pub, sub = connect_pair(endpoint, timeout=5000)
    res = pub.reserve(3)  # type: ignore[attr-defined]
    assert isinstance(res, _reservation.Reservation)
    with res as buf:
        buf[:] = b"abc"
    assert sub.receive() == b"abc"  # type: ignore[attr-defined]
    with pytest.raises(ValueError):  # the view ends with the block
        buf[0] = 1
    with pytest.raises(RuntimeError, match="already committed or aborted"):
        res.commit()
    res.abort()  # nothing left to drop
    with pytest.raises(KeyError):
        with pub.reserve(2) as buf:  # type: ignore[attr-defined]
            buf[:] = b"no"
            raise KeyError("abandon")
    pub.send(b"next")  # type: ignore[attr-defined]
    assert sub.receive() == b"next"  # type: ignore[attr-defined]  # the abandoned one never came


def test_close_and_reconnect_abandon_the_open_reservation(backend: str, endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    res = pub.reserve(4)
    buf = res.__enter__()
    pub.close()
    with pytest.raises(ValueError):  # released: writing cannot reach the closed queue
        buf[:] = b"late"
    with pytest.raises(RuntimeError, match="closed or reconnected"):
        res.commit()
    pub.connect(msgq.context, endpoint)
    res = pub.reserve(4)
    pub.connect(msgq.context, endpoint)
    with pytest.raises(RuntimeError, match="closed or reconnected"):
        res.commit()
    with pub.reserve(1) as buf:  # the abandoned ones block nothing
        buf[:] = b"z"
    pub.close()



def test_the_reservation_base_is_backend_neutral() -> None:
    """The base lives in its own small module (no C core), which the shared-memory
    extension re-exports under its old name."""
    assert shm_backend.Reservation is _reservation.Reservation
    assert issubclass(shm_backend.RingReservation, _reservation.Reservation)
