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
    """A subscriber, then a publisher, of ``endpoint``, returned once a probe message has
    gone through (ZMQ subscriptions take a moment to reach the publisher); the probes are
    drained, so the subscriber is empty."""
    import time

    sub = msgq.sub_sock(endpoint, **sub_kwargs)  # type: ignore[arg-type]
    pub = msgq.pub_sock(endpoint)
    deadline = time.monotonic() + 10
    while True:
        pub.send(b"__probe__")
        if sub.receive(non_blocking=True) is not None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"subscriber of {endpoint} never connected")
        time.sleep(0.01)
    while sub.receive(non_blocking=True) is not None:
        pass
    if hasattr(sub, "setTimeout") and "timeout" not in sub_kwargs:
        sub.setTimeout(-1)
    return pub, sub


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
