"""Chunks for large messages in the shared-memory backend (docs/ring.md, P1-P6) between
processes: on by default, the file, ring and limits of the plain ring, a burst the plain
ring holds held whole, large messages through every receive API, a publisher SIGKILLed
inside ``reserve()``, a reader SIGKILLed holding a view."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import struct

import pytest
from helpers import wait_until

import msgq
from msgq.queues import queue_dir

pytestmark = [pytest.mark.multiprocess]

FORK = mp.get_context("fork")
SEGMENT = 10 * 1024 * 1024
MIB = 1024 * 1024
#: Header fields of a queue file (msgq_ring.h): capacity at 24, flags at 44, ring at 48.
CAPACITY = struct.Struct("<I")
FLAG_POOL = 2


@pytest.fixture(autouse=True)
def shm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_BACKEND", "msgq")
    monkeypatch.delenv("ZMQ", raising=False)
    monkeypatch.delenv("MSGQ_POOL", raising=False)  # on by default


def message(seq: int, size: int) -> bytes:
    """Message ``seq`` of ``size`` bytes (a multiple of 8): every 8-byte word is ``seq``,
    so a torn message (parts of two) is seen."""
    return seq.to_bytes(8, "little") * (size // 8)


def seq_of(data: bytes | memoryview | None) -> int:
    """The sequence of a whole message (else AssertionError)."""
    assert data is not None
    seq = int.from_bytes(data[:8], "little")
    assert data == message(seq, len(data)), "torn message"
    return seq


def header_field(endpoint: str, offset: int) -> int:
    with open(os.path.join(queue_dir(), f"msgq_{endpoint}"), "rb") as f:
        f.seek(offset)
        return CAPACITY.unpack(f.read(4))[0]


def test_chunks_are_the_default_with_the_plain_rings_size_and_limits(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    path = os.path.join(queue_dir(), f"msgq_{endpoint}")
    assert header_field(endpoint, 44) & FLAG_POOL
    assert header_field(endpoint, 48) == SEGMENT  # the ring is the whole segment
    pooled = (os.stat(path).st_size, pub.max_message_size)
    assert pub.max_message_size == 3_495_240  # (segment - 8) / 3, to 8 bytes, less 8
    pub.close()
    os.unlink(path)
    monkeypatch.setenv("MSGQ_POOL", "0")
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    assert not header_field(endpoint, 44) & FLAG_POOL
    assert header_field(endpoint, 48) == SEGMENT
    # Chunks take ring bytes: the file and the largest message are the same.
    assert (os.stat(path).st_size, pub.max_message_size) == pooled
    pub.close()


def test_a_burst_the_plain_ring_holds_is_held_whole(endpoint: str) -> None:
    # 1,200 messages (5.7 MiB) and 12 large ones in chunks (3.4 MiB), sent before the
    # reader reads one: the 10 MiB ring holds them all, chunks or not. (A segment split
    # into an eighth of ring and a pool, layout 4, held 250 of the small ones.)
    sizes = [300_000 if i % 100 == 50 else 5_000 for i in range(1_200)]
    sub = msgq.sub_sock(endpoint, segment_size=SEGMENT, timeout=0)
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    for seq, size in enumerate(sizes, 1):
        pub.send(message(seq, size))
    got = []
    while (data := sub.receive(non_blocking=True)) is not None:
        got.append((seq_of(data), len(data)))
    assert got == list(enumerate(sizes, 1))


def publish(endpoint: str, sizes: list[int], started, window) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    started.wait(10)
    for seq, size in enumerate(sizes, 1):
        # At most a few messages ahead of the reader: this test is about delivery, with
        # chunks reused, not about lapping.
        assert window.acquire(timeout=10)
        if seq % 2:
            pub.send(message(seq, size))
        else:
            with pub.reserve(size) as buf:
                buf[:] = message(seq, size)


def test_large_messages_reach_every_receive_api(endpoint: str) -> None:
    # 256 KiB and more travel in chunks; the last one is the largest message the queue
    # takes (a third of the segment), which stays inline (a fresh chunk of it would take
    # 32 bytes more than a third).
    sizes = [64 * 1024, MIB, 16 * 1024, 2 * MIB, 200 * 1024, 8] * 3 + [3_495_240]
    sub = msgq.sub_sock(endpoint, segment_size=SEGMENT, timeout=10_000)
    started = FORK.Event()
    window = FORK.Semaphore(2)
    child = FORK.Process(target=publish, args=(endpoint, sizes, started, window))
    child.start()
    buf = bytearray(4 * MIB)
    try:
        started.set()
        for seq, size in enumerate(sizes, 1):
            if seq % 3 == 0:
                data = sub.receive()
                assert data is not None and len(data) == size and seq_of(data) == seq
            elif seq % 3 == 1:
                n = sub.receive_into(buf)
                assert n == size and seq_of(memoryview(buf)[:n]) == seq
            else:
                with sub.receive_view() as view:
                    assert view is not None and len(view) == size and seq_of(view) == seq
            window.release()
    finally:
        child.join(10)
    assert child.exitcode == 0


def die_inside_reserve(endpoint: str, ready) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    pub.send(message(1, MIB))
    pub.send(message(2, MIB))
    with pub.reserve(MIB) as buf:
        buf[: MIB // 2] = message(3, MIB // 2)
        ready.set()
        os.kill(os.getpid(), signal.SIGKILL)


def test_publisher_killed_inside_a_chunk(endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint, segment_size=SEGMENT, timeout=5000)
    ready = FORK.Event()
    child = FORK.Process(target=die_inside_reserve, args=(endpoint, ready))
    child.start()
    child.join(10)
    assert child.exitcode == -signal.SIGKILL and ready.is_set()
    assert [seq_of(sub.receive()) for _ in range(2)] == [1, 2]
    assert sub.receive(non_blocking=True) is None  # the half-written one never appears
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)  # takes over
    for seq in range(10, 40):
        pub.send(message(seq, MIB))
        assert seq_of(sub.receive()) == seq


def hold_a_view(endpoint: str, holding) -> None:
    sub = msgq.sub_sock(endpoint, segment_size=SEGMENT, timeout=10_000)
    holding.set()  # subscribed
    with sub.receive_view() as view:
        assert view is not None
        os.kill(os.getpid(), signal.SIGKILL)


def test_reader_killed_holding_a_view_never_stops_the_publisher(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    live = msgq.sub_sock(endpoint, segment_size=SEGMENT, timeout=5000)
    holding = FORK.Event()
    child = FORK.Process(target=hold_a_view, args=(endpoint, holding))
    child.start()
    assert holding.wait(10)
    wait_until(lambda: pub.num_readers == 2)
    pub.send(message(1, MIB))
    child.join(10)
    assert child.exitcode == -signal.SIGKILL
    # The dead reader pins a chunk and is behind every message: the publisher goes on
    # (fresh chunks until its sweep frees the slot and the pin) and the live reader gets
    # everything whole.
    for seq in range(1, 60):
        if seq > 1:
            pub.send(message(seq, MIB))
        assert seq_of(live.receive()) == seq
