"""Soak: a publisher restarted again and again (killed or exiting), four subscribers in
their own processes verifying every message, mixed sizes from 1 B to 256 KiB. Reports and
bounds each subscriber's resident memory and open file descriptors from start to end.

CI runs a short profile; ``MSGQ_CHAOS_SECONDS`` (set by ``scripts/chaos.sh --minutes N``)
makes it as long as asked."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import struct
import time
import zlib

import pytest

import msgq

pytestmark = [pytest.mark.crash, pytest.mark.multiprocess, pytest.mark.slow]

FORK = mp.get_context("fork")
#: generation (publisher incarnation), sequence, payload size, crc32 of the payload
HEADER = struct.Struct("<IQII")
SIZES = (1, 7, 64, 1000, 4096, 65_536, 256 * 1024 - HEADER.size)
SEGMENT = 4 << 20
SUBSCRIBERS = 4


def budget_s() -> float:
    return float(os.environ.get("MSGQ_CHAOS_SECONDS", "12"))


def resources() -> tuple[int, int]:
    """(resident bytes, open file descriptors) of this process."""
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return rss_pages * os.sysconf("SC_PAGE_SIZE"), len(os.listdir("/proc/self/fd"))


def payload(generation: int, seq: int, size: int) -> bytes:
    rng = random.Random(generation * 1_000_003 + seq)
    return rng.randbytes(size)


def publish(endpoint: str, generation: int, seconds: float, ready) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    ready.set()
    rng = random.Random(generation)
    deadline = time.monotonic() + seconds
    seq = 0
    while time.monotonic() < deadline:
        size = rng.choice(SIZES)
        body = payload(generation, seq, size)
        pub.send(HEADER.pack(generation, seq, size, zlib.crc32(body)) + body)
        seq += 1
        if seq % 64 == 0:
            time.sleep(0.001)  # a robot's service, not a flood: subscribers keep up
    pub.close()


def subscribe(endpoint: str, stop, ready, results) -> None:
    sub = msgq.sub_sock(endpoint, segment_size=SEGMENT, timeout=100)
    ready.set()
    received = corrupt = 0
    generations: set[int] = set()
    start: tuple[int, int] | None = None
    warm_after = time.monotonic() + 1.0
    while not stop.is_set():
        msg = sub.receive()
        if msg is None:
            continue
        generation, seq, size, crc = HEADER.unpack_from(msg)
        body = msg[HEADER.size:]
        if len(body) != size or zlib.crc32(body) != crc or body != payload(generation, seq, size):
            corrupt += 1
        received += 1
        generations.add(generation)
        if start is None and time.monotonic() > warm_after:
            start = resources()  # after the first allocations settled
    end = resources()
    results.put((received, corrupt, sorted(generations), start or end, end, sub.resets))


def test_soak_publisher_restarts_with_four_verifying_subscribers(endpoint: str) -> None:
    total = budget_s()
    stop = FORK.Event()
    results = FORK.Queue()
    subs = []
    for _ in range(SUBSCRIBERS):
        ready = FORK.Event()
        proc = FORK.Process(target=subscribe, args=(endpoint, stop, ready, results))
        proc.start()
        assert ready.wait(30)
        subs.append(proc)
    rng = random.Random(11)
    generation, kills, exits = 0, 0, 0
    deadline = time.monotonic() + total
    while time.monotonic() < deadline:
        generation += 1
        ready = FORK.Event()
        seconds = rng.uniform(0.3, 1.2)
        pub = FORK.Process(target=publish, args=(endpoint, generation, seconds, ready))
        pub.start()
        assert ready.wait(30)
        if rng.random() < 0.5:
            time.sleep(rng.uniform(0.05, seconds))
            os.kill(pub.pid, signal.SIGKILL)  # mid-send, most likely
            kills += 1
        else:
            exits += 1
        pub.join(30)
        assert pub.exitcode is not None, "publisher hung"
    time.sleep(0.3)
    stop.set()
    reports = [results.get(timeout=30) for _ in subs]
    for proc in subs:
        proc.join(30)
        assert proc.exitcode == 0, "a subscriber died"

    rows = [("subscriber", "received", "corrupt", "generations", "resets", "RSS start MiB",
             "RSS end MiB", "fds start", "fds end")]
    for i, (received, corrupt, gens, (rss0, fd0), (rss1, fd1), resets) in enumerate(reports):
        rows.append((str(i), str(received), str(corrupt), f"{len(gens)}/{generation}",
                     str(resets), f"{rss0 / 2**20:.1f}", f"{rss1 / 2**20:.1f}", str(fd0),
                     str(fd1)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    print(f"\nsoak: {total:.0f} s, {generation} publishers ({kills} killed, {exits} exited)")
    for r in rows:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))

    for received, corrupt, gens, (rss0, fd0), (rss1, fd1), _ in reports:
        assert corrupt == 0
        assert received > 0
        # every publisher incarnation that lived long enough reached every subscriber
        assert len(gens) >= generation - 1, f"followed {len(gens)} of {generation} publishers"
        assert fd1 == fd0, "file descriptors leaked across publisher restarts"
        assert rss1 - rss0 < 16 * 2**20, "resident memory grew by more than 16 MiB"
