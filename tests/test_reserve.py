"""``pub.reserve(n)``: one Reservation, one commit/abort protocol, on every backend (the
shared-memory ring's RingReservation and the ZMQ backend's BufferReservation are both
``msgq._reservation.Reservation``, the backend-neutral base), with and without the fake
layer."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
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


#: A buffer kept past its reserve() block in the ways users keep one, then the socket
#: closed (or reconnected) and the buffer written: the child ends in a one-line error or
#: finishes, never by a signal (issue 43: it was a segfault).
_KEPT_PAST_THE_BLOCK = """
import sys
import numpy as np
import msgq
from msgq.errors import IpcError
kind, ending = sys.argv[1], sys.argv[2]
pub = msgq.pub_sock("kept"); sub = msgq.sub_sock("kept", timeout=100)
with pub.reserve(1000) as buf:
    keep = {"slice": lambda: buf[:10], "memoryview": lambda: memoryview(buf),
            "numpy": lambda: np.frombuffer(buf, dtype=np.uint8)}[kind]()
    buf[:4] = b"abcd"
assert sub.receive() == b"abcd" + bytes(996)
try:
    if ending == "close":
        pub.close()
    else:
        pub.connect(msgq.context, "kept")
except IpcError as e:
    print("refused:", e)
else:
    print("not refused")
sub.close()
keep[0:4] = b"zzzz" if kind != "numpy" else np.frombuffer(b"zzzz", dtype=np.uint8)
del keep
pub.close()  # nothing kept any more: closes
print("closed")
"""


@pytest.mark.parametrize("ending", ["close", "reconnect"])
@pytest.mark.parametrize("kind", ["slice", "memoryview", "numpy"])
def test_a_buffer_kept_past_the_block_makes_close_refuse(kind: str, ending: str) -> None:
    child = subprocess.run([sys.executable, "-c", _KEPT_PAST_THE_BLOCK, kind, ending],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    refused, closed = child.stdout.splitlines()
    assert refused.startswith("refused: endpoint 'kept': a buffer of a reservation on this "
                              "socket is still in use"), refused
    assert "release it before closing or reconnecting" in refused
    assert closed == "closed"


def test_a_reservation_exports_only_while_open(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    res = pub.reserve(4)
    with res:
        again = memoryview(res)  # the reservation is the buffer its view is made from
        assert again.nbytes == 4 and not again.readonly
        again.release()
    with pytest.raises(BufferError, match="committed or aborted"):
        memoryview(res)
    pub.close()


def test_a_buffer_held_at_commit_neither_loses_the_message_nor_blocks_the_socket(
        backend: str, fake_layer: bool, endpoint: str) -> None:
    """issue 43 item 2: releasing the block's view fails (BufferError) while something
    holds a buffer exported by it (pickle.PickleBuffer here; C extensions that keep a
    Py_buffer do the same); that once raised out of the block, lost the message and left
    the socket waiting for a reservation that would never end."""
    pub, sub = connect_pair(endpoint, timeout=5000)
    with pub.reserve(4) as buf:  # type: ignore[attr-defined]
        held = pickle.PickleBuffer(buf)
        arr = np.frombuffer(buf, dtype=np.uint8)
        arr[:] = [1, 2, 3, 4]
    assert sub.receive() == b"\x01\x02\x03\x04"  # type: ignore[attr-defined]
    with pytest.raises(KeyError):  # an abandoned one, still held
        with pub.reserve(4) as buf:  # type: ignore[attr-defined]
            held2 = pickle.PickleBuffer(buf)
            raise KeyError("abandon")
    with pub.reserve(2) as buf:  # type: ignore[attr-defined]  # the socket is free
        buf[:] = b"ok"
    pub.send(b"next")  # type: ignore[attr-defined]
    assert sub.receive() == b"ok"  # type: ignore[attr-defined]
    assert sub.receive() == b"next"  # type: ignore[attr-defined]
    del held, held2, arr
    pub.close()  # type: ignore[attr-defined]
    sub.close()  # type: ignore[attr-defined]


#: A reservation, its socket and a slice of its view in one garbage cycle: the collector
#: empties the reservation (tp_clear) before the slice lets go of its buffer, and the
#: release must not count on a socket that is gone (it wrote through None: a segfault
#: in a later collection; found by tests/test_api_sequences.py).
_GARBAGE_CYCLE = """
import gc
import msgq
for _ in range(300):
    pub = msgq.pub_sock("cycle", segment_size=0x4000)
    res = pub.reserve(10)
    with res as buf:
        keep = buf[:5]
    cycle = [keep, res, pub]
    cycle.append(cycle)
    del keep, res, pub, buf, cycle
    gc.collect()
print("collected")
"""


def test_a_reservation_collected_in_a_cycle_with_its_buffer() -> None:
    child = subprocess.run([sys.executable, "-c", _GARBAGE_CYCLE], capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert child.stdout.strip() == "collected"


#: A slice of a reserve() block kept while another process damages the queue file and
#: its next opener renames a new queue into place: the socket's next send follows the
#: endpoint to the new file (msgq.h O6), and the old ring stays mapped under the slice
#: until the slice is released (O8), then is unmapped (counted in /proc/self/maps).
_REPLACED_UNDER_A_KEPT_SLICE = """
import os, subprocess, sys
import msgq
from msgq import shm_backend
ep = sys.argv[1]
def old_mappings():  # of the first queue file, by its inode
    with open("/proc/self/maps") as f:
        return sum(line.split()[4] == str(first) for line in f)
pub = msgq.pub_sock(ep, segment_size=0x4000)
first = os.stat(shm_backend.queue_path(ep)).st_ino
with pub.reserve(100) as buf:
    kept = buf[:16]
code = (f"import msgq; from msgq import shm_backend\\n"
        f"with open(shm_backend.queue_path({ep!r}), 'r+b') as f: f.write(bytes(8))\\n"
        f"msgq.pub_sock({ep!r}, segment_size=0x4000).close()\\n")
subprocess.run([sys.executable, "-c", code], check=True)
pub.send(b"after")  # follows to the new file
kept[:4] = b"zzzz"  # lands in the old, unlinked file
print(old_mappings(), bytes(kept[:4]).decode())
del kept
print(old_mappings())
pub.send(b"again")
pub.close()
print("closed")
"""


def test_a_queue_file_replaced_under_a_kept_slice_stays_mapped_until_it_goes(
        prefix: str, endpoint: str) -> None:
    child = subprocess.run([sys.executable, "-c", _REPLACED_UNDER_A_KEPT_SLICE, endpoint],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert child.stdout.splitlines() == ["1 zzzz", "0", "closed"]
