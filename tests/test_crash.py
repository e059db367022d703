"""Crash tests of the shared-memory ring: processes SIGKILLed mid-operation."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import struct
import zlib

import pytest

import msgq
from msgq import shm_backend

pytestmark = [pytest.mark.crash, pytest.mark.multiprocess]

FORK = mp.get_context("fork")
HEADER = struct.Struct("<IQI")  # round, sequence, crc32 of everything after the header


@pytest.fixture(autouse=True)
def shm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_BACKEND", "msgq")
    monkeypatch.delenv("ZMQ", raising=False)


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
            for i in range(shm_backend.READER_SLOTS)
        ]
        for c in children:
            c.start()
        for _ in children:
            assert ready.acquire(timeout=30)
        assert pub.num_readers == shm_backend.READER_SLOTS
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
