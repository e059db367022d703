"""Deterministic lockstep replay: the harness, the simulated clock, the output diff and
the fixture, with the example controller as the process under test."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from msgq.lockstep import (
    LockstepProcess,
    LockstepProcessError,
    LockstepResult,
    LockstepTimeoutError,
    StepOutput,
    assert_outputs_equal,
    canonical_bytes,
    clock,
    diff_outputs,
    input_events,
    remove_stale_runs,
    run_lockstep,
)
from msgq.lockstep import example_controller as controller
from msgq.lockstep.pytest_plugin import Lockstep, lockstep  # noqa: F401 (the fixture)
from msgq.logs import LogReader, LogWriter
from msgq.messaging import PubMaster, SubMaster, log_from_bytes, new_message

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

STEPS = 300
TRIGGER = controller.TRIGGER
OUTPUTS = controller.OUTPUTS


# --- the log -------------------------------------------------------------------------------

def write_drive(folder: Path, steps: int = STEPS, seed: int = 7) -> Path:
    """A log of ``steps`` vehicleState events with jittered spacing (5-15 ms), each after
    two gyroscope and one accelerometer samples, plus a few sensor samples after the last
    vehicleState. The cruise control engages at step 20, the brake is pressed around
    step 150, the driver steers around step 220."""
    rng = random.Random(seed)
    t = 5_000_000_000
    with LogWriter(str(folder)) as log:
        for k in range(steps):
            for _ in range(2):
                m = new_message("gyroscope", logMonoTime=t, valid=True)
                m.gyroscope.value.z = 0.05 * rng.uniform(-1, 1) + 0.02
                m.gyroscope.timestampNs = t
                log.write(m)
                t += rng.randint(1_000_000, 3_000_000)
            m = new_message("accelerometer", logMonoTime=t, valid=True)
            m.accelerometer.value.y = rng.uniform(-1.5, 1.5)
            log.write(m)
            t += rng.randint(1_000_000, 3_000_000)
            m = new_message("vehicleState", logMonoTime=t, valid=True)
            vs = m.vehicleState
            vs.speed = 18.0 + 4.0 * k / steps + rng.uniform(-0.1, 0.1)
            vs.yawRate = rng.uniform(-0.05, 0.05)
            vs.cruiseState.enabled = k >= 20
            vs.cruiseState.setSpeed = 24.0 if k < 200 else 0.0
            vs.brakePressed = 150 <= k < 160
            vs.steeringPressed = 220 <= k < 225
            log.write(m)
            t += rng.randint(1_000_000, 7_000_000)
        for _ in range(3):
            m = new_message("gyroscope", logMonoTime=t, valid=True)
            log.write(m)
            t += 2_000_000
    return folder


@pytest.fixture(scope="module")
def drive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_drive(tmp_path_factory.mktemp("lockstep") / "drive")


@pytest.fixture(scope="module")
def baseline(drive: Path) -> LockstepResult:
    """The example controller replayed once over the drive, unloaded."""
    return run_lockstep(controller.main, drive, TRIGGER, OUTPUTS)


def trigger_times(drive: Path) -> list[int]:
    return [e.mono_ns for e in LogReader(str(drive), services=[TRIGGER]).raw()]


def run_dir_gone(process: LockstepProcess) -> bool:
    return not os.path.exists(process.queue_dir)


def pid_gone(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Busy processes on every core (at least two) while the test runs."""
    count = max(2, os.cpu_count() or 2)
    spin = "print('spinning', flush=True)\nwhile True: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
            for _ in range(count)]
    try:
        for hog in hogs:  # every one of them is busy before the test starts
            assert hog.stdout is not None and hog.stdout.readline() == b"spinning\n"
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


# --- services under test (module level: they are pickled into the child) -------------------

