"""Chaos matrix, shared-memory part (issue 13): real processes, real queue files, SIGKILL
at random moments, and random or targeted writes into a live queue file.

Each test runs for its budget (MSGQ_CHAOS_SECONDS, else a short CI budget; the three
together take about 30 s in CI) and reports its trials and outcomes (chaos_support.py).
Messages carry a generation, a sequence number and the CRC32 of their body, so every
subscriber checks every message it gets: a torn message is one whose body does not match.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import random
import signal
import struct
import time
import zlib

import pytest
from chaos_support import budget as chaos_budget
from chaos_support import report as chaos_report

import msgq
from msgq import queues

pytestmark = [pytest.mark.crash, pytest.mark.multiprocess, pytest.mark.slow,
              pytest.mark.usefixtures("shm")]

FORK = mp.get_context("fork")
HEADER = struct.Struct("<IQI")  # generation, sequence, crc32 of the body
STOP = b"stop"
SEGMENT = 2 * 1024 * 1024  # room for 256 KiB messages (a third of the ring each)


def _body(rng: random.Random, largest: int) -> bytes:
    # sizes from 1 B to `largest`, spread over the orders of magnitude
    return rng.randbytes(max(1, int(2 ** rng.uniform(0, largest.bit_length() - 1))))


def publish_hashed(endpoint: str, generation: int, largest: int, started) -> None:
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    started.set()
    rng = random.Random(generation)
    seq = 0
    while True:
        try:
            body = _body(rng, largest)
            pub.send(HEADER.pack(generation, seq, zlib.crc32(body)) + body)
        except msgq.MultiplePublishersError:
            pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)  # a scribbled token
        except msgq.IpcError as e:  # each file it followed was replaced again at once
            if "replaced under its name" not in str(e):
                raise
            pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
        seq += 1


def verify_messages(endpoint: str, ready, results, hang_s: float) -> None:
    """Receives until STOP; reports (received, torn, hangs, last generation, resets)."""
    sub = msgq.sub_sock(endpoint, segment_size=SEGMENT, timeout=int(hang_s * 1000))
    ready.release()
    received = torn = hangs = 0
    last_generation = -1
    while True:
        msg = sub.receive()
        if msg is None:
            hangs += 1  # nothing for hang_s while a publisher should be sending
            continue
        if msg == STOP:
            break
        if len(msg) < HEADER.size:
            torn += 1
            continue
        generation, _seq, crc = HEADER.unpack_from(msg)
        if zlib.crc32(msg[HEADER.size :]) != crc:
            torn += 1
            continue
        received += 1
        last_generation = max(last_generation, generation)
    results.put((received, torn, hangs, last_generation, sub.resets))


def _start_subscribers(endpoint: str, n: int, hang_s: float = 5.0):
    ready, results = FORK.Semaphore(0), FORK.Queue()
    subs = [FORK.Process(target=verify_messages, args=(endpoint, ready, results, hang_s))
            for _ in range(n)]
    for s in subs:
        s.start()
    for _ in subs:
        assert ready.acquire(timeout=30)
    return subs, results


def _stop_subscribers(endpoint: str, subs, results) -> list[tuple]:
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    deadline = time.monotonic() + 15
    while any(s.is_alive() for s in subs) and time.monotonic() < deadline:
        try:
            pub.send(STOP)  # again and again: a reader that was just reset may miss one
        except msgq.MultiplePublishersError:  # a live publisher took the endpoint back
            pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
        time.sleep(0.01)
    out = [results.get(timeout=10) for s in subs if s.exitcode == 0 or s.is_alive() is False]
    for s in subs:
        s.join(5)
        if s.is_alive():
            os.kill(s.pid, signal.SIGKILL)
            s.join()
    return out


def test_publisher_killed_mid_send(endpoint: str) -> None:
    """SIGKILL the publisher at random moments while it sends 1 B - 256 KiB messages;
    three subscribers verify every message and must follow each next publisher."""
    budget = chaos_budget(10)
    subs, results = _start_subscribers(endpoint, 3)
    rng = random.Random(1)
    trials = 0
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        started = FORK.Event()
        pub = FORK.Process(target=publish_hashed, args=(endpoint, trials, 256 * 1024, started))
        pub.start()
        assert started.wait(10)
        time.sleep(rng.uniform(0.001, 0.05))
        os.kill(pub.pid, signal.SIGKILL)
        pub.join()
        trials += 1
    # a last publisher that lives: everyone must be following it
    started = FORK.Event()
    last = FORK.Process(target=publish_hashed, args=(endpoint, trials, 256 * 1024, started))
    last.start()
    assert started.wait(10)
    time.sleep(0.3)
    os.kill(last.pid, signal.SIGKILL)
    last.join()
    out = _stop_subscribers(endpoint, subs, results)
    assert len(out) == 3, "a subscriber died"
    torn = sum(r[1] for r in out)
    hangs = sum(r[2] for r in out)
    followed = sum(r[3] == trials for r in out)
    chaos_report("publisher SIGKILL mid-send (3 verifying subscribers)", trials,
                 received=sum(r[0] for r in out), torn=torn, hangs=hangs,
                 followed_last_publisher=f"{followed}/3", signals=0)
    assert torn == 0 and hangs == 0 and followed == 3


def _connect_then_die(endpoint: str, mode: str, ready) -> None:
    sub = msgq.sub_sock(endpoint, segment_size=SEGMENT)
    ready.release()
    if mode == "receive":
        sub.receive()
    else:
        signal.pause()


def test_subscribers_killed_by_hundreds(endpoint: str) -> None:
    """SIGKILL subscribers while connecting, idle and asleep in receive(), in batches;
    with no new subscriber to help, the publisher alone must give every slot and
    waiting bit back (a send wakes sleepers only while waiting bits are set: with them
    given back, a send costs what it cost before)."""
    budget = chaos_budget(8)
    pub = msgq.pub_sock(endpoint, segment_size=SEGMENT)
    path = queues.queue_path(endpoint)
    payload = bytes(1024)
    rng = random.Random(2)
    killed = {"connecting": 0, "idle": 0, "receive": 0}
    not_reclaimed = 0
    trials = 0
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        ready = FORK.Semaphore(0)
        batch = []
        for _ in range(40):
            mode = rng.choice(("connecting", "idle", "receive"))
            p = FORK.Process(target=_connect_then_die, args=(endpoint, mode, ready))
            p.start()
            batch.append((p, mode))
        for p, mode in batch:
            if mode == "connecting":  # somewhere in connect, or just after
                os.kill(p.pid, signal.SIGKILL)
            else:
                assert ready.acquire(timeout=30)
        if rng.random() < 0.5:
            pub.send(b"wake the sleepers")
        for p, mode in batch:
            os.kill(p.pid, signal.SIGKILL)
            p.join()
            killed[mode] += 1
        trials += 1
        t_end = time.monotonic() + 10.0  # a condition: room for a loaded machine
        while True:
            pub.send(payload)
            info = queues.inspect_queue(path)
            if info["waiters"] == 0 and info["readers_claimed"] == 0:
                break
            if time.monotonic() > t_end:
                not_reclaimed += 1
                break
            time.sleep(0.001)
    for _ in range(1000):  # what was given back stays given back
        pub.send(payload)
    info = queues.inspect_queue(path)
    chaos_report("subscribers SIGKILLed by hundreds", sum(killed.values()),
                 batches=trials, **{f"killed_{k}": v for k, v in killed.items()},
                 not_reclaimed_in_10s=not_reclaimed)
    assert not_reclaimed == 0
    assert (info["waiters"], info["readers_claimed"]) == (0, 0), info


# Regions of a queue file (msgq_ring.h): offsets in the header, then the ring.
CONTROL_REGIONS = {
    "publisher line": (64, 128),  # write_pointer, write_reserve, token, pid, superseded, ...
    "wake line": (128, 192),  # notify_seq, waiting_readers
    "reader slots": (192, 64 * (3 + queues.READER_SLOTS)),
}


class LiveQueueFile:
    """A writable mapping of the file under an endpoint's name that follows the name: a
    write into `superseded` or the header makes the next opener replace the file, and the
    damage must go on in the file the live processes moved to, not in the orphan."""

    def __init__(self, endpoint: str) -> None:
        self.path = queues.queue_path(endpoint)
        self.inode = -1
        self.files = 0  # files mapped so far
        self.map: mmap.mmap | None = None

    def current(self) -> mmap.mmap:
        """The mapping of the file under the name now (re-mapped when it was replaced)."""
        inode = os.stat(self.path).st_ino
        if inode != self.inode or self.map is None:
            fd = os.open(self.path, os.O_RDWR)  # files are renamed into place: never absent
            try:
                mapped = mmap.mmap(fd, 0)
                inode = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            if self.map is not None:
                self.map.close()
            self.map, self.inode = mapped, inode
            self.files += 1
        return self.map

    def close(self) -> None:
        if self.map is not None:
            self.map.close()


def test_writes_into_a_live_queue_file(endpoint: str) -> None:
    """Random and targeted writes into every control region of a live queue file, then
    into the header line and the ring bytes: no signal, no hang, and no torn message
    from control-field damage (with data damage, only no signal and no hang). The writes
    follow the endpoint's file when damage makes an opener replace it."""
    budget = chaos_budget(10)
    subs, results = _start_subscribers(endpoint, 2, hang_s=10.0)
    started = FORK.Event()
    pub = FORK.Process(target=publish_hashed, args=(endpoint, 0, 4096, started))
    pub.start()
    assert started.wait(10)
    live = LiveQueueFile(endpoint)
    rng = random.Random(3)
    writes = {name: 0 for name in CONTROL_REGIONS}
    deadline = time.monotonic() + budget * 0.7
    while time.monotonic() < deadline:
        name = rng.choice(sorted(CONTROL_REGIONS))
        lo, hi = CONTROL_REGIONS[name]
        at = rng.randrange(lo, hi - 8) & ~7 if rng.random() < 0.7 else rng.randrange(lo, hi - 8)
        kind = rng.random()
        if kind < 0.3:
            value = bytes(8)  # cleared
        elif kind < 0.5:
            value = b"\xff" * 8
        else:
            value = rng.randbytes(8)
        live.current()[at : at + 8] = value
        writes[name] += 1
        time.sleep(rng.uniform(0, 0.002))
    assert pub.is_alive(), f"publisher died (exit code {pub.exitcode})"
    control_out = _stop_subscribers(endpoint, subs, results)
    control_torn = sum(r[1] for r in control_out)
    control_hangs = sum(r[2] for r in control_out)
    control_files = live.files
    # now the ring bytes and the immutable header too (a damaged header is replaced by
    # the next opener; the live processes follow the new file)
    subs, results = _start_subscribers(endpoint, 2, hang_s=10.0)
    data_writes = 0
    deadline = time.monotonic() + budget * 0.3
    while time.monotonic() < deadline:
        m = live.current()
        if rng.random() < 0.05:
            at = rng.randrange(0, 56)
        else:
            capacity = len(m) - 64 * (3 + queues.READER_SLOTS)
            at = 64 * (3 + queues.READER_SLOTS) + rng.randrange(0, capacity - 8)
        m[at : at + 8] = rng.randbytes(8)
        data_writes += 1
        time.sleep(rng.uniform(0, 0.002))
    alive = pub.is_alive()
    data_out = _stop_subscribers(endpoint, subs, results)
    os.kill(pub.pid, signal.SIGKILL)
    pub.join()
    live.close()
    chaos_report("writes into a live queue file", sum(writes.values()) + data_writes,
                 **{f"writes_{k.replace(' ', '_')}": v for k, v in writes.items()},
                 writes_header_and_ring=data_writes, files_written_control=control_files,
                 files_written_in_all=live.files,
                 torn_from_control_damage=control_torn, hangs=control_hangs + sum(
                     r[2] for r in data_out),
                 publisher_survived=alive, subscribers_survived=len(control_out) + len(data_out),
                 delivered=sum(r[0] for r in control_out + data_out))
    assert len(control_out) == 2 and len(data_out) == 2, "a subscriber died"
    assert alive, "the publisher died"
    assert control_torn == 0
    assert control_hangs == 0 and sum(r[2] for r in data_out) == 0
