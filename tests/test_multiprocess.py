"""Publishers and subscribers in separate processes, on every backend; Ctrl-C in blocking
calls."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import interrupt, wait_until_asleep

import msgq

pytestmark = pytest.mark.multiprocess

PROBE = b"__probe__"
SPAWN = mp.get_context("spawn")


def payloads(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    return [
        i.to_bytes(4, "little") + rng.randbytes(rng.choice([0, 3, 100, 5000, 70000]))
        for i in range(n)
    ]


def publish_after_handshake(endpoint: str, ready, seed: int, n: int) -> None:
    """Child: probe until the parent says its subscribers are live, then publish."""
    pub = msgq.pub_sock(endpoint)
    while not ready.wait(0.01):
        pub.send(PROBE)
    for p in payloads(seed, n):
        pub.send(p)


def wait_for_probe(sub, ready=None) -> None:
    sub.setTimeout(60_000)  # starting a process takes long on a loaded machine
    while (msg := sub.receive()) != PROBE:
        assert msg is not None, "publisher never showed up"
    if ready is not None:
        ready.set()


def receive_skipping_probes(sub, n: int) -> list[bytes]:
    """Exactly n messages from sub, probes left out."""
    out: list[bytes] = []
    sub.setTimeout(10000)
    while len(out) < n:
        msg = sub.receive()
        assert msg is not None, f"timed out after {len(out)} of {n}"
        if msg != PROBE:
            out.append(msg)
    return out


def test_cross_process_round_trip(backend: str, endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint)
    ready = SPAWN.Event()
    child = SPAWN.Process(target=publish_after_handshake, args=(endpoint, ready, 11, 400))
    child.start()
    try:
        wait_for_probe(sub, ready)
        assert receive_skipping_probes(sub, 400) == payloads(11, 400)
    finally:
        child.join(30)
    assert child.exitcode == 0


def test_poller_with_publishers_in_other_processes(backend: str, endpoint: str) -> None:
    poller = msgq.Poller()
    names = [f"{endpoint}_{i}" for i in range(3)]
    subs = {name: msgq.sub_sock(name, poller=poller, timeout=10000) for name in names}
    readies = [SPAWN.Event() for _ in names]
    children = [
        SPAWN.Process(target=publish_after_handshake, args=(name, ev, i, 200))
        for i, (name, ev) in enumerate(zip(names, readies, strict=True))
    ]
    for c in children:
        c.start()
    try:
        for name, ev in zip(names, readies, strict=True):
            wait_for_probe(subs[name], ev)
        got: dict[str, list[bytes]] = {name: [] for name in names}
        deadline = time.monotonic() + 30
        while any(len(v) < 200 for v in got.values()):
            assert time.monotonic() < deadline, {k: len(v) for k, v in got.items()}
            for sock in poller.poll(1000):
                for msg in msgq.drain_sock_raw(sock):
                    if msg != PROBE:
                        got[sock.endpoint].append(msg)
        for i, name in enumerate(names):
            assert got[name] == payloads(i, 200)
    finally:
        for c in children:
            c.join(30)


def subscribe_and_hash(endpoint: str, n: int, seen_probe, results) -> None:
    """Child: subscribe, report the first probe, then hash n payloads."""
    sub = msgq.sub_sock(endpoint)
    wait_for_probe(sub)
    seen_probe.release()
    digest = hashlib.sha256()
    for msg in receive_skipping_probes(sub, n):
        digest.update(msg)
    results.put(digest.hexdigest())


def test_many_subscriber_processes(backend: str, endpoint: str) -> None:
    n, subscribers = 300, 6
    seen_probe = SPAWN.Semaphore(0)
    results = SPAWN.Queue()
    children = [
        SPAWN.Process(target=subscribe_and_hash, args=(endpoint, n, seen_probe, results))
        for _ in range(subscribers)
    ]
    for c in children:
        c.start()
    pub = msgq.pub_sock(endpoint)
    live = 0
    deadline = time.monotonic() + 60
    while live < subscribers:
        assert time.monotonic() < deadline
        pub.send(PROBE)
        while seen_probe.acquire(timeout=0.01):
            live += 1
    expected = hashlib.sha256(b"".join(payloads(5, n))).hexdigest()
    for p in payloads(5, n):
        pub.send(p)
    got = [results.get(timeout=60) for _ in children]
    for c in children:
        c.join(30)
    assert got == [expected] * subscribers


BLOCKED_CHILD = textwrap.dedent("""
    import sys, time, traceback, msgq
    sub = msgq.sub_sock(sys.argv[1])
    poller = msgq.Poller()
    poller.registerSocket(sub)
    print("ready", flush=True)
    try:
        if sys.argv[2] == "receive":
            sub.receive()
        else:
            poller.poll(-1)
    except KeyboardInterrupt as e:
        # Where it was raised: the frames below this one, innermost last.
        inner = [f.name.rsplit(".", 1)[-1] for f in traceback.extract_tb(e.__traceback__)[1:]]
        print(time.monotonic(), ",".join(inner), flush=True)
        sys.exit(0)
    sys.exit(3)
""")


@pytest.mark.parametrize("call", ["receive", "poll"])
def test_ctrl_c_interrupts_blocking_call(backend: str, endpoint: str, call: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKED_CHILD, endpoint, call],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        # After "ready" the child's only blocking system call is the one under test.
        wait_until_asleep(proc.pid)
        sent = time.monotonic()
        out, _ = interrupt(proc, 0)  # fails, with the output, if it hangs 30 s or dies
        caught, inner = out.split()
    finally:
        proc.kill()
    # Raised inside the call (not at its first line), and promptly: a generous bound, as
    # the machine running the tests may be loaded; the latency itself is not measured here.
    assert call in inner.split(","), inner
    assert float(caught) - sent < 5.0
