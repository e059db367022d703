"""The messaging suite: ``python -m msgq.bench.messaging`` (``msgq bench messaging``).

Prints one table: the cost per call of ``SubMaster.update`` over 20 services and of
``PubMaster.send``, measured on the shared-memory backend, beside what Cap'n Proto
(pycapnp) alone costs on the same bytes: decoding the messages an update took
(``which()`` of each, what an eager subscriber pays), serialising the sent builder.
Over 100%: the call costs less than pycapnp's decoding alone (SubMaster reads payloads
through views, without decoding).

* ``update + read, at their rates``: a 100 Hz update loop; before each tick the services
  due at their registry rates are published (outside the timed call), so each update
  reads what a real 100 Hz consumer reads, and the timed call then takes the payload of
  every service it updated (``sm[s]``: a view over the bytes, made when read).
* ``update only``: the same without taking the payloads (a consumer that looks at the
  health flags, or at a few services only); its pycapnp column is "-".
* ``all 20 new``: every service has a new message at every update (worst case).
* ``update, nothing new``: the cost of an update that finds nothing.
* ``send``: ``PubMaster.send(service, builder)`` for a small and a large message; the
  pycapnp column is ``builder.to_bytes()``.

``--cereal CEREAL_DIR --cereal-python PYTHON`` adds the comparison with cereal's own
SubMaster over upstream msgq (``scripts/cereal-bench.sh`` builds that Python): the
workload of :mod:`msgq.bench.submaster_tick` — one publisher process, 8 services at
100/100/20/20/2/4/100/100 Hz (sizes within 2x), the measured process running SubMaster at
100 Hz, reading one field of each updated service and sending one message per tick — run
by both sides with the checkout's schema (ours through :mod:`msgq.compat.cereal`),
alternating (ours, cereal's) ``--rounds`` times; CPU per tick is the measured process's
``process_time`` over its ticks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from msgq.bench.fixtures import SERVICES, filled_message
from msgq.compat.cereal import write_shim
from msgq.messaging import PubMaster, SubMaster, decode_event
from msgq.queues import queue_dir
from msgq.schemas import SERVICE_LIST
from msgq.tables import format_table

__all__ = ["main", "run"]

UPDATE_HZ = 100.0


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.fmean(ordered), ordered[len(ordered) // 2], p99


def _time_updates(sm: Any, ticks: int, publish: Callable[[int], list[bytes]],
                  read: bool = True) -> tuple[list[float], float]:
    """µs per ``sm.update(0)`` — followed, with ``read``, by reading the payload of every
    service it updated (``sm[s]``, as a consumer does; payloads are decoded when read) —
    over ``ticks`` ticks, and the µs pycapnp spends decoding those messages (measured
    separately on the same bytes)."""
    samples: list[float] = []
    decode_ns = 0
    services = sm.services
    for tick in range(ticks):
        sent = publish(tick)
        t0 = time.perf_counter_ns()
        sm.update(0)
        if read:
            for s in services:
                if sm.updated[s]:
                    sm[s]
        samples.append((time.perf_counter_ns() - t0) / 1000)
        t1 = time.perf_counter_ns()
        for data in sent:
            decode_event(data).which()
        decode_ns += time.perf_counter_ns() - t1
    return samples, decode_ns / 1000


def run(ticks: int) -> list[tuple[str, ...]]:
    """Runs every measurement; returns the table rows (header first)."""
    rows: list[tuple[str, ...]] = [
        ("operation", "msgs/call", "bytes/call", "mean µs", "p50 µs", "p99 µs",
         "pycapnp alone")]
    pm = PubMaster(SERVICES)
    sm = SubMaster(SERVICES, frequency=UPDATE_HZ)
    payloads = {s: filled_message(s).to_bytes() for s in SERVICES}
    periods = {s: max(1, round(UPDATE_HZ / SERVICE_LIST[s].frequency)) for s in SERVICES}

    def at_rates(tick: int) -> list[bytes]:
        sent = [payloads[s] for s in SERVICES if tick % periods[s] == 0]
        for s in SERVICES:
            if tick % periods[s] == 0:
                pm.sock[s].send(payloads[s])
        return sent

    def all_new(tick: int) -> list[bytes]:
        for s in SERVICES:
            pm.sock[s].send(payloads[s])
        return list(payloads.values())

    def nothing(tick: int) -> list[bytes]:
        return []

    for label, publish, read in (
            ("SubMaster.update + read, 20 at their rates", at_rates, True),
            ("SubMaster.update only, 20 at their rates", at_rates, False),
            ("SubMaster.update + read, all 20 new", all_new, True),
            ("SubMaster.update only, all 20 new", all_new, False),
            ("SubMaster.update, nothing new", nothing, True)):
        _time_updates(sm, min(200, ticks), publish, read)  # warm-up
        counts: list[int] = []
        sizes: list[int] = []

        def counting(tick: int, publish: Callable[[int], list[bytes]] = publish,
                     counts: list[int] = counts, sizes: list[int] = sizes) -> list[bytes]:
            sent = publish(tick)
            counts.append(len(sent))
            sizes.append(sum(len(d) for d in sent))
            return sent

        samples, decode_us = _time_updates(sm, ticks, counting, read)
        mean, p50, p99 = _percentiles(samples)
        share = decode_us / sum(samples) if sum(samples) and read else None
        rows.append((label, f"{statistics.fmean(counts):.1f}", f"{statistics.fmean(sizes):.0f}",
                     f"{mean:.1f}", f"{p50:.1f}", f"{p99:.1f}",
                     "-" if share is None else f"{share:.0%}"))

    for service in ("vehicleState", "modelOutput"):
        msg = filled_message(service)
        size = len(msg.to_bytes())
        msg.clear_write_flag()
        samples = []
        serialise_ns = 0
        for _ in range(ticks):
            t0 = time.perf_counter_ns()
            pm.send(service, msg)
            samples.append((time.perf_counter_ns() - t0) / 1000)
            msg.clear_write_flag()  # re-sending one builder is what we measure
            t1 = time.perf_counter_ns()
            msg.to_bytes()
            serialise_ns += time.perf_counter_ns() - t1
            msg.clear_write_flag()
            sm.update(0)  # keeps the queue drained as a live reader would
        mean, p50, p99 = _percentiles(samples)
        rows.append((f"PubMaster.send {service}", "1", str(size),
                     f"{mean:.1f}", f"{p50:.1f}", f"{p99:.1f}",
                     f"{serialise_ns / 1000 / sum(samples):.0%}"))
    pm.close()
    sm.close()
    return rows


#: The standalone program both sides of the cereal comparison run.
TICK_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "submaster_tick.py")
#: What :func:`script_command` has Python run: the program at argv[1] as ``__main__``,
#: with sys.path as ``python -P PROGRAM`` leaves it (3.11+ only): neither the program's
#: folder (msgq/bench, whose modules would shadow others) nor the current folder on it.
_RUN_BY_PATH = ("import runpy, sys\n"
                "if not getattr(sys.flags, 'safe_path', False):\n"
                "    del sys.path[0]  # '' (the current folder), which -c put there\n"
                "sys.argv = sys.argv[1:]\n"
                "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def script_command(python: str, program: str, *args: str) -> list[str]:
    """The command that runs ``program`` (a path) with ``args`` under ``python`` the way
    ``python -P program args`` does, on every Python (``-P`` is 3.11+): the program's
    imports find only what PYTHONPATH and the environment have."""
    return [python, "-c", _RUN_BY_PATH, program, *args]
#: cereal's compiled messaging module, made of upstream msgq's (msgq-ipc) for the checkout.
_CEREAL_MESSAGING_PYX = '''"""cereal.messaging's compiled module, from upstream msgq (msgq-ipc):
written by msgq.bench.messaging for the comparison; nothing of cereal's is copied."""
from msgq.ipc_pyx import (Context, IpcError as MessagingError, MultiplePublishersError,
                          Poller, PubSocket, SocketEventHandle, SubSocket, delete_fake_prefix,
                          get_fake_prefix, set_fake_prefix, toggle_fake_events,
                          wait_for_one_event)
