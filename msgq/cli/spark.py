"""``msgq spark``: helpers for running msgq's Spark pipeline on a cluster."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

from msgq.cli.output import (
    EXIT_OK,
    CommandError,
    UsageError,
    human_bytes,
    paint,
    spark_conf,
)
from msgq.extras import require

# pyspark-free at their top: --status, --stop and pack-env run without the spark extra
from msgq.spark import connect, server
from msgq.spark.pack import ARCHIVE_ROOT, pack_env
from msgq.spark.session import ExecutorPythonError, JavaMissingError

DESCRIPTION = """\
Helpers for running msgq's Spark pipeline (msgq logstats, msgq.spark): a warm Spark server,
and a cluster.

  serve                 run a Spark Connect server (a warm Spark) with msgq's Python: every
                        msgq command attaches to it with --remote sc://HOST:PORT or
                        MSGQ_SPARK_REMOTE=sc://HOST:PORT, skipping Spark's start-up. Runs in
                        the foreground until Ctrl-C (--detach: in the background); --stop
                        stops the one on --port, --status says whether one runs.

  pack-env OUT.tar.gz   pack this virtual environment, msgq included, for executors that
                        lack msgq: PySpark's packed-virtualenv route. Then run
                          msgq logstats PATH --master spark://HOST:7077 \\
                            --conf spark.archives=OUT.tar.gz#environment \\
                            --conf spark.pyspark.python=./environment/bin/python
                        The executors need the base Python of this venv at the same path
                        (the archive links bin/python to it); pyspark's jars are left out
                        (executors run their own Spark's). Zips via --py-files cannot
                        carry msgq: no compiled extensions or schema files from a zip.

See docs/spark.md ("Warm Spark", "On a cluster")."""

EPILOG = """\
examples:
  msgq spark serve                               sc://127.0.0.1:15002 until Ctrl-C
  msgq spark serve --detach --port 15010         in the background; prints its URL
  MSGQ_SPARK_REMOTE=sc://127.0.0.1:15010 msgq logstats rec/
  msgq spark serve --stop --port 15010
  msgq spark pack-env msgq-env.tar.gz            this venv, msgq included, for executors
  msgq logstats /shared/rec --master spark://head:7077 \\
      --conf spark.archives=msgq-env.tar.gz#environment \\
      --conf spark.pyspark.python=./environment/bin/python"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq spark``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "spark", help="a warm Spark server, cluster helpers (serve, pack-env)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="spark_command", metavar="<action>", required=True)
    pack = actions.add_parser("pack-env", help="this venv, msgq included, as a tar.gz for "
                                               "spark.archives",
                              description="Pack this virtual environment (msgq included) "
                                          "for spark.archives; see msgq spark --help.",
                              epilog="examples:\n  msgq spark pack-env msgq-env.tar.gz",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    pack.add_argument("output", metavar="OUT.tar.gz", help="the archive to write")
    serve = actions.add_parser(
        "serve", help="a Spark Connect server with msgq's Python (a warm Spark)",
        description=SERVE_DESCRIPTION, epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--port", type=int, default=None, metavar="PORT",
                       help="the port to listen on (default 15002, Spark Connect's)")
    serve.add_argument("--host", default=None, metavar="ADDRESS",
                       help="the address to listen on (default 127.0.0.1: this machine "
                            "only; the server runs code its clients send)")
    serve.add_argument("--master", metavar="URL",
                       help="the server's Spark master (default local[*])")
    serve.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                       help="a Spark setting of the server (repeatable)")
    serve.add_argument("--no-warm-up", action="store_true",
                       help="report ready without running the warm-up query first")
    mode = serve.add_mutually_exclusive_group()
    mode.add_argument("--detach", action="store_true",
                      help="run in the background (log: msgq spark serve --status says "
                           "where); prints the URL once it answers")
    mode.add_argument("--stop", action="store_true",
                      help="stop the server msgq spark serve runs on --port")
    mode.add_argument("--status", action="store_true",
                      help="whether a server of msgq spark serve runs on --port (exit 1 "
                           "if not)")
    return parser


SERVE_DESCRIPTION = """\
Run a Spark Connect server (Spark's own, shipped inside pyspark) whose Python workers are
this msgq's interpreter, so the msgqlog source and msgq's analyses run in it. Commands
attach with --remote sc://HOST:PORT or MSGQ_SPARK_REMOTE=sc://HOST:PORT and skip the JVM's
start-up, the first planning and the Python workers' start: msgq logstats of one segment
then does about a third of the work of a command that starts Spark (docs/spark.md).

It listens on 127.0.0.1 (this machine only) unless --host says otherwise: a client can
run any code in the server, as the user who started it. Once the server answers, one
warm-up query runs (the Python planners and workers start), then its URL is printed on
stdout (alone on its line). It runs in the foreground until Ctrl-C or SIGTERM; --detach
runs it in the background (its output in a log file). A state file per port
($XDG_CACHE_HOME/msgq/spark-connect/PORT.json: pid, URL, log) lets --stop and --status
find it. The server reads the files: paths are the server machine's."""

