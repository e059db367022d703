"""``SubSocket.receive_view``: a message used where it lies, and a reader that is told
when the publisher overwrote it meanwhile.

The API on every backend and under the fake layer, the rules around an open view
(no second receive, no close while a memoryview of it lives), and the property that
matters: a publisher process lapping a reader that holds views, killed with SIGKILL and
replaced mid-run, never leaves that reader with torn bytes it was not told about.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from helpers import connect_pair

import msgq
from msgq import queues

#: Payload of the stress publisher: seq (u64), then `size - 16` bytes derived from it,
#: then seq again; a torn message shows as a mismatch somewhere.
HEADER = struct.Struct("<Q")


def payload(seq: int, size: int) -> bytes:
    body = bytes((seq * 7 + i) & 0xFF for i in range(size - 16))
    return HEADER.pack(seq) + body + HEADER.pack(seq)


def test_view_reads_the_message_in_place(backend: str, endpoint: str) -> None:
    pub, sub = connect_pair(endpoint, timeout=5000)
    pub.send(b"hello view")
    with sub.receive_view() as view:
        assert isinstance(view, memoryview)
        assert view.readonly
        assert bytes(view) == b"hello view"
        with pytest.raises(TypeError):
            view[0] = 1  # read-only
    with sub.receive_view(non_blocking=True) as view:
        assert view is None  # nothing left: as receive
    pub.send(b"")
    with sub.receive_view() as view:
        assert view is not None and len(view) == 0  # an empty message is not "none"
    pub.send(b"next")
    assert sub.receive() == b"next"  # the views advanced the reader


def test_view_under_the_fake_layer(backend: str, endpoint: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEREAL_FAKE", "1")
    monkeypatch.setenv("CEREAL_FAKE_PREFIX", f"view_{os.getpid()}")
    pub, sub = connect_pair(endpoint, timeout=5000)
    assert type(sub).__name__ == "FakeSubSocket"
    pub.send(b"through the gate")
    with sub.receive_view() as view:
        assert bytes(view) == b"through the gate"


def test_timeout_gives_none(backend: str, endpoint: str) -> None:
    _pub, sub = connect_pair(endpoint, timeout=50)
    t0 = time.monotonic()
    with sub.receive_view() as view:
        assert view is None
    assert time.monotonic() - t0 >= 0.04


def test_an_open_view_holds_the_socket(endpoint: str) -> None:
    np = pytest.importorskip("numpy")
    pub, sub = connect_pair(endpoint, timeout=5000)
    pub.send(b"abcdefgh")
    pub.send(b"second")
    with sub.receive_view() as view:
        with pytest.raises(RuntimeError, match="receive_view block"):
            sub.receive(non_blocking=True)
        with pytest.raises(RuntimeError, match="receive_view block"):
            sub.receive_into(bytearray(16), non_blocking=True)
        with pytest.raises(RuntimeError, match="receive_view block"):
            sub.receive_view()
        with pytest.raises(msgq.IpcError, match="still in use"):
            sub.close()
        kept = np.frombuffer(view, dtype=np.uint8)  # outlives the block
    assert sub.receive() == b"second"
    with pytest.raises(msgq.IpcError, match="still in use"):
        sub.close()  # the array still points into the ring: it stays mapped
    assert kept.nbytes == 8
    del kept
    sub.close()


def test_an_exception_in_the_block_goes_on_unchanged(endpoint: str) -> None:
    pub, sub = connect_pair(endpoint, timeout=5000)
    pub.send(b"one")
    pub.send(b"two")
    with pytest.raises(KeyError):
        with sub.receive_view() as view:
            assert bytes(view) == b"one"
            raise KeyError("the block's own error")
    assert sub.receive() == b"two"  # the message used was consumed


def test_a_lapped_view_raises_message_overwritten(endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint, timeout=5000, segment_size=4096)
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    pub.send(b"x" * 100)
    with pytest.raises(msgq.MessageOverwritten, match="overwritten") as caught:
        with sub.receive_view() as view:
            first = bytes(view)
            for i in range(200):  # laps the 4 KiB ring several times
                pub.send(bytes([i & 0xFF]) * 100)
    assert isinstance(caught.value, msgq.IpcError)
    assert first == b"x" * 100
    assert sub.resets >= 1
    pub.send(b"after")
    assert sub.receive() == b"after"  # the reader went on from the writer


def test_a_checksummed_queue_checks_the_viewed_bytes(endpoint: str) -> None:
    pub = msgq.PubSocket()
    pub.connect(msgq.context, endpoint, checksum=True)  # the creator chooses checksums
    sub = msgq.sub_sock(endpoint, timeout=5000)
    assert sub.checksum
    pub.send(b"intact bytes")
    with sub.receive_view() as view:
        assert bytes(view) == b"intact bytes"
    pub.send(b"y" * 64)
    # A hostile writer flips a byte of the message in the queue file while it is viewed.
    with pytest.raises(msgq.MessageOverwritten, match="CRC32C"):
        with sub.receive_view() as view:
            path = queues.queue_path(endpoint)
            with open(path, "r+b") as f:
                data = f.read()
                at = data.index(b"y" * 64)
                f.seek(at + 10)
                f.write(b"z")
    assert sub.checksum_errors == 1


STRESS_PUBLISHER = textwrap.dedent("""
    import struct, sys, time
    import msgq
    endpoint, size, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pub = msgq.pub_sock(endpoint, segment_size=65536)
    print("ready", flush=True)
    seq = start
    while True:
        body = bytes((seq * 7 + i) & 0xFF for i in range(size - 16))
        pub.send(struct.pack("<Q", seq) + body + struct.pack("<Q", seq))
        seq += 1
        if seq % 64 == 0:
            time.sleep(0.0005)
