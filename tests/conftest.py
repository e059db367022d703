"""Shared fixtures: every test gets its own queue namespace, and socket tests run on
every backend the build offers."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pytest

import msgq


@pytest.fixture(autouse=True)
def prefix(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh MSGQ_PREFIX per test, so tests (and parallel runs) never meet; its queue
    folder is removed afterwards."""
    name = f"test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("MSGQ_PREFIX", name)
    monkeypatch.delenv("OPENPILOT_PREFIX", raising=False)
    yield name
    shutil.rmtree(
        os.path.join(os.environ.get("MSGQ_SHM_DIR", "/dev/shm"), name), ignore_errors=True
    )


@pytest.fixture(params=sorted(msgq.BACKENDS))
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test once per backend, selected the way users select it."""
    monkeypatch.setenv("MSGQ_BACKEND", request.param)
    monkeypatch.delenv("ZMQ", raising=False)
    return request.param


@pytest.fixture
def endpoint() -> str:
    """An endpoint name unused so far in this run."""
    return f"ep_{uuid.uuid4().hex[:12]}"


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
    import time

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
    import time

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


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local Spark session (``local[2]``) for the whole test run, started by the first
    test that asks for it (runs without Spark tests start no JVM) and stopped at the end.
    Fails when pyspark or a Java 17+ runtime is missing: scripts/ensure_env.sh installs
    both, so a missing one is a broken set-up, not a reason to skip."""
    from msgq.spark.session import JavaMissingError, spark_session

    try:
        session = spark_session(
            "local[2]",
            app_name="msgq tests",
            config={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        )
    except JavaMissingError as e:
        pytest.fail(f"{e} (run ./test.sh, which installs a Java runtime)")
    yield session
    session.stop()
