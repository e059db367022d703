"""What a newcomer meets first, in the parts that can be checked quickly: ``./run.sh``'s
demo (its Spark statistics never write the driver's class archive, which the first run
would wait for; its report's counts read right) and scripts/ensure_env.sh (the run
profile installs the spark extra's requirements, not the test extra's), and
docs/cli.md against the commands (a section for each, the messages quoted as
printed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from msgq.demo import pipeline, setup_wait

ROOT = Path(__file__).resolve().parent.parent
JAVA = "/opt/java/bin/java"
VERSION = 'openjdk version "17.0.1"\n'


def test_the_demos_logstats_maps_the_class_archive_but_never_writes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MSGQ_SPARK_CLASS_CACHE", raising=False)
    assert pipeline._logstats_env()["MSGQ_SPARK_CLASS_CACHE"] == "read"
    monkeypatch.setenv("MSGQ_SPARK_CLASS_CACHE", "0")  # the user's choice stands
    assert pipeline._logstats_env()["MSGQ_SPARK_CLASS_CACHE"] == "0"


def test_read_mode_maps_an_archive_that_is_there_and_writes_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    from msgq.spark import class_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("MSGQ_SPARK_CLASS_CACHE", "read")
    path = class_cache.archive_path(JAVA, VERSION)
    assert class_cache.enabled() and not class_cache.writes_missing()
    assert class_cache.jvm_flags(JAVA, VERSION) == []
    assert not os.path.exists(path + ".writing")  # no marker: nobody is writing it
    os.makedirs(os.path.dirname(path), mode=0o700)
    Path(path).write_bytes((0xF00BABA8).to_bytes(4, sys.byteorder) + b"the rest")
    assert class_cache.jvm_flags(JAVA, VERSION) == [
        f"-XX:SharedArchiveFile={path}", "-XX:+VerifySharedSpaces", "-Xlog:cds*=off"]
    monkeypatch.setenv("MSGQ_SPARK_CLASS_CACHE", "1")
    os.remove(path)
    assert class_cache.writes_missing()
    assert class_cache.jvm_flags(JAVA, VERSION)[0] == f"-XX:ArchiveClassesAtExit={path}"


def _pending_setup(tmp_path: Path, script: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A set-up job the way scripts/ensure_env.sh leaves one running for the demo: a
    process (its pid in extra-setup.pid) that writes its exit status to extra-setup.status
    when it ends (``script``: a shell command run in ``tmp_path``)."""
    status = tmp_path / "extra-setup.status"
    job = subprocess.Popen(["sh", "-c", script], cwd=tmp_path)
    (tmp_path / "extra-setup.pid").write_text(f"{job.pid}\n")
    return str(status), job


def test_the_demo_waits_for_the_spark_extra_that_run_sh_left_installing(
        tmp_path: Path) -> None:
    assert setup_wait.wait_for_setup(None) is None  # nothing pending: no wait
    status, job = _pending_setup(tmp_path, "sleep 0.5; echo 0 > extra-setup.status")
    assert setup_wait.wait_for_setup(status, timeout=30) is None
    assert os.path.exists(status)  # it returned only once the job had ended
    job.wait(10)


def test_the_spark_step_may_start_its_session_once_pyspark_alone_is_installed(
        tmp_path: Path) -> None:
    status, job = _pending_setup(
        tmp_path, "sleep 0.3; : > extra-setup.pyspark; exec sleep 30")
    try:
        assert setup_wait.wait_for_setup(status, timeout=30, pyspark_only=True) is None
        assert job.poll() is None and not os.path.exists(status)  # the rest goes on
        started = time.monotonic()  # the whole extra is still waited for
        assert setup_wait.wait_for_setup(status, timeout=0.5) is not None
        assert time.monotonic() - started >= 0.5
    finally:
        job.kill()
        job.wait(10)
    # an install that fails before pyspark is in is a failure either way
    failed = tmp_path / "failed"
    failed.mkdir()
    status, job = _pending_setup(failed, "echo 1 > extra-setup.status")
    job.wait(10)
    problem = setup_wait.wait_for_setup(status, timeout=30, pyspark_only=True)
    assert problem is not None and "failed (exit 1" in problem


