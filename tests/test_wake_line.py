"""The wake line (docs/ring.md I4): how many system calls a stream of sends makes.

A publisher that wakes sleeping readers takes their waiting bits. Before it did, the bits
stayed set until each woken reader ran again; on one CPU a woken reader cannot run until
the publisher yields, so every send of the publisher's time slice made a futex call
(0.24 per message in the paced benchmark, 0.75 of f742234's 1 KiB x1 rate).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import time

import pytest

import msgq
from msgq import queues

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("shm")]

FORK = mp.get_context("fork")
MESSAGES = 20_000
PAYLOAD = 256
BURST = 2_000
SEQ = struct.Struct("<Q")


def receive_all(endpoint: str, cpu: int, ready, result) -> None:
    os.sched_setaffinity(0, {cpu})
    sub = msgq.sub_sock(endpoint, timeout=5000)
    ready.set()
    expected = 0
    while expected < MESSAGES:
        msg = sub.receive()
        if msg is None:
            break
        if SEQ.unpack_from(msg)[0] != expected:
            break
        expected += 1
    result.put(expected)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_a_woken_reader_that_cannot_run_yet_costs_no_more_wakes(endpoint: str) -> None:
    """Publisher and subscriber on one CPU: every message arrives, in order, and the
    publisher wakes the reader about once per time it fell asleep, not once per send."""
    cpu = min(os.sched_getaffinity(0))
    pub = msgq.pub_sock(endpoint, segment_size=16 * 1024 * 1024)
    ready, result = FORK.Event(), FORK.Queue()
    child = FORK.Process(target=receive_all, args=(endpoint, cpu, ready, result))
    child.start()
    before = os.sched_getaffinity(0)
    try:
        assert ready.wait(30)
        pub.wait_for_readers()
        os.sched_setaffinity(0, {cpu})
        path = queues.queue_path(endpoint)
        wakes_before = queues.inspect_queue(path)["wakes"]
        body = bytes(PAYLOAD - SEQ.size)
        for i in range(MESSAGES):
            if i % BURST == 0:
                time.sleep(0.005)  # the reader drains the burst and falls asleep
            pub.send(SEQ.pack(i) + body)  # 5.3 MB in all: the ring never laps the reader
        os.sched_setaffinity(0, before)
        received = result.get(timeout=60)
        wakes = queues.inspect_queue(path)["wakes"] - wakes_before
    finally:
        os.sched_setaffinity(0, before)
        child.join(30)
        if child.is_alive():
            child.kill()
    assert received == MESSAGES
    # Bits left set until the reader ran made this about one wake per send while the
    # reader waited for the CPU; taken by the waker, at most one per sleep.
    assert wakes < MESSAGES * 0.05, f"{wakes} wakes for {MESSAGES} sends"
