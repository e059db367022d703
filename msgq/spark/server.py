"""A warm Spark, the server side: ``msgq spark serve``, a Spark Connect server running
msgq's Python, and the state file that ``--stop`` and ``--status`` read.

* :func:`serve` starts the server with ``spark-submit`` from the installed pyspark, with
  the settings of a local msgq session (:func:`msgq.spark.session.server_settings`):
  msgq's interpreter for every Python worker, so the ``msgqlog`` source (a Python data
  source) and the analyses' Arrow functions run in the server as they do locally. It
  listens on loopback unless told otherwise, runs one warm-up query (the Python planners
  and workers started once, not by the first command), prints its ``sc://`` URL and runs
  until Ctrl-C or :func:`stop_server` (``msgq spark serve --stop``).
* A state file per port (:func:`state_path`) records the server's pid, URL and log for
  ``--stop`` and ``--status``.

Sessions attach to it through :mod:`msgq.spark.connect`.

Layer: part of the Spark tool, over :mod:`msgq.spark.session` (the settings of a local
session) and :mod:`msgq.spark.connect` (the client); no pyspark at its top.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgq.spark
from msgq.schemas import new_message, registry_in_force
from msgq.spark import session
from msgq.spark.class_cache import cache_folder, spark_home
from msgq.spark.connect import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    SERVER_CLASS,
    SHARED_SESSION_CONF,
    RemoteError,
    _close_at_exit,
    _first_line,
    connect_session,
)

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "serve", "server_command", "server_state",
           "state_folder", "state_path", "stop_server"]


def state_folder() -> str:
    """Where the state files of running servers live (beside the class archive)."""
    return os.path.join(cache_folder(), "spark-connect")


def state_path(port: int) -> str:
    """The state file of the server on ``port`` (JSON: pid, url, log, started)."""
    return os.path.join(state_folder(), f"{port}.json")


def _process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which the process that started it has not reaped
    yet, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def server_state(port: int) -> dict[str, Any] | None:
    """The state of the server ``msgq spark serve`` runs on ``port`` (pid of its ``msgq
    spark serve`` process, url, log, started), or None when there is none (a state file
    whose process died is removed)."""
    path = state_path(port)
    try:
        with open(path) as f:
            state = json.load(f)
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _process_alive(pid):
        _remove(path)
        return None
    return state


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _write_state(port: int, state: dict[str, Any]) -> None:
    os.makedirs(state_folder(), mode=0o700, exist_ok=True)
    path = state_path(port)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        json.dump(state, f)
    os.replace(temporary, path)


def stop_server(port: int, timeout_s: float = 60.0) -> dict[str, Any] | None:
    """Stops the server ``msgq spark serve`` runs on ``port`` (SIGTERM to its serve
    process, which stops the JVM) and waits until it is gone; returns its state, or None
    when none runs there. A process that does not stop within ``timeout_s`` is killed."""
    state = server_state(port)
    if state is None:
        return None
    pid = int(state["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        _remove(state_path(port))
        return state
    deadline = time.monotonic() + timeout_s
    while _process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _process_alive(pid):
        jvm = state.get("server_pid")
        for victim in (jvm, pid):
            if victim:
                try:
                    os.kill(int(victim), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
    _remove(state_path(port))
    return state


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def server_command(host: str, port: int, master: str | None = None,
                   config: Mapping[str, str] | None = None,
                   java_options: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that start a Spark Connect server on ``host:port`` with
    pyspark's ``spark-submit``, the settings of a local msgq session (its Python workers
    msgq's interpreter, the class archive mapped, quiet logging) and ``config`` last."""
    settings, env = session.server_settings(master, config, java_options)
    settings["spark.connect.grpc.binding.address"] = host
    settings["spark.connect.grpc.binding.port"] = str(port)
    settings.setdefault("spark.app.name", "msgq Spark Connect server")
    submit = os.path.join(spark_home(), "bin", "spark-submit")
    argv = [submit, "--class", SERVER_CLASS]
    for key, value in settings.items():
        argv += ["--conf", f"{key}={value}"]
    return argv, env


def _warm_up_recording(folder: str) -> None:
    """A small recording of the schema in force: three of its periodic services, 60
    events each, one outage making a gap (so that every stage of ``log_stats`` runs:
    Spark skips the stages of empty inputs); only the ``logStart`` event msgq's writer
    begins a segment with when the schema has no such services."""
    # start-up cost: msgq.logs (numpy), for the warm-up only, not for --status or --stop
    from msgq.logs import LogWriter

    registry = registry_in_force()
    services = [name for name, service in registry.items() if service.frequency > 0][:3]
    with LogWriter(folder) as writer:
        events = []
        for number, name in enumerate(services):
            period = int(1e9 / registry[name].frequency)
            for i in range(60):
                if i != 30:  # the outage
                    events.append((10**9 + i * period + number, name))
        for mono_time, name in sorted(events):
            try:
                message = new_message(name)
            except Exception:  # a member the builder cannot make: left out
                continue
            message.logMonoTime = mono_time
            writer.write(message.to_bytes())


