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


@pytest.fixture(autouse=True)
def schema_in_force(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts with msgq's own schema in force (whatever the caller's
    environment says) and leaves no other behind."""
    from msgq.schemas import selection, services

    for name in (selection.ENV_SCHEMA, selection.ENV_SERVICES, selection.ENV_ROOT):
        monkeypatch.delenv(name, raising=False)
    selection.reset_to_environment()
    yield
    # use_schema() exports the schema to os.environ itself: monkeypatch, which restores
    # only what it set, would leave a test's schema to the next modules
    for name in (selection.ENV_SCHEMA, selection.ENV_SERVICES, selection.ENV_ROOT):
        os.environ.pop(name, None)
    services.register(None)
    selection.reset_to_environment()


@pytest.fixture
def robot(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """tests/schemas/robot (a real-schema profile, see schema_profiles.py) in force for
    this test and its child processes; yields the Schema."""
    from schema_profiles import ROBOT_SCHEMA, ROBOT_SERVICES

    from msgq.schemas import use_schema

    schema = use_schema(ROBOT_SCHEMA, ROBOT_SERVICES)  # exports MSGQ_SCHEMA/MSGQ_REGISTRY
    yield schema  # the autouse schema_in_force fixture removes what it exported


@pytest.fixture(params=["msgq", "robot"])
def schema_profile(request: pytest.FixtureRequest) -> object:
    """Runs a test on each schema profile (msgq's own, then the robot schema), in force;
    yields the Schema."""
    if request.param == "robot":
        return request.getfixturevalue("robot")
    from msgq.schemas import msgq_schema

    return msgq_schema()


@pytest.fixture(params=sorted(msgq.BACKENDS))
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test once per backend, selected the way users select it."""
    monkeypatch.setenv("MSGQ_BACKEND", request.param)
    monkeypatch.delenv("ZMQ", raising=False)
    return request.param


@pytest.fixture(params=[False, True], ids=["plain", "fake"])
def fake_layer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Runs the test with and without CEREAL_FAKE (no handle enabled: receives pass)."""
    if request.param:
        monkeypatch.setenv("CEREAL_FAKE", "1")
        monkeypatch.setenv("CEREAL_FAKE_PREFIX", f"fake_{os.getpid()}_{uuid.uuid4().hex[:6]}")
    else:
        monkeypatch.delenv("CEREAL_FAKE", raising=False)
    return bool(request.param)


@pytest.fixture
def endpoint() -> str:
    """An endpoint name unused so far in this run."""
    return f"ep_{uuid.uuid4().hex[:12]}"


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
