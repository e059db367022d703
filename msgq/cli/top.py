"""``msgq top``: a live table of the services (of the registry in force: msgq's own, or the
application's of ``--schema``/``--registry``) that have a publisher — expected and measured
rate, bytes/s, readers, alive — like ``top`` for topics.

Rates are measured by subscribing: every message that arrives during a sampling interval
is counted (and its bytes summed), so ``Hz`` is what a subscriber really receives. On the
shared-memory backend the queue headers also give the publisher's pid and liveness and
the number of readers (this command's own reader is not counted); services without a queue
or without a live publisher are left out unless ``--all``. On the ZMQ backend there are no
headers to read: every registry service is subscribed and those that sent anything in the
interval are listed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import msgq
from msgq.cli.output import EXIT_OK, human_bytes, number, paint, print_json, print_table
from msgq.cli.services import check_services, schema_in_force_name
from msgq.queues import inspect_queue, namespace_prefix, queue_path
from msgq.schemas import registry_in_force
from msgq.sockets import backend_name

EPILOG = """\
examples:
  msgq top                           refresh every second until Ctrl-C
  msgq top --once --json             one 1-second sample as JSON, for scripts
  msgq top --interval 5 --once       one 5-second sample (more precise rates)
  msgq top --services can,vehicleState
  msgq --schema cereal/log.capnp --registry cereal/services.py top --services carState