def test_the_demo_says_why_its_spark_step_cannot_run_when_the_install_fails(
        tmp_path: Path) -> None:
    status, job = _pending_setup(tmp_path, "sleep 0.2; echo 1 > extra-setup.status")
    problem = setup_wait.wait_for_setup(status, timeout=30)
    assert problem is not None and "failed (exit 1" in problem
    assert str(tmp_path / "extra-setup.log") in problem
    job.wait(10)
    # a status file created and not yet written (a shell opens it before it writes) is
    # waited through, not read as an empty exit status
    os.remove(status)
    status, job = _pending_setup(
        tmp_path, "sleep 0.2; : > extra-setup.status; sleep 0.6; echo 1 > extra-setup.status")
    problem = setup_wait.wait_for_setup(status, timeout=30)
    assert problem is not None and "failed (exit 1;" in problem
    job.wait(10)
    # a job killed before it could write its status is noticed, not waited for to the end
    status, job = _pending_setup(tmp_path, "exec sleep 30")
    os.remove(status)
    job.kill()
    started = time.monotonic()
    problem = setup_wait.wait_for_setup(status, timeout=60)
    assert problem is not None and "stopped without finishing" in problem
    assert time.monotonic() - started < 10


def _spark_step(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    """The demo's Spark process (msgq.demo.spark_step) on a recording that does not
    matter, with a Java 11 runtime: Spark refuses it at once, so no JVM starts."""
    java = tmp_path / "java11" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    java.chmod(0o755)
    return subprocess.Popen(
        [sys.executable, "-m", "msgq.demo.spark_step", str(tmp_path / "rec"),
         str(tmp_path / "rates.png")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "JAVA_HOME": str(java.parent.parent), **env})


def test_the_demos_spark_step_yields_to_the_robot_and_runs_only_when_told(
        tmp_path: Path) -> None:
    from msgq.demo import spark_step

    step = _spark_step(tmp_path)
    try:
        # it waits for the demo's line at a lower priority (inherited by its JVM); a test
        # run already at the lowest (nice 19: ./test.sh --pythons) sees no change
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        expected = min(19, ours + spark_step.NICENESS)
        deadline = time.monotonic() + 60
        while expected != ours and os.getpriority(os.PRIO_PROCESS, step.pid) == ours:
            assert step.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert os.getpriority(os.PRIO_PROCESS, step.pid) == expected
        out, err = step.communicate("", timeout=60)  # the demo ended without its line
    finally:
        step.kill()
    assert (step.returncode, out) == (0, "")
    assert not (tmp_path / "rates.png").exists()
    # told, it runs msgq logstats, whose error (Java 11) is the step's
    step = _spark_step(tmp_path / "told")
    out, err = step.communicate("go\n", timeout=120)
    assert step.returncode == 1 and "msgq logstats: error:" in err, err


def test_the_demos_spark_step_ends_at_once_when_the_spark_extra_failed(
        tmp_path: Path) -> None:
    from msgq.demo import spark_step

    status, job = _pending_setup(tmp_path, "echo 1 > extra-setup.status")
    job.wait(10)
    step = _spark_step(tmp_path, MSGQ_PENDING_SETUP=status)
    step.communicate(timeout=60)
    assert step.returncode == spark_step.EXIT_SETUP_FAILED


def test_the_demos_report_counts_in_words_that_agree_with_the_numbers() -> None:
    one = {"messages": 1, "services": {"can": 1}, "segments": 1, "file_bytes": 2_000_000,
           "drops": 1, "bad": 0}
    assert pipeline._recording_line(one, "rec") == (
        "recording    1 message of 1 service, 1 segment, 2.00 MB (zstd), 1 drop, 0 bad -> rec")
    many = {**one, "messages": 9440, "services": {"can": 1, "gps": 2}, "segments": 4,
            "drops": 0}
    assert pipeline._recording_line(many, "rec").startswith(
        "recording    9440 messages of 2 services, 4 segments, 2.00 MB (zstd), 0 drops")


def test_the_cli_page_quotes_the_missing_extra_messages_as_commands_print_them() -> None:
    from msgq.extras import MissingExtraError, require

    page = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    for command, extra, library in (("logstats", "spark", "pyspark"), ("export", "viz", "mcap")):
        with pytest.raises(MissingExtraError) as missing:
            require(extra, "msgq_no_such_module")
        message = str(missing.value).replace("msgq_no_such_module", library)
        assert f"msgq {command}: error: {message}" in page


def test_the_cli_page_has_a_section_for_every_command_of_msgq_help() -> None:
    from msgq.cli import build_parser

    page = (ROOT / "docs" / "cli.md").read_text()
    commands = list(build_parser().command_parsers)
    assert len(commands) >= 14
    for command in commands:
        assert f"\n## msgq {command}\n" in page, command
        assert f"](#msgq-{command})" in page, command


def _requirements(profile: str) -> list[str]:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "ensure_env.sh"),
                          "--print-requirements", profile],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [re.split(r"[<>=!~ ;\[]", line)[0] for line in out.split()]