""")


def _start_publisher(endpoint: str, size: int, start: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", STRESS_PUBLISHER, endpoint, str(size),
                             str(start)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.multiprocess
def test_views_are_never_silently_torn(endpoint: str) -> None:
    """A publisher process laps a reader that holds views; midway it is SIGKILLed and a
    new one takes over. Every view either was whole for its whole use, or its block
    raised MessageOverwritten: never torn bytes without the error."""
    size = 3000  # a 64 KiB ring holds about 21: the publisher laps a slow reader often
    sub = msgq.sub_sock(endpoint, timeout=2000, segment_size=65536)
    whole = overwritten = silently_torn = attempts = 0
    procs = [_start_publisher(endpoint, size, 1)]
    try:
        deadline = time.monotonic() + 6.0
        killed_at = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            if len(procs) == 1 and time.monotonic() > killed_at:
                procs[0].send_signal(signal.SIGKILL)  # at whatever point it is in a send
                procs[0].wait()
                procs.append(_start_publisher(endpoint, size, 10_000_000))
            attempts += 1
            try:
                with sub.receive_view() as view:
                    if view is None:
                        continue
                    before = bytes(view)
                    # Every third use is slow (lapped, mostly), the others quick (whole,
                    # mostly). Counted by attempts: counting by whole views could stay on
                    # a slow use for good once the publisher laps every one of them.
                    time.sleep(0.003 if attempts % 3 == 0 else 0.0002)
                    after = bytes(view)
                    looks_whole = (before == after and len(before) == size
                                   and before == payload(HEADER.unpack_from(before)[0], size))
                whole += 1
                if not looks_whole:
                    silently_torn += 1
            except msgq.MessageOverwritten:
                overwritten += 1
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert silently_torn == 0
    assert whole > 50, (whole, overwritten)
    assert overwritten > 0, "the publisher never lapped the reader: the test proved nothing"


def test_receive_view_is_part_of_the_protocol() -> None:
    assert "receive_view" in msgq.SubSocket.__abstractmethods__


def test_view_waits_for_a_message(endpoint: str) -> None:
    pub, sub = connect_pair(endpoint, timeout=5000)
    started = time.monotonic()

    def later() -> None:
        time.sleep(0.05)
        pub.send(b"late")

    thread = threading.Thread(target=later)
    thread.start()
    with sub.receive_view() as view:
        assert bytes(view) == b"late"
    thread.join()
    assert time.monotonic() - started >= 0.04


def test_recv_view_decodes_in_place(backend: str, endpoint: str) -> None:
    from msgq.messaging import new_message, recv_view

    sock = msgq.sub_sock("vehicleState", timeout=5000)
    pub = msgq.pub_sock("vehicleState")
    pub.wait_for_readers(timeout=5)
    msg = new_message("vehicleState", valid=True)
    msg.vehicleState.speed = 12.5
    pub.send(msg.to_bytes())
    with recv_view(sock) as event:
        assert event.which() == "vehicleState" and event.valid
        speed = event.vehicleState.speed
    assert speed == 12.5
    with recv_view(sock, non_blocking=True) as event:
        assert event is None
    sock.close()
    # A reader used after its block (and after close) reads stale bytes; it never
    # crashes the process.
    assert isinstance(event, type(None))


def test_recv_view_reader_misused_after_close_does_not_crash(endpoint: str) -> None:
    code = textwrap.dedent("""
        from msgq.messaging import new_message, pub_sock, recv_view, sub_sock
        sock = sub_sock("vehicleState", timeout=5000)
        pub = pub_sock("vehicleState")
        pub.wait_for_readers(timeout=5)
        msg = new_message("vehicleState")
        msg.vehicleState.speed = 4.25
        pub.send(msg.to_bytes())
        with recv_view(sock) as event:
            pass
        sock.close()
        print(event.vehicleState.speed)  # misuse: stale, but mapped
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4.25"


