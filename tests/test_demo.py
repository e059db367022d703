"""The README's main job runs end to end and leaves other namespaces alone."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

import msgq
from msgq import queues
from msgq.demo.robot import SERVICES

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


@pytest.mark.slow
def test_robot_runs_alone_in_the_callers_namespace_until_ctrl_c(prefix: str) -> None:
    # ./run.sh robot: what msgq top / dump / record see from another terminal.
    robot = subprocess.Popen([sys.executable, "-m", "msgq.demo.robot"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=os.environ.copy())
    try:
        # the caller's namespace; every process of the robot up (its camera process can
        # start seconds after the vehicle's on a loaded machine: CI missed its services)
        for service in SERVICES:
            sub = msgq.sub_sock(service, timeout=30_000)
            try:
                assert sub.receive() is not None, f"no {service} within 30 s"
            finally:
                sub.close()
        top = subprocess.run([sys.executable, "-m", "msgq", "top", "--once", "--json",
                              "--interval", "0.5"], capture_output=True, text=True,
                             timeout=120, env=os.environ.copy())
        assert top.returncode == 0, top.stderr
        assert set(SERVICES) <= set(top.stdout.split('"')), top.stdout[:2000]
        robot.send_signal(signal.SIGINT)
        out, err = robot.communicate(timeout=30)
    finally:
        if robot.poll() is None:
            robot.kill()
            robot.communicate()
    assert robot.returncode == 0, err
    assert f"in namespace {prefix}" in out
    assert "Traceback" not in err, err
    # its processes are gone: no publisher of the robot is alive
    for service in SERVICES:
        info = queues.inspect_queue(queues.queue_path(service))
        assert not info["publisher_alive"], service


@pytest.mark.slow
def test_record_of_nothing_fails_and_names_the_namespace_with_live_publishers(
        prefix: str, tmp_path: object) -> None:
    # The newcomer's trap: the demo robot published in demo_<pid> while `msgq record` in
    # another terminal recorded the default namespace: 0 messages, exit 0.
    elsewhere = f"{prefix}_robot"
    env = {**os.environ, "MSGQ_PREFIX": elsewhere}
    publisher = subprocess.Popen(
        [sys.executable, "-c", "import sys, msgq; p = msgq.pub_sock('vehicleState'); "
         "print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert publisher.stdout is not None and publisher.stdout.readline() == "ready\n"
        done = subprocess.run(
            [sys.executable, "-m", "msgq", "record", "vehicleState", "-o",
             os.path.join(str(tmp_path), "rec"), "--duration", "0.3"],
            capture_output=True, text=True, timeout=120, env=os.environ.copy())
    finally:
        publisher.communicate("")
        import shutil
        shutil.rmtree(os.path.join(os.environ.get("MSGQ_SHM_DIR", "/dev/shm"), elsewhere),
                      ignore_errors=True)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.splitlines()[-1:]
    assert line.startswith("msgq record: error: recorded nothing"), line
    assert f"in namespace {prefix} " in line and f"{elsewhere} (1)" in line, line
    assert "Traceback" not in done.stderr
