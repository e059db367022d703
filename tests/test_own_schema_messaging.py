"""Bring your own schema, in the Event and messaging layers: the schema in force, raw
reads that apply the schema's declared defaults, loading order that never aborts, one
registry sizing every socket of a service, registries without sizes, and cereal's
frequency rule — on tests/schemas/robot (a real-schema profile, see schema_profiles.py)
beside msgq's own."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from helpers import wait_until
from schema_profiles import ROBOT_SCHEMA, ROBOT_SERVICES, ROBOT_SERVICES_TOML, robot_schema

import msgq
from msgq import messaging
from msgq.messaging import PubMaster, SubMaster, new_message
from msgq.schemas import (
    SCHEMA_DIR,
    UNSIZED_QUEUE_SIZE,
    SchemaSpec,
    load_registry,
    load_schema,
    msgq_schema,
    registry_in_force,
    schema_in_force,
    use_schema,
)

# --- raw reads apply the declared defaults (defect 1) ---------------------------------


def _random_event(schema: Any, rng: random.Random) -> Any:
    service = rng.choice([s for s in schema.services if s not in schema.sized_fields])
    msg = new_message(service, schema=schema, valid=rng.random() < 0.5,
                      logMonoTime=rng.choice([0, 1000, rng.getrandbits(64), 2**64 - 1]))
    return msg


def test_peeked_valid_and_time_equal_pycapnp_on_every_profile(schema_profile: Any) -> None:
    """valid (declared `= true` in the robot schema) and logMonoTime (default 1000 there)
    read from the bytes are what pycapnp decodes, whatever their values."""
    rng = random.Random(7)
    layout = schema_profile.layout
    seen = set()
    for _ in range(400):
        data = _random_event(schema_profile, rng).to_bytes()
        decoded = schema_profile.decode(data)
        assert layout.peek(data) == (decoded.logMonoTime, decoded.valid, decoded.which())
        assert layout.identify(data) == layout.peek(data)
        seen.add((decoded.valid, decoded.logMonoTime == 1000))
    assert seen == {(True, True), (True, False), (False, True), (False, False)}


def test_robot_layout_knows_its_defaults(robot: Any) -> None:
    assert robot.layout.valid_default is True and robot.layout.mono_default == 1000
    assert msgq_schema().layout.valid_default is False
    # an Event whose data section ends before valid (an older writer) reads the default
    empty = robot.event.new_message()
    data = empty.to_bytes()
    assert robot.layout.peek(data)[:2] == (1000, True)
    assert robot.decode(data).valid is True


def test_submaster_valid_follows_the_declared_default(robot: Any) -> None:
    pm = PubMaster(["armState", "imu"])
    sm = SubMaster(["armState", "imu"])
    for valid in (True, False, True):
        sent = {}
        for service in ("armState", "imu"):
            msg = new_message(service, valid=valid)
            sent[service] = msg.logMonoTime
            pm.send(service, msg)
        wait_until(lambda: (sm.update(0), all(sm.updated.values()))[1], timeout=5,
                   what="both services updated")
        assert sm.valid == {"armState": valid, "imu": valid}
        assert sm.all_valid() is valid
        assert sm.logMonoTime == sent
        assert sm["armState"].gripper.force == 12.5  # a payload default, decoded
    pm.close()
    sm.close()


# --- loading never aborts (defect 2) ---------------------------------------------------

_LOAD_ORDERS = {
    "capnp.load first": """
        capnp.load(SCHEMA)
        s = load_schema(SCHEMA, SERVICES)
        use_schema(SCHEMA, SERVICES)
    """,
    "capnp.load first, other import folders": """
        capnp.load(SCHEMA, imports=[os.path.dirname(SCHEMA)])
        s = load_schema(SCHEMA, SERVICES, imports=[OTHER])
    """,
    "msgq first, then capnp.load as cereal does": """
        s = use_schema(SCHEMA, SERVICES)
        capnp.load(SCHEMA)
    """,
    "the imported file loaded alone first": """
        capnp.load(os.path.join(os.path.dirname(SCHEMA), "sensors.capnp"), imports=[OTHER])
        s = load_schema(SCHEMA, SERVICES)
    """,
    "a loaded module given": """
        module = capnp.load(SCHEMA)
        s = load_schema(module, SERVICES)
        assert s.module is module
    """,
}


@pytest.mark.parametrize("order", list(_LOAD_ORDERS))
def test_no_loading_order_aborts(order: str) -> None:
    """pycapnp aborts the process ("Duplicate ID") when a file it parsed is parsed again
    with other import folders: each order runs in its own process."""
    program = textwrap.dedent("""
        import os, capnp
        capnp.remove_import_hook()
        from msgq.schemas import load_schema, use_schema
        SCHEMA, SERVICES, OTHER = {schema!r}, {services!r}, {other!r}
    """).format(schema=ROBOT_SCHEMA, services=ROBOT_SERVICES, other=SCHEMA_DIR)
    program += textwrap.dedent(_LOAD_ORDERS[order])
    program += "print(s.new_message('armState') if False else s.event.schema.node.id)\n"
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, (order, out.returncode, out.stderr[-2000:])
    assert int(out.stdout.strip()) == robot_schema().event.schema.node.id


# --- one registry sizes every socket of a service (defect 3) --------------------------


def _registry_file(tmp_path: Any, text: str) -> str:
    path = os.path.join(tmp_path, "services.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_every_socket_of_a_service_gets_the_registry_in_force_size(tmp_path: Any) -> None:
    """msgq also knows `can` (its own registry: 4 MiB): with an application's registry in
    force (no sizes: upstream's 10 MiB) the plain sockets must not keep msgq's size while
    PubMaster / SubMaster use the application's."""
    registry = _registry_file(tmp_path, '[services.can]\nfrequency = 100.0\n'
                                        '[services.vehicleState]\nfrequency = 100.0\n')
    use_schema(os.path.join(SCHEMA_DIR, "log.capnp"), registry)
    assert msgq.pub_sock("can").segment_size == UNSIZED_QUEUE_SIZE
    pm = PubMaster(["can"])
    sm = SubMaster(["can"])
    plain = msgq.sub_sock("can", timeout=2000)
    assert pm.sock["can"].segment_size == UNSIZED_QUEUE_SIZE
    data = new_message("can", 2).to_bytes()
    pm.send("can", data)
    assert plain.receive() == data
    # msgq's own services that the application's registry lacks get the default size
    assert registry_in_force().get("gyroscope") is None
    pm.close()
    sm.close()


def _child_segment_size(queue: Any) -> None:
    queue.put((msgq.sub_sock("armState").segment_size, messaging.log.Event.schema.node.id,
               messaging.new_message("armState").armState.gripper.force))


def test_child_processes_follow_the_schema_in_force(robot: Any) -> None:
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: only the environment
    queue = ctx.Queue()
    child = ctx.Process(target=_child_segment_size, args=(queue,))
    child.start()
    size, node, force = queue.get(timeout=60)
    child.join(30)
    assert (size, node, force) == (UNSIZED_QUEUE_SIZE, robot.event.schema.node.id, 12.5)


def test_environment_sets_the_schema_in_force_for_every_layer() -> None:
    program = textwrap.dedent("""
        import msgq
        from msgq import messaging
        from msgq.schemas import default_schema
        sm = messaging.SubMaster(["armState", "heartbeat"])
        print(messaging.log.Event.schema.node.displayName.split(":")[0],
              msgq.pub_sock("imu").segment_size, sm.update_freq,
              default_schema().layout.valid_default)
    """)
    env = dict(os.environ, MSGQ_SCHEMA=ROBOT_SCHEMA, MSGQ_REGISTRY=ROBOT_SERVICES_TOML)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=60, env=env, check=True)
    # imu has a message size in services.toml (512 B at 50 Hz: 64 KiB)
    assert out.stdout.split() == ["robot.capnp", "65536", "100.0", "True"]


