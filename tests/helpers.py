"""Running programs from tests so that a failure shows why: the command, its exit code,
its stdout and its stderr (``subprocess.run(check=True)`` shows none of the output)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "MSGQ",
    "ProgramFailedError",
    "asleep_in_the_kernel",
    "expect_exit",
    "interrupt",
    "run_cli",
    "run_program",
    "wait_until",
    "wait_until_asleep",
]

#: The msgq command as users run it, from this interpreter.
MSGQ = [sys.executable, "-m", "msgq"]


class ProgramFailedError(AssertionError):
    """A program a test ran did not exit as expected (the message holds its output)."""


def _describe(argv: Sequence[str], code: int | None, expected: int | Sequence[int],
              out: str | None, err: str | None) -> str:
    return (f"{' '.join(map(str, argv))}\nexited {code}, expected {expected}\n"
            f"--- stdout ---\n{out or ''}\n--- stderr ---\n{err or ''}")


def expect_exit(argv: Sequence[str], code: int | None, expected: int | Sequence[int],
                out: str | None, err: str | None) -> None:
    """Raises :class:`ProgramFailedError` (with the output) unless ``code`` is ``expected``
    (one code or a sequence of them)."""
    allowed = [expected] if isinstance(expected, int) else list(expected)
    if code not in allowed:
        raise ProgramFailedError(_describe(argv, code, expected, out, err))


def run_program(argv: Sequence[str], expect: int | Sequence[int] | None = 0,
                timeout: float = 60, env: dict[str, str] | None = None,
                **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` to completion (text output captured); with ``expect`` (default 0),
    any other exit code fails the test with the program's stdout and stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env=os.environ.copy() if env is None else env, **kwargs)
    if expect is not None:
        expect_exit(argv, proc.returncode, expect, proc.stdout, proc.stderr)
    return proc


def run_cli(*args: str, expect: int | Sequence[int] | None = 0, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``msgq ARGS`` in a process of its own (see :func:`run_program`)."""
    return run_program([*MSGQ, *args], expect=expect, timeout=timeout, env=env)


def interrupt(proc: subprocess.Popen[str], expect: int | Sequence[int],
              signum: int = signal.SIGINT, timeout: float = 30) -> tuple[str, str]:
    """Sends ``signum`` (Ctrl-C by default) to a running program, waits for it and
    checks its exit code; returns its (stdout, stderr)."""
    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise ProgramFailedError(_describe(proc.args, None, expect, out, err)  # type: ignore[arg-type]
                            + f"\n(still running {timeout} s after signal {signum})") from None
    expect_exit(proc.args, proc.returncode, expect, out, err)  # type: ignore[arg-type]
    return out or "", err or ""


def asleep_in_the_kernel(pid: int) -> bool:
    """Whether the main thread of process ``pid`` is in an interruptible sleep (a
    blocking system call: a futex, a poll, a file lock)."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def wait_until(condition: Callable[[], bool], timeout: float = 30.0,
               what: str = "condition", interval: float = 0.002) -> None:
    """Waits until ``condition()`` holds (the test's synchronisation, instead of a sleep);
    TimeoutError naming ``what`` after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


def wait_until_asleep(pid: int, timeout: float = 30) -> None:
    """Waits until process ``pid`` blocks in the kernel (instead of sleeping a guessed
    time before signalling it)."""
    wait_until(lambda: asleep_in_the_kernel(pid), timeout, f"process {pid} blocking",
               interval=0.005)
