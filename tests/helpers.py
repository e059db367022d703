"""What tests share, imported by name (``from helpers import ...``; fixtures stay in
conftest.py): running programs so that a failure shows why (the command, its exit code,
its stdout and its stderr: ``subprocess.run(check=True)`` shows none of the output),
waiting for conditions, and connecting socket pairs on any backend."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgq

__all__ = [
    "MSGQ",
    "DAMAGE_KINDS",
    "ProgramFailedError",
    "asleep_in_the_kernel",
    "child_env",
    "connect_pair",
    "damage_bytes",
    "damage_message",
    "expect_exit",
    "free_port",
    "free_port_pair",
    "interrupt",
    "open_fds",
    "publisher_ready",
    "receive_all",
    "rerun_in_own_namespace",
    "run_cli",
    "run_program",
    "start_publisher",
    "sync_subscriber",
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


def child_env(**changes: str | None) -> dict[str, str]:
    """The environment for a child process: the test's (its MSGQ_PREFIX, backend and
    schema) with ``changes`` (a value of None removes the variable). Passed explicitly:
    a forkserver child inherits the fork server's environment, not the test's."""
    env = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def open_fds() -> int:
    """How many file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_pair() -> int:
    """A free TCP port on 127.0.0.1 whose next port is free too (the bridge binds two)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", 0))
                port = a.getsockname()[1]
                if port >= 65534:
                    continue
                b.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


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


#: Set in a test run again by :func:`rerun_in_own_namespace` (where it must not recurse).
IN_OWN_NAMESPACE = "MSGQ_TEST_IN_OWN_NAMESPACE"


def rerun_in_own_namespace(nodeid: str, basetemp: str | os.PathLike[str]) -> None:
    """Runs test ``nodeid`` again in a pytest of its own, in a user and mount namespace
    where it is root (``unshare --user --map-root-user --mount``): what needs mount
    rights runs there without them here (its temporary files under ``basetemp``). Skips,
    saying why, where the kernel refuses user namespaces; fails with the child's output
    when the test fails there."""
    import pytest

    if os.environ.get(IN_OWN_NAMESPACE):
        pytest.fail("the test needs mount rights even in a namespace of its own")
    unshare = ["unshare", "--user", "--map-root-user", "--mount"]
    probe = subprocess.run([*unshare, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"needs root or a user namespace to mount a tmpfs: {probe.stderr.strip()}")
    env = {**os.environ, IN_OWN_NAMESPACE: "1"}
    env.pop("PYTEST_ADDOPTS", None)
    tests = os.path.dirname(os.path.abspath(__file__))
    done = run_program([*unshare, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"--basetemp={basetemp}", nodeid],
                       env=env, cwd=os.path.dirname(tests), timeout=120)
    assert re.search(r"\b1 passed", done.stdout), done.stdout[-3000:]


#: The publisher program of the tests (see its docstring for what it sends).
RATE_PUBLISHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rate_publisher.py")


def start_publisher(rates: dict[str, float], *options: str, env: dict[str, str] | None = None,
                    ready: bool = True) -> subprocess.Popen[str]:
    """``tests/rate_publisher.py SERVICE=HZ ... OPTIONS`` in a process of its own,
    returned once its sockets exist (``ready``: it printed so; else at once, and the
    caller waits with :func:`publisher_ready`); the caller kills it (the ``publisher``
    fixture of conftest.py does)."""
    argv = [sys.executable, RATE_PUBLISHER, *(f"{s}={hz:g}" for s, hz in rates.items()),
            *options]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env() if env is None else env)
    if ready:
        publisher_ready(proc)
    return proc


def publisher_ready(proc: subprocess.Popen[str]) -> None:
    """Waits until a publisher of :func:`start_publisher` printed ``ready``; fails with its
    output when it died instead."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        out, err = proc.communicate()
        raise ProgramFailedError(_describe(proc.args, proc.returncode, 0,  # type: ignore[arg-type]
                                           line + out, err))


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


def connect_pair(endpoint: str, **sub_kwargs: object) -> tuple[object, object]:
    """A subscriber, then a publisher, of ``endpoint``, returned once they are connected
    (see :func:`sync_subscriber`), the subscriber empty."""
    sub = msgq.sub_sock(endpoint, **sub_kwargs)  # type: ignore[arg-type]
    pub = msgq.pub_sock(endpoint)
    sync_subscriber(pub, sub, conflate=bool(sub_kwargs.get("conflate")))
    sub.setTimeout(sub_kwargs.get("timeout", -1))  # type: ignore[attr-defined]
    return pub, sub


