"""A warm Spark: ``msgq spark serve`` (a real Spark Connect server process on a free loopback
port, started once for the module) and commands attaching to it with ``--remote`` /
``MSGQ_SPARK_REMOTE``; their results against a local session's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from helpers import MSGQ, child_env, free_port, run_cli  # noqa: E402

pytestmark = pytest.mark.spark

#: Long enough for the server's JVM and warm-up query on a loaded two-core machine.
START_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six simulated seconds of the benchmark's services (one segment, about 4,700
    events: outages make gaps, one event in 50 is invalid)."""
    # the benchmark's recording: realistic rates, jitter and gaps
    from msgq.bench.spark import make_recording

    folder = tmp_path_factory.mktemp("connect") / "rec"
    assert make_recording(str(folder), 6, 60) > 1000
    return folder


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``msgq spark serve`` on a free loopback port, in the foreground as a user runs it;
    its URL. Stopped with ``msgq spark serve --stop`` at the end, which must end it."""
    port = free_port()
    proc = subprocess.Popen([*MSGQ, "spark", "serve", "--port", str(port)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout is not None and proc.stderr is not None
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True).start()
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    url = lines[0].strip() if lines else ""
    if not url.startswith("sc://"):
        proc.kill()
        proc.wait()
        pytest.fail(f"msgq spark serve printed no URL within {START_TIMEOUT_S:g} s "
                    f"(exit {proc.returncode}):\n{''.join(errors)[-3000:]}")
    assert url == f"sc://127.0.0.1:{port}"
    try:
        yield url
    finally:
        stopped = run_cli("spark", "serve", "--stop", "--port", str(port), expect=None,
                          timeout=90)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("msgq spark serve still ran 60 s after --stop")
        assert stopped.returncode == 0, stopped.stderr
        assert proc.returncode == 0, "".join(errors)[-3000:]


def _attached_line(stderr: str, url: str) -> None:
    """The one line saying the command attached to the server at ``url``."""
    lines = [line for line in stderr.splitlines() if "Connect server" in line]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"msgq: Spark on the Connect server at {url} "), stderr


def test_logstats_attaches_and_matches_a_local_session(server: str, recording: Path,
                                                       spark: object) -> None:
    # the local answer: the suite's local session, the same analyses
    import msgq.spark
    from msgq.spark.analyses import expected_rates, log_stats

    df = msgq.spark.read_logs(spark, str(recording), data=False, compact=True,
                              keep_problems=True)
    stats = log_stats(df, expected_rates())
    local = json.loads(json.dumps(stats.to_dict()))
    stats.unpersist()
    done = run_cli("logstats", str(recording), "--json", "--remote", server,
                   env=child_env(MSGQ_SPARK_REMOTE=None), timeout=120)
    _attached_line(done.stderr, server)
    remote = json.loads(done.stdout)
    assert remote["master"] == server
    assert remote["services"], "no statistics at all"
    for key in ("services", "segments", "gaps", "problems"):
        assert remote[key] == local[key], key


def test_spark_session_honours_the_environment(server: str, recording: Path) -> None:
    code = (
        "import sys\n"
        "import msgq.spark\n"
        "from msgq.spark.session import spark_session\n"
        "spark = spark_session()\n"
        "df = msgq.spark.read_logs(spark, sys.argv[1])\n"
        "print(type(spark).__module__, df.where(df.service.isNotNull()).count())\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(recording)], capture_output=True,
                          text=True, timeout=120, env=child_env(MSGQ_SPARK_REMOTE=server))
    assert done.returncode == 0, done.stderr
    _attached_line(done.stderr, server)
    module, count = done.stdout.split()
    assert module.startswith("pyspark.sql.connect")
    from msgq.logs import LogReader

    assert int(count) == sum(1 for _ in LogReader(str(recording)))


def test_a_dead_remote_is_refused_in_one_line(recording: Path) -> None:
    port = free_port()  # nobody listens there
    url = f"sc://127.0.0.1:{port}"
    started = time.monotonic()
    done = run_cli("logstats", str(recording), "--remote", url, expect=1, timeout=60)
    assert time.monotonic() - started < 30
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"msgq logstats: error: no Spark Connect server at {url}")
    assert "msgq spark serve" in lines[0]
    # from the environment: said with the variable's name
    done = run_cli("logstats", str(recording), expect=1, timeout=60,
                   env=child_env(MSGQ_SPARK_REMOTE=url))
    assert done.stderr.strip().splitlines() == [
        line.replace(url, f"{url} (MSGQ_SPARK_REMOTE)") for line in lines]


def test_a_port_that_speaks_no_spark_connect_is_refused(recording: Path) -> None:
    """A listener that accepts and never answers: one line after the connect timeout,
    not gRPC's minutes of retries."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"sc://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        done = run_cli("logstats", str(recording), "--remote", url, expect=1, timeout=90)
        assert time.monotonic() - started < 45
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Spark Connect server answered" in lines[0], done.stderr