def counting_service(crash_at: int = -1, how: str = "raise", stall_at: int = -1) -> None:
    """Publishes controllerState (step = its step count) on even steps only; crashes
    (``how``: raise, kill, return) or stalls at the given step."""
    sm = SubMaster([TRIGGER], poll=TRIGGER)
    pm = PubMaster(["controllerState"])
    print("counting service up", flush=True)
    step = 0
    while True:
        sm.update(1000)
        if not sm.updated[TRIGGER]:
            continue
        if step == crash_at:
            if how == "raise":
                raise ZeroDivisionError(f"boom at step {step}")
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            return
        if step == stall_at:
            stuck_here()
        if step % 2 == 0:
            msg = clock.new_message("controllerState", valid=True)
            msg.controllerState.step = step
            pm.send("controllerState", msg)
        step += 1


def stuck_here() -> None:
    time.sleep(3600)


# --- determinism ---------------------------------------------------------------------------

def test_one_command_and_one_state_per_step(drive: Path, baseline: LockstepResult) -> None:
    times = trigger_times(drive)
    assert len(times) == STEPS
    assert len(baseline.steps) == STEPS
    assert baseline.startup == []
    for step, mono in zip(baseline.steps, times, strict=True):
        assert [e.service for e in step.events] == list(OUTPUTS)
        assert step.mono_ns == mono
        assert step.inputs == 4  # two gyroscope, one accelerometer, the trigger
    assert baseline.unused_inputs == 3  # the samples after the last vehicleState
    assert [e.event.controllerState.step for e in baseline.by_service("controllerState")] \
        == list(range(1, STEPS + 1))


def test_replay_under_cpu_load_is_byte_identical(drive: Path, baseline: LockstepResult,
                                                 cpu_load: None) -> None:
    loaded = run_lockstep(controller.main, drive, TRIGGER, OUTPUTS)
    # What the issue asks for: identical bytes with logMonoTime ignored ...
    assert_outputs_equal(baseline, loaded, mode="bytes")
    assert [canonical_bytes(e.data) for e in baseline.events] == \
        [canonical_bytes(e.data) for e in loaded.events]
    # ... and since the controller stamps its outputs with the simulated clock, the raw
    # bytes are identical too.
    assert [e.data for e in baseline.events] == [e.data for e in loaded.events]


