"""Crash tests of the shared-memory ring: processes SIGKILLed mid-operation."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import struct
import zlib

import pytest
from helpers import wait_until

import msgq
from msgq import queues

pytestmark = [pytest.mark.crash, pytest.mark.multiprocess, pytest.mark.usefixtures("shm")]

FORK = mp.get_context("fork")
HEADER = struct.Struct("<IQI")  # round, sequence, crc32 of everything after the header


def publish_checksummed_forever(endpoint: str, round_no: int, started) -> None:
    pub = msgq.pub_sock(endpoint)
    started.set()
    rng = random.Random(round_no)
    seq = 0
    while True:
        body = rng.randbytes(rng.randint(0, 3000))
        pub.send(HEADER.pack(round_no, seq, zlib.crc32(body)) + body)
        seq += 1


def test_killed_publisher_never_tears_a_payload(endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint, segment_size=64 * 1024, timeout=5000)
    torn = 0
    for round_no in range(8):
        started = FORK.Event()
        child = FORK.Process(target=publish_checksummed_forever, args=(endpoint, round_no, started))
        child.start()
        assert started.wait(10)
        received, last_seq = 0, -1
        while received < 3000:
            msg = sub.receive()
            assert msg is not None, "publisher stopped sending"
            r, seq, crc = HEADER.unpack_from(msg)
            if zlib.crc32(msg[HEADER.size :]) != crc:
                torn += 1
            if r == round_no:
                assert seq > last_seq  # in order (gaps are allowed: we are the slow one)
                last_seq = seq
                received += 1
        os.kill(child.pid, signal.SIGKILL)  # somewhere inside send()
        child.join()
        for msg in msgq.drain_sock_raw(sub):
            r, seq, crc = HEADER.unpack_from(msg)
            torn += zlib.crc32(msg[HEADER.size :]) != crc
    assert torn == 0
    # the subscriber survived every crash and still takes a fresh publisher's messages
    pub = msgq.pub_sock(endpoint)
    pub.send(b"after the crashes")
    assert sub.receive() == b"after the crashes"


def hold_reader_slot(endpoint: str, ready, block_in_receive: bool) -> None:
    sub = msgq.sub_sock(endpoint)
    ready.release()
    if block_in_receive:
        sub.receive()  # asleep on the futex when killed
    else:
        signal.pause()


def test_killed_subscribers_free_their_slots(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    kills = 0
    for round_no in range(4):
        ready = FORK.Semaphore(0)
        children = [
            FORK.Process(target=hold_reader_slot, args=(endpoint, ready, i % 2 == 0))
            for i in range(queues.READER_SLOTS)
        ]
        for c in children:
            c.start()
        for _ in children:
            assert ready.acquire(timeout=30)
        assert pub.num_readers == queues.READER_SLOTS
        if round_no == 0:  # live subscribers are never evicted for a new one
            with pytest.raises(msgq.IpcError, match="reader slots"):
                msgq.sub_sock(endpoint)
        pub.send(b"wake the sleepers")
        for c in children:
            os.kill(c.pid, signal.SIGKILL)
        for c in children:
            c.join()
        kills += len(children)
        assert pub.num_readers == 0
    assert kills >= 256
    sub = msgq.sub_sock(endpoint, timeout=2000)
    pub.send(b"still served")
    assert sub.receive() == b"still served"
    assert pub.all_readers_updated()  # the dead ones are not waited for
    pub.send(b"one more")
    assert not pub.all_readers_updated()
    assert sub.receive() == b"one more"
    assert pub.all_readers_updated()


# --- issue 13: hostile processes ------------------------------------------------------------

WAKE_LINE = 128  # wake line, then the reader slots, up to the end of the header
HEADER_END = 64 * (3 + queues.READER_SLOTS)


def publish_numbered_forever(endpoint: str, started, size: int) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=64 * 1024)
    started.set()
    seq = 0
    while True:
        # every 8-byte word holds the sequence number: any mix of two messages shows
        pub.send(struct.pack("<Q", seq) * (size // 8))
        seq += 1


def test_damaged_control_fields_never_deliver_a_torn_message(endpoint: str) -> None:
    """Item 2: zeroing the wake line (where the active-readers mask was) and every reader
    slot while a lapped reader copies must not make it deliver overwritten bytes: the
    reader proves from write_reserve, not from its slot, that its copy is intact."""
    import mmap

    sub = msgq.sub_sock(endpoint, segment_size=64 * 1024, timeout=5000)
    started = FORK.Event()
    child = FORK.Process(target=publish_numbered_forever, args=(endpoint, started, 4096))
    child.start()
    try:
        assert started.wait(10)
        fd = os.open(queues.queue_path(endpoint), os.O_RDWR)
        m = mmap.mmap(fd, HEADER_END)
        os.close(fd)
        torn = received = 0
        zeros = bytes(HEADER_END - WAKE_LINE)
        while received < 3000:
            m[WAKE_LINE:HEADER_END] = zeros  # every slot, the mask, the waiting bits
            buf = bytearray(4096)
            n = sub.receive_into(buf)
            assert n == 4096, "publisher stopped sending"
            words = set(struct.unpack("<512Q", buf))
            torn += len(words) != 1
            received += 1
        m.close()
        assert sub.resets > 0, "the reader was never lapped: the test proved nothing"
        assert torn == 0
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()


def publish_until_told(endpoint: str, started, stop, sent) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=64 * 1024)
    started.set()
    n = 0
    while not stop.is_set():
        pub.send(struct.pack("<Q", n))
        n += 1
        sent.value = n


@pytest.mark.parametrize("attempt", range(3))
def test_zeroed_magic_under_live_processes_is_replaced_not_truncated(
    endpoint: str, attempt: int
) -> None:
    """Item 1: with a publisher and a subscriber live, zero the file's magic, then connect
    a new subscriber. The opener used to re-make the file in place (truncate to 0) under
    the live mappings, and the publisher died of SIGBUS. Now a new file is renamed into
    place; the publisher and the old subscriber notice and follow it."""
    old_sub = msgq.sub_sock(endpoint, segment_size=64 * 1024, timeout=5000)
    started, stop, sent = FORK.Event(), FORK.Event(), FORK.Value("q", 0)
    child = FORK.Process(target=publish_until_told, args=(endpoint, started, stop, sent))
    child.start()
    try:
        assert started.wait(10)
        seq = struct.Struct("<Q")
        # one of our publisher's numbers (not necessarily 0: on a loaded machine the
        # publisher laps this reader before its first receive, which then skips ahead).
        # The publisher counts a message after sending it, so message n can arrive while
        # the count still says n: at most the count, never beyond it.
        first = old_sub.receive()
        assert first is not None and len(first) == 8, first
        assert seq.unpack(first)[0] <= sent.value, (first, sent.value)
        path = queues.queue_path(endpoint)
        old_ino = os.stat(path).st_ino
        sent_before = sent.value
        with open(path, "r+b") as f:
            f.write(bytes(8))
        new_sub = msgq.sub_sock(endpoint, timeout=5000)
        assert os.stat(path).st_ino != old_ino
        assert new_sub.segment_size == 64 * 1024  # the damaged queue's size was kept
        got = new_sub.receive()
        assert got is not None, "the publisher did not follow the new file"
        # from our publisher, sent into the new file: after the damage
        assert len(got) == 8 and seq.unpack(got)[0] >= sent_before, got
        # the old subscriber reads what is left in the old file, then follows too: our
        # publisher's numbers, in order, none twice (gaps are the lapped reader's)
        (last,) = seq.unpack(first)
        for _ in range(100000):
            msg = old_sub.receive()
            assert msg is not None and len(msg) == 8, msg
            (number,) = seq.unpack(msg)
            assert number > last, f"{number} after {last}"
            last = number
            if queues.inspect_queue(path)["readers_claimed"] == 2:
                break
        else:
            raise AssertionError("the old subscriber never followed the new file")
        assert child.is_alive(), f"publisher died: exit code {child.exitcode}"
        before = sent.value
        wait_until(lambda: sent.value > before + 100, what="publisher to keep sending")
        # and both subscribers get what it sends now
        for sub in (old_sub, new_sub):
            while sub.receive(non_blocking=True) is not None:
                pass
            fresh = sub.receive()
            assert fresh is not None and seq.unpack(fresh)[0] > before, fresh
    finally:
        stop.set()
        child.join(10)
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
            child.join()
    assert child.exitcode == 0, f"publisher died: exit code {child.exitcode}"


def block_in_receive(endpoint: str, ready) -> None:
    sub = msgq.sub_sock(endpoint)
    ready.release()
    sub.receive()


def test_dead_sleeping_subscribers_are_reclaimed_without_a_newcomer(endpoint: str) -> None:
    """Item 3: subscribers killed while asleep in receive() used to keep their slots and
    their count in num_waiters until a new subscriber reclaimed a slot, and every send
    made a futex syscall for them. Now the publisher's sweep gives both back (a send
    wakes waiters only while the count of waiters is above 0: the count is the check)."""
    pub = msgq.pub_sock(endpoint, segment_size=1024 * 1024)
    payload = bytes(1024)
    path = queues.queue_path(endpoint)
    for _round in range(4):
        ready = FORK.Semaphore(0)
        children = [
            FORK.Process(target=block_in_receive, args=(endpoint, ready)) for _ in range(20)
        ]
        for c in children:
            c.start()
        for _ in children:
            assert ready.acquire(timeout=30)
        wait_until(lambda: queues.inspect_queue(path)["waiters"] == 20, what="sleepers")
        for c in children:
            os.kill(c.pid, signal.SIGKILL)
        for c in children:
            c.join()

        def reclaimed() -> bool:
            pub.send(payload)
            info = queues.inspect_queue(path)
            return info["waiters"] == 0 and info["readers_claimed"] == 0

        wait_until(reclaimed, timeout=5, what="the sweep")
    assert pub.reclaimed_slots == 80
    for _ in range(1000):  # and what was given back stays given back
        pub.send(payload)
    info = queues.inspect_queue(path)
    assert (info["waiters"], info["readers_claimed"], pub.reclaimed_slots) == (0, 0, 80), info
