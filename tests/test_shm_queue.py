"""Behaviour specific to the shared-memory backend: queue files, sizes, reader slots,
publishers taking over, and the ring under wrap-around, overtaking and corruption."""

from __future__ import annotations

import mmap
import os
import random
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest
from helpers import rerun_in_own_namespace, wait_until_asleep

import msgq
from msgq import queues, shm_backend

pytestmark = pytest.mark.usefixtures("shm")


HEADER_SIZE = 64 * (3 + queues.READER_SLOTS)


# --- sizes ------------------------------------------------------------------------------


def test_oversized_message_is_value_error(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    sub = msgq.sub_sock(endpoint, timeout=100)
    biggest = pub.max_message_size
    assert biggest >= 4096 // 3 - 16
    pub.send(b"x" * biggest)
    assert sub.receive() == b"x" * biggest
    with pytest.raises(ValueError, match="larger segment_size"):
        pub.send(b"x" * (biggest + 1))
    assert sub.receive(non_blocking=True) is None  # nothing half-sent


@pytest.mark.parametrize("size", [1, 63, 2**32, -1])
def test_segment_size_out_of_range(endpoint: str, size: int) -> None:
    with pytest.raises(ValueError, match="segment"):
        msgq.pub_sock(endpoint, segment_size=size)
    assert not os.path.exists(queues.queue_path(endpoint))


def test_default_segment_size(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    assert pub.segment_size == queues.DEFAULT_SEGMENT_SIZE
    assert os.path.getsize(queues.queue_path(endpoint)) == HEADER_SIZE + pub.segment_size


def test_subscriber_adopts_existing_segment_size(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=8192)
    sub = msgq.sub_sock(endpoint, segment_size=65536)
    assert sub.segment_size == 8192
    pub.send(b"hi")
    assert sub.receive(non_blocking=True) == b"hi"


def test_publisher_needing_larger_ring_than_live_queue_is_refused(endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint, segment_size=8192)
    with pytest.raises(ValueError, match="smaller segment size"):
        msgq.pub_sock(endpoint, segment_size=65536)
    assert msgq.pub_sock(endpoint).segment_size == 8192  # 0 adopts
    sub.close()


def test_publisher_adopts_larger_live_queue(endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint)  # default size, created first
    pub = msgq.pub_sock(endpoint, segment_size=8192)
    assert pub.segment_size == queues.DEFAULT_SEGMENT_SIZE
    pub.send(b"fits")
    assert sub.receive(non_blocking=True) == b"fits"


def test_publisher_with_other_size_recreates_unused_queue(endpoint: str) -> None:
    old = msgq.pub_sock(endpoint, segment_size=8192)
    old.close()
    pub = msgq.pub_sock(endpoint, segment_size=65536)
    assert pub.segment_size == 65536
    sub = msgq.sub_sock(endpoint)
    pub.send(b"after resize")
    assert sub.receive(non_blocking=True) == b"after resize"


# --- files and names ------------------------------------------------------------------------


def test_queue_file_mode_is_private_by_default(endpoint: str) -> None:
    msgq.pub_sock(endpoint)
    assert stat.S_IMODE(os.stat(queues.queue_path(endpoint)).st_mode) == 0o600


def test_queue_file_mode_from_environment(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_SHM_MODE", "0640")
    msgq.pub_sock(endpoint)
    assert stat.S_IMODE(os.stat(queues.queue_path(endpoint)).st_mode) == 0o640


def test_prefixes_isolate_queues(
    endpoint: str, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    monkeypatch.setenv("MSGQ_PREFIX", prefix + "_a")
    pub_a = msgq.pub_sock(endpoint)
    sub_a = msgq.sub_sock(endpoint)
    path_a = queues.queue_path(endpoint)
    monkeypatch.delenv("MSGQ_PREFIX")
    monkeypatch.setenv("OPENPILOT_PREFIX", prefix + "_b")  # the upstream name works too
    sub_b = msgq.sub_sock(endpoint)
    path_b = queues.queue_path(endpoint)
    assert path_a != path_b and prefix + "_b" in path_b
    pub_a.send(b"only a")
    assert sub_a.receive(non_blocking=True) == b"only a"
    assert sub_b.receive(non_blocking=True) is None
    import shutil

    for p in (path_a, path_b):
        shutil.rmtree(os.path.dirname(p), ignore_errors=True)


def test_bad_prefix_is_value_error(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_PREFIX", "../escape")
    with pytest.raises(ValueError, match="PREFIX"):
        msgq.pub_sock(endpoint)


def test_bad_name_creates_nothing(prefix: str) -> None:
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(ValueError):
        msgq.pub_sock("../../tmp/evil")
    assert set(os.listdir("/dev/shm")) - before <= {prefix}


# --- corrupt queue files ----------------------------------------------------------------------


def _write_file(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _upstream_queue_bytes(segment_size: int = 1024 * 1024) -> bytes:
    """A queue file as upstream msgq (msgq.cc) leaves it under the same name: a 384-byte
    header (num_readers, write_pointer, write_uid, then 15 read pointers, valids and
    uids, all uint64) followed by the segment, no magic number."""
    header = struct.pack("<3Q", 2, (3 << 32) | 1024, 0xABCDEF)
    header += struct.pack("<15Q", *[(3 << 32) | 512] * 15)
    header += struct.pack("<15Q", *[1] * 15) + struct.pack("<15Q", *range(15))
    assert len(header) == 384
    return header + bytes(range(256)) * (segment_size // 256)


def _valid_queue_bytes(endpoint: str) -> bytes:
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    pub.close()
    with open(queues.queue_path(endpoint), "rb") as f:
        return f.read()


def _damaged(endpoint: str, offset: int, value: bytes) -> bytes:
    data = bytearray(_valid_queue_bytes(endpoint))
    data[offset : offset + len(value)] = value
    return bytes(data)


# Each: what is found under the queue's name, and whether it is a msgq file of this
# layout (then the replacer marks it superseded; anything else is left byte for byte).
_FOUND = {
    "garbage": lambda e: (b"garbage!" * 1000, False),
    "one-byte": lambda e: (b"\x01", False),
    "empty": lambda e: (b"", False),
    "upstream": lambda e: (_upstream_queue_bytes(), False),
    "random": lambda e: (random.Random(5).randbytes(HEADER_SIZE + 4096), False),
    "zero-magic": lambda e: (_damaged(e, 0, bytes(8)), True),
    "version": lambda e: (_damaged(e, 8, struct.pack("<I", 99)), False),
    "header_size": lambda e: (_damaged(e, 12, struct.pack("<I", 128)), False),
    "total_size": lambda e: (_damaged(e, 16, struct.pack("<Q", 1 << 40)), False),
    "capacity": lambda e: (_damaged(e, 24, struct.pack("<I", 1 << 30)), False),
    "reader_slots": lambda e: (_damaged(e, 28, struct.pack("<I", 3)), True),
    "truncated": lambda e: (_valid_queue_bytes(e)[: (HEADER_SIZE + 4096) // 2], False),
}


@pytest.mark.parametrize("found", sorted(_FOUND))
@pytest.mark.parametrize("first", ["publisher", "subscriber"])
def test_foreign_or_damaged_file_is_replaced_atomically(
    endpoint: str, found: str, first: str
) -> None:
    """Issue 12/13: a file under the queue's name that is not a queue this build can use
    (upstream msgq's, garbage, a damaged header) no longer blocks the endpoint. A new
    queue is renamed into place: the old inode is never truncated (whoever still maps it
    is unharmed) and, unless it is a msgq file of this layout, never written."""
    content, ours = _FOUND[found](endpoint)
    path = queues.queue_path(endpoint)
    _write_file(path, content)
    old_fd = os.open(path, os.O_RDONLY)  # a process that still has the old file
    try:
        old_ino = os.fstat(old_fd).st_ino
        if first == "publisher":
            pub = msgq.pub_sock(endpoint)
            sub = msgq.sub_sock(endpoint, timeout=1000)
        else:
            sub = msgq.sub_sock(endpoint, timeout=1000)
            pub = msgq.pub_sock(endpoint)
        assert os.stat(path).st_ino != old_ino
        assert queues.inspect_queue(path)["valid"]
        pub.send(b"through")
        assert sub.receive() == b"through"
        old = os.pread(old_fd, len(content) + 1, 0)
        assert len(old) == len(content)  # never truncated
        if not ours:
            assert old == content  # never written
    finally:
        os.close(old_fd)
    leftovers = [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".msgq-new")]
    assert leftovers == []


def test_replaced_damaged_queue_keeps_its_segment_size(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=8192)
    pub.close()
    path = queues.queue_path(endpoint)
    with open(path, "r+b") as f:
        f.write(bytes(8))  # zero the magic
    sub = msgq.sub_sock(endpoint)
    assert sub.segment_size == 8192


def _ring_map(endpoint: str) -> mmap.mmap:
    fd = os.open(queues.queue_path(endpoint), os.O_RDWR)
    try:
        return mmap.mmap(fd, 0)
    finally:
        os.close(fd)


@pytest.mark.parametrize("garbage", [2**62, -7, 2**31, 5, 3, 2**32 - 1], ids=str)
def test_garbage_size_prefix_resets_reader(endpoint: str, garbage: int) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    sub = msgq.sub_sock(endpoint)
    pub.send(b"A" * 40)
    pub.send(b"B" * 40)
    m = _ring_map(endpoint)
    m[HEADER_SIZE : HEADER_SIZE + 8] = struct.pack("<q", garbage)  # first message's size
    got = msgq.drain_sock_raw(sub)
    for msg in got:  # whatever it returns is a real message or a prefix-consistent slice
        assert len(msg) <= pub.max_message_size
    pub.send(b"C" * 40)
    assert msgq.drain_sock_raw(sub)[-1:] == [b"C" * 40]
    m.close()


def test_random_garbage_in_ring_never_crashes(endpoint: str) -> None:
    rng = random.Random(7)
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    sub = msgq.sub_sock(endpoint)
    m = _ring_map(endpoint)
    for _ in range(300):
        for _ in range(rng.randint(0, 5)):
            pub.send(rng.randbytes(rng.randint(0, 300)))
        start = HEADER_SIZE + rng.randrange(0, 4096 - 16)
        m[start : start + 8] = rng.randbytes(8)
        for msg in msgq.drain_sock_raw(sub):
            assert len(msg) <= pub.max_message_size
    # the reader slot itself may be scribbled on too (its position and valid word)
    slot0 = 64 * 3
    m[slot0 : slot0 + 12] = rng.randbytes(12)
    pub.send(b"may be lost: the reader notices the damage here and resets")
    msgq.drain_sock_raw(sub)
    pub.send(b"still works")
    assert msgq.drain_sock_raw(sub)[-1:] == [b"still works"]
    m.close()


# --- ring behaviour ---------------------------------------------------------------------------


def test_wrap_around_keeps_every_message(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=1024)
    sub = msgq.sub_sock(endpoint)
    rng = random.Random(3)
    for i in range(5000):  # many cycles of a tiny ring, read as we go
        msg = i.to_bytes(4, "little") + rng.randbytes(rng.randint(0, 200))
        pub.send(msg)
        assert sub.receive(non_blocking=True) == msg
    assert sub.resets == 0


def test_overtaken_reader_resets_and_goes_on(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=1024)
    slow = msgq.sub_sock(endpoint)
    for i in range(100):  # far more than the ring holds
        pub.send(i.to_bytes(4, "little") * 10)
    got = msgq.drain_sock_raw(slow)
    assert slow.resets >= 1  # it knows it lost messages
    assert len(got) < 100
    assert all(m == m[:4] * 10 for m in got)  # never a torn message
    for i in range(100, 110):  # after the reset it follows the publisher again
        pub.send(i.to_bytes(4, "little") * 10)
    assert msgq.drain_sock_raw(slow)[-10:] == [
        i.to_bytes(4, "little") * 10 for i in range(100, 110)
    ]


def _echo(endpoint: str, ready, stop: bytes) -> None:
    """Child: sends every message of ``endpoint`` back on ``endpoint + "_echo"``."""
    back = msgq.pub_sock(endpoint + "_echo", segment_size=1 << 20)
    sub = msgq.sub_sock(endpoint, timeout=10_000, segment_size=1 << 20)
    ready.release()
    msg = sub.receive()
    while msg is not None and msg != stop:
        back.send(msg)
        msg = sub.receive()


def test_ring_start_is_reused_while_a_reader_in_another_process_keeps_up(
    endpoint: str,
) -> None:
    """A request/response pattern: the reader (another process) has read everything
    before each send, so the publisher wraps early and the ring's bytes in use stay
    within its first 256 KiB and a message, instead of walking the whole MiB."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    pub = msgq.pub_sock(endpoint, segment_size=1 << 20)
    pong = msgq.sub_sock(endpoint + "_echo", timeout=10_000, segment_size=1 << 20)
    ready = ctx.Semaphore(0)
    child = ctx.Process(target=_echo, args=(endpoint, ready, b"stop"))
    child.start()
    assert ready.acquire(timeout=10)
    path = queues.queue_path(endpoint)
    rng = random.Random(5)
    highest = 0
    for i in range(600):
        msg = i.to_bytes(4, "little") + rng.randbytes(8188)
        pub.send(msg)
        assert pong.receive() == msg
        highest = max(highest, queues.inspect_queue(path)["write_offset"])
    pub.send(b"stop")
    child.join(10)
    assert child.exitcode == 0
    assert pub.early_wraps >= 600 * 8200 // (256 * 1024 + 8200) - 1
    assert highest <= 256 * 1024 + 8200


def test_reader_that_stops_after_an_early_wrap_loses_nothing_a_ring_holds(
    endpoint: str,
) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=64 * 1024)
    sub = msgq.sub_sock(endpoint)
    i = 0
    while pub.early_wraps == 0:  # read as we go until the writer goes back early
        i += 1
        pub.send(i.to_bytes(4, "little") * 250)
        if pub.early_wraps == 0:
            assert sub.receive(non_blocking=True) == i.to_bytes(4, "little") * 250
    first_unread = i
    while i < first_unread + 60:  # 60 x 1008 B: most of the ring, the reader asleep
        i += 1
        pub.send(i.to_bytes(4, "little") * 250)
    got = msgq.drain_sock_raw(sub)
    assert got == [n.to_bytes(4, "little") * 250 for n in range(first_unread, i + 1)]
    assert sub.resets == 0 and pub.early_wraps == 1


def test_conflate_skips_to_newest_across_wraps(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    sub = msgq.sub_sock(endpoint, conflate=True)
    path = queues.queue_path(endpoint)
    for rnd in range(10):
        for i in range(300):  # 48 B each: 14,400 bytes, 3.5 rings' worth per round
            pub.send(b"%04d" % (rnd * 1000 + i) * 10)
        assert sub.receive(non_blocking=True) == b"%04d" % (rnd * 1000 + 299) * 10
        assert sub.receive(non_blocking=True) is None
    assert queues.inspect_queue(path)["write_cycle"] >= 30  # it really wrapped


def test_conflate_on_a_lapped_reader_gets_the_newest(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    sub = msgq.sub_sock(endpoint, conflate=True)
    plain = msgq.sub_sock(endpoint)
    for i in range(2000):  # laps both readers many times
        pub.send(b"%05d" % i * 8)
    assert sub.receive(non_blocking=True) == b"01999" * 8
    assert sub.receive(non_blocking=True) is None
    msgq.drain_sock_raw(plain)
    assert plain.resets > 0  # the plain reader was lapped, the conflating one too


def _conflate_reader(endpoint: str, ready, out) -> None:
    sub = msgq.sub_sock(endpoint, conflate=True, timeout=5000)
    ready.release()
    msg = sub.receive()
    while msg is not None and msg != b"stop":
        out.put(msg)
        msg = sub.receive()


def test_conflate_across_processes(endpoint: str) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    ready, out = ctx.Semaphore(0), ctx.Queue()
    child = ctx.Process(target=_conflate_reader, args=(endpoint, ready, out))
    child.start()
    assert ready.acquire(timeout=10)
    last = -1
    for rnd in range(20):
        for i in range(200):  # wraps the ring between the child's reads
            pub.send(b"%06d" % (rnd * 1000 + i) * 4)
        # the child takes whatever is newest; it never sees an older one after a newer
        msg = out.get(timeout=10)
        value = int(msg[:6])
        assert msg == msg[:6] * 4 and value > last
        last = value
        while not out.empty():
            msg = out.get()
            assert int(msg[:6]) > last
            last = int(msg[:6])
    pub.send(b"stop")
    child.join(10)
    assert child.exitcode == 0
    assert last >= 19 * 1000  # it kept up with the newest rounds


def test_reserve_writes_in_place(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint)
    with pub.reserve(5) as buf:
        buf[:] = b"hello"
    assert sub.receive(non_blocking=True) == b"hello"
    with pytest.raises(RuntimeError):
        with pub.reserve(3) as buf:
            buf[:] = b"bye"
            raise RuntimeError("changed my mind")
    assert sub.receive(non_blocking=True) is None
    pub.send(b"next")
    assert sub.receive(non_blocking=True) == b"next"


def test_reserve_too_large(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=4096)
    with pytest.raises(ValueError):
        pub.reserve(pub.max_message_size + 1)


def test_second_publisher_takes_over(endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint)
    first = msgq.pub_sock(endpoint)
    first.send(b"1")
    second = msgq.pub_sock(endpoint)
    with pytest.raises(msgq.MultiplePublishersError):
        first.send(b"lost")
    second.send(b"2")
    assert msgq.drain_sock_raw(sub) == [b"1", b"2"]


def test_publisher_restart_keeps_subscribers(endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint)
    for generation in range(3):
        pub = msgq.pub_sock(endpoint)
        for i in range(10):
            pub.send(b"%d-%d" % (generation, i))
        pub.close()
    assert msgq.drain_sock_raw(sub) == [b"%d-%d" % (g, i) for g in range(3) for i in range(10)]


def test_readers_updated(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    # upstream's meaning: every reader, and at least one, has read everything
    assert not pub.all_readers_updated() and pub.num_readers == 0
    assert pub.wait_until_read(timeout=0.01) is False
    with pytest.raises(TimeoutError, match="did not connect"):
        pub.wait_for_readers(timeout=0.01)
    sub = msgq.sub_sock(endpoint)
    assert pub.num_readers == 1 and pub.all_readers_updated()
    pub.send(b"x")
    assert not pub.all_readers_updated()
    assert not pub.wait_until_read(timeout=0.01)
    with pytest.raises(TimeoutError, match="not every one read"):
        pub.wait_for_readers(timeout=0.01)
    sub.receive()
    assert pub.all_readers_updated() and pub.wait_until_read(timeout=0.01)
    assert pub.wait_for_readers() is None
    sub.close()
    assert not pub.all_readers_updated()


def test_reader_slots_are_bounded_and_reused(endpoint: str) -> None:
    subs = [msgq.sub_sock(endpoint) for _ in range(queues.READER_SLOTS)]
    with pytest.raises(msgq.IpcError, match="reader slots"):
        msgq.sub_sock(endpoint)
    subs.pop().close()
    again = msgq.sub_sock(endpoint)
    pub = msgq.pub_sock(endpoint)
    pub.send(b"all")
    assert all(s.receive(non_blocking=True) == b"all" for s in [*subs, again])


def test_forked_child_exit_keeps_parent_subscriber(endpoint: str) -> None:
    """A child that inherits sockets through fork() and exits normally (finalizers run)
    must not free the parent's reader slot or publisher ownership."""
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint)
    pid = os.fork()
    if pid == 0:  # child: drop the inherited copies the way interpreter shutdown does
        sub.close()
        pub.close()
        os._exit(0)
    os.waitpid(pid, 0)
    assert pub.num_readers == 1
    other = msgq.sub_sock(endpoint)  # must not be handed the parent's slot
    pub.send(b"both")
    assert sub.receive(non_blocking=True) == b"both"
    assert other.receive(non_blocking=True) == b"both"


def test_full_shm_folder_is_an_error_at_connect_not_a_crash_later(
    endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """On a 1 MiB tmpfs as the shm folder; without mount rights (not root), in a user
    and mount namespace of its own."""
    mount_point = tmp_path / "tinyshm"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mount_point)],
                             capture_output=True)
    if mounted.returncode != 0:
        rerun_in_own_namespace(request.node.nodeid, tmp_path / "in_namespace")
        return
    try:
        monkeypatch.setenv("MSGQ_SHM_DIR", str(mount_point))
        with pytest.raises(msgq.IpcError, match="full"):
            msgq.pub_sock(endpoint)  # 10 MiB default does not fit in 1 MiB
        pub = msgq.pub_sock(endpoint, segment_size=256 * 1024)  # the space was given back
        sub = msgq.sub_sock(endpoint)
        for _ in range(50):  # several passes over every page: no SIGBUS
            pub.send(b"x" * 60_000)
            assert sub.receive(non_blocking=True) == b"x" * 60_000
        pub.close()
        sub.close()
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_close_while_another_thread_receives_is_refused(endpoint: str) -> None:
    """Unmapping under a thread asleep in receive() crashed the process; now close()
    says the socket is busy, and works once the call has returned."""
    import threading

    sub = msgq.sub_sock(endpoint, timeout=2000)
    pub = msgq.pub_sock(endpoint)
    got: list[bytes | None] = []
    reader = threading.Thread(target=lambda: got.append(sub.receive()))
    reader.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # wait until it is inside the blocking call
        try:
            sub.close()
        except msgq.IpcError as e:
            assert "another thread" in str(e)
            break
        time.sleep(0.001)
    else:
        raise AssertionError("close() never found the receiving thread")
    pub.send(b"still mapped")
    reader.join(5)
    assert got == [b"still mapped"]
    sub.close()  # idle now


def test_close_abandons_open_reservation(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint)
    res = pub.reserve(4)
    buf = res.__enter__()
    pub.close()
    with pytest.raises(ValueError):  # released: writing cannot reach unmapped memory
        buf[:] = b"late"
    with pytest.raises(RuntimeError, match="closed or reconnected"):
        res.commit()
    pub.connect(msgq.context, endpoint)
    pub.send(b"fresh")  # not blocked by the abandoned reservation
    assert sub.receive(non_blocking=True) == b"fresh"


def test_prefix_folder_symlink_is_refused(endpoint: str, prefix: str, tmp_path) -> None:
    """A prefix "folder" that is a symlink would put queues outside the shm folder."""
    os.symlink(tmp_path, os.path.join("/dev/shm", prefix))
    try:
        with pytest.raises(msgq.IpcError):
            msgq.pub_sock(endpoint)
        assert os.listdir(tmp_path) == []
    finally:
        os.unlink(os.path.join("/dev/shm", prefix))


def test_queue_file_of_another_user_is_refused(endpoint: str) -> None:
    if os.geteuid() != 0:  # CI runs as root
        pytest.skip("needs root to make a file owned by another user (a user namespace "
                    "maps only our own uid)")
    path = queues.queue_path(endpoint)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o666)
    os.close(fd)
    os.chown(path, 65534, 65534)  # nobody, who could then forge our messages
    with pytest.raises(msgq.IpcError, match="another user"):
        msgq.sub_sock(endpoint)


def test_connect_blocked_on_a_stuck_lock_holder_answers_ctrl_c(endpoint: str) -> None:
    import fcntl
    import signal
    import subprocess
    import sys

    msgq.pub_sock(endpoint, segment_size=4096).close()
    fd = os.open(queues.queue_path(endpoint), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # like an opener stopped in a debugger
    try:
        child = subprocess.Popen(
            [sys.executable, "-c",
             "import sys, time, msgq\nprint('go', flush=True)\n"
             "try:\n    msgq.sub_sock(sys.argv[1])\n"
             "except KeyboardInterrupt:\n    print(time.monotonic(), flush=True)\n",
             endpoint], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
        assert child.stdout.readline().strip() == "go"
        wait_until_asleep(child.pid)  # waiting for the lock (in 50 ms slices)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        caught = float(child.stdout.readline())
        child.wait(10)
        assert caught - sent < 5.0  # promptly, not after the holder lets go (never here)
    finally:
        os.close(fd)


def test_queue_tools_give_way_to_an_opener_holding_the_lock(endpoint: str) -> None:
    """inspect_queue and remove_unused_queue wait at most 50 ms for an opener's lock,
    then say so; the path comes back as a str whatever form it was given in."""
    import fcntl

    msgq.pub_sock(endpoint, segment_size=4096).close()
    path = queues.queue_path(endpoint)
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # an opener creating or registering right now
    try:
        with pytest.raises(BlockingIOError):
            queues.inspect_queue(path)
        result = queues.remove_unused_queue(os.fsencode(path))
        assert result["path"] == path and not result["removed"]
        assert "another process" in result["kept_because"]
    finally:
        os.close(fd)
    assert os.path.exists(path)
    result = queues.remove_unused_queue(os.fsencode(path))  # unused once unlocked
    assert result["path"] == path and result["removed"]
    assert not os.path.exists(path)


def test_msgq_queues_lists_upstream_files_as_foreign(endpoint: str) -> None:
    import json
    import subprocess
    import sys

    path = queues.queue_path(endpoint)
    _write_file(path, _upstream_queue_bytes(64 * 1024))
    garbage = queues.queue_path(endpoint + "_garbage")
    _write_file(garbage, b"garbage!" * 1000)
    proc = subprocess.run(
        [sys.executable, "-m", "msgq", "queues", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    data = json.loads(proc.stdout)
    rows = data["queues"] if isinstance(data, dict) else data
    states = {q["endpoint"]: q["state"] for q in rows}
    assert states[endpoint] == "foreign"
    assert states[endpoint + "_garbage"] == "damaged"
    # and a publisher takes the endpoint over (the old file left for whoever maps it)
    pub = msgq.pub_sock(endpoint)
    pub.send(b"ours now")
    assert queues.inspect_queue(path)["valid"]


def test_checksummed_queue_drops_a_message_whose_bytes_were_changed(endpoint: str) -> None:
    pub = shm_backend.PubSocket()
    pub.connect(None, endpoint, 4096, checksum=True)
    sub = msgq.sub_sock(endpoint)
    assert pub.checksum and sub.checksum
    assert queues.inspect_queue(queues.queue_path(endpoint))["checksum"]
    pub.send(b"first message")
    pub.send(b"second")
    m = _ring_map(endpoint)
    m[HEADER_SIZE + 8 + 3] ^= 0x20  # one bit of the first payload, after it was sent
    m.close()
    assert sub.receive(non_blocking=True) == b"second"
    assert sub.checksum_errors == 1
    buf = bytearray(64)
    pub.send(b"third")
    assert sub.receive_into(buf, non_blocking=True) == 5 and buf[:5] == b"third"


def test_checksum_from_environment_and_kept_by_a_live_queue(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSGQ_CHECKSUM", "1")
    sub = msgq.sub_sock(endpoint)  # the creator picks it
    assert sub.checksum
    monkeypatch.delenv("MSGQ_CHECKSUM")
    pub = shm_backend.PubSocket()
    pub.connect(None, endpoint, checksum=False)  # a live queue keeps what it has
    assert pub.checksum
    pub.send(b"x")
    assert sub.receive(non_blocking=True) == b"x"
    sub.close()
    pub.close()
    pub.connect(None, endpoint, checksum=False)  # an unused one is replaced
    assert not pub.checksum
