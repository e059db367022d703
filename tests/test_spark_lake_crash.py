"""The lake under kill -9: ``msgq lake build`` and ``msgq lake follow`` run as a user runs
them (a process group of their own: Python, the JVM, its Python workers) and are killed
with SIGKILL at random moments, again and again. After every kill each file a reader can
see in the tables is a whole Parquet file and no event is in the lake twice; a last run
finishes the work, and then the lake holds every event of the logs exactly once.

``MSGQ_LAKE_CRASH_RUNS`` (default 2) sets the kills per test; issue 42 asks for 20, run
by hand: ``MSGQ_LAKE_CRASH_RUNS=20 pytest tests/test_spark_lake_crash.py``."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from msgq.logs import LogReader  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(3600)]

RUNS = int(os.environ.get("MSGQ_LAKE_CRASH_RUNS", "2"))
#: How long the last follow (not killed) runs while the writer writes: its batches say
#: how fresh the lake is kept.
FOLLOW_SECONDS = 30


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYSPARK_PYTHON", None)  # as a user's shell has it
    return env


def _start(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "msgq", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL to the whole group: the command, its JVM and the JVM's Python workers."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def _lake_rows(lake: Path) -> list[tuple[str, int]]:
    """(file, offset) of every event a reader of the lake sees now, having checked that
    every file in the tables is a whole Parquet file (pyarrow reads its footer and rows)
    named as the build names them."""
    import pyarrow.parquet as pq

    rows: list[tuple[str, int]] = []
    for table in sorted(os.listdir(lake)):
        if table.startswith("_") or table.startswith("."):
            continue
        for folder, _, files in os.walk(lake / table):
            for name in files:
                path = os.path.join(folder, name)
                assert name.startswith("part-") and name.endswith(".parquet"), path
                content = pq.read_table(path, columns=["file", "offset"])
                rows += zip(content.column("file").to_pylist(),
                            content.column("offset").to_pylist(), strict=True)
    return rows


def _raw_rows(folders: list[Path]) -> set[tuple[str, int]]:
    return {(e.path, e.offset) for f in folders for e in LogReader(str(f)).raw()}


def _assert_once(rows: list[tuple[str, int]], raw: set[tuple[str, int]]) -> None:
    assert len(set(rows)) == len(rows), "an event twice in the lake"
    assert set(rows) <= raw, "an event that is not in the logs"


def _finish(sources: Path, lake: Path) -> None:
    """The last ``msgq lake build``, not killed: in this process, on the run's Spark
    session (the killed runs were processes of their own; a JVM less to start)."""
    from helpers import run_msgq_here

    code, _, err = run_msgq_here("lake", "build", str(sources), "--to", str(lake), "--json")
    assert code == 0, err


def test_build_killed_at_random_moments_loses_and_doubles_nothing(spark: object,
                                                                   tmp_path: Path) -> None:
    from msgq.bench.spark import make_recording

    fleet = tmp_path / "fleet"
    folders = [fleet / f"drive{i}" for i in range(4)]
    for i, folder in enumerate(folders):
        make_recording(str(folder), 6.0, 1.0, seed=i)
    raw = _raw_rows(folders)
    lake = tmp_path / "lake"
    rng = random.Random(int(os.environ.get("MSGQ_LAKE_CRASH_SEED", "42")))
    kills = 0
    took = 60.0  # a first guess of a whole build: the kills land anywhere in it
    for _ in range(RUNS):
        began = time.monotonic()
        proc = _start("lake", "build", str(fleet), "--to", str(lake), "--json")
        delay = rng.uniform(0.2, took)
        try:
            proc.wait(delay)
        except subprocess.TimeoutExpired:
            _kill(proc)
            kills += 1
        else:  # it finished first: the next one starts from a complete lake
            out, err = proc.communicate()
            assert proc.returncode == 0, err
            took = max(5.0, time.monotonic() - began)
        if lake.is_dir():
            _assert_once(_lake_rows(lake), raw)
    _finish(fleet, lake)
    rows = _lake_rows(lake)
    _assert_once(rows, raw)
    assert set(rows) == raw
    print(f"\n{RUNS} builds, {kills} killed with SIGKILL; {len(rows)} events, each once")


WRITER = textwrap.dedent("""
    import os, sys, time
    from msgq.logs import LogWriter
    from msgq.messaging import new_message

    # writes until the file sys.argv[3] exists (sys.argv[2] seconds at most)
    folder, seconds, stop = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    with LogWriter(folder, rotate_seconds=3.0, flush_seconds=0.25) as writer:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end and not os.path.exists(stop):
            for service in ("vehicleState", "can"):
                writer.write(new_message(service, valid=i % 9 != 0,
                                         logMonoTime=time.monotonic_ns()).to_bytes())
            i += 1
            time.sleep(0.005)
""")


def test_follow_killed_at_random_moments_loses_and_doubles_nothing(spark: object,
                                                                    tmp_path: Path) -> None:
    live = tmp_path / "live"
    lake = tmp_path / "lake"
    stop = tmp_path / "stop-writing"
    rng = random.Random(int(os.environ.get("MSGQ_LAKE_CRASH_SEED", "7")))
    # it writes until the last follow has ended (told by the file stop)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(live), "900", str(stop)])
    kills = 0
    ages: list[float] = []
    try:
        deadline = time.monotonic() + 60
        while not any(live.glob("segment-*")):
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.1)
        for _ in range(RUNS):
            proc = _start("lake", "follow", str(live), "--to", str(lake), "--every", "1",
                          "--json")
            try:
                proc.wait(rng.uniform(3.0, 20.0))
            except subprocess.TimeoutExpired:
                _kill(proc)
                kills += 1
            else:
                pytest.fail(f"follow exited by itself: {proc.communicate()[1]}")
            if lake.is_dir():
                _assert_once(_lake_rows(lake), _raw_rows([live]))
        # one that is not killed: its batches say how fresh the lake is
        proc = _start("lake", "follow", str(live), "--to", str(lake), "--every", "1",
                      "--json", "--duration", str(FOLLOW_SECONDS))
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        ages = [json.loads(line)["newest_age_s"] for line in out.splitlines() if line]
        assert writer.poll() is None, "the writer stopped before the last follow ended"
        stop.touch()
        assert writer.wait(timeout=60) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
    _finish(live, lake)
    rows = _lake_rows(lake)
    raw = _raw_rows([live])
    _assert_once(rows, raw)
    assert set(rows) == raw
    ages = sorted(a for a in ages if a is not None)  # none when a batch outlasts the follow
    latency = f"median {ages[len(ages) // 2]:.2f} s, max {ages[-1]:.2f} s" if ages else "-"
    print(f"\n{RUNS} follows killed with SIGKILL ({kills}); {len(rows)} events, each "
          f"once; write -> queryable over {len(ages)} batches: {latency}")
