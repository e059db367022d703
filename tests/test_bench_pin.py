"""The benchmark's placement option ($MSGQ_BENCH_PIN): every process of a throughput run
on the CPU the fan-out bound's model gives its thread, whatever the backend."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from msgq.bench.runner import Runner, pin_process, throughput_cpus

pytestmark = pytest.mark.multiprocess

needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="placement needs two CPUs",
)


def test_placement_is_the_fanout_models() -> None:
    # subscribers first, the publisher last (the order the runner starts them in)
    assert throughput_cpus(1, [0, 1]) == [1, 0]
    assert throughput_cpus(4, [2, 5]) == [5, 2, 5, 2, 2]
    assert throughput_cpus(3, [7]) == [7, 7, 7, 7]
    with pytest.raises(ValueError, match="no CPU"):
        throughput_cpus(1, [])


def test_the_option_takes_0_or_1_only(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = multiprocessing.get_context("spawn")
    monkeypatch.setenv("MSGQ_BENCH_PIN", "yes")
    with pytest.raises(ValueError, match=r"MSGQ_BENCH_PIN must be 0 or 1, not 'yes'"):
        Runner(ctx, "/tmp", "p", 0.1)
    monkeypatch.setenv("MSGQ_BENCH_PIN", "0")
    assert not Runner(ctx, "/tmp", "p", 0.1).pin
    monkeypatch.setenv("MSGQ_BENCH_PIN", "1")
    assert Runner(ctx, "/tmp", "p", 0.1).pin == bool(os.sched_getaffinity(0))


@needs_two_cpus
def test_pin_process_pins_every_thread_of_a_running_process() -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    code = (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) == 2
        pin_process(child.pid, cpu)
        assert all(os.sched_getaffinity(t) == {cpu} for t in tids)
    finally:
        child.kill()
        child.wait()
    pin_process(child.pid, cpu)  # a process that is gone: nothing to do, no error


@needs_two_cpus
def test_pinned_run_records_and_keeps_its_placement(tmp_path: Path) -> None:
    out = tmp_path / "pinned.json"
    cmd = [sys.executable, "-m", "msgq.bench", "--backends", "msgq", "--tests", "throughput",
           "--sizes", "64K", "--subs", "2", "--repeat", "1", "--duration", "0.2",
           "--json", str(out)]
    env = dict(os.environ, MSGQ_BENCH_PIN="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # While it runs, every worker (a grandchild: the fork server's children) is on one CPU.
    seen: dict[int, set[int]] = {}
    while proc.poll() is None:
        for worker in _grandchildren(proc.pid):
            try:
                seen[worker] = os.sched_getaffinity(worker)
            except OSError:
                pass
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stdout + stderr
    first, second = sorted(os.sched_getaffinity(0))[:2]
    detail = json.loads(out.read_text())["results"][0]["median"]["detail"]
    assert detail["cpus"] == [second, first, first]
    assert "runs pinned (MSGQ_BENCH_PIN=1)" in stdout  # the table says how it was placed
    # the last look at each worker (they live about a second, looked at every 20 ms)
    assert len(seen) == 3 and all(len(c) == 1 and c <= {first, second} for c in seen.values())


def _grandchildren(pid: int) -> list[int]:
    out: list[int] = []
    for child in _children(pid):
        out += _children(child)
    return out


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []
