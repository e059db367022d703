"""The demo's Spark statistics in a process of their own, started with the demo so that
Spark's start-up overlaps the robot: ``python -m msgq.demo.spark_step RECORDING PNG``.

It lowers its priority (the robot and the recorder come first; once they are done,
nothing else wants the CPU), waits for the spark extra (./run.sh may have left it
installing: ``MSGQ_PENDING_SETUP``; ``msgq logstats`` imports pyarrow with the lake's
modules, so the session cannot start on pyspark alone), starts ``msgq logstats``'s Spark
session and runs the command once on a small recording of its
own (the first query on a new session pays for what later
ones reuse: seconds here). Then it waits for one line on its standard input, which the
demo writes when the recording is closed, and runs ``msgq logstats RECORDING --plot PNG``
on that session, printing what the command prints. End of input without that line (the
demo gave up) ends it without running anything.

Exit status: the command's; 3 when the pending install failed (the demo says why).
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import sys
import tempfile
from collections.abc import Sequence

from msgq.cli import main as msgq_command
from msgq.demo.setup_wait import wait_for_setup
from msgq.logs import LogWriter
from msgq.schemas import new_message

__all__ = ["EXIT_SETUP_FAILED", "NICENESS", "main"]

#: The exit status when the spark extra's install failed or died.
EXIT_SETUP_FAILED = 3

#: How much this process yields to the robot (its JVM and workers inherit it).
NICENESS = 10


def _go_given() -> bool:
    """Whether the demo's line (or the end of input) is there already."""
    return bool(select.select([sys.stdin], [], [], 0)[0])


def _start_session() -> bool:
    """Starts logstats' session; whether it started (a failure is left to the real
    command, which reports it in its own words)."""
    # optional extra: msgq.cli.logstats imports pyspark and pyarrow at its top, which
    # this step has just waited for (run.sh installs them beside the demo)
    from msgq.cli.logstats import start_session

    try:
        start_session()
    except Exception:  # noqa: BLE001 (the real command reports it)
        return False
    return True


def _warm_up() -> None:
    """Runs the command once on a small recording of its own: the first query's costs
    (Python workers, the data source's planning, the JIT, matplotlib's fonts) are paid
    before the real one, unless the recording is ready by then (a new machine, where the
    spark extra installed late: the real query goes first). Its output is dropped; a
    failure is left to the real command."""
    with tempfile.TemporaryDirectory(prefix="msgq-demo-warm-up-") as folder:
        try:
            if _go_given():
                return
            recording = os.path.join(folder, "recording")
            with LogWriter(recording) as writer:
                for i in range(1, 201):
                    writer.write(new_message("gyroscope", logMonoTime=i * 10_000_000))
            sink = io.StringIO()
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                msgq_command(["logstats", recording, "--plot",
                              os.path.join(folder, "rates.png")])
        except Exception:  # noqa: BLE001 (the real command reports it)
            pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (see the module docs); returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m msgq.demo.spark_step RECORDING PNG", file=sys.stderr)
        return 2
    recording, png = args
    if hasattr(os, "nice"):
        os.nice(NICENESS)
    pending = os.environ.get("MSGQ_PENDING_SETUP")
    if wait_for_setup(pending) is not None:
        return EXIT_SETUP_FAILED
    started = _start_session()
    if started:
        _warm_up()
    if not sys.stdin.readline():
        return 0  # the demo ended first
    return msgq_command(["logstats", recording, "--plot", png])


if __name__ == "__main__":
    raise SystemExit(main())
