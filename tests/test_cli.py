"""The ``msgq`` command, run as users run it (``python -m msgq``, a separate process)
against queues of real publisher and subscriber processes in the test's namespace."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import child_env, free_port, interrupt, run_logstats

import msgq.cli
import msgq.cli.bench
from msgq.cli import main
from msgq.cli.output import human_age, human_bytes, paint, use_colour
from msgq.queues import LAYOUT_VERSION, queue_dir, queue_path
from msgq.version import DISTRIBUTION

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("shm")]

# A publisher or subscriber in a process of its own: connects, says "ready", then waits
# until its stdin closes (or it is killed).
ENDPOINT_PROCESS = """
import sys
import msgq
role, endpoint = sys.argv[1], sys.argv[2]
if role == "pub":
    sock = msgq.pub_sock(endpoint, segment_size=4096)
    sock.send(b"x" * 100)
else:
    sock = msgq.sub_sock(endpoint, segment_size=4096)
print("ready", flush=True)
sys.stdin.read()
"""


def cli_env() -> dict[str, str]:
    """The test's environment (the shm fixture's backend, its MSGQ_PREFIX), no colour."""
    return child_env(NO_COLOR="1")


def msgq_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "msgq", *args],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Endpoints:
    """Starts publisher/subscriber processes and stops them at the end of the test."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, role: str, endpoint: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", ENDPOINT_PROCESS, role, endpoint],
            env=cli_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until it is connected (or died)
        assert line == "ready\n", f"{role} of {endpoint} did not start"
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[str]) -> None:
        """SIGKILL, then reap it: until reaped a killed child still exists (a zombie)."""
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def endpoints() -> Iterator[Endpoints]:
    procs = Endpoints()
    yield procs
    procs.stop_all()


def queues_json() -> dict[str, Any]:
    proc = msgq_cli("queues", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def by_endpoint(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {q["endpoint"]: q for q in document["queues"]}


def one_line(text: str) -> str:
    lines = text.strip("\n").split("\n")
    assert len(lines) == 1, text
    return lines[0]


# --- the command itself ----------------------------------------------------------------


def test_every_command_is_registered_and_loads() -> None:
    # The commands users and the docs rely on: dropping one from the list, or one that
    # no longer imports (shown as "unavailable"), fails here rather than going unnoticed.
    expected = {"dump", "top", "queues", "record", "replay", "info", "logstats", "export",
                "foxglove", "spark", "bridge", "bench", "config"}
    assert expected <= set(msgq.cli.COMMANDS)
    parser = msgq.cli.build_parser()
    for name in expected:
        assert parser.command_parsers[name].get_default("_run").__module__ == \
            f"msgq.cli.{name}", name


def test_the_command_table_gives_each_command_its_modules_help() -> None:
    # `msgq --help` lists the table's lines without importing the modules: each line must
    # be the one the module registers for `msgq <command> --help`.
    parser = msgq.cli.build_parser()
    actions = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in actions._choices_actions}
    assert helps == {name: command.help for name, command in msgq.cli.COMMANDS.items()}


# Runs the msgq command in a process where pyspark cannot be imported, then lists the
# command modules that were imported.
WITHOUT_PYSPARK = """
import sys, importlib.abc
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'pyspark':
            raise ImportError(f'No module named {name!r}', name=name)
sys.meta_path.insert(0, Hide())
import msgq.cli
try:
    code = msgq.cli.main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(sorted(m for m in msgq.cli.COMMANDS if f"msgq.cli.{m}" in sys.modules), file=sys.stderr)
sys.exit(code)
"""


def without_pyspark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_PYSPARK, *args], env=cli_env(),
                          capture_output=True, text=True, timeout=60)


