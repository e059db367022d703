"""A warm Spark: a Spark Connect server running msgq's Python, and sessions that attach to it.

Every ``msgq logstats`` in its own process starts a JVM, plans its first query and starts
its Python workers: seconds of fixed cost before the first event is read. A Spark Connect
server (``org.apache.spark.sql.connect.service.SparkConnectServer``, shipped inside pyspark
4) keeps all of that alive between commands: a command then only connects over gRPC and
runs its query.

* :func:`serve` (``msgq spark serve``) starts the server with ``spark-submit`` from the
  installed pyspark, with the settings of a local msgq session
  (:func:`msgq.spark.session.local_settings`): msgq's interpreter for every Python worker,
  so the ``msgqlog`` source (a Python data source) and the analyses' Arrow functions run
  in the server as they do locally. It listens on loopback unless told otherwise, runs one
  warm-up query (the Python planners and workers started once, not by the first command),
  prints its ``sc://`` URL and runs until Ctrl-C or :func:`stop_server` (``msgq spark serve
  --stop``). A state file per port (:func:`state_path`) records the server's pid, URL and
  log for ``--stop`` and ``--status``.
* :func:`connect_session` attaches to a server (``--remote sc://HOST:PORT`` or
  :data:`ENV_REMOTE`), says so on stderr in one line, and registers the ``msgqlog``
  source on that session (through the Connect client: the source class is pickled and
  sent). A server that does not answer is refused in one line (:class:`RemoteError`)
  within a few seconds, never a hang in gRPC's retries.

The server reads the files: paths are those of the server's machine (the client's
working folder travels with each read for relative paths), and the server's Python must be
the client's version with msgq installed (a loopback server of ``msgq spark serve`` is).
"""

from __future__ import annotations

import atexit
import json
import os
import re
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

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ENV_REMOTE", "RemoteError", "connect_session",
           "default_parallelism", "is_connect", "parse_remote", "remote_url",
           "server_command", "serve", "server_state", "state_path", "stop_server"]

#: The environment variable naming the Connect server every msgq command attaches to.
ENV_REMOTE = "MSGQ_SPARK_REMOTE"
#: Spark Connect's own default port.
DEFAULT_PORT = 15002
#: Where ``msgq spark serve`` listens unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"
#: How long a command waits for a server to accept a connection and answer.
CONNECT_TIMEOUT_S = 10.0
#: The server's main class (in pyspark's jars/spark-connect_*.jar).
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: The server setting naming its shared session (a UUID :func:`serve` makes up): see
#: :func:`connect_session`.
SHARED_SESSION_CONF = "spark.msgq.connect.sharedSession"


class RemoteError(RuntimeError):
    """A Spark Connect server that cannot be used: not answering, not a Connect server, or
    a malformed ``sc://`` URL (one line saying which and what to do)."""


# -- the client side -------------------------------------------------------------------


def parse_remote(url: str) -> tuple[str, int]:
    """(host, port) of a Spark Connect URL ``sc://HOST[:PORT][/;param=value...]`` (port
    default 15002); RemoteError for anything else."""
    match = re.fullmatch(r"sc://(\[[0-9A-Fa-f:.]+\]|[^:/;\[\]\s]+)(?::(\d+))?(/.*)?", url.strip())
    if not match:
        raise RemoteError(f"{url!r} is not a Spark Connect URL: give sc://HOST:PORT "
                          f"(e.g. sc://127.0.0.1:{DEFAULT_PORT}, what msgq spark serve prints)")
    host = match.group(1).strip("[]")
    port = int(match.group(2) or DEFAULT_PORT)
    if not 0 < port < 65536:
        raise RemoteError(f"{url}: port {port} is out of range (1-65535)")
    return host, port


def remote_url(remote: str | None = None) -> str | None:
    """The Connect server to attach to: ``remote`` (``--remote``), else
    :data:`ENV_REMOTE` when set and not empty, else None (a local session). Checked for
    form (RemoteError), not yet for an answer."""
    url = remote if remote is not None else os.environ.get(ENV_REMOTE, "").strip() or None
    if url is None:
        return None
    parse_remote(url)
    return url.strip()