def test_the_run_profile_installs_the_spark_extra_and_the_test_profile_everything() -> None:
    run, test = _requirements("run"), _requirements("test")
    for name in ("numpy", "pycapnp", "pyzmq", "pyspark", "pyarrow", "pandas", "matplotlib"):
        assert name in run and name in test, name
    for name in ("pytest", "ruff", "atheris", "scons", "mcap", "Cython"):
        assert name not in run and name in test, name
    assert not [r for r in run + test if r.startswith("msgq")]  # own extras expanded


def test_lockstep_page_says_before_its_details_that_a_script_needs_the_main_guard() -> None:
    page = (ROOT / "docs" / "lockstep.md").read_text()
    intro = page[: page.index("## How it works")]
    assert 'if __name__ == "__main__":' in intro


def _scons_step(tmp_path: Path, fake_scons: str) -> subprocess.CompletedProcess[str]:
    """test.sh's scons_step run in ``tmp_path`` with a fake .venv/bin/scons."""
    text = (ROOT / "test.sh").read_text()
    function = text[text.index("scons_step() {"):]
    function = function[:function.index("\n}\n") + 3]
    (tmp_path / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    scons = tmp_path / ".venv" / "bin" / "scons"
    scons.write_text("#!/bin/sh\n" + fake_scons)
    scons.chmod(0o755)
    return subprocess.run(["bash", "-c", f"set -euo pipefail; jobs=2; {function}"
                           "scons_step c-tests-plain test"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_test_sh_keeps_the_compiler_lines_in_a_log_and_shows_them_on_failure(
        tmp_path: Path) -> None:
    # ./test.sh printed about 70 raw gcc/ar lines per build.
    compiled = ("echo 'gcc -o build/plain/x.o -c msgq/src/x.c'\necho 'ar rc build/libx.a'\n"
                "echo 'ok   test_round_trip'\necho '29 passed, 0 failed'\n"
                "echo 'ring: 2 passed, 0 failed'\n")
    done = _scons_step(tmp_path, compiled)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("   31 passed, 0 failed in 2 C test run(s) "
                           "(output: build/c-tests-plain.log)\n")
    assert "gcc -o" in (tmp_path / "build" / "c-tests-plain.log").read_text()
    failed = _scons_step(tmp_path, "echo 'gcc -c x.c'\necho 'x.c:1: error: oops'\nexit 2\n")
    assert failed.returncode == 1
    assert "x.c:1: error: oops" in failed.stdout
    assert "failed: scons test (full output: build/c-tests-plain.log)" in failed.stderr