def _warm_up(url: str) -> float:
    """One msgqlog read and ``log_stats`` through the server, of a small recording
    (:func:`_warm_up_recording`): the server's Python planners and workers start, and its
    JVM plans and compiles that query's stages, here rather than in the first command
    (with one ``logStart`` event only, the first command still cost the server about 1.5
    CPU-s more than the next). Returns its seconds."""
    # start-up cost: the analyses (pyspark, the optional extra), for the warm-up only,
    # not for --status or --stop
    from msgq.spark.analyses import expected_rates, log_stats

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="msgq-connect-warm-up-") as folder:
        _warm_up_recording(folder)
        spark = connect_session(url, app_name="msgq spark serve warm-up", announce=False)
        df = msgq.spark.read_logs(spark, folder, data=False, compact=True,
                                  keep_problems=True)
        stats = log_stats(df, expected_rates())
        stats.to_dict()
        stats.unpersist()
        _close_at_exit(spark)  # this process goes on: closed now, the session kept
    return time.perf_counter() - started


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, master: str | None = None,
          config: Mapping[str, str] | None = None, warm_up: bool = True,
          ready: Callable[[str], None] | None = None, timeout_s: float = 180.0,
          log: Callable[[str], None] | None = None) -> int:
    """Runs a Spark Connect server on ``host:port`` until SIGINT or SIGTERM (or the JVM
    ends); returns the JVM's exit status (0 when this stopped it). ``ready(url)`` is
    called once it answers (after the warm-up query unless ``warm_up`` is false). The
    JVM's output goes to stderr, less its start-up notices. Raises RemoteError when the
    port is taken, another ``msgq spark serve`` runs on it, or the server does not answer
    within ``timeout_s``."""
    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    running = server_state(port)
    if running is not None:
        raise RemoteError(f"msgq spark serve already runs on port {port} (pid "
                          f"{running['pid']}, {running['url']}): stop it with "
                          f"'msgq spark serve --stop --port {port}'")
    if not _port_free(host, port):
        raise RemoteError(f"{host}:{port} is in use: choose another --port")
    config = {SHARED_SESSION_CONF: str(uuid.uuid4()),
              # the shared session lives as long as the server (Spark's default: an hour
              # idle)
              "spark.connect.session.manager.defaultSessionTimeout": "3650d",
              **(config or {})}
    argv, env = server_command(host, port, master, config)
    shown = f"[{host}]" if ":" in host else host
    url = f"sc://{shown}:{port}"
    process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)

    def copy_output() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.rstrip(b"\r\n") != session.INCUBATOR_NOTICE:
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()

    threading.Thread(target=copy_output, name="msgq-connect-log", daemon=True).start()
    stopping = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    _write_state(port, {"pid": os.getpid(), "server_pid": process.pid, "url": url,
                        "host": host, "port": port, "started": time.time(),
                        "log": _stderr_file()})
    try:
        deadline = time.monotonic() + timeout_s
        while not stopping.is_set():
            if process.poll() is not None:
                raise RemoteError(f"the Spark Connect server exited with status "
                                  f"{process.returncode} before it answered (its output is "
                                  "above)")
            try:
                with socket.create_connection((host, port), timeout=1.0):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RemoteError(f"the Spark Connect server did not answer on {url} "
                                  f"within {timeout_s:g} s")
            stopping.wait(0.2)
        if not stopping.is_set() and warm_up:
            say("msgq spark serve: warming up (one query: the Python planners and "
                "workers start) ...")
            try:
                seconds = _warm_up(url)
                say(f"msgq spark serve: warm-up query {seconds:.1f} s")
            except Exception as e:  # the server still serves: said, not fatal
                say(f"msgq spark serve: the warm-up query failed ({_first_line(e)}); "
                    "serving anyway")
        if not stopping.is_set() and ready is not None:
            ready(url)
        while not stopping.is_set() and process.poll() is None:
            stopping.wait(0.5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        code = _stop_jvm(process)
        _remove(state_path(port))
    return 0 if stopping.is_set() else code


def _stderr_file() -> str | None:
    """The file this process's stderr writes to (the log of a detached server), or None
    (a terminal, a pipe)."""
    try:
        path = os.readlink("/proc/self/fd/2")
        return path if os.path.isfile(path) else None
    except OSError:
        return None


def _stop_jvm(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """SIGTERM to the server's JVM (its shutdown hooks stop Spark), SIGKILL after
    ``timeout_s``; its exit status."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return int(process.returncode or 0)
