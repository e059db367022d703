"""msgq against upstream's own wheel (``msgq-ipc``): the same measuring code run once in
each one's environment, for the README's "why" table.

    python -m msgq.bench.upstream                 both, medians of 3, a table
    python -m msgq.bench.upstream --json OUT      also the results as JSON (figures)

Upstream's wheel is fetched from the package index with ``pip download --no-deps`` into
``build/upstream/`` (as ``scripts/upstream-tests.sh`` does) and unzipped there; it is
never installed. Its side runs this file as a script (``python -S`` with only the
unzipped wheel on ``PYTHONPATH``), so ``import msgq`` is upstream's; ours runs it with
the interpreter running this command. Both use 32 MiB queues in a namespace of their
own (``OPENPILOT_PREFIX``, which both read) and only the API they share: ``pub_sock``,
``sub_sock``, ``send``, ``receive``.

What is measured (each a median of the repeats):

* send + receive in one process: a publisher and a subscriber in one process, each
  message sent and then received (``non_blocking``: it is there), for payloads of 8 B,
  1 KiB, 64 KiB and 1 MiB;
* round trip between two processes, 8 B: a ping published, received by a forked child
  and published back as a pong; p50 of the round trips.

Layer: programs (a benchmark). The measuring half (:func:`measure`) imports nothing of
msgq but the package named ``msgq`` on the path.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

SIZES = (8, 1024, 65536, 1048576)
RTT_SIZE = 8
#: Queue size of every socket on both sides (upstream's default holds no 1 MiB message).
SEGMENT_SIZE = 32 * 1024 * 1024
#: Messages per size in one process (fewer for large payloads), and round trips.
COUNTS = {8: 200_000, 1024: 200_000, 65536: 20_000, 1048576: 1_000}
ROUND_TRIPS = 5_000
UPSTREAM_VERSION = "1.0"


def _in_process(msgq: object, size: int, count: int, run: int) -> float:
    """Messages per second through one publisher and one subscriber in this process
    (endpoints of their own for each ``run``)."""
    name = f"inproc{size}_{run}"
    sub = msgq.sub_sock(name, timeout=1000, segment_size=SEGMENT_SIZE)  # type: ignore
    pub = msgq.pub_sock(name, segment_size=SEGMENT_SIZE)  # type: ignore[attr-defined]
    payload = b"x" * size
    # Each message is there when received: non_blocking receives, on both sides.
    for _ in range(min(count, 1000)):  # warm: the ring's pages, the caches
        pub.send(payload)
        sub.receive(non_blocking=True)
    start = time.perf_counter()
    for _ in range(count):
        pub.send(payload)
        if sub.receive(non_blocking=True) is None:
            raise RuntimeError(f"a {size} B message was not received")
    return count / (time.perf_counter() - start)


def _round_trip_p50_us(msgq: object, size: int, count: int, run: int) -> float:
    """p50 of ping -> pong round trips with a forked child, in µs (endpoints of their own
    for each ``run``: a new publisher resets upstream's readers)."""
    ping, pong = f"ping{run}", f"pong{run}"
    # Each publisher exists before its subscriber connects (a new publisher resets
    # upstream's readers).
    pub = msgq.pub_sock(ping)  # type: ignore[attr-defined]
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # the echo side
        try:
            echo = msgq.pub_sock(pong)  # type: ignore[attr-defined]
            sub = msgq.sub_sock(ping, timeout=5000)  # type: ignore[attr-defined]
            os.write(ready_w, b"r")
            while True:
                msg = sub.receive()
                if msg is None or msg == b"stop":
                    break
                echo.send(msg)
        finally:
            os._exit(0)
    os.read(ready_r, 1)
    sub = msgq.sub_sock(pong, timeout=100)  # type: ignore[attr-defined]
    payload = b"p" * size
    while True:  # until the echo's reply shows both sides connected
        pub.send(payload)
        if sub.receive() is not None:
            break
    while sub.receive() is not None:  # replies to the extra pings
        pass
    sub.setTimeout(5000)
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        pub.send(payload)
        if sub.receive() is None:
            raise RuntimeError("a round trip timed out")
        times.append(time.perf_counter() - t0)
    pub.send(b"stop")
    os.waitpid(child, 0)
    return statistics.median(times) * 1e6


def measure(repeat: int, quick: bool) -> dict[str, object]:
    """Both measurements with the ``msgq`` on the path; medians of ``repeat`` runs."""
    import msgq  # another msgq: whichever the path has (this side's, upstream's or ours)

    scale = 10 if quick else 1
    results: dict[str, object] = {}
    for size in SIZES:
        results[f"inproc/{size}"] = statistics.median(
            _in_process(msgq, size, max(100, COUNTS[size] // scale), run)
            for run in range(repeat))
    results[f"rtt/{RTT_SIZE}"] = statistics.median(
        _round_trip_p50_us(msgq, RTT_SIZE, max(200, ROUND_TRIPS // scale), run)
        for run in range(repeat))
    return {"module": msgq.__file__, "python": sys.version.split()[0], "results": results}


def upstream_package(root: str) -> str:
    """The folder holding upstream's unzipped wheel (downloaded once into build/)."""
    folder = os.path.join(root, "build", "upstream", f"msgq-ipc-{UPSTREAM_VERSION}-package")
    if os.path.isdir(os.path.join(folder, "msgq")):
        return folder
    download = os.path.join(root, "build", "upstream")
    os.makedirs(download, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                    "--disable-pip-version-check", "--only-binary=:all:", "--python-version",
                    "3.11", "--implementation", "cp", "-d", download,
                    f"msgq-ipc=={UPSTREAM_VERSION}"], check=True)
    [wheel] = glob.glob(os.path.join(download, f"msgq_ipc-{UPSTREAM_VERSION}-*.whl"))[:1]
    with zipfile.ZipFile(wheel) as z:
        z.extractall(folder + ".tmp")
    os.replace(folder + ".tmp", folder)
    return folder


def _run_side(python: list[str], env: dict[str, str], repeat: int, quick: bool,
              cwd: str) -> dict:
    prefix = f"bench_upstream_{os.getpid()}_{len(python)}"
    shm = env.get("MSGQ_SHM_DIR") or "/dev/shm"
    # ours puts a namespace's queues in <shm>/<prefix>/, upstream's in /dev/shm/msgq_<prefix>/
    folders = [os.path.join(shm, prefix), os.path.join("/dev/shm", "msgq_" + prefix)]
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
    env = {**env, "OPENPILOT_PREFIX": prefix}
    env.pop("MSGQ_PREFIX", None)
    try:
        done = subprocess.run([*python, os.path.abspath(__file__), "--measure", str(repeat),
                               *(["--quick"] if quick else [])], env=env, capture_output=True,
                              text=True, timeout=1800, cwd=cwd)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(python)}: the measurement failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m msgq.bench.upstream",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (median)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--measure", type=int, metavar="REPEAT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:  # one side, run by the parent: JSON on the last line
        print(json.dumps(measure(args.measure, args.quick)))
        return 0
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    package = upstream_package(root)
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "MSGQ_BACKEND", "ZMQ", "CEREAL_FAKE")}
    with tempfile.TemporaryDirectory() as home:  # neither side imports from the checkout
        theirs = _run_side([sys.executable, "-S"], {**base, "PYTHONPATH": package},
                           args.repeat, args.quick, home)
        ours = _run_side([sys.executable], base, args.repeat, args.quick, home)
    if package not in theirs["module"] or package in ours["module"]:
        raise SystemExit(f"wrong msgq imported: {theirs['module']} / {ours['module']}")
    rows = [("send + receive in one process, " + _size(s), f"inproc/{s}", "/s")
            for s in SIZES] + [("round trip between two processes, 8 B, p50", "rtt/8", " µs")]
    print(f"{'':48} {'upstream':>14} {'msgq':>14} {'ratio':>7}")
    for label, key, unit in rows:
        a, b = theirs["results"][key], ours["results"][key]
        ratio = a / b if unit == " µs" else b / a
        print(f"{label:48} {a:>12,.1f}{unit:2} {b:>12,.1f}{unit:2} {ratio:>6.1f}×")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"upstream": theirs, "msgq": ours,
                       "upstream_version": UPSTREAM_VERSION}, f, indent=2)
    return 0


def _size(n: int) -> str:
    return f"{n // 1048576} MiB" if n >= 1048576 else f"{n // 1024} KiB" if n >= 1024 \
        else f"{n} B"


if __name__ == "__main__":
    raise SystemExit(main())