SERVE_EPILOG = """\
examples:
  msgq spark serve                               in the foreground until Ctrl-C
  msgq spark serve --detach                      in the background
  msgq logstats rec/ --remote sc://127.0.0.1:15002
  export MSGQ_SPARK_REMOTE=sc://127.0.0.1:15002  every msgq command attaches
  msgq spark serve --status
  msgq spark serve --stop"""


def run(args: argparse.Namespace) -> int:
    """Runs the chosen action."""
    if args.spark_command == "serve":
        return _serve(args)

    def progress(text: str) -> None:
        if sys.stderr.isatty():
            print(paint(text, "dim", sys.stderr), file=sys.stderr)

    try:
        info = pack_env(args.output, progress)
    except (ValueError, OSError) as e:
        raise CommandError(str(e)) from None
    print(f"wrote {info['path']} ({human_bytes(int(info['bytes']))}, {info['files']} files; "
          f"Python {info['python']} at {info['base_python']} needed on every executor)")
    print(f"use: --conf spark.archives={info['path']}#{ARCHIVE_ROOT} "
          f"--conf spark.pyspark.python=./{ARCHIVE_ROOT}/bin/python")
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    """msgq spark serve: in the foreground, detached, --stop or --status."""
    port = connect.DEFAULT_PORT if args.port is None else args.port
    if not 0 < port < 65536:
        raise UsageError(f"--port {port} is out of range (1-65535)")
    if args.stop or args.status:
        for flag, given in (("--host", args.host), ("--master", args.master),
                            ("--conf", args.conf), ("--no-warm-up", args.no_warm_up)):
            if given:
                raise UsageError(f"{flag} goes with starting a server, not with "
                                 f"{'--stop' if args.stop else '--status'}")
        return _stop(port) if args.stop else _status(port)
    host = args.host or connect.DEFAULT_HOST
    conf = spark_conf(args.conf)
    require("spark", "pyspark")
    if args.detach:
        return _detach(args, port, host)

    def ready(url: str) -> None:
        print(url, flush=True)
        print(f"msgq spark serve: Spark Connect at {url} (pid {os.getpid()}); attach with "
              f"--remote {url} or {connect.ENV_REMOTE}={url}; Ctrl-C or 'msgq spark serve "
              f"--stop{'' if port == connect.DEFAULT_PORT else f' --port {port}'}' "
              "stops it", file=sys.stderr, flush=True)

    try:
        code = server.serve(host, port, args.master, conf, warm_up=not args.no_warm_up,
                            ready=ready)
    except (connect.RemoteError, JavaMissingError, ExecutorPythonError, ValueError) as e:
        raise CommandError(str(e)) from None
    if code != 0:  # it ended on its own: its output above says why
        raise CommandError(f"the Spark Connect server exited with status {code}")
    print("msgq spark serve: stopped", file=sys.stderr, flush=True)
    return EXIT_OK



def _stop(port: int) -> int:
    state = server.stop_server(port)
    if state is None:
        raise CommandError(f"no msgq spark serve runs on port {port}")
    print(f"stopped the Spark Connect server at {state['url']} (pid {state['pid']})")
    return EXIT_OK


def _status(port: int) -> int:
    state = server.server_state(port)
    if state is None:
        raise CommandError(f"no msgq spark serve runs on port {port}")
    log = f", log {state['log']}" if state.get("log") else ""
    print(f"{state['url']} (pid {state['pid']}, up {time.time() - state['started']:.0f} s"
          f"{log})")
    return EXIT_OK


def _detach(args: argparse.Namespace, port: int, host: str) -> int:
    """Starts this command again in the foreground, in a session of its own, its output
    in a log file; waits for its URL (its first line on stdout) and prints it."""
    argv = ["spark", "serve", "--port", str(port), "--host", host]
    if args.master:
        argv += ["--master", args.master]
    for item in args.conf:
        argv += ["--conf", item]
    if args.no_warm_up:
        argv.append("--no-warm-up")
    os.makedirs(server.state_folder(), mode=0o700, exist_ok=True)
    log = os.path.join(server.state_folder(), f"{port}.log")
    with open(log, "wb") as out:
        child = subprocess.Popen([sys.executable, "-m", "msgq", *argv],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=out, start_new_session=True)
    assert child.stdout is not None
    line = child.stdout.readline().decode().strip()  # the URL, once it answers
    child.stdout.close()
    if not line.startswith("sc://"):
        child.wait()
        tail = _last_line(log)
        raise CommandError(f"the server did not start ({tail}; log: {log})")
    print(line)
    print(f"msgq spark serve: running in the background (pid {child.pid}, log {log}); "
          f"'msgq spark serve --stop{'' if port == connect.DEFAULT_PORT else f' --port {port}'}'"
          " stops it", file=sys.stderr)
    return EXIT_OK


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"
