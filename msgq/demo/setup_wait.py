"""Waiting for the set-up step that ``./run.sh`` leaves running behind the demo: the spark
extra installing while the robot runs. ``MSGQ_PENDING_SETUP`` names the file its exit
status goes to when it ends, beside its ``.pid`` and ``.log``, and its ``.pyspark``
marker, written once pyspark itself is installed (before the extra's other packages:
Spark's JVM can start then) (scripts/ensure_env.sh)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from msgq.queues import process_alive

__all__ = ["wait_for_setup"]


def wait_for_setup(status_file: str | None, timeout: float = 900.0,
                   say: Callable[[str], None] | None = None, *,
                   pyspark_only: bool = False) -> str | None:
    """Waits for the pending set-up step whose status ``status_file`` will hold (None:
    nothing pending). Returns None once it succeeded, else why the Spark step can't run.
    ``say`` is told, once, that it waits. With ``pyspark_only``, it returns as soon as
    pyspark is installed (enough to start a session; reading logs needs the rest)."""
    if not status_file:
        return None
    base = status_file.removesuffix(".status")
    log = base + ".log"
    deadline = time.monotonic() + timeout
    said = False
    while (code := _read_status(status_file)) is None:
        if pyspark_only and os.path.exists(base + ".pyspark"):
            return None
        if say is not None and not said:
            say(f"   (waiting for the spark extra to finish installing; log: {log})")
            said = True
        if not _alive(base + ".pid"):
            if (code := _read_status(status_file)) is not None:  # it ended between checks
                break
            return f"the spark extra's install stopped without finishing (log: {log})"
        if time.monotonic() > deadline:
            return f"the spark extra's install did not finish in {timeout:.0f} s (log: {log})"
        time.sleep(0.2)
    return None if code == "0" else f"the spark extra's install failed (exit {code}; log: {log})"


def _read_status(status_file: str) -> str | None:
    """The exit status the job wrote, or None while there is none yet: no file, or one
    created and not yet written (a shell's ``echo 1 > file`` opens before it writes)."""
    try:
        with open(status_file) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def _alive(pid_file: str) -> bool:
    """Whether the process whose pid ``pid_file`` holds is running (a file that can't be
    read counts as alive: the status file alone then decides). run.sh's shell became the
    demo's process, so the job is usually the demo's child: one that ended is reaped
    here, not left a zombie that would look alive."""
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return True
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != pid
    except ChildProcessError:
        return process_alive(pid)  # not our child