def test_recv_view_raises_when_lapped(endpoint: str) -> None:
    from msgq.messaging import new_message, recv_view

    sock = msgq.sub_sock(endpoint, timeout=5000, segment_size=4096)
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    pub.send(new_message("vehicleState").to_bytes())
    with pytest.raises(msgq.MessageOverwritten):
        with recv_view(sock) as event:
            assert event.which() == "vehicleState"
            for _ in range(100):
                pub.send(new_message("gyroscope").to_bytes())


#: A slice of a receive_view view kept while another process damages the queue file and
#: its next opener renames a new queue into place: the socket's next receive follows the
#: endpoint (msgq.h O6), and the old ring stays mapped under the slice until the slice is
#: released (O8), then is unmapped (counted in /proc/self/maps).
_REPLACED_UNDER_A_KEPT_VIEW = """
import os, subprocess, sys
import msgq
from msgq import shm_backend
ep = sys.argv[1]
def old_mappings():  # of the first queue file, by its inode
    with open("/proc/self/maps") as f:
        return sum(line.split()[4] == str(first) for line in f)
sub = msgq.sub_sock(ep, segment_size=0x4000, timeout=0)
first = os.stat(shm_backend.queue_path(ep)).st_ino
pub = msgq.pub_sock(ep, segment_size=0x4000)
pub.send(b"kept" * 4)
pub.close()  # only the subscriber maps the file now
with sub.receive_view() as view:
    kept = view[:16]
code = (f"import msgq; from msgq import shm_backend\\n"
        f"with open(shm_backend.queue_path({ep!r}), 'r+b') as f: f.write(bytes(8))\\n"
        f"msgq.pub_sock({ep!r}, segment_size=0x4000).close()\\n")
subprocess.run([sys.executable, "-c", code], check=True)
assert sub.receive() is None  # follows to the new file
print(old_mappings(), bytes(kept[:4]).decode())
del kept
print(old_mappings())
sub.close()
print("closed")
"""


def test_a_queue_file_replaced_under_a_kept_view_stays_mapped_until_it_goes(
        prefix: str, endpoint: str) -> None:
    child = subprocess.run([sys.executable, "-c", _REPLACED_UNDER_A_KEPT_VIEW, endpoint],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert child.stdout.splitlines() == ["1 kept", "0", "closed"]


def test_recv_view_reader_used_after_its_queue_file_was_replaced() -> None:
    # A decoder's reader keeps raw pointers into the ring (keep_readable): the mapping it
    # reads stays mapped for good, also when the socket follows a replaced queue file
    # (msgq.h O6, O8; the follow unmapped it: a segfault at the reader's next use).
    code = textwrap.dedent("""
        import subprocess, sys
        from msgq import shm_backend
        from msgq.messaging import new_message, pub_sock, recv_view, sub_sock
        sock = sub_sock("vehicleState", timeout=5000)
        pub = pub_sock("vehicleState")
        pub.wait_for_readers(timeout=5)
        msg = new_message("vehicleState")
        msg.vehicleState.speed = 4.25
        pub.send(msg.to_bytes())
        pub.close()
        with recv_view(sock) as event:
            pass
        path = shm_backend.queue_path("vehicleState")
        replace = (f"import msgq\\nwith open({path!r}, 'r+b') as f: f.write(bytes(8))\\n"
                   "msgq.pub_sock('vehicleState').close()\\n")
        subprocess.run([sys.executable, "-c", replace], check=True)
        sock.setTimeout(0)
        assert sock.receive() is None  # follows to the new file
        print(event.vehicleState.speed)  # misuse: stale, but mapped
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "4.25"
