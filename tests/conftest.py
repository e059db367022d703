"""Shared fixtures: every test gets its own queue namespace, and socket tests run on
every backend the build offers.

The quick tier (``./test.sh --quick``, i.e. ``pytest -m "quick or not slow"``): a new test
that takes over 1.5 s alone carries ``@pytest.mark.slow`` (and ``spark``/``chaos``/``fuzz``/
``packaging`` where it is one); files that are heavy whole are marked here by name
(:data:`HEAVY_FILES`), and one test per layer that only slow tests reach is kept in
(:data:`LAYER_REPRESENTATIVES`, marked ``quick``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import msgq

#: Test files that are heavy whole, by name pattern, and the marker each gets (with
#: ``slow``): the quick tier leaves them out. test_own_schema_cli.py runs every command
#: again on the robot schema (41 s); the quick tier reaches the robot schema through
#: test_own_schema_messaging.py and test_own_schema_logs.py.
HEAVY_FILES = (
    ("chaos/test_*.py", "chaos"),
    ("fuzz/test_*.py", "fuzz"),
    ("test_spark*.py", "spark"),
    ("test_*_spark.py", "spark"),
    ("test_packaging.py", "packaging"),
    ("test_own_schema_cli.py", "slow"),
)
#: Markers that make a test ``slow`` wherever it lives.
HEAVY_MARKERS = ("spark", "chaos", "fuzz", "packaging")
#: One test per layer the quick tier would otherwise not reach (marked ``quick``; a
#: parametrized test is named with its parameters): the Spark data source on a small
#: recording (the session start is most of its time), and the bridge end to end.
LAYER_REPRESENTATIVES = (
    "tests/test_bridge.py::test_bridge_carries_services_and_frames[none]",
)
#: Tests that the per-Python sessions (noxfile.py: ``-m "quick or not slow or pythons"``)
#: add to the quick tier, marked ``pythons``: the Spark data source on a small recording
#: (pyspark and py4j on that Python). Too slow for ``./test.sh --quick`` itself: the
#: session's start is most of its 100 s at a load average of 12.
PYTHONS_REPRESENTATIVES = (
    "tests/test_spark.py::test_rows_are_the_events_of_the_log_reader",
)
#: Tests of files the quick tier keeps that take too long for it, marked ``slow`` here
#: (the full suite runs them): each took 25-60 s of a 340 s quick tier at a load average
#: of 12, where most take under one. The quick tier keeps test_crash.py's other crash
#: tests and test_api_sequences.py's other sequences.
SLOW_TESTS = (
    "tests/test_crash.py::test_killed_publisher_never_tears_a_payload",  # 8 rounds of kills
    "tests/test_api_sequences.py::test_no_sequence_of_calls_kills_the_process",  # fuzzing
)


def pytest_configure(config: pytest.Config) -> None:
    """Gives the run a Ctrl-C handler where it was started with SIGINT ignored (a shell
    does that to a job it starts in the background with &, and so do some CI runners):
    the programs the tests start inherit an ignored SIGINT across exec, and Python then
    installs no KeyboardInterrupt handler, so every test that stops a program with
    Ctrl-C would hang or fail. A handled SIGINT is reset to the default at exec."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselect anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests of :data:`HEAVY_FILES` (and any test carrying a heavy marker) and
    :data:`SLOW_TESTS` ``slow``, :data:`LAYER_REPRESENTATIVES` ``quick`` and
    :data:`PYTHONS_REPRESENTATIVES` ``pythons``; a run that selects by those markers fails
    when a named test's file was collected without it (renamed or removed: name another)."""
    tests_dir = Path(__file__).resolve().parent
    files: set[str] = set()
    found: set[str] = set()
    heavy_files: set[str] = set()
    for item in items:
        path = Path(str(item.path))
        relative = path.relative_to(tests_dir) if path.is_relative_to(tests_dir) else path
        for pattern, marker in HEAVY_FILES:
            if relative.match(pattern):
                item.add_marker(marker)
        if any(item.get_closest_marker(m) for m in HEAVY_MARKERS):
            heavy_files.add(str(item.path))
            if not item.get_closest_marker("slow"):
                item.add_marker("slow")
        base = item.nodeid.split("[", 1)[0]
        files.add(base.split("::", 1)[0])
        for nodeid in (item.nodeid, base):
            for named, marker in ((LAYER_REPRESENTATIVES, "quick"),
                                  (PYTHONS_REPRESENTATIVES, "pythons"), (SLOW_TESTS, "slow")):
                if nodeid in named:
                    item.add_marker(marker)
                    found.add(nodeid)
    # Heavy files first (their order and each file's own order kept): pytest-xdist hands
    # out files in this order (test.sh: --dist loadfile --no-loadscope-reorder), so the
    # minutes-long Spark, packaging and chaos files start while the small ones wait to
    # fill the gaps, instead of running last, one per worker, while the other idles.
    items.sort(key=lambda item: str(item.path) not in heavy_files)
    missing = [n for n in (*LAYER_REPRESENTATIVES, *PYTHONS_REPRESENTATIVES, *SLOW_TESTS)
               if n.split("::", 1)[0] in files and n not in found]
    markexpr = config.getoption("markexpr") or ""
    if missing and ("quick" in markexpr or "slow" in markexpr):
        raise pytest.UsageError(f"{missing[0]}, named in tests/conftest.py for the quick "
                                "tier, no longer exists: name another test there")


@pytest.fixture(autouse=True)
def zmq_port_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gives each xdist worker its own slice of the ZMQ backend's port range, so
    publishers of tests running at once in different workers never hash to one port (a
    port held by another worker's publisher failed a test with MultiplePublishersError).
    Outside xdist: the default range. Children started by a test inherit the slice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        monkeypatch.delenv("MSGQ_ZMQ_BASE_PORT", raising=False)
        monkeypatch.delenv("MSGQ_ZMQ_PORT_SPAN", raising=False)
        return
    from msgq.zmq.ports import DEFAULT_BASE_PORT, DEFAULT_PORT_SPAN

    span = DEFAULT_PORT_SPAN // count
    index = int(worker[2:]) % count
    monkeypatch.setenv("MSGQ_ZMQ_BASE_PORT", str(DEFAULT_BASE_PORT + index * span))
    monkeypatch.setenv("MSGQ_ZMQ_PORT_SPAN", str(span))


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
    from msgq.schemas import selection

    for name in (selection.ENV_SCHEMA, selection.ENV_SERVICES, selection.ENV_ROOT):
        monkeypatch.delenv(name, raising=False)
    selection.reset_to_environment()
    yield
    # use_schema() exports the schema to os.environ itself: monkeypatch, which restores
    # only what it set, would leave a test's schema to the next modules
    for name in (selection.ENV_SCHEMA, selection.ENV_SERVICES, selection.ENV_ROOT):
        os.environ.pop(name, None)
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


@pytest.fixture
def shm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared-memory backend, whatever the caller's environment selects (use it
    with ``pytestmark = pytest.mark.usefixtures("shm")``)."""
    monkeypatch.setenv("MSGQ_BACKEND", "msgq")
    monkeypatch.delenv("ZMQ", raising=False)


@pytest.fixture
def publisher() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts ``tests/rate_publisher.py`` processes (``publisher(vehicleState=100)``,
    options first: ``publisher("--value", "speed", vehicleState=100)``), each returned
    once it is ready, all killed at the end of the test."""
    from helpers import start_publisher

    procs: list[subprocess.Popen[str]] = []

    def start(*options: str, **rates: float) -> subprocess.Popen[str]:
        procs.append(start_publisher(rates, *options))
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()
        proc.communicate()


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