def sync_subscriber(pub: object, sub: object, conflate: bool = False) -> None:
    """Sends numbered probes until ``sub`` gets one (ZMQ subscriptions take a moment to
    reach the publisher), then drains every probe, including those still in flight."""
    deadline = time.monotonic() + 10
    sent = 0
    while True:
        sent += 1
        pub.send(b"__probe__%d" % sent)  # type: ignore[attr-defined]
        msg = sub.receive(non_blocking=True)  # type: ignore[attr-defined]
        if msg is not None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("subscriber never connected")
        time.sleep(0.01)
    last = b"__probe__%d" % sent
    sub.setTimeout(10_000)  # type: ignore[attr-defined]
    while msg != last and not conflate:  # probes arrive in order
        msg = sub.receive()  # type: ignore[attr-defined]
        if msg is None:
            raise TimeoutError(f"probe {last!r} never arrived")
    while sub.receive(non_blocking=True) is not None:  # type: ignore[attr-defined]
        pass


def receive_all(sub: object, count: int, timeout_s: float = 10.0) -> list[bytes]:
    """Exactly ``count`` messages from ``sub`` (blocking receives within timeout_s)."""
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    sub.setTimeout(100)  # type: ignore[attr-defined]
    while len(out) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"received {len(out)} of {count} messages")
        msg = sub.receive()  # type: ignore[attr-defined]
        if msg is not None:
            out.append(msg)
    return out


#: The ways damage_bytes damages a file: cut its tail, flip bits, zero a run, append junk.
DAMAGE_KINDS = ("truncate", "flip", "zero", "append")


def damage_bytes(data: bytes, kind: str,
                 rng: random.Random) -> tuple[bytes, list[tuple[int, int]], str]:
    """``data`` damaged one way of DAMAGE_KINDS, drawn from ``rng`` (the same seed gives the
    same damage): (the damaged bytes, the damaged [start, end) spans of the original
    offsets — an append's span lies past its end — and, for an append, what was appended:
    "random", "own bytes" or "zstd magic"; else "")."""
    if kind not in DAMAGE_KINDS:
        raise ValueError(f"damage kind {kind!r} is unknown; use one of {DAMAGE_KINDS}")
    damaged = bytearray(data)
    size = len(damaged)
    style = ""
    if kind == "truncate":
        cut = rng.randrange(size)
        del damaged[cut:]
        spans = [(cut, size)]
    elif kind == "flip":
        spans = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            at = rng.randrange(size)
            damaged[at] ^= 1 << rng.randrange(8)
            spans.append((at, at + 1))
    elif kind == "zero":
        at = rng.randrange(size)
        length = min(rng.randint(1, 256), size - at)
        damaged[at:at + length] = bytes(length)
        spans = [(at, at + length)]
    else:
        style = rng.choice(("random", "own bytes", "zstd magic"))
        n = rng.randint(1, 600)
        if style == "random":
            extra = rng.randbytes(n)
        elif style == "own bytes":
            at = rng.randrange(size)
            extra = bytes(damaged[at:at + n])
        else:
            extra = b"\x28\xb5\x2f\xfd" + rng.randbytes(n)
        damaged += extra
        spans = [(size, size + len(extra))]
    return bytes(damaged), spans, style


def damage_message(rng: random.Random, good: bytes, truncate: float = 0.0) -> bytes:
    """``good`` (a serialized message) with 1 to 4 bytes damaged, drawn from ``rng``: each
    either one bit flipped or the byte replaced; with probability ``truncate`` the tail is
    then cut too (0 draws nothing for it, so a test without cuts keeps its sequence)."""
    data = bytearray(good)
    for _ in range(rng.choice((1, 1, 2, 4))):
        at = rng.randrange(len(data))
        if rng.random() < 0.5:
            data[at] ^= 1 << rng.randrange(8)
        else:
            data[at] = rng.randrange(256)
    if truncate > 0 and rng.random() < truncate:
        data = data[: rng.randrange(len(data))]
    return bytes(data)


def fnv1a(data: bytes) -> str:
    """The hash the C examples (raw_subscriber) print for a message: FNV-1a 64, hex."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def run_logstats(*argv: str) -> tuple[int, str]:
    """``msgq logstats ARGV`` in this process, through the msgq command (so a missing
    command fails the test), on the run's Spark session: (exit code, stdout)."""
    import contextlib
    import io

    from msgq.cli import main  # the command layer: loaded by the tests that run it only

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["logstats", *argv])
    return code, out.getvalue()


def run_msgq_here(*argv: str) -> tuple[int, str, str]:
    """``msgq ARGV`` in this process, on the run's Spark session where the command uses
    Spark (no JVM of its own to start: an active session is returned as it is):
    (exit code, stdout, stderr)."""
    import contextlib
    import io

    from msgq.cli import main  # the command layer: loaded by the tests that run it only

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()
