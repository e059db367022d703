"""A warm Spark, the client side: sessions that attach to a Spark Connect server running
msgq's Python (:mod:`msgq.spark.server` starts one: ``msgq spark serve``).

Every ``msgq logstats`` in its own process starts a JVM, plans its first query and starts
its Python workers: seconds of fixed cost before the first event is read. A Spark Connect
server (``org.apache.spark.sql.connect.service.SparkConnectServer``, shipped inside pyspark
4) keeps all of that alive between commands: a command then only connects over gRPC and
runs its query.

:func:`connect_session` attaches to a server (``--remote sc://HOST:PORT`` or
:data:`ENV_REMOTE`), says so on stderr in one line, and registers the ``msgqlog`` source
on that session (through the Connect client: the source class is pickled and sent). A
server that does not answer is refused in one line (:class:`RemoteError`) within a few
seconds, never a hang in gRPC's retries.

The server reads the files: paths are those of the server's machine (the client's
working folder travels with each read for relative paths), and the server's Python must be
the client's version with msgq installed (a loopback server of ``msgq spark serve`` is).

Layer: part of the Spark tool, under :mod:`msgq.spark.session` (which attaches through
it) and :mod:`msgq.spark.server`; the standard library only at its top.
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgq.spark

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ENV_REMOTE", "RemoteError", "connect_session",
           "default_parallelism", "is_connect", "parse_remote", "remote_url"]

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

    On a server of :func:`msgq.spark.server.serve` (its :data:`SHARED_SESSION_CONF`), a
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
