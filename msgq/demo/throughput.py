"""The throughput demo: a publisher and subscribers in separate processes, and a report
of what flowed and how fast (``./run.sh throughput``).

    python -m msgq.demo.throughput            # 3 subscribers, 3 s, 1 KiB messages, full speed
    python -m msgq.demo.throughput --subscribers 5 --size 65536 --seconds 5
    python -m msgq.demo.throughput --rate 100 # paced like a 100 Hz sensor

Each message carries a sequence number and a CRC32 of its body; every subscriber checks
both, so the table shows messages lost (sequence gaps) and messages damaged (CRC
mismatches, which must always be 0).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import struct
import sys
import time
import uuid
import zlib
from dataclasses import asdict, dataclass

import msgq
from msgq import queues
from msgq.tables import format_table

HEADER = struct.Struct("<QI")  # sequence number, crc32 of the body
END = b"__end__"


@dataclass
class SubscriberReport:
    """What one subscriber saw."""

    name: str
    received: int
    lost: int
    damaged: int
    megabytes: float
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.received / self.seconds if self.seconds > 0 else 0.0


def run_subscriber(endpoint: str, name: str, ready, results) -> None:
    """Child process: receive until the end marker, checking sequence and CRC."""
    sub = msgq.sub_sock(endpoint, timeout=10_000)
    ready.release()
    received = lost = damaged = nbytes = 0
    expected = 0
    start = None
    while True:
        msg = sub.receive()
        if msg is None or msg == END:
            break
        if start is None:
            start = time.perf_counter()
        seq, crc = HEADER.unpack_from(msg)
        if zlib.crc32(memoryview(msg)[HEADER.size :]) != crc:
            damaged += 1
        lost += max(0, seq - expected)
        expected = seq + 1
        received += 1
        nbytes += len(msg)
    elapsed = time.perf_counter() - start if start is not None else 0.0
    results.put(SubscriberReport(name, received, lost, damaged, nbytes / 1e6, elapsed))


def run_publisher(endpoint: str, size: int, seconds: float, rate: float, go, results) -> None:
    """Child process: publish checksummed messages for ``seconds``."""
    segment_size = max(10 * 1024 * 1024, 8 * size)
    pub = msgq.pub_sock(endpoint, segment_size=segment_size)
    # Messages that fit in half the ring: the most we send before checking the readers.
    window = max(1, segment_size // (size + 16) // 2)
    body = random.Random(0).randbytes(max(0, size - HEADER.size))
    crc = zlib.crc32(body)
    go.wait()
    period = 1.0 / rate if rate > 0 else 0.0
    start = time.perf_counter()
    deadline = start + seconds
    seq = 0
    next_send = start
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        if period:
            if now < next_send:
                time.sleep(min(next_send - now, 0.01))
                continue
            next_send += period
        else:
            # Full speed, but never lap the slowest subscriber: after half a ring of
            # messages, wait for the readers, so the demo shows throughput without losses.
            if seq % window == window - 1:
                pub.wait_until_read(timeout=1.0, poll_interval=0.0)
        pub.send(HEADER.pack(seq, crc) + body)
        seq += 1
    elapsed = time.perf_counter() - start
    pub.wait_until_read(timeout=5.0)
    pub.send(END)
    results.put(("publisher", seq, elapsed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m msgq.demo.throughput",
        description="Publisher and subscribers in separate processes; prints what flowed "
        "and how fast.",
        epilog="example: python -m msgq.demo.throughput --subscribers 4 --size 65536 --seconds 5",
    )
    parser.add_argument("--subscribers", type=int, default=3, help="subscriber processes (3)")
    parser.add_argument("--size", type=int, default=1024, help="message size in bytes (1024)")
    parser.add_argument("--seconds", type=float, default=3.0, help="publishing time (3)")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="messages per second; 0 = as fast as the readers keep up (0)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.size < HEADER.size:
        parser.error(f"--size must be at least {HEADER.size}")
    if args.subscribers < 1:
        parser.error("--subscribers must be at least 1")

    # A namespace of its own: the demo never meets (or removes) anyone else's queues.
    os.environ["MSGQ_PREFIX"] = f"demo_{uuid.uuid4().hex[:8]}"
    endpoint = "demo"
    ctx = mp.get_context("spawn")
    ready, go, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    subs = [
        ctx.Process(target=run_subscriber, args=(endpoint, f"sub{i}", ready, results))
        for i in range(args.subscribers)
    ]
    pub = ctx.Process(
        target=run_publisher, args=(endpoint, args.size, args.seconds, args.rate, go, results)
    )
    try:
        for p in subs:
            p.start()
        for _ in subs:
            if not ready.acquire(timeout=30):
                print("a subscriber did not start", file=sys.stderr)
                return 1
        pub.start()
        if not args.json:
            print(
                f"backend {msgq.backend_name()}, {args.subscribers} subscribers, "
                f"{args.size} B messages, {args.seconds:g} s "
                f"({f'{args.rate:g} Hz' if args.rate else 'full speed'}) ...",
                flush=True,
            )
        go.set()
        reports: list[SubscriberReport] = []
        published = None
        for _ in range(args.subscribers + 1):
            item = results.get(timeout=args.seconds + 60)
            if isinstance(item, SubscriberReport):
                reports.append(item)
            else:
                published = item
        for p in [pub, *subs]:
            p.join(10)
    finally:
        for p in [pub, *subs]:
            if p.is_alive():
                p.kill()
        shutil.rmtree(queues.queue_dir(), ignore_errors=True)

    reports.sort(key=lambda r: r.name)
    sent = published[1] if published else 0
    if args.json:
        print(
            json.dumps(
                {
                    "published": sent,
                    "subscribers": [{**asdict(r), "msgs_per_s": r.msgs_per_s} for r in reports],
                },
                indent=2,
            )
        )
    else:
        print(f"published {sent} messages\n")
        header = ["subscriber", "received", "msgs/s", "MB/s", "lost", "damaged"]
        print(format_table([header] + [
            [r.name, r.received, f"{r.msgs_per_s:,.0f}",
             f"{r.megabytes / r.seconds if r.seconds else 0:.1f}", r.lost, r.damaged]
            for r in reports
        ]))
    ok = all(r.damaged == 0 and r.received == sent for r in reports)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