def test_bad_remote_urls_and_conflicts_are_usage_errors(recording: Path) -> None:
    done = run_cli("logstats", str(recording), "--remote", "http://127.0.0.1:15002", expect=2)
    assert "is not a Spark Connect URL" in done.stderr
    done = run_cli("logstats", str(recording), "--remote", "sc://127.0.0.1:1",
                   "--master", "local[1]", expect=2)
    assert "--remote and --master" in done.stderr
    done = run_cli("logstats", str(recording), "--follow", "--remote", "sc://127.0.0.1:1",
                   expect=2)
    assert "--follow" in done.stderr


def test_serve_status_and_a_second_server_on_the_port(server: str) -> None:
    port = server.rsplit(":", 1)[1]
    status = run_cli("spark", "serve", "--status", "--port", port)
    assert status.stdout.startswith(f"{server} (pid ")
    second = run_cli("spark", "serve", "--port", port, expect=1, timeout=60)
    assert "already runs on port" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    free = str(free_port())
    assert "no msgq spark serve runs" in run_cli("spark", "serve", "--status", "--port", free,
                                                 expect=1).stderr
    assert os.path.exists(os.path.join(_state_folder(), f"{port}.json"))


def _state_folder() -> str:
    # stdlib only: where the state files live
    from msgq.spark.server import state_folder

    return state_folder()


def test_the_java_version_is_asked_once_per_runtime(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every local session checks its Java runtime; a JVM started only to print its
    version is remembered per runtime (its file and the variables it reads), not run for
    every command."""
    from msgq.spark import session

    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    java = home / "bin" / "java"

    def install(version: str) -> None:
        java.write_text(f"#!/bin/sh\necho x >> {calls}\n"
                        f"echo 'openjdk version \"{version}\" 2025-04-15' >&2\n")
        java.chmod(0o755)

    install("17.0.15")
    monkeypatch.setenv("JAVA_HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("JAVA_TOOL_OPTIONS", raising=False)
    assert session.check_java() == 17
    assert session.check_java() == 17
    assert calls.read_text().count("x") == 1
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xss2m")  # java -version says it picked it up
    assert session.check_java() == 17
    assert calls.read_text().count("x") == 2
    install("11.0.2")  # the runtime replaced: asked again, and refused
    with pytest.raises(session.JavaMissingError, match="Java 11"):
        session.check_java()
    assert calls.read_text().count("x") == 3


#: Run in a child process (a process holds a classic session or a Connect one, not both):
#: the lake's compact read on the Connect session, its checks, and log_stats's answers.
_ON_CONNECT = """
import json, sys
from msgq.spark import read_logs
from msgq.spark.analyses import log_stats
from msgq.spark.compact import COMPACT_COLUMNS, GroupableRead
from msgq.spark.connect import is_connect
from msgq.spark.session import spark_session

spark = spark_session()
rates = json.loads(sys.argv[2])
read = read_logs(spark, sys.argv[1], compact=True)
assert is_connect(spark) and isinstance(read, GroupableRead), type(read)
assert is_connect(read.frame.sparkSession)
assert tuple(read.columns) == COMPACT_COLUMNS  # used as the frame it holds
assert read.where(read["kind"] == "problem").count() > 0
assert not isinstance(read.select("*"), GroupableRead)
print(json.dumps([log_stats(read, rates).to_dict(),  # grouped in the tasks
                  log_stats(read.select("*"), rates).to_dict()]))  # Spark's shuffle
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_compact_lake_read_on_connect_groups_in_tasks(
        spark: Any, server: str, tmp_path: Path) -> None:
    """A lake's compact read on the Connect session is a GroupableRead over a Connect
    DataFrame (nothing set on the frame, which answers unknown attribute names with a
    Column), used as that frame; ``log_stats`` groups it in the tasks that read it with
    the local session's answers."""
    from test_spark_stats import RATES, write_corner_recordings

    from msgq.spark import lake as lakes
    from msgq.spark import read_logs
    from msgq.spark.analyses import log_stats

    a, b = tmp_path / "drive-a", tmp_path / "drive b"
    write_corner_recordings(a, b)
    lake = str(tmp_path / "lake")
    lakes.build(spark, [str(a), str(b)], lake)
    stats = log_stats(read_logs(spark, lake, compact=True), RATES)
    local = json.loads(json.dumps(stats.to_dict()))
    done = subprocess.run([sys.executable, "-c", _ON_CONNECT, lake, json.dumps(RATES)],
                          capture_output=True, text=True, timeout=300,
                          env=child_env(MSGQ_SPARK_REMOTE=server))
    assert done.returncode == 0, done.stderr[-3000:]
    grouped, shuffled = json.loads(done.stdout)
    assert local["services"] and grouped == local and shuffled == local