def test_controller_saw_the_simulated_clock(drive: Path, baseline: LockstepResult,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    times = trigger_times(drive)
    for step, mono in zip(baseline.steps, times, strict=True):
        for event in step.events:
            assert event.mono_ns == mono  # stamped with the clock = the trigger's time
        state = step.of("controllerState")[0].event.controllerState
        assert state.cumLagMs == 0.0  # the clock stood at the trigger's logMonoTime

    # The same control law run in this process, on the logged times, gives the same
    # bytes; on a regular 10 ms clock it does not: dt (from the clock) matters.
    monkeypatch.setenv("SIMULATION", "1")

    def reference(step_times: list[int]) -> list[bytes]:
        sm = SubMaster(list(controller.INPUTS), poll=TRIGGER)
        law = controller.Controller()
        out: list[bytes] = []
        before: list[Any] = []
        events = iter(step_times)
        for event in LogReader(str(drive), services=controller.INPUTS):
            before.append(event)
            if event.which() != TRIGGER:
                continue
            now = next(events)
            sm.update_msgs(now / 1e9, before)
            before = []
            out += [m.to_bytes() for m in law.step(sm, now)]
        sm.close()
        return out

    assert reference(times) == [e.data for e in baseline.events]
    regular = [times[0] + 10_000_000 * k for k in range(len(times))]
    assert not diff_outputs(baseline.events, reference(regular),
                            ignore=("logMonoTime", "controllerState.cumLagMs")).equal


def test_command_target_gives_the_same_outputs(drive: Path, baseline: LockstepResult) -> None:
    command = [sys.executable, "-m", "msgq.lockstep.example_controller"]
    result = run_lockstep(command, drive, TRIGGER, OUTPUTS)
    assert_outputs_equal(baseline, result, mode="bytes", ignore=())


# --- the step protocol -----------------------------------------------------------------------

def test_steps_without_output_and_step_by_step(drive: Path) -> None:
    events = list(input_events(drive))
    triggers = [e for e in events if e.service == TRIGGER][:6]
    with LockstepProcess(counting_service, TRIGGER, ["controllerState"]) as process:
        assert process.start() == []
        outputs = [process.step(event) for event in triggers]
        assert process.clock_ns == triggers[-1].mono_ns
        pid = process.pid
    assert [len(s.events) for s in outputs] == [1, 0, 1, 0, 1, 0]
    assert [s.events[0].event.controllerState.step for s in outputs[::2]] == [0, 2, 4]
    assert "counting service up" in process.output
    assert pid_gone(pid) and run_dir_gone(process)


def test_max_steps_and_explicit_input_services(drive: Path) -> None:
    result = run_lockstep(controller.main, drive, TRIGGER, OUTPUTS, max_steps=25,
                          input_services=["accelerometer"])
    assert len(result.steps) == 25
    assert all(s.inputs == 2 for s in result.steps)  # the accelerometer, the trigger


def test_no_trigger_in_inputs_starts_nothing(drive: Path) -> None:
    sensors_only = LogReader(str(drive), services=["gyroscope", "accelerometer"])
    with pytest.raises(ValueError, match=r"no 'vehicleState' event.*gyroscope \(603\)"):
        run_lockstep(controller.main, sensors_only, TRIGGER, OUTPUTS)


def test_bad_targets_and_arguments(drive: Path) -> None:
    with pytest.raises(TypeError, match="picklable"):
        run_lockstep(lambda: None, drive, TRIGGER, OUTPUTS)
    with pytest.raises(TypeError, match="callable or a command"):
        LockstepProcess("python -m x", TRIGGER, OUTPUTS)
    with pytest.raises(ValueError, match="trigger"):
        LockstepProcess(controller.main, TRIGGER, [TRIGGER])
    with pytest.raises(ValueError, match="MSGQ_PREFIX"):
        LockstepProcess(controller.main, TRIGGER, OUTPUTS, env={"MSGQ_PREFIX": "x"})
    with pytest.raises(KeyError, match="vehicleState"):
        LockstepProcess(controller.main, "vehicleStat", OUTPUTS)


# --- failures ------------------------------------------------------------------------------

def test_crash_names_the_step_exit_code_and_traceback(drive: Path) -> None:
    with pytest.raises(LockstepProcessError) as error:
        run_lockstep(counting_service, drive, TRIGGER, ["controllerState"],
                     kwargs={"crash_at": 3})
    assert error.value.exit_code == 1
    assert error.value.step == 3
    message = str(error.value)
    assert "crashed with exit code 1 during step 3" in message
    assert "ZeroDivisionError: boom at step 3" in message
    assert "Traceback" in error.value.output


@pytest.mark.crash
def test_killed_and_exited_processes(drive: Path) -> None:
    with pytest.raises(LockstepProcessError, match=r"exit code -9 \(SIGKILL\) during step 5"):
        run_lockstep(counting_service, drive, TRIGGER, ["controllerState"],
                     kwargs={"crash_at": 5, "how": "kill"})
    with pytest.raises(LockstepProcessError, match="exited normally with exit code 0") as e:
        run_lockstep(counting_service, drive, TRIGGER, ["controllerState"],
                     kwargs={"crash_at": 0, "how": "return"})
    assert e.value.step == 0
    with pytest.raises(LockstepProcessError, match="exit code 127 before its first receive"):
        run_lockstep(["no-such-program-msgq-lockstep"], drive, TRIGGER, OUTPUTS)


def test_step_timeout_names_the_step_and_cleans_up(drive: Path) -> None:
    triggers = [e for e in input_events(drive) if e.service == TRIGGER]
    process = LockstepProcess(counting_service, TRIGGER, ["controllerState"],
                              kwargs={"stall_at": 2}, step_timeout=1.0)
    process.start()
    process.step(triggers[0])
    process.step(triggers[1])
    started = time.monotonic()
    with pytest.raises(LockstepTimeoutError) as error:
        process.step(triggers[2])
    assert time.monotonic() - started < 10
    assert isinstance(error.value, TimeoutError)
    assert error.value.step == 2
    assert "step 2 timed out" in str(error.value)
    assert f"logMonoTime {triggers[2].mono_ns}" in str(error.value)
    assert "stuck_here" in str(error.value)  # the stacks the process dumped
    assert process.closed and pid_gone(process.pid) and run_dir_gone(process)


def test_startup_timeout(drive: Path) -> None:
    with pytest.raises(LockstepTimeoutError, match="did not receive on 'vehicleState' within"):
        run_lockstep([sys.executable, "-c", "import time; time.sleep(60)"], drive, TRIGGER,
                     OUTPUTS, startup_timeout=1.0)


def test_remove_stale_runs(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    stale = [shm / f"test_1.lockstep-{dead.pid}-0123456789ab",
             shm / f"lockstep-{dead.pid}-0123456789ab", tmp / f"msgq-lockstep-{dead.pid}-x1"]
    alive = [shm / f"lockstep-{os.getpid()}-0123456789ab", tmp / f"msgq-lockstep-{os.getpid()}-y",
             shm / "unrelated"]
    for folder in stale + alive:
        (folder / "queue").mkdir(parents=True)
    assert sorted(remove_stale_runs(str(shm), str(tmp))) == sorted(map(str, stale))
    assert all(folder.exists() for folder in alive)


# --- the diff ------------------------------------------------------------------------------

def perturbed(result: LockstepResult, step: int, delta: float) -> list[list[bytes]]:
    """The steps of ``result`` as bytes, with controllerState.lateral.output of ``step``
    moved by ``delta``."""
    steps = [[e.data for e in s.events] for s in result.steps]
    builder = log_from_bytes(steps[step][1]).as_builder()
    builder.controllerState.lateral.output += delta
    steps[step][1] = builder.to_bytes()
    return steps


def test_diff_finds_a_perturbed_value(baseline: LockstepResult) -> None:
    changed = perturbed(baseline, 17, 1e-3)
    diff = diff_outputs(baseline, changed)
    assert not diff.equal
    [difference] = diff.differences
    assert (difference.step, difference.index, difference.service, difference.path) == \
        (17, 1, "controllerState", "controllerState.lateral.output")
    assert difference.b - difference.a == pytest.approx(1e-3, rel=1e-3)
    assert "step 17, event 1 (controllerState): controllerState.lateral.output" in str(diff)

    assert diff_outputs(baseline, changed,
                        tolerances={"controllerState.lateral.output": 2e-3}).equal
    assert diff_outputs(baseline, changed, tolerances={"controllerState.lateral": 2e-3}).equal
    assert not diff_outputs(baseline, changed,
                            tolerances={"controllerState.lateral.output": 1e-6}).equal
    assert diff_outputs(baseline, changed,
                        ignore=("logMonoTime", "controllerState.lateral")).equal
    assert diff_outputs(baseline, changed, ignore=("logMonoTime", "*.output")).equal
    in_bytes = diff_outputs(baseline, changed, mode="bytes")
    assert [d.path for d in in_bytes.differences] == ["controllerState.lateral.output"]
    with pytest.raises(AssertionError, match="step 17"):
        assert_outputs_equal(baseline, changed)


def test_diff_ignores_log_mono_time_by_default(baseline: LockstepResult) -> None:
    steps = [[e.data for e in s.events] for s in baseline.steps]
    builder = log_from_bytes(steps[3][0]).as_builder()
    builder.logMonoTime += 12345
    steps[3][0] = builder.to_bytes()
    assert diff_outputs(baseline, steps).equal
    assert diff_outputs(baseline, steps, mode="bytes").equal
    strict = diff_outputs(baseline, steps, ignore=())
    assert [(d.step, d.path) for d in strict.differences] == [(3, "logMonoTime")]
    assert not diff_outputs(baseline, steps, mode="bytes", ignore=()).equal


def test_diff_reports_structure(baseline: LockstepResult) -> None:
    steps = [[e.data for e in s.events] for s in baseline.steps]
    shorter = diff_outputs(baseline, steps[:-2])
    assert [d.path for d in shorter.differences] == ["<steps>"]
    assert "only in a: 298, 299" in str(shorter)

    extra = [list(s) for s in steps]
    extra[40].append(steps[40][0])
    [difference] = diff_outputs(baseline, extra).differences
    assert (difference.step, difference.path) == (40, "<events>")

    swapped = [list(s) for s in steps]
    swapped[41].reverse()
    paths = {d.path for d in diff_outputs(baseline, swapped).differences}
    assert paths == {"<service>"}

    many = diff_outputs(baseline, [[s[1], s[0]] for s in steps], max_differences=5)
    assert len(many.differences) == 5 and many.more == 2 * STEPS - 5
    flat = diff_outputs(baseline.events, [e.data for e in baseline.events])
    assert flat.equal and flat.events_compared == 2 * STEPS
    step_objects = [StepOutput(s.index, s.mono_ns, s.inputs, s.events) for s in baseline]
    assert diff_outputs(step_objects, steps).equal


# --- the clock -----------------------------------------------------------------------------

def test_clock_is_real_outside_the_harness(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.delenv(clock.CLOCK_ENV, raising=False)
    clock.reload()
    assert not clock.is_simulated()
    # resolved to the real clock: the time module's own functions, no Python frame between
    assert clock.monotonic is time.monotonic and clock.monotonic_ns is time.monotonic_ns
    assert clock.time_ns is time.time_ns and clock.wall_time is time.time
    before = time.monotonic_ns()
    now = clock.monotonic_ns()
    assert before <= now <= time.monotonic_ns()
    # the wall clock too: time.time() outside the harness (bracketed, not within a window)
    wall_before = time.time()
    wall = clock.wall_time()
    assert wall_before <= wall <= time.time()
    assert abs(clock.time_ns() - time.time_ns()) < 1_000_000_000

    path = tmp_path / "clock"
    writer = clock.ClockFile(str(path), mono_ns=42_000, wall_offset_ns=1_000)
    monkeypatch.setenv(clock.CLOCK_ENV, str(path))
    clock.reload()
    assert clock.monotonic_ns is not time.monotonic_ns  # resolved again at the next call
    try:
        assert clock.is_simulated()
        assert clock.monotonic_ns is not time.monotonic_ns
        assert clock.monotonic_ns() == 42_000 and clock.time_ns() == 43_000
        assert clock.wall_time() == 43_000 / 1e9
        writer.set(7_000_000_000)
        assert clock.monotonic() == 7.0
        assert clock.new_message("vehicleState").logMonoTime == 7_000_000_000
        # the harness moves the wall clock's offset (a log's logStart), mono stays
        writer.set_wall_offset(1_700_000_000 * 10**9)
        assert clock.time_ns() == 1_700_000_007 * 10**9 and clock.monotonic() == 7.0
        assert clock.wall_time() == 1_700_000_007.0
        writer.set_wall_offset(-2_000_000_000)  # wall = mono + offset, offsets below 0 too
        assert clock.time_ns() == 5_000_000_000
    finally:
        writer.close()
        monkeypatch.delenv(clock.CLOCK_ENV)
        clock.reload()
    assert not path.exists()

    monkeypatch.setenv(clock.CLOCK_ENV, str(tmp_path / "missing"))
    clock.reload()
    try:
        with pytest.raises(RuntimeError, match="cannot be opened"):
            clock.monotonic_ns()
    finally:
        monkeypatch.delenv(clock.CLOCK_ENV)
        clock.reload()


# --- the fixture ---------------------------------------------------------------------------

def test_fixture_runs_and_cleans_up(lockstep: Lockstep, drive: Path,  # noqa: F811
                                    baseline: LockstepResult) -> None:
    lockstep.defaults["max_steps"] = 30
    result = lockstep.run(controller.main, drive, TRIGGER, OUTPUTS)
    lockstep.assert_equal(result.steps, baseline.steps[:30])
    process = lockstep.start(controller.main, TRIGGER, OUTPUTS)
    assert process.startup == []
    pid = process.pid
    lockstep.close()  # what the teardown does
    assert pid_gone(pid) and run_dir_gone(process)
