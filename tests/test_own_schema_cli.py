"""``msgq dump``, ``top``, ``bridge``, ``queues`` and ``config`` with an application's own
schema (tests/schemas/robot, shaped like openpilot's cereal), each run as a real ``msgq``
process against real publishers: the schema is given on the command line
(``--schema``/``--registry``) or through MSGQ_SCHEMA/MSGQ_REGISTRY, and every command
reads services, rates and values from it — never from msgq's own. A bad schema file, a
registry of another schema and an unknown service are one line on stderr."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import MSGQ, free_port_pair, run_cli, run_program, start_publisher
from schema_profiles import (
    ROBOT_SCHEMA,
    ROBOT_SERVICES,
    ROBOT_SERVICES_TOML,
    robot_armstate,
    robot_schema,
)

pytestmark = pytest.mark.multiprocess

SCHEMA_ENV = ("MSGQ_SCHEMA", "MSGQ_REGISTRY", "MSGQ_SCHEMA_ROOT")

# The robot-schema publisher: tests/rate_publisher.py (helpers.start_publisher), the schema
# from its environment; armState number i is schema_profiles.robot_armstate(i) (speedLimit =
# i, valid = i is even, logMonoTime = the declared default 1000 when i % 3 == 0); heartbeat
# goes out at its registry rate, 0.5 Hz (the first at once), each one announced on stdout.


def _armstate(i: int) -> Any:
    """The armState number ``i`` of the publisher, built here with the robot schema."""
    return robot_armstate(i, schema=robot_schema())


def _env(schema_env: bool, prefix: str | None = None, **extra: str) -> dict[str, str]:
    """This test's environment, with the robot schema in MSGQ_SCHEMA/MSGQ_REGISTRY or
    without any."""
    env = os.environ.copy()
    for name in SCHEMA_ENV:
        env.pop(name, None)
    if schema_env:
        env.update(MSGQ_SCHEMA=ROBOT_SCHEMA, MSGQ_REGISTRY=ROBOT_SERVICES)
    if prefix is not None:
        env.pop("MSGQ_PREFIX", None)
        env["OPENPILOT_PREFIX"] = prefix
    env.update(extra)
    return env


class Way:
    """How a command is given the robot schema: its options, or the environment."""

    def __init__(self, name: str) -> None:
        self.name = name

    def argv(self, *args: str) -> list[str]:
        """``msgq`` with the schema options (when given that way) and ``args``."""
        options = ["--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES] \
            if self.name == "options" else []
        return [*MSGQ, *options, *args]

    def env(self, prefix: str | None = None) -> dict[str, str]:
        """The command's environment (MSGQ_SCHEMA/MSGQ_REGISTRY when given that way)."""
        return _env(self.name == "environment", prefix)

    def run(self, *args: str, expect: int = 0,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Runs ``msgq ARGS`` to completion (see helpers.run_program)."""
        return run_program(self.argv(*args), expect=expect, timeout=timeout, env=self.env())


@pytest.fixture(params=["options", "environment"])
def way(request: pytest.FixtureRequest) -> Way:
    """Each test runs with the schema on the command line, then in the environment."""
    return Way(request.param)


@pytest.fixture
def publisher() -> Iterator[Any]:
    """Starts robot-schema publishers sending ``name=Hz``; killed afterwards."""
    procs: list[subprocess.Popen[str]] = []

    def start(prefix: str | None = None, **rates: float) -> subprocess.Popen[str]:
        procs.append(start_publisher(rates, "--builder", "schema_profiles:robot_message",
                                     "--announce", "heartbeat", env=_env(True, prefix)))
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


# --- dump -------------------------------------------------------------------------------


def test_dump_shows_what_pycapnp_decodes(way: Way, publisher: Any) -> None:
    # valid is declared `= true` and logMonoTime `= 1000`: Cap'n Proto stores them XOR
    # their defaults, so a reader that ignores the schema's defaults shows valid inverted
    # and logMonoTime 0 for 1000.
    publisher(armState=100)
    docs = [json.loads(line) for line in
            way.run("dump", "armState", "--json", "--count", "12").stdout.splitlines()]
    assert len(docs) == 12
    for doc in docs:
        i = int(doc["armState"]["speedLimit"])
        expected = _armstate(i)
        decoded = robot_schema().decode(expected.to_bytes())  # pycapnp, from the bytes
        assert doc["service"] == "armState"
        assert doc["valid"] is decoded.valid is (i % 2 == 0)
        assert doc["logMonoTime"] == decoded.logMonoTime == (1000 if i % 3 == 0 else 5000 + i)
        # the payload's own defaults: enabled = true, mode = position, gripper's group
        assert doc["armState"] == json.loads(json.dumps(decoded.to_dict()["armState"]))
        assert doc["armState"]["enabled"] is True and doc["armState"]["mode"] == "position"
        assert doc["armState"]["gripper"] == {"closed": True, "force": 12.5,
                                              "temperature": -40}
    assert {d["valid"] for d in docs} == {True, False}
    assert 1000 in {d["logMonoTime"] for d in docs}

    text = way.run("dump", "armState", "--count", "6").stdout
    blocks = ["armState " + b for b in text.split("armState ")[1:]]
    assert len(blocks) == 6, text
    for block in blocks:
        match = re.search(r"speedLimit = ([0-9.e+]+)", block)
        assert match is not None, block
        i = int(float(match.group(1)))
        mono = 1000 if i % 3 == 0 else 5000 + i
        assert block.splitlines()[0] == f"armState logMonoTime={mono} valid={i % 2 == 0}"
        assert "force = 12.5" in block and "enabled = true" in block

    values = way.run("dump", "armState", "--values", "gripper.force", "--count", "3").stdout
    assert values.split() == ["12.5"] * 3


def test_dump_says_a_message_of_another_service_in_one_line(publisher: Any) -> None:
    # armState's queue carries an Event that is not an armState (a publisher of another
    # schema, or one that mislabels): dump says so instead of showing it as armState.
    import msgq
    from msgq.schemas import new_message, use_schema

    use_schema(ROBOT_SCHEMA, ROBOT_SERVICES, export=False)
    proc = subprocess.Popen([*MSGQ, "dump", "armState", "--count", "1"], env=_env(True),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pub = msgq.pub_sock("armState")
    imu = new_message("imu", schema=robot_schema(), valid=True).to_bytes()
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        pub.send(imu)
        time.sleep(0.02)
    out, err = proc.communicate(timeout=10)
    pub.close()
    assert proc.returncode == 0, err
    line = out.strip()
    assert line.startswith("armState: a imu event, not armState ("), line
    assert "robot.capnp with the registry services.py" in line and "\n" not in line


# --- top --------------------------------------------------------------------------------


def test_top_shows_the_registry_rates_and_keeps_slow_services_alive(
        way: Way, publisher: Any) -> None:
    proc = publisher(armState=100, heartbeat=0.5)
    assert proc.stdout.readline().strip() == "heartbeat"  # the first, at once
    # The next heartbeat is 2 s away: the sample sees none, and a 0.5 Hz service is not
    # dead for that (10 of its periods, cereal's rule, are 20 s).
    out = way.run("top", "--once", "--json", "--interval", "0.5")
    doc = json.loads(out.stdout)
    assert doc["schema"] == "robot.capnp with the registry services.py"
    rows = {r["service"]: r for r in doc["services"]}
    assert set(rows) == {"armState", "heartbeat"}
    assert rows["armState"]["expected_hz"] == 100.0
    assert rows["heartbeat"]["expected_hz"] == 0.5
    assert rows["armState"]["measured_hz"] == pytest.approx(100, rel=0.3)
    assert rows["armState"]["alive"] is True
    assert rows["heartbeat"]["alive"] is True, rows["heartbeat"]
    table = way.run("top", "--once", "--interval", "0.3").stdout.splitlines()
    assert "robot.capnp with the registry services.py" in table[0]  # where the rates are from
    heartbeat = next(line.split() for line in table if line.startswith("heartbeat"))
    assert heartbeat[1] == "0.5" and heartbeat[-2] == "yes"  # alive, then pid
    only = json.loads(way.run("top", "--once", "--json", "--interval", "0.2", "--services",
                              "heartbeat").stdout)
    assert [r["service"] for r in only["services"]] == ["heartbeat"]


def test_top_calls_a_silent_fast_service_dead(way: Way) -> None:
    # The other side of the rule: a 100 Hz service whose live publisher sends nothing is
    # dead after 10 periods (0.1 s), whatever the schema.
    import msgq
    from msgq.schemas import use_schema

    use_schema(ROBOT_SCHEMA, ROBOT_SERVICES, export=False)
    pub = msgq.pub_sock("armState")
    rows = json.loads(way.run("top", "--once", "--json", "--interval", "0.3").stdout)
    row = next(r for r in rows["services"] if r["service"] == "armState")
    assert row["expected_hz"] == 100.0 and row["alive"] is False
    assert row["publisher_pid"] == os.getpid()
    pub.close()


# --- bridge -----------------------------------------------------------------------------


@pytest.fixture
def machines(prefix: str) -> Iterator[tuple[str, str, list[subprocess.Popen[str]]]]:
    """Two namespaces, a robot's and a laptop's, and the processes started in them."""
    robot, laptop = f"{prefix}_robot", f"{prefix}_laptop"
    procs: list[subprocess.Popen[str]] = []
    yield robot, laptop, procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    for name in (robot, laptop):
        shutil.rmtree(os.path.join(os.environ.get("MSGQ_SHM_DIR", "/dev/shm"), name),
                      ignore_errors=True)


def test_bridge_carries_the_schemas_services(
        way: Way, publisher: Any, machines: tuple[str, str, list[subprocess.Popen[str]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    robot, laptop, procs = machines
    port = free_port_pair()
    publisher(prefix=robot, armState=100)
    procs.append(subprocess.Popen(
        way.argv("bridge", "serve", "armState", "--port", str(port)), env=way.env(robot),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True))
    connect = subprocess.Popen(
        way.argv("bridge", "connect", "127.0.0.1", "armState", "--no-vision", "--port",
                 str(port), "--json"),
        env=way.env(laptop), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(connect)

    monkeypatch.setenv("OPENPILOT_PREFIX", laptop)  # this process is on the laptop now
    monkeypatch.delenv("MSGQ_PREFIX")
    import msgq
    from msgq.schemas import use_schema

    use_schema(ROBOT_SCHEMA, ROBOT_SERVICES, export=False)
    sub = msgq.sub_sock("armState", timeout=200)
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 20 and time.monotonic() < deadline:
        data = sub.receive()
        if data is not None:
            got.append(data)
    assert len(got) == 20, "armState did not cross the bridge"
    for data in got:  # byte for byte what the robot sent
        i = int(robot_schema().decode(data).armState.speedLimit)
        assert data == _armstate(i).to_bytes()
    connect.terminate()
    out, err = connect.communicate(timeout=30)
    counts = json.loads(out)
    assert counts["messages"] >= 20 and "mislabeled" not in counts, (out, err)


def test_bridge_serve_all_is_every_service_of_the_registry(way: Way) -> None:
    port = free_port_pair()
    proc = way.run("bridge", "serve", "--all", "--port", str(port), "--duration", "0.2")
    assert "forwarding 10 services" in proc.stderr, proc.stderr


def test_bridge_connect_drops_another_schemas_events_and_says_why(
        machines: tuple[str, str, list[subprocess.Popen[str]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What the laptop (robot schema) gets from a robot side that is not what it should
    # be: a service its schema does not have, and on armState's topic an imu Event.
    import zmq

    import msgq
    from msgq.bridge.wire import service_topic
    from msgq.schemas import new_message, use_schema

    _, laptop, procs = machines
    port = free_port_pair()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    connect = subprocess.Popen(
        [*MSGQ, "--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES_TOML, "bridge",
         "connect", "127.0.0.1", "--no-vision", "--port", str(port), "--json"],
        env=_env(False, laptop), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(connect)
    theirs = new_message("imu", schema=robot_schema(), valid=True).to_bytes()
    ours = _armstate(7).to_bytes()
    monkeypatch.setenv("OPENPILOT_PREFIX", laptop)  # this process is on the laptop now
    monkeypatch.delenv("MSGQ_PREFIX")
    use_schema(ROBOT_SCHEMA, ROBOT_SERVICES, export=False)
    sub = msgq.sub_sock("armState", timeout=50)
    try:
        # Each round: theirs on armState's and gpsLocation's topics, then one of ours.
        # Ours re-published means the round's others were handled (one connection keeps
        # the order).
        deadline = time.monotonic() + 30
        while (data := sub.receive()) is None:
            assert time.monotonic() < deadline, "nothing crossed the bridge"
            pub.send_multipart([service_topic("armState"), theirs])
            pub.send_multipart([service_topic("gpsLocation"), theirs])
            pub.send_multipart([service_topic("armState"), ours])
        assert data == ours
        connect.terminate()
        out, err = connect.communicate(timeout=30)
    finally:
        pub.close()
        ctx.term()
    counts = json.loads(out)
    assert counts["mislabeled"] >= 1 and counts["unknown_services"] >= 1, counts
    assert counts["messages"] >= 1 and counts.get("bad_messages", 0) == 0, counts
    notice = [line for line in err.splitlines() if "dropped" in line]
    assert len(notice) == 1 and "does the other side use the same schema?" in notice[0], err


# --- queues and config: they take the options and read no schema ----------------------


def test_queues_and_config_run_with_the_schema_given(way: Way, publisher: Any) -> None:
    proc = publisher(armState=10)
    queues = json.loads(way.run("queues", "--json").stdout)
    text = json.dumps(queues)
    assert "armState" in text and str(proc.pid) in text, text
    flags = way.run("config", "--cflags").stdout
    assert flags.startswith("-I") and flags.strip().endswith("include"), flags


# --- errors: one line, exit 1 or 2, no traceback ----------------------------------------

COMMANDS = [
    ("dump", "armState", "--timeout", "0.2"),
    ("top", "--once", "--interval", "0.1"),
    ("bridge", "serve", "armState", "--duration", "0.1"),
    ("queues",),
    ("config", "--cflags"),
]
# the commands that use the schema in force (queues and config do not read it)
SCHEMA_COMMANDS = COMMANDS[:3]


def _one_line_error(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert proc.returncode in (1, 2), (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_event_schema(tmp_path: Any) -> str:
    """A schema file that loads but has no Event struct."""
    path = tmp_path / "noevent.capnp"
    path.write_text("@0xd1e2f3a4b5c6d7e9;\nstruct Foo { a @0 :UInt8; }\n")
    return str(path)


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_bad_schema_option_is_one_line(command: tuple[str, ...], no_event_schema: str,
                                         tmp_path: Any) -> None:
    for options, expected in [
        (["--schema", no_event_schema], ("has no struct 'Event'",)),
        (["--schema", str(tmp_path / "missing.capnp")], ("does not exist",)),
        (["--schema", ROBOT_SCHEMA, "--registry", str(tmp_path / "none.py")],
         ("does not exist",)),
    ]:
        _one_line_error(run_cli(*options, *command, expect=None, env=_env(False)), *expected)


@pytest.mark.parametrize("command", SCHEMA_COMMANDS, ids=[c[0] for c in SCHEMA_COMMANDS])
def test_a_bad_schema_in_the_environment_is_one_line(command: tuple[str, ...],
                                                     no_event_schema: str) -> None:
    env = _env(False, MSGQ_SCHEMA=no_event_schema, MSGQ_REGISTRY=ROBOT_SERVICES)
    _one_line_error(run_cli(*command, expect=None, env=env), "has no struct 'Event'",
                    "MSGQ_SCHEMA")


@pytest.mark.parametrize("command", SCHEMA_COMMANDS, ids=[c[0] for c in SCHEMA_COMMANDS])
def test_a_registry_of_another_schema_is_one_line(command: tuple[str, ...],
                                                  tmp_path: Any) -> None:
    # msgq's own registry (as a file) beside the robot schema: its services are not
    # members of the robot union.
    other = tmp_path / "services.json"
    other.write_text(json.dumps({"services": {"vehicleState": {"frequency": 100},
                                              "gpsLocation": {"frequency": 10}}}))
    expected = ("2 services of the registry are not members of Event's union",
                "is it the registry of another schema?")
    _one_line_error(run_cli("--schema", ROBOT_SCHEMA, "--registry", str(other), *command,
                            expect=None, env=_env(False)), *expected)
    env = _env(False, MSGQ_SCHEMA=ROBOT_SCHEMA, MSGQ_REGISTRY=str(other))
    _one_line_error(run_cli(*command, expect=None, env=env), *expected)


@pytest.mark.parametrize("text", [
    "@0xd1e2f3a4b5c6d7ea;\nstruct Event {\n",
    "@0xd1e2f3a4b5c6d7eb;\nstruct Event { logMonoTime @0 :UInt64; x @1 :NoSuchType; }\n",
    "struct Event { logMonoTime @0 :UInt64; }\n",
], ids=["parse error", "unknown type", "no file id"])
def test_a_schema_file_that_does_not_compile_is_one_line(tmp_path: Any, text: str) -> None:
    # pycapnp aborts the process that compiles a bad file: msgq compiles it in a child
    bad = tmp_path / "bad.capnp"
    bad.write_text(text)
    line = _one_line_error(run_cli("--schema", str(bad), "dump", "armState", expect=None,
                                   env=_env(False)), "bad.capnp")
    assert "does not compile" in line


@pytest.mark.parametrize("command", [
    ("dump", "{}"), ("top", "--once", "--services", "{}"), ("bridge", "serve", "{}"),
    ("bridge", "connect", "127.0.0.1", "{}"),
], ids=["dump", "top", "serve", "connect"])
def test_an_unknown_service_is_one_line(way: Way, command: tuple[str, ...]) -> None:
    def run(name: str) -> str:
        args = [a.replace("{}", name) for a in command]
        proc = way.run(*args, expect=2)
        return _one_line_error(proc)

    # a typo of the robot schema's service: the close names
    line = run("armStat")
    assert "unknown service 'armStat' in robot.capnp with the registry services.py" in line
    assert "did you mean 'armState'" in line
    # a service of msgq's own schema: it says so, and how the schema is selected
    line = run("vehicleState")
    assert "'vehicleState' is a service of msgq's own schema" in line
    assert "--schema FILE.capnp --registry FILE (or MSGQ_SCHEMA/MSGQ_REGISTRY)" in line
    # a service of no schema known
    line = run("carState")
    assert "unknown service 'carState' in robot.capnp" in line
    assert "--schema FILE.capnp --registry FILE (or MSGQ_SCHEMA/MSGQ_REGISTRY)" in line


def test_an_application_service_under_msgq_own_schema_says_how_to_select_it() -> None:
    line = _one_line_error(run_cli("dump", "armState", expect=2, env=_env(False)))
    assert "unknown service 'armState' in msgq's own schema" in line
    assert "--schema FILE.capnp --registry FILE (or MSGQ_SCHEMA/MSGQ_REGISTRY) select the " \
           "application's schema" in line


def test_a_union_member_missing_from_the_registry_is_said(tmp_path: Any) -> None:
    partial = tmp_path / "services.toml"
    partial.write_text('[services.armState]\nfrequency = 100\n')
    line = _one_line_error(run_cli("--schema", ROBOT_SCHEMA, "--registry", str(partial),
                                   "dump", "imu", expect=2, env=_env(False)))
    assert "'imu' is a member of the schema's union but not a service of its registry" in line


def test_help_says_how_services_and_schemas_are_chosen() -> None:
    for command in (["dump"], ["top"], ["bridge"]):
        text = " ".join(run_cli(*command, "--help").stdout.split())
        assert "--schema FILE.capnp and --registry FILE (or MSGQ_SCHEMA and MSGQ_REGISTRY)" \
            in text or "--schema FILE.capnp and --registry FILE, or MSGQ_SCHEMA and " \
            "MSGQ_REGISTRY" in text, (command, text)
        assert "registry in force" in text, command


def test_bridge_connect_refuses_another_schema(
        machines: tuple[str, str, list[subprocess.Popen[str]]]) -> None:
    # The robot side serves with msgq's own schema, the laptop side connects with the
    # robot schema: Events of one read as the other's would be mislabeled (an msgq
    # gpsLocation reads as a robot armState), so connect says so and exits, before it
    # re-publishes anything.
    robot, laptop, procs = machines
    port = free_port_pair()
    procs.append(subprocess.Popen([*MSGQ, "bridge", "serve", "gpsLocation", "--port",
                                   str(port)], env=_env(False, robot),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    connect = run_program(
        [*MSGQ, "--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES, "bridge", "connect",
         "127.0.0.1", "--no-vision", "--port", str(port), "--duration", "30", "--json"],
        expect=1, env=_env(False, laptop))
    assert connect.stderr.startswith("msgq bridge connect: re-publishing from ")
    errors = connect.stderr.splitlines()[1:]  # after the line that says it started
    assert len(errors) == 1 and "Traceback" not in connect.stderr, connect.stderr
    assert errors[0].startswith("msgq bridge: error: the other side sends Events of another "
                                "schema: its root struct keeps logMonoTime, valid or the "
                                "union in other places than this side's"), errors[0]
    assert "run this side with its schema" in errors[0]
    assert "messages" not in json.loads(connect.stdout)  # nothing re-published


def test_bridge_connect_checks_the_schema_again_when_the_robot_side_restarts(
        publisher: Any, machines: tuple[str, str, list[subprocess.Popen[str]]],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    # The robot side restarts with another version of the schema (armState and imu
    # swapped in the union): nothing it forwards is re-published under the verdict on
    # the first one's schema, and connect refuses it.
    import msgq
    from msgq.schemas import use_schema

    robot, laptop, procs = machines
    port = free_port_pair()
    for name in ("robot.capnp", "sensors.capnp"):
        text = open(os.path.join(os.path.dirname(ROBOT_SCHEMA), name)).read()
        if name == "robot.capnp":
            text = text.replace("@0xc4f1e2d3b4a59687;", "@0xc4f1e2d3b4a59688;")
            text = text.replace("armState @2 :ArmState;", "armState @3 :ArmState;")
            text = text.replace("imu @3 :Sensors.ImuReading;", "imu @2 :Sensors.ImuReading;")
        (tmp_path / name).write_text(text)
    publisher(prefix=robot, armState=100)

    def serve(*schema: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([*MSGQ, *schema, "bridge", "serve", "armState", "--port",
                                 str(port)], env=_env(False, robot),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    first = serve("--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES)
    connect = subprocess.Popen(
        [*MSGQ, "--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES, "bridge", "connect",
         "127.0.0.1", "--no-vision", "--port", str(port)],
        env=_env(False, laptop), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(connect)
    monkeypatch.setenv("OPENPILOT_PREFIX", laptop)  # this process is on the laptop now
    monkeypatch.delenv("MSGQ_PREFIX")
    use_schema(ROBOT_SCHEMA, ROBOT_SERVICES, export=False)
    sub = msgq.sub_sock("armState", timeout=100)
    deadline = time.monotonic() + 30
    while sub.receive() is None:
        assert time.monotonic() < deadline, "armState did not cross the bridge"
    first.kill()
    first.wait()
    while sub.receive() is not None:  # what the first robot side sent (100 ms of quiet)
        assert time.monotonic() < deadline + 30, "the first robot side still forwards"
    serve("--schema", str(tmp_path / "robot.capnp"), "--registry", ROBOT_SERVICES)
    out, err = connect.communicate(timeout=60)
    assert connect.returncode == 1, (out, err)
    assert "its union member #1 is 'imu', this side's 'armState'" in err, err
    assert sub.receive() is None  # nothing of the second robot side was re-published
