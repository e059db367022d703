"""The README's main job runs end to end and leaves other namespaces alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import msgq
from msgq import queues

pytestmark = pytest.mark.multiprocess


def test_demo_reports_every_message_and_keeps_the_callers_queues(endpoint: str) -> None:
    mine = msgq.pub_sock(endpoint)  # a queue in the caller's namespace (MSGQ_PREFIX)
    # Paced: at most 1,500 messages of 1 KiB, which the 10 MiB ring holds whole, so no
    # scheduling delay can make a subscriber lose one; every loss is the library's.
    proc = subprocess.run(
        [sys.executable, "-m", "msgq.demo.throughput", "--seconds", "0.3", "--subscribers", "2",
         "--rate", "5000"],
        capture_output=True, text=True, timeout=120, env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in map(str.split, proc.stdout.splitlines()) if r[:1] in (["sub0"], ["sub1"])]
    assert len(rows) == 2
    published = int(proc.stdout.split("published ")[1].split()[0].replace(",", ""))
    assert 0 < published <= 1500
    for name, received, _rate, _mbs, lost, damaged in rows:
        assert (int(received), int(lost), int(damaged)) == (published, 0, 0), name
    assert os.path.exists(queues.queue_path(endpoint))  # the demo used its own prefix
    mine.send(b"still here")


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(600)  # 50 s alone, 150 s beside the other workers' JVMs
def test_end_to_end_demo(tmp_path: object) -> None:
    """The README's main job: every stage runs and the report says so."""
    out = os.path.join(str(tmp_path), "out")
    proc = subprocess.run(
        [sys.executable, "-m", "msgq.demo", "--seconds", "6", "--out", out],
        capture_output=True, text=True, timeout=600, env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = proc.stdout.split("== report")[1]
    # the share of SubMaster updates with every check holding, and how many were checked
    # (about 100 a second after the warm-up): a line printed whatever they are
    health = re.search(r"all alive, at rate and valid in (\d+)% of (\d+) updates", report)
    assert health, report
    assert int(health[1]) >= 90 and int(health[2]) >= 100, health[0]
    frames = re.search(r"camera +(\d+) frames received, 0 frame-id gaps", report)
    assert frames and int(frames[1]) >= 30, report  # 20 Hz for the 3 s after warm-up
    assert " 0 drops, 0 bad" in report
    assert "byte-identical" in report and "spark        ok" in report
    (run,) = os.listdir(out)
    png = os.path.join(out, run, "rates.png")
    assert os.path.getsize(png) > 20_000
    assert os.path.isdir(os.path.join(out, run, "recording"))
    # the Spark table lists the robot's services with their measured rates
    assert any(line.startswith("vehicleState") for line in proc.stdout.splitlines())


def test_health_view_expects_the_registrys_rates() -> None:
    # It expected 100 Hz of the 104 Hz IMU services (capped by a polled 100 Hz service),
    # where the registry, msgq top and msgq logstats say 104.
    from msgq.demo.pipeline import health_master
    from msgq.demo.robot import SENSOR_RATES, SERVICES
    from msgq.schemas import services

    sm = health_master()
    try:
        expected = {s: sm.freq_tracker[s].expected_hz for s in SERVICES}
    finally:
        sm.close()
    registry = {s: services.SERVICE_LIST[s].frequency for s in SERVICES}
    assert expected == registry
    assert expected["gyroscope"] == expected["accelerometer"] == SENSOR_RATES["gyroscope"] == 104