def test_help_imports_no_command_and_one_command_imports_itself() -> None:
    proc = without_pyspark("--help")
    assert proc.returncode == 0 and "commands:" in proc.stdout, proc.stderr
    assert proc.stderr.splitlines() == ["[]"]
    proc = without_pyspark("queues", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["['queues']"]


def test_a_command_whose_extra_is_missing_says_what_to_install_in_one_line(
        tmp_path: Path) -> None:
    proc = without_pyspark("logstats", str(tmp_path))
    assert proc.returncode == 1
    error, loaded = proc.stderr.splitlines()
    assert error == ("msgq logstats: error: pyspark is not installed; this needs the spark "
                     f"extra: pip install '{DISTRIBUTION}[spark]'")
    assert loaded == "[]"  # said before the command's module (which imports it) is loaded


@pytest.mark.parametrize("command", [None, *msgq.cli.COMMANDS])
def test_help_has_examples_and_exits_zero(command: str | None) -> None:
    proc = msgq_cli(*([command] if command else []), "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: msgq" in proc.stdout
    assert "examples:\n  msgq" in proc.stdout
    assert proc.stderr == ""


def test_unknown_command_is_a_one_line_error() -> None:
    proc = msgq_cli("queus")
    assert proc.returncode == 2
    assert proc.stdout == ""
    line = one_line(proc.stderr)
    assert line.startswith("msgq: error: unknown command 'queus'")
    assert "did you mean 'queues'?" in line


def test_bad_option_is_a_one_line_error() -> None:
    proc = msgq_cli("queues", "--no-such-option")
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert line.startswith("msgq queues: error: unrecognized arguments: --no-such-option")


def test_no_command_shows_help_and_fails() -> None:
    proc = msgq_cli()
    assert proc.returncode == 2
    assert "commands:" in proc.stderr


def test_interrupt_exits_130_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr("msgq.cli.queues.run", interrupted)
    assert main(["queues"]) == 130
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_colour_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_colour(Terminal())  # type: ignore[arg-type]
    assert paint("dead", "red", Terminal()) == "\x1b[31mdead\x1b[0m"  # type: ignore[arg-type]
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(Terminal())  # type: ignore[arg-type]
    monkeypatch.delenv("NO_COLOR")
    assert not use_colour(open(os.devnull, "w"))  # noqa: SIM115


def test_human_forms() -> None:
    assert [human_bytes(n) for n in (None, 0, 1536, 10 * 2**20, 300 * 2**30)] == [
        "-",
        "0 B",
        "1.5 KiB",
        "10.0 MiB",
        "300 GiB",
    ]
    assert [human_age(s) for s in (None, 5.9, 130, 7200, 3 * 86400)] == [
        "-",
        "5 s ago",
        "2 min ago",
        "2 h ago",
        "3 d ago",
    ]


# --- msgq config -------------------------------------------------------------------------


def test_config_prints_the_flags_of_the_installed_c_api(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from msgq import cflags

    proc = msgq_cli("config", "--include-dir")  # once as users run it
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == f"{cflags.include_dir()}\n"
    assert (cflags.include_dir() / "msgq.h").is_file()

    def config(*args: str) -> list[str]:  # the other forms in this process (fast)
        assert main(["config", *args]) == 0
        out, err = capsys.readouterr()
        assert err == ""
        return out.split()

    both = config()
    assert f"-I{cflags.include_dir()}" in both and "-lmsgq" in both
    assert f"-L{cflags.lib_dir()}" in both and f"-Wl,-rpath,{cflags.lib_dir()}" in both
    assert config("--libs", "--static") == [str(cflags.lib_dir() / "libmsgq.a"), "-lpthread"]
    vision = config("--libs", "--visionipc")
    assert vision.index("-lvisionipc") < vision.index("-lmsgq")  # the order a linker needs
    assert config("--lib-dir") == [str(cflags.lib_dir())]


def test_config_without_the_c_library_says_so_and_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from msgq import cflags

    gone = cflags.lib_dir() / "libmsgq.so"
    monkeypatch.setattr(cflags, "missing", lambda: [gone])
    assert main(["config", "--libs"]) == 1
    out, err = capsys.readouterr()
    assert out.split() and "-lmsgq" in out.split()  # the flags still, for the record
    assert one_line(err) == f"msgq config: not installed: {gone} (rebuild msgq with pip install .)"


# --- msgq logstats: the gap options --------------------------------------------------------


@pytest.mark.spark
def test_logstats_gap_factor_and_max_gaps(spark: object, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from msgq.logs import LogWriter
    from msgq.messaging import new_message
    from msgq.schemas import find_service

    period = 1e9 / find_service("gyroscope").frequency
    # 100 events one period apart, but 3 periods before events 20, 40 and 60, 7 before 80
    mono, stamps = 10**9, []
    for i in range(100):
        mono += round(period * {20: 3, 40: 3, 60: 3, 80: 7}.get(i, 1))
        stamps.append(mono)
    with LogWriter(str(tmp_path / "rec")) as writer:
        for stamp in stamps:
            writer.write(new_message("gyroscope", logMonoTime=stamp))
    folder = str(tmp_path / "rec")

    def gaps(*options: str) -> tuple[float, list[int]]:
        code, text = run_logstats(folder, "--json", "--services", "gyroscope", *options)
        assert code == 0, text
        doc = json.loads(text)
        return doc["gap_factor"], [round(g["duration_ms"] * 1e6 / period) for g in doc["gaps"]]

    assert gaps() == (2.5, [3, 3, 3, 7])  # the default: dt over 2.5 periods
    # (each logstats run is a Spark job, seconds each: three of them)
    assert gaps("--gap-factor", "5") == (5.0, [7])

    def gap_rows(text: str, heading: str) -> list[str]:
        after = text.split(f"\n{heading}\n", 1)[1].split("\n\n", 1)[0].splitlines()
        return [line for line in after if line.startswith("gyroscope")]

    code, text = run_logstats(folder, "--services", "gyroscope", "--max-gaps", "2")
    assert code == 0, text
    assert len(gap_rows(text, "gaps (first 2 of 4; --json lists all)")) == 2
    capsys.readouterr()
    code, _ = run_logstats(folder, "--gap-factor", "0")
    assert code == 2 and "--gap-factor" in one_line(capsys.readouterr().err)


# --- msgq queues -------------------------------------------------------------------------


def test_queues_in_an_empty_namespace() -> None:
    proc = msgq_cli("queues")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no queues in ")
    assert queues_json()["queues"] == []


def test_queues_lists_a_live_publisher_and_its_readers(endpoints: Endpoints) -> None:
    pub = endpoints.start("pub", "ep_live")
    endpoints.start("sub", "ep_live")
    endpoints.start("sub", "ep_live")
    q = by_endpoint(queues_json())["ep_live"]
    assert q["state"] == "live" and q["valid"] is True
    assert q["publisher_pid"] == pub.pid and q["publisher_alive"] is True
    assert (q["readers_live"], q["readers_claimed"]) == (2, 2)
    assert q["segment_size"] == 4096
    assert q["bytes_written"] == 8 + 104  # size prefix + 100 bytes padded to 8
    assert q["path"] == queue_path("ep_live")
    assert 0 <= q["age_s"] < 600

    proc = msgq_cli("queues")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout  # no colour into a pipe
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith("ep_live"))
    assert row[:6] == ["ep_live", "live", "4.0", "KiB", str(pub.pid), "alive"]
    assert row[6] == "2/2"


def test_a_killed_publisher_shows_as_dead(endpoints: Endpoints) -> None:
    pub = endpoints.start("pub", "ep_dead")
    endpoints.kill(pub)
    q = by_endpoint(queues_json())["ep_dead"]
    assert q["state"] == "dead"
    assert q["publisher_pid"] == pub.pid and q["publisher_alive"] is False
    proc = msgq_cli("queues")
    assert f"{pub.pid} dead" in proc.stdout


def test_clean_removes_only_the_queues_nobody_alive_uses(endpoints: Endpoints) -> None:
    endpoints.start("pub", "ep_live_pub")
    endpoints.kill(endpoints.start("pub", "ep_live_reader"))
    endpoints.start("sub", "ep_live_reader")  # a live reader, its publisher dead
    endpoints.kill(endpoints.start("pub", "ep_all_dead"))
    endpoints.kill(endpoints.start("sub", "ep_all_dead"))
    paths = {
        name: Path(queue_path(name)) for name in ("ep_live_pub", "ep_live_reader", "ep_all_dead")
    }

    dry = msgq_cli("queues", "--clean", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove ep_all_dead" in dry.stdout
    assert all(p.exists() for p in paths.values())

    proc = msgq_cli("queues", "--clean")
    assert proc.returncode == 0, proc.stderr
    assert "removed ep_all_dead" in proc.stdout
    assert "kept ep_live_pub: in use by a live process" in proc.stdout
    assert "kept ep_live_reader: in use by a live process" in proc.stdout
    assert not paths["ep_all_dead"].exists()
    assert paths["ep_live_pub"].exists() and paths["ep_live_reader"].exists()
    assert set(by_endpoint(queues_json())) == {"ep_live_pub", "ep_live_reader"}

    document = json.loads(msgq_cli("queues", "clean", "--json").stdout)
    assert document["removed"] == [] and len(document["kept"]) == 2


def test_damaged_files_are_listed_not_trusted(endpoints: Endpoints) -> None:
    folder = Path(queue_dir(create=True))
    (folder / "msgq_random").write_bytes(os.urandom(5000))
    (folder / "msgq_empty").write_bytes(b"")
    pub = endpoints.start("pub", "ep_truncated")
    endpoints.kill(pub)
    os.truncate(queue_path("ep_truncated"), 100)
    old = endpoints.start("pub", "ep_old")  # as left by the msgq before an upgrade
    endpoints.kill(old)
    with open(queue_path("ep_old"), "r+b") as f:
        f.seek(8)  # layout_version, after the magic
        f.write((LAYOUT_VERSION - 1).to_bytes(4, "little"))
    (folder / "msgq_link").symlink_to(folder / "msgq_random")
    # Not queues: other files of the namespace are not listed at all.
    (folder / "msgq-fake.0123.ep.state").write_bytes(b"x" * 64)
    vision = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    vision.bind(str(folder / "visionipc_camerad"))

    try:
        queues = by_endpoint(queues_json())
        assert set(queues) == {"random", "empty", "ep_truncated", "ep_old", "link"}
        assert queues["ep_old"]["state"] == "damaged"
        assert queues["ep_old"]["error"] == (f"layout version {LAYOUT_VERSION - 1}, this "
                                             f"msgq's is {LAYOUT_VERSION}: the next opener "
                                             "replaces it")
        assert queues["random"]["state"] == "damaged"
        assert queues["random"]["error"] == "file is not a msgq queue (bad magic number)"
        assert queues["ep_truncated"]["state"] == "damaged"
        assert "inconsistent" in queues["ep_truncated"]["error"]
        assert queues["empty"]["state"] == "unfinished"
        assert queues["link"]["state"] == "damaged"
        assert "symlink" in queues["link"]["error"]

        proc = msgq_cli("queues")
        assert proc.returncode == 0, proc.stderr
        assert "random: damaged: file is not a msgq queue" in proc.stdout

        proc = msgq_cli("queues", "--clean")
        assert proc.returncode == 0, proc.stderr
        assert "removed empty: unfinished" in proc.stdout
        assert "kept link: a symlink, not a queue file: never removed" in proc.stdout
        assert (folder / "msgq_link").is_symlink()
        assert (folder / "visionipc_camerad").exists()
    finally:
        vision.close()


# --- msgq bench ------------------------------------------------------------------------


def test_bench_core_runs_and_prints_its_table() -> None:
    proc = msgq_cli(
        "bench", "core", "--",
        "--quick", "--backends", "msgq", "--sizes", "8", "--subs", "1",
        "--repeat", "1", "--duration", "0.1", "--tests", "throughput",
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert any(r[:5] == ["throughput", "8", "B", "1", "sub"] and "msgq" in r for r in rows), (
        proc.stdout
    )


def test_bench_passes_exit_codes_through() -> None:
    proc = msgq_cli("bench", "core", "--", "--sizes", "1")  # below the bench's minimum
    assert proc.returncode == 2
    assert "msgq-bench: error:" in proc.stderr


def test_bench_without_a_suite_module_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(
        msgq.cli.bench.SUITES, "visionipc", ("msgq.no_such_bench", "not written yet")
    )
    assert main(["bench", "visionipc"]) == 1
    err = one_line(capsys.readouterr().err)
    assert err == (
        "msgq bench: error: the visionipc benchmark (msgq.no_such_bench) is not in this "
        "installation of msgq"
    )


def test_bench_unknown_suite_is_a_usage_error() -> None:
    proc = msgq_cli("bench", "gpu")
    assert proc.returncode == 2
    assert one_line(proc.stderr).startswith("msgq bench: error: unknown suite 'gpu'")


# --- Ctrl-C: every long-running command exits 130 -------------------------------------


def _started(argv: list[str], ready: str, stream: str = "stderr") -> subprocess.Popen[str]:
    """``msgq ARGV`` in a process of its own, returned once it printed a line containing
    ``ready`` on ``stream`` (it has set itself up and is running)."""
    proc = subprocess.Popen([sys.executable, "-m", "msgq", *argv], env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pipe = proc.stderr if stream == "stderr" else proc.stdout
    assert pipe is not None
    line = pipe.readline()
    if ready not in line:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"msgq {' '.join(argv)} did not start: {line}{out}{err}")
    return proc


def test_ctrl_c_stops_record_with_130_and_a_closed_log(tmp_path: Path) -> None:
    proc = _started(["record", "gyroscope", "-o", str(tmp_path / "rec")], "recording")
    out, _ = interrupt(proc, 130)
    assert out.startswith("SERVICE") and "messages in" in out  # it stopped cleanly


def test_ctrl_c_stops_replay_with_130(tmp_path: Path) -> None:
    from msgq.logs import LogWriter
    from msgq.messaging import new_message

    with LogWriter(str(tmp_path / "rec")) as writer:
        for i in range(5):
            writer.write(new_message("gyroscope", logMonoTime=10**9 + i * 10**8))
    env = cli_env()
    sub = subprocess.Popen([sys.executable, "-c", "import msgq; s = msgq.sub_sock('gyroscope',"
                            " timeout=20000); print('ready', flush=True);"
                            " print(s.receive() is not None, flush=True)"],
                           env=env, stdout=subprocess.PIPE, text=True)
    assert sub.stdout is not None and sub.stdout.readline() == "ready\n"
    proc = subprocess.Popen([sys.executable, "-m", "msgq", "replay", str(tmp_path / "rec"),
                             "--loop"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert sub.stdout.readline() == "True\n"  # the replay is sending
    sub.wait(10)
    out, _ = interrupt(proc, 130)
    assert "stopped:" in out


def test_ctrl_c_stops_top_with_130() -> None:
    proc = _started(["top", "--interval", "0.2", "--all"], "msgq top", stream="stdout")
    interrupt(proc, 130)


def test_ctrl_c_stops_bridge_with_130() -> None:
    port = str(free_port())
    proc = _started(["bridge", "connect", "127.0.0.1", "--port", port], "re-publishing")
    interrupt(proc, 130)