def test_a_bad_schema_in_the_environment_is_one_clear_error(tmp_path: Any) -> None:
    env = dict(os.environ, MSGQ_SCHEMA=os.path.join(tmp_path, "missing.capnp"))
    out = subprocess.run([sys.executable, "-c", "from msgq import messaging; messaging.log"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1
    assert "MSGQ_SCHEMA" in out.stderr and "missing.capnp" in out.stderr


# --- registries: files, no sizes -------------------------------------------------------


def test_registry_files_agree_and_have_no_sizes() -> None:
    py, toml = load_registry(ROBOT_SERVICES), load_registry(ROBOT_SERVICES_TOML)
    assert list(py) == list(toml)
    for name in py:
        assert py[name].frequency == toml[name].frequency
        assert py[name].should_log == toml[name].should_log
    assert py["armState"].message_size is None
    assert py["armState"].queue_size == UNSIZED_QUEUE_SIZE
    assert py["armState"].port == 9102 and py["cameraFrame"].decimation is None
    assert toml["armState"].queue_size < UNSIZED_QUEUE_SIZE  # sized in the TOML
    as_json = {"services": {n: {"frequency": s.frequency, "should_log": s.should_log}
                            for n, s in py.items()}}
    assert load_registry(_registry_json(as_json)).keys() == py.keys()


def _registry_json(doc: dict[str, Any]) -> str:
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return path


@pytest.mark.parametrize(("text", "suffix", "message"), [
    ("X = 1\n", ".py", "no SERVICE_LIST"),
    ("[services.a]\nshould_log = true\n", ".toml", "no frequency"),
    ('[services.a]\nfrequency = "fast"\n', ".toml", "must be a number"),
    ("{}", ".json", "no 'services' table"),
    ("", ".yaml", ".py, .toml or .json"),
])
def test_a_bad_registry_file_names_itself(tmp_path: Any, text: str, suffix: str,
                                          message: str) -> None:
    path = os.path.join(tmp_path, "reg" + suffix)
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(ValueError, match=message) as info:
        load_registry(path)
    assert path in str(info.value) and "\n" not in str(info.value)


def test_a_registry_of_another_schema_is_refused_in_one_line(tmp_path: Any) -> None:
    with pytest.raises(ValueError) as info:
        load_schema(os.path.join(SCHEMA_DIR, "log.capnp"), ROBOT_SERVICES)
    text = str(info.value)
    assert "10 services of the registry" in text and "another schema" in text
    assert "and 5 more" in text and "\n" not in text


def test_the_spec_pickles_and_rebuilds_the_same_schema(robot: Any) -> None:
    import pickle

    spec = pickle.loads(pickle.dumps(robot.spec))
    assert spec == robot.spec and spec.load() is robot
    assert SchemaSpec().load() is msgq_schema()
    assert schema_in_force() is robot
    assert robot.spec.environment() == {"MSGQ_SCHEMA_ROOT": "Event",
                                        "MSGQ_SCHEMA": ROBOT_SCHEMA,
                                        "MSGQ_REGISTRY": ROBOT_SERVICES}


def test_use_schema_follows_in_messaging_after_import(robot: Any) -> None:
    assert messaging.log is robot.module
    assert new_message("heartbeat").heartbeat.counter == -1
    use_schema(None)
    assert messaging.log is msgq_schema().module
    assert "MSGQ_SCHEMA" not in os.environ or os.environ["MSGQ_SCHEMA"] != ROBOT_SCHEMA


# --- cereal's frequency rule (defect 4) ------------------------------------------------


def _feed(sm: SubMaster, rates: dict[str, float], seconds: float, tick_hz: float) -> None:
    due = {s: 0.0 for s in rates}
    t = 100.0
    end = t + seconds
    while t < end:
        msgs = []
        for service, hz in rates.items():
            if t + 1e-9 >= 100.0 + due[service]:
                msgs.append(messaging.log_from_bytes(new_message(service, valid=True)
                                                     .to_bytes()))
                due[service] += 1.0 / hz
        sm.update_msgs(t, msgs)
        t += 1.0 / tick_hz


def test_all_freq_ok_leaves_out_services_at_or_under_1hz(robot: Any) -> None:
    """heartbeat (0.5 Hz) arrives at its rate: cereal leaves it out of all_freq_ok (its
    band has a 1 Hz floor; diagnostics at 1 Hz counts); before, msgq counted it, and
    all_freq_ok() was False for any openpilot stack (carParams 0.02 Hz)."""
    sm = SubMaster(["armState", "heartbeat", "diagnostics"])
    _feed(sm, {"armState": 100.0, "heartbeat": 0.5, "diagnostics": 1.0}, 12.0, 100.0)
    assert sm.freq_ok["armState"] and sm.all_alive()
    assert not sm.freq_ok["heartbeat"]  # 0.5 Hz seen against cereal's 1 Hz floor
    assert sm.all_freq_ok() and sm.all_checks()
    assert [s for s in sm.services if sm._check_avg_freq(s)] == ["armState", "diagnostics"]
    sm.close()


def test_bands_are_cereals(robot: Any) -> None:
    # cereal's test_avg_frequency_checks, on the robot registry (update at 20 Hz)
    for poll in (True, False):
        sm = SubMaster(["plannerPlan", "heartbeat", "armState", "imu", "diagnostics"],
                       poll="plannerPlan" if poll else None,
                       frequency=None if poll else 20.0)
        expected = {"armState": (20, 20), "plannerPlan": (20, 20 if poll else 10),
                    "imu": (20, 20), "diagnostics": (1, 1)}
        for service, (high, low) in expected.items():
            assert sm._check_avg_freq(service)
            assert sm.max_freq[service] == high * 1.2
            assert sm.min_freq[service] == low * 0.8
        assert not sm._check_avg_freq("heartbeat")
        sm.close()


def test_a_service_that_stops_is_not_at_its_rate(robot: Any) -> None:
    sm = SubMaster(["armState"])
    _feed(sm, {"armState": 100.0}, 2.0, 100.0)
    assert sm.freq_ok["armState"]
    sm.update_msgs(time.monotonic() + 1e6, [])
    assert not sm.alive["armState"] and not sm.freq_ok["armState"]
    sm.close()


def test_a_schema_that_would_abort_the_process_is_a_value_error(tmp_path: Any) -> None:
    """pycapnp aborts a process that compiles a bad file, or parses msgq's log.capnp again
    through an import folder after loading it directly: each is a ValueError."""
    program = textwrap.dedent("""
        import sys
        from msgq.schemas import SCHEMA_DIR, load_schema, msgq_schema
        msgq_schema()
        for text in sys.argv[1:]:
            path = sys.argv[0] + str(len(text)) + ".capnp"
            open(path, "w").write(text)
            try:
                load_schema(path, imports=[SCHEMA_DIR])
                print("loaded")
            except ValueError as e:
                print("ValueError", "Duplicate ID" in str(e), "does not compile" in str(e))
    """)
    texts = [
        "@0xd1e2f3a4b5c6d7f1;\nstruct Event { logMonoTime @0 :UInt64; x @1 :Nope; }\n",
        '@0xd1e2f3a4b5c6d7f2;\nusing Log = import "/log.capnp";\nstruct Event {\n'
        "  logMonoTime @0 :UInt64; valid @1 :Bool;\n"
        "  union { start @2 :Log.LogStart; note @3 :Text; }\n}\n",
    ]
    out = subprocess.run([sys.executable, "-c", program, *texts], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["ValueError False True", "ValueError True False"]


def test_two_schemas_with_one_id_are_refused_and_copies_are_one(tmp_path: Any) -> None:
    text = ("@0xd1e2f3a4b5c6d7f3;\nstruct Event {\n  logMonoTime @0 :UInt64; valid @1 :Bool;\n"
            "  union { a @2 :Text; b @3 :Data; }\n}\n")
    first, copy, other = (os.path.join(tmp_path, name) for name in ("a", "b", "c"))
    for folder, body in ((first, text), (copy, text), (other, text.replace("b @3", "c @3"))):
        os.makedirs(folder)
        with open(os.path.join(folder, "s.capnp"), "w") as f:
            f.write(body)
    loaded = load_schema(os.path.join(first, "s.capnp"))
    assert load_schema(os.path.join(copy, "s.capnp")).module is loaded.module
    with pytest.raises(ValueError, match="two schemas cannot share an id"):
        load_schema(os.path.join(other, "s.capnp"))  # pycapnp would abort the process