'''


def cereal_over_upstream(checkout: str, folder: str) -> str:
    """Lays out in ``folder`` a ``cereal`` package that is the checkout (each of its files
    linked, not copied) with ``messaging/messaging_pyx`` from upstream msgq, the compiled
    module a cereal checkout of mid-2024 otherwise builds with scons; returns ``folder``
    (put it on PYTHONPATH)."""
    package = os.path.join(folder, "cereal")
    os.makedirs(os.path.join(package, "messaging"), exist_ok=True)
    for name in os.listdir(checkout):
        if name != "messaging":
            os.symlink(os.path.join(checkout, name), os.path.join(package, name))
    for name in os.listdir(os.path.join(checkout, "messaging")):
        if not name.startswith("messaging_pyx"):
            os.symlink(os.path.join(checkout, "messaging", name),
                       os.path.join(package, "messaging", name))
    with open(os.path.join(package, "messaging", "messaging_pyx.py"), "w") as f:
        f.write(_CEREAL_MESSAGING_PYX)
    return folder


def _side_env(side: str, path: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MSGQ_", "OPENPILOT_", "CEREAL_")) and k not in ("ZMQ",)}
    env["PYTHONPATH"] = path
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if side == "ours":
        env["MSGQ_PREFIX"] = prefix
        env["MSGQ_BACKEND"] = "msgq"
    else:
        env["OPENPILOT_PREFIX"] = prefix  # upstream wants the folder to exist
        os.makedirs(f"/dev/shm/msgq_{prefix}", exist_ok=True)
    return env


def _tick_run(python: str, env: dict[str, str], cwd: str, seconds: float,
              phases: bool = False) -> dict[str, Any]:
    """One measured run: a publisher process and the measured SubMaster process (with
    ``phases``: its µs per part of a tick instead of its CPU per tick)."""
    publisher = subprocess.Popen(script_command(python, TICK_PROGRAM, "--role", "pub"), env=env,
                                 cwd=cwd, stdout=subprocess.DEVNULL)
    try:
        done = subprocess.run(script_command(python, TICK_PROGRAM, "--role", "sub", "--seconds",
                                             str(seconds), *(["--phases"] if phases else [])),
                              env=env,
                              cwd=cwd, capture_output=True, text=True, timeout=seconds + 60)
    finally:
        publisher.send_signal(signal.SIGTERM)
        try:
            publisher.wait(10)
        except subprocess.TimeoutExpired:
            publisher.kill()
            publisher.wait()
    if done.returncode != 0:
        raise RuntimeError(f"the measured process failed ({python}):\n{done.stderr[-2000:]}")
    record: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return record


def compare_with_cereal(checkout: str, cereal_python: str, rounds: int,
                        seconds: float, phases: bool = False) -> list[tuple[str, ...]]:
    """The rows of the cereal comparison (header first): CPU per tick of each run, ours
    and cereal's alternating, and the ratio of the medians; with ``phases``, then a row
    per part of a tick (update, reads, new_message, send: thread CPU µs, median of each
    run, ``rounds`` more alternating runs)."""
    checkout = os.path.abspath(checkout)
    if not os.path.isfile(os.path.join(checkout, "log.capnp")):
        raise SystemExit(f"{checkout} has no log.capnp: --cereal takes a cereal checkout")
    scratch = tempfile.mkdtemp(prefix="msgq-cereal-bench-")
    try:
        ours_path = write_shim(checkout, os.path.join(scratch, "ours"))
        theirs_path = cereal_over_upstream(checkout, os.path.join(scratch, "cereal"))
        sides = {"ours": (sys.executable, ours_path), "cereal": (cereal_python, theirs_path)}
        sizes = json.loads(subprocess.run(
            script_command(sys.executable, TICK_PROGRAM, "--role", "sizes"),
            env=_side_env("ours", ours_path, f"cb_sizes_{os.getpid()}"), cwd=scratch,
            capture_output=True, text=True, check=True).stdout)
        per_tick: dict[str, list[float]] = {"ours": [], "cereal": []}
        for round_ in range(rounds):
            for side, (python, path) in sides.items():
                prefix = f"cb_{side}_{os.getpid()}_{round_}"
                try:
                    record = _tick_run(python, _side_env(side, path, prefix), scratch,
                                       seconds)
                finally:
                    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
                    shutil.rmtree(os.path.join(queue_dir(), prefix), ignore_errors=True)
                if not record["all_alive"]:
                    raise RuntimeError(f"{side}: not every service was alive: {record}")
                per_tick[side].append(record["cpu_s"] / record["ticks"] * 1e6)
        parts: dict[str, dict[str, list[float]]] = {"ours": {}, "cereal": {}}
        for round_ in range(rounds if phases else 0):
            for side, (python, path) in sides.items():
                prefix = f"cbp_{side}_{os.getpid()}_{round_}"
                try:
                    record = _tick_run(python, _side_env(side, path, prefix), scratch,
                                       seconds, phases=True)
                finally:
                    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
                    shutil.rmtree(os.path.join(queue_dir(), prefix), ignore_errors=True)
                for part, (median, _) in record["phases_us"].items():
                    parts[side].setdefault(part, []).append(median)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ours = statistics.median(per_tick["ours"])
    theirs = statistics.median(per_tick["cereal"])
    label = (f"SubMaster CPU per tick vs cereal over upstream msgq (8 services, "
             f"{min(sizes.values())}-{max(sizes.values())} B)")
    rows = [("workload", "ours µs/tick", "cereal µs/tick", "ours / cereal"),
            (label, " ".join(f"{v:.0f}" for v in per_tick["ours"]),
             " ".join(f"{v:.0f}" for v in per_tick["cereal"]),
             f"{ours / theirs:.2f}x (medians {ours:.0f} / {theirs:.0f})")]
    for part, ours_parts in parts["ours"].items():
        theirs_parts = parts["cereal"].get(part, [])
        if not theirs_parts:
            continue
        ours_m, theirs_m = statistics.median(ours_parts), statistics.median(theirs_parts)
        rows.append((f"  {part}: thread CPU µs per tick (median of each run)",
                     " ".join(f"{v:.0f}" for v in ours_parts),
                     " ".join(f"{v:.0f}" for v in theirs_parts),
                     f"{ours_m / theirs_m:.2f}x" if theirs_m > 0 else "-"))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m msgq.bench.messaging``."""
    parser = argparse.ArgumentParser(
        prog="python -m msgq.bench.messaging",
        description="Cost of SubMaster.update (20 services) and PubMaster.send per call.")
    parser.add_argument("--ticks", type=int, default=5000,
                        help="calls measured per row (default 5000)")
    parser.add_argument("--cereal", metavar="CEREAL_DIR",
                        help="also compare SubMaster's CPU per tick with cereal's own over "
                        "upstream msgq (a cereal checkout: log.capnp, services.py, messaging/)")
    parser.add_argument("--cereal-python", metavar="PYTHON",
                        help="the Python with upstream msgq (msgq-ipc) and pycapnp for "
                        "cereal's side (scripts/cereal-bench.sh builds one)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating runs of each side in the comparison (default 3)")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="measured seconds of each run in the comparison (default 5)")
    parser.add_argument("--phases", action="store_true",
                        help="with --cereal: then as many runs of each side timing the "
                        "parts of a tick (update, reads, new_message, send)")
    parser.add_argument("--cereal-only", action="store_true",
                        help="run the comparison only, not the per-call table")
    args = parser.parse_args(argv)
    if args.ticks < 1:
        parser.error("--ticks must be >= 1")
    if (args.cereal is None) != (args.cereal_python is None):
        parser.error("--cereal and --cereal-python go together "
                     "(scripts/cereal-bench.sh CEREAL_DIR runs both)")
    if args.cereal_only and args.cereal is None:
        parser.error("--cereal-only needs --cereal and --cereal-python")
    if args.cereal is not None:
        rows = compare_with_cereal(args.cereal, args.cereal_python, args.rounds, args.seconds,
                                   args.phases)
        print(f"SubMaster at 100 Hz vs cereal's over upstream msgq, {args.rounds} alternating "
              f"runs of {args.seconds:g} s each, CPU per tick of the measured process")
        print(format_table(rows))
        if args.cereal_only:
            return 0
    os.environ["MSGQ_PREFIX"] = f"bench_messaging_{os.getpid()}"
    os.environ["MSGQ_BACKEND"] = "msgq"
    os.environ.pop("ZMQ", None)

    run_dir = queue_dir(create=True)
    try:
        rows = run(args.ticks)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"messaging layer, shared-memory backend, {args.ticks} calls per row "
          f"(python {sys.version.split()[0]})")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