services: those of the registry in force: msgq's own, or the one --schema FILE.capnp and
--registry FILE (or MSGQ_SCHEMA and MSGQ_REGISTRY) select, e.g. cereal's.
columns: expected Hz (the registry's; 0 = event-driven), measured Hz and bytes/s received
by this command during the interval, readers (other subscribers of the queue), alive (the
publisher's process is alive and, for a service with a rate, it has not been silent for
10 of its periods: since its last message, or since top began watching it, so a 0.5 Hz
service is not called dead between two messages)."""

ALIVE_PERIODS = 10.0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq top``."""
    parser = subparsers.add_parser(
        "top", help="live table of services: rates, bytes/s, readers, alive",
        description="A live table of the services of the registry in force that have a "
                    "publisher.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--once", action="store_true", help="one sample, then exit")
    parser.add_argument("--json", action="store_true", help="JSON output (implies --once)")
    parser.add_argument("--interval", type=number(float, 0.0, "a positive number of seconds",
                                                  exclusive=True), default=1.0, metavar="S",
                        help="sampling interval in seconds (default 1)")
    parser.add_argument("--services", metavar="A,B", help="only these services")
    parser.add_argument("--all", action="store_true",
                        help="also list services without a live publisher")
    parser.add_argument("--addr", default="127.0.0.1", help="publisher host (ZMQ backend)")
    return parser


class _Watcher:
    """Subscriptions to the watched services and what they received."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.poller = msgq.Poller()
        self.sockets: dict[str, Any] = {}
        self.by_id: dict[int, str] = {}
        self.counts: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.last_seen: dict[str, float] = {}
        #: When each service began to be watched (monotonic seconds).
        self.watched_since: dict[str, float] = {}

    def watch(self, services: list[str]) -> None:
        """Subscribes to those of ``services`` not watched yet."""
        for s in services:
            if s in self.sockets:
                continue
            sock = msgq.sub_sock(s, poller=self.poller, addr=self.addr)
            self.sockets[s] = sock
            self.by_id[id(sock)] = s
            self.counts[s] = 0
            self.bytes[s] = 0
            self.watched_since[s] = time.monotonic()

    def silence(self, service: str, now: float) -> float:
        """Seconds ``service`` has been silent at ``now``: since its last message, or
        since it began to be watched when none came yet."""
        seen = self.last_seen.get(service)
        return now - (self.watched_since[service] if seen is None else seen)

    def collect(self, until: float) -> None:
        """Counts what arrives until ``until`` (monotonic seconds)."""
        while True:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            for sock in self.poller.poll(max(1, int(remaining * 1000))):
                s = self.by_id[id(sock)]
                n = 0
                while (data := sock.receive(non_blocking=True)) is not None:
                    n += 1
                    self.bytes[s] += len(data)
                if n:
                    self.counts[s] += n
                    self.last_seen[s] = time.monotonic()

    def reset(self) -> None:
        """Starts a sample: what is already queued belongs to the time before it."""
        for s, sock in self.sockets.items():
            drained = False
            while sock.receive(non_blocking=True) is not None:
                drained = True
            if drained:  # it arrived while the last sample was printed: not silent
                self.last_seen[s] = time.monotonic()
            self.counts[s] = 0
            self.bytes[s] = 0


def _queue_info(service: str) -> dict[str, Any] | None:
    """The queue header of ``service`` (shared-memory backend), or None."""
    try:
        info = inspect_queue(queue_path(service))
    except OSError:
        return None
    return info if info.get("valid") else None


def _alive_within(expected_hz: float) -> float:
    """Seconds of silence after which a service with rate ``expected_hz`` is dead
    (infinite for an event-driven one): cereal's SubMaster rule, 10 periods."""
    return ALIVE_PERIODS / expected_hz if expected_hz > 0 else float("inf")


def _sample(watcher: _Watcher, interval: float, shm: bool) -> list[dict[str, Any]]:
    services = list(watcher.sockets)
    registry = registry_in_force()
    watcher.reset()
    start = time.monotonic()
    watcher.collect(start + interval)
    elapsed = time.monotonic() - start
    now = time.monotonic()
    rows = []
    for s in services:
        expected = registry[s].frequency
        row: dict[str, Any] = {
            "service": s,
            "expected_hz": expected,
            "measured_hz": watcher.counts[s] / elapsed,
            "bytes_per_s": watcher.bytes[s] / elapsed,
            "messages": watcher.counts[s],
        }
        seen = watcher.last_seen.get(s)
        # Not silent too long: a slow service (0.5 Hz) is not dead between its messages,
        # nor before its first one until 10 of its periods have passed.
        recent = watcher.silence(s, now) < _alive_within(expected)
        if shm:
            info = _queue_info(s)
            publisher_alive = bool(info and info.get("publisher_alive"))
            row["publisher_pid"] = info.get("publisher_pid") if info else None
            # our own reader is one of the live ones
            row["readers"] = max(0, int(info.get("readers_live", 0)) - 1) if info else 0
            row["alive"] = publisher_alive and recent
            row["has_publisher"] = publisher_alive
        else:
            row["publisher_pid"] = None
            row["readers"] = None
            row["has_publisher"] = watcher.counts[s] > 0 or seen is not None
            row["alive"] = row["has_publisher"] and recent
        rows.append(row)
    return rows


def _print(rows: list[dict[str, Any]], interval: float, show_all: bool) -> None:
    shown = [r for r in rows if show_all or r["has_publisher"]]
    header = ("service", "expected Hz", "Hz", "bytes/s", "readers", "alive", "pid")
    table = []
    colours = []
    for r in shown:
        table.append((r["service"], f"{r['expected_hz']:g}", f"{r['measured_hz']:.1f}",
                      human_bytes(int(r["bytes_per_s"])),
                      "-" if r["readers"] is None else r["readers"],
                      "yes" if r["alive"] else "no",
                      "-" if r["publisher_pid"] is None else r["publisher_pid"]))
        colours.append(None if r["alive"] else "red")

    prefix = namespace_prefix() or "-"
    print(paint(f"msgq top — namespace {prefix}, {schema_in_force_name()}, {len(shown)} "
                f"services with a publisher, {interval:g} s samples", "dim"))
    if table:
        print_table(header, table, colours)
    else:
        print(f"no service of {schema_in_force_name()} has a publisher in this namespace")


def run(args: argparse.Namespace) -> int:
    """Samples and prints until Ctrl-C (or once)."""
    services = check_services([args.services]) if args.services else list(registry_in_force())
    shm = backend_name() == "msgq"
    watcher = _Watcher(args.addr)
    once = args.once or args.json
    live = not once and sys.stdout.isatty()
    while True:
        if shm:
            # Subscribing makes a queue: watch only services that already have one (a
            # publisher started since the last sample is picked up here).
            watcher.watch([s for s in services if os.path.exists(queue_path(s))])
        else:
            watcher.watch(services)
        rows = _sample(watcher, args.interval, shm)
        if args.json:
            print_json({"interval_s": args.interval, "backend": backend_name(),
                        "schema": schema_in_force_name(),
                        "services": [r for r in rows if args.all or r["has_publisher"]]})
            return EXIT_OK
        if live:
            sys.stdout.write("\x1b[H\x1b[2J")
        _print(rows, args.interval, args.all)
        sys.stdout.flush()
        if once:
            return EXIT_OK