def _where(url: str) -> str:
    """How a message names the server: the URL, and the variable when it came from
    there."""
    from_env = os.environ.get(ENV_REMOTE, "").strip() == url
    return f"{url} ({ENV_REMOTE})" if from_env else url


def check_answers(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """RemoteError unless something accepts a TCP connection at the URL's host and port
    within ``timeout_s`` (gRPC would retry a refused connection for minutes)."""
    host, port = parse_remote(url)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        if isinstance(e, TimeoutError) or "timed out" in reason:
            reason = f"no answer within {timeout_s:g} s"
        raise RemoteError(
            f"no Spark Connect server at {_where(url)}: {reason}; start one with "
            f"'msgq spark serve --port {port}', or unset {ENV_REMOTE} / leave out --remote "
            "for a local session") from None


#: The HTTP/2 connection preface and an empty SETTINGS frame: what a gRPC client sends
#: first. A gRPC server answers with a SETTINGS frame of its own.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_HTTP2_SETTINGS = 4


def check_speaks_grpc(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """RemoteError unless the server at ``url`` answers an HTTP/2 connection preface with
    a SETTINGS frame within ``timeout_s`` (a gRPC server does; something else listening
    on the port would leave gRPC's client retrying for minutes)."""
    check_answers(url, timeout_s)
    host, port = parse_remote(url)
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(_HTTP2_HELLO)
            header = b""
            while len(header) < 9:
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = conn.recv(9 - len(header))
                if not chunk:
                    break
                header += chunk
    except OSError:
        header = b""
    if len(header) < 9 or header[3] != _HTTP2_SETTINGS:
        raise RemoteError(f"{_where(url)} accepts connections but no Spark Connect server "
                          f"answered within {timeout_s:g} s: is that port a Spark Connect "
                          "server's (msgq spark serve)?")


def _with_timeout(what: Callable[[], Any], timeout_s: float, url: str) -> Any:
    """``what()`` in a thread; RemoteError when it has not returned within
    ``timeout_s`` (a port that accepts connections but speaks no Spark Connect)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = what()
        except BaseException as e:  # re-raised below, in the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name="msgq-connect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RemoteError(f"{_where(url)} accepts connections but no Spark Connect server "
                          f"answered within {timeout_s:g} s: is that port a Spark Connect "
                          "server's (msgq spark serve)?")
    if "error" in outcome:
        error = outcome["error"]
        raise RemoteError(f"the Spark Connect server at {_where(url)} refused the session: "
                          f"{_first_line(error)}") from None
    return outcome.get("value")


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300] if text else type(error).__name__


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no JVM here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _session_url(url: str, session_id: str) -> str:
    """``url`` naming the server-side session ``session_id``."""
    return f"{url};session_id={session_id}" if "/;" in url else \
        f"{url.rstrip('/')}/;session_id={session_id}"


def connect_session(url: str, app_name: str = "msgq",
                    config: Mapping[str, str] | None = None,
                    timeout_s: float = CONNECT_TIMEOUT_S, announce: bool = True) -> Any:
    """A Spark Connect session on the server at ``url`` (``sc://HOST:PORT``), the msgqlog
    source registered on it. Says so on stderr in one line (``announce``). ``config``:
    session settings (SQL settings; the server's static settings cannot change).
    ``app_name`` is not sent: a Connect server is one Spark application. A server that
    does not answer within ``timeout_s`` (nothing listening, or something that speaks no
    gRPC) is RemoteError, in one line. The client is closed at exit.

    On a server of :func:`serve` (its :data:`SHARED_SESSION_CONF` names a session), a
    command without ``config`` joins that server-side session instead of opening one of
    its own: Spark starts Python workers per session (its artifacts' UUID is part of
    their key), so a session of its own would start the data source's planners and the
    task workers again for each command (seconds) and leave them running. The shared
    session is never released by a client. Reads carry everything they depend on as
    options (schema, working folder), so commands sharing it do not see each other's
    registrations; ``config`` (session settings) gets a session of its own."""
    check_speaks_grpc(url, timeout_s)
    # pyspark (the spark extra), imported when attaching. Its builder, given a remote,
    # marks this process as a Connect client (SPARK_CONNECT_MODE_ENABLED): the column
    # functions build Connect expressions from then on, not the JVM's.
    from pyspark.sql import SparkSession

    import msgq.spark

    def open_session(session_url: str) -> Any:
        """A client of the session (no call to the server yet), closed at exit before
        pyspark's own exit handler would call the server (its ML cache clean-up, which
        retries for minutes when the server is gone)."""
        spark = SparkSession.builder.remote(session_url).getOrCreate()
        atexit.register(_close_at_exit, spark)
        return spark

    def attach(spark: Any) -> Any:
        shared = None if config or "session_id=" in url else \
            spark.conf.get(SHARED_SESSION_CONF, None)  # the first call to the server
        if shared:
            spark.stop()  # (releases the session just opened on the server)
            spark = open_session(_session_url(url, shared))
            spark.release_session_on_close = False  # others' too
        for key, value in (config or {}).items():
            spark.conf.set(key, value)
        return spark, spark.version

    spark, version = _with_timeout(lambda: attach(open_session(url)), timeout_s, url)
    if announce:
        print(f"msgq: Spark on the Connect server at {_where(url)} (Spark {version})",
              file=sys.stderr, flush=True)
    msgq.spark.register(spark)
    return spark


def _close_at_exit(spark: Any, timeout_s: float = 5.0) -> None:
    """Closes a Connect client at exit: a session of its own is released on the server
    first (within ``timeout_s``); a shared one is left there."""
    client = getattr(spark, "client", None)
    if client is None or client.is_closed:
        return
    if spark.release_session_on_close:
        releasing = threading.Thread(target=client.release_session, daemon=True)
        releasing.start()
        releasing.join(timeout_s)
    try:
        client.close()
    except Exception:  # at exit: nothing left to tell
        pass


def default_parallelism(spark: Any) -> int:
    """The number of tasks a read is planned for: the session's default parallelism. On
    Connect (no SparkContext), the server's ``spark.default.parallelism``, which
    :func:`serve` sets, else the cores its ``local[N]`` master names, else 2."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    for key in ("spark.default.parallelism", "spark.master"):
        try:
            value = spark.conf.get(key, None)
        except Exception:  # a server that does not say
            value = None
        if not value:
            continue
        if key == "spark.default.parallelism" and str(value).strip().isdigit():
            return max(1, int(value))
        match = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", str(value).strip())
        if match:
            return max(1, int(match.group(1)))
    return 2


# -- the server side -------------------------------------------------------------------


def state_folder() -> str:
    """Where the state files of running servers live (beside the class archive)."""
    # small: the cache folder's rule only
    from msgq.spark.class_cache import cache_folder

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
    # pyspark's installation and msgq's session settings: the spark extra
    from msgq.spark import session

    settings, env = session.server_settings(master, config, java_options)
    settings["spark.connect.grpc.binding.address"] = host
    settings["spark.connect.grpc.binding.port"] = str(port)
    settings.setdefault("spark.app.name", "msgq Spark Connect server")
    submit = os.path.join(session.msgq.spark.class_cache.spark_home(), "bin", "spark-submit")
    argv = [submit, "--class", SERVER_CLASS]
    for key, value in settings.items():
        argv += ["--conf", f"{key}={value}"]
    return argv, env


def _warm_up(url: str) -> float:
    """One msgqlog read and ``log_stats`` through the server, of a recording that holds
    only the ``logStart`` event msgq's writer begins a segment with (none under a schema
    without it): the server's Python planners and workers start here, not in the first
    command. Returns its seconds."""
    import msgq.spark
    from msgq.logs import LogWriter
    from msgq.spark.analyses import expected_rates, log_stats

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="msgq-connect-warm-up-") as folder:
        with LogWriter(folder):
            pass
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
    # pyspark's filter of the JVM's stderr: the session's own
    from msgq.spark.session import INCUBATOR_NOTICE

    process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)

    def copy_output() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.rstrip(b"\r\n") != INCUBATOR_NOTICE:
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
