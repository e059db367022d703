"""msgq.compat.cereal: openpilot-style code (``from cereal import log``, ``import
cereal.messaging as messaging``, ``from cereal.services import SERVICE_LIST``) runs over
msgq with a cereal checkout's own schema and services.

No cereal checkout is needed: each test builds a cereal-shaped one in ``tmp_path`` from
the robot schema (tests/schemas/robot: ``robot.capnp`` as ``log.capnp``, its import, its
cereal-style ``services.py``), whose ``messaging/`` and ``visionipc/`` packages raise when
imported, as a checkout's unbuilt Cython modules would. Installing cereal changes
``sys.modules`` and the schema in force of the whole process, so every installation runs
in a subprocess of its own (an abort in pycapnp shows there as the exit code).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from schema_profiles import ROBOT_DIR

from msgq.compat import cereal as compat

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "cereal-tests.sh"

#: Every public name of cereal's messaging/__init__.py.
CEREAL_MESSAGING_NAMES = [
    "Context", "Poller", "SubSocket", "PubSocket", "SocketEventHandle", "toggle_fake_events",
    "set_fake_prefix", "get_fake_prefix", "delete_fake_prefix", "wait_for_one_event",
    "MultiplePublishersError", "MessagingError", "fake_event_handle", "log_from_bytes",
    "new_message", "pub_sock", "sub_sock", "drain_sock_raw", "drain_sock", "recv_sock",
    "recv_one", "recv_one_or_none", "recv_one_retry", "SubMaster", "PubMaster",
    "NO_TRAVERSAL_LIMIT", "context",
]

# A schema of our own standing for cereal's custom.capnp (loaded beside log.capnp).
CUSTOM_CAPNP = """@0xb1a2c3d4e5f60718;
struct CustomReserved0 {
  value @0 :Int32 = 5;
}
"""

UNBUILT = 'raise ImportError("the checkout\'s own {} package must not be imported")\n'


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A cereal-shaped checkout: log.capnp (the robot schema) and what it imports,
    custom.capnp, services.py, and messaging/visionipc packages that must not run."""
    folder = tmp_path / "cereal"
    folder.mkdir()
    shutil.copy(os.path.join(ROBOT_DIR, "robot.capnp"), folder / "log.capnp")
    shutil.copy(os.path.join(ROBOT_DIR, "sensors.capnp"), folder / "sensors.capnp")
    shutil.copy(os.path.join(ROBOT_DIR, "services.py"), folder / "services.py")
    (folder / "custom.capnp").write_text(CUSTOM_CAPNP)
    for package in ("messaging", "visionipc"):
        (folder / package).mkdir()
        (folder / package / "__init__.py").write_text(UNBUILT.format(package))
    (folder / "messaging" / "tests").mkdir()
    (folder / "messaging" / "tests" / "__init__.py").write_text("")
    return folder


def run_python(code: str, env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh Python (the test's environment, MSGQ_PREFIX included)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def result_of(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The JSON object the child printed last, after checking it exited cleanly."""
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cereal_code_runs_with_the_checkouts_schema(checkout: Path) -> None:
    done = run_python(f"""
        import glob, json, os
        from msgq.compat.cereal import install
        install({str(checkout)!r})

        from cereal import log, custom
        import cereal.messaging as messaging
        from cereal.services import SERVICE_LIST
        import msgq, msgq.messaging
        from msgq.schemas import UNSIZED_QUEUE_SIZE, find_service, schema_in_force

        out = {{}}
        out["log_file"] = log.__file__
        out["log_in_force"] = log is schema_in_force().module
        out["custom_default"] = custom.CustomReserved0.new_message().value
        out["services_file"] = SERVICE_LIST["armState"].__class__.__module__
        out["ports"] = [SERVICE_LIST[s].port for s in ("initData", "armState", "imu")]
        out["registry_is_checkouts"] = sorted(schema_in_force().services) == sorted(SERVICE_LIST)
        out["names"] = [n for n in {CEREAL_MESSAGING_NAMES!r} if hasattr(messaging, n)]
        out["same_objects"] = (messaging.SubMaster is msgq.messaging.SubMaster
                               and messaging.PubMaster is msgq.messaging.PubMaster
                               and messaging.Context is msgq.Context
                               and messaging.context is msgq.context
                               and messaging.MessagingError is msgq.IpcError
                               and issubclass(messaging.MultiplePublishersError,
                                              messaging.MessagingError))
        out["env"] = [os.environ.get("MSGQ_SCHEMA"), os.environ.get("MSGQ_REGISTRY")]

        msg = messaging.new_message("armState")
        out["new_valid"] = msg.valid
        out["new_which"] = msg.which()

        pm = messaging.PubMaster(["armState", "missionLog"])
        sm = messaging.SubMaster(["armState", "missionLog"])
        sock = messaging.sub_sock("armState", timeout=2000)
        out["queue_size"] = find_service("armState").queue_size == UNSIZED_QUEUE_SIZE
        if msgq.backend_name() == "msgq":  # the queue file holds the queue and a header
            queue = glob.glob(os.path.join(os.environ.get("MSGQ_SHM_DIR", "/dev/shm"),
                                           os.environ["MSGQ_PREFIX"], "*armState*"))
            out["queue_bytes"] = [os.path.getsize(q) >= UNSIZED_QUEUE_SIZE for q in queue]
        else:
            out["queue_bytes"] = [True]

        msg = messaging.new_message("armState", valid=True)
        msg.armState.speedLimit = 2.5
        msg.armState.gripper.closed = False
        pm.send("armState", msg)
        text = messaging.new_message("missionLog", 5)
        text.missionLog = "go"
        pm.send("missionLog", text)
        got = messaging.recv_one(sock)
        out["recv"] = [got.which(), got.armState.speedLimit, got.armState.gripper.closed,
                       got.armState.gripper.force, got.valid]
        for _ in range(50):
            sm.update(100)
            if sm.seen["armState"] and sm.seen["missionLog"]:
                break
        out["sm"] = [sm["armState"].speedLimit, sm["missionLog"], sm.valid["armState"],
                     sm.valid["missionLog"], sm.logMonoTime["armState"] > 0]
        print(json.dumps(out))
    """)
    out = result_of(done)
    assert out["log_file"] == str(checkout / "log.capnp")
    assert out["log_in_force"] is True
    assert out["custom_default"] == 5
    assert out["services_file"] == "cereal.services"  # the checkout's own Service class
    assert out["ports"] == [9101, 9102, 9103]
    assert out["registry_is_checkouts"] is True
    assert out["names"] == CEREAL_MESSAGING_NAMES
    assert out["same_objects"] is True
    assert out["env"] == [str(checkout / "log.capnp"), str(checkout / "services.py")]
    assert out["new_valid"] is False  # cereal's new_message: valid False
    assert out["new_which"] == "armState"
    assert out["queue_size"] is True  # a registry without sizes: upstream's 10 MiB
    assert out["queue_bytes"] == [True]
    assert out["recv"] == ["armState", 2.5, False, 12.5, True]
    # valid=True is the schema's default (stored as 0): read from raw bytes, it is True
    assert out["sm"] == [2.5, "go", True, False, True]


@pytest.mark.parametrize("first", ["capnp", "compat"])
def test_loading_order_never_aborts(checkout: Path, first: str) -> None:
    done = run_python(f"""
        import json
        import capnp
        capnp.remove_import_hook()
        path = {str(checkout / "log.capnp")!r}
        if {first!r} == "capnp":
            own = capnp.load(path)
        from msgq.compat.cereal import install
        install({str(checkout)!r})
        from cereal import log
        import cereal.messaging as messaging
        if {first!r} == "compat":
            own = capnp.load(path)
        # a message of either module reads as the other's
        msg = own.Event.new_message(imu={{"temperature": 30.5}})
        back = messaging.log_from_bytes(msg.to_bytes())
        theirs = messaging.new_message("imu")
        theirs.imu.calibrated = False
        again = own.Event.from_bytes(theirs.to_bytes())
        with again as reader:
            calibrated = reader.imu.calibrated
        print(json.dumps([own is log, back.imu.temperature, back.imu.calibrated,
                          calibrated]))
    """)
    same, temperature, calibrated_default, calibrated = result_of(done)
    assert same is (first == "capnp")  # a file pycapnp already loaded is reused
    assert temperature == 30.5
    assert calibrated_default is True
    assert calibrated is False


def test_shim_package_serves_every_process(checkout: Path, tmp_path: Path) -> None:
    """``python -m msgq.compat.cereal CHECKOUT FOLDER`` writes a package with which
    unchanged cereal code runs in any process started with FOLDER on its path."""
    shim = tmp_path / "shim"
    made = subprocess.run([sys.executable, "-m", "msgq.compat.cereal", str(checkout),
                           str(shim)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str(shim)
    assert not (shim / "cereal" / "log.capnp").exists()  # nothing of cereal copied
    env = {"PYTHONPATH": str(shim)}
    subscriber = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import cereal.messaging as messaging
            sock = messaging.sub_sock("heartbeat", timeout=10000)
            print("ready", flush=True)
            msg = messaging.recv_one(sock)
            print(msg.which(), msg.heartbeat.to_dict(), msg.valid, flush=True)
        """)], env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert subscriber.stdout is not None
        assert subscriber.stdout.readline().strip() == "ready"
        done = run_python("""
            import cereal, cereal.messaging as messaging
            from cereal.services import SERVICE_LIST
            pm = messaging.PubMaster(["heartbeat"])
            pm.sock["heartbeat"].wait_for_readers(timeout=10)  # the subscriber's socket
            msg = messaging.new_message("heartbeat")
            pm.send("heartbeat", msg)
            print(cereal.__file__, SERVICE_LIST["heartbeat"].frequency)
        """, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(shim / "cereal" / "__init__.py"), "0.5"]
        out, err = subscriber.communicate(timeout=30)
    finally:
        subscriber.kill()
        subscriber.wait()
    assert subscriber.returncode == 0, err
    which, payload, valid = out.split(" ", 1)[0], *out.strip().split(" ", 1)[1].rsplit(" ", 1)
    assert (which, valid) == ("heartbeat", "False")
    assert payload.startswith("{")


def test_visionipc_names_come_from_msgq(checkout: Path) -> None:
    done = run_python(f"""
        import json, sys
        from msgq.compat.cereal import install
        install({str(checkout)!r})
        loaded_early = "msgq.visionipc" in sys.modules
        from cereal.visionipc import VisionIpcClient, VisionIpcServer, VisionStreamType
        import msgq.visionipc
        print(json.dumps([loaded_early, VisionIpcServer is msgq.visionipc.VisionIpcServer,
                          VisionIpcClient is msgq.visionipc.VisionIpcClient,
                          VisionStreamType is msgq.visionipc.VisionStreamType]))
    """)
    assert result_of(done) == [False, True, True, True]


def test_install_twice_and_conflicts(checkout: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(checkout, other)
    done = run_python(f"""
        import json
        from msgq.compat.cereal import install
        first = install({str(checkout)!r})
        again = install({str(checkout)!r})
        try:
            install({str(other)!r})
            conflict = None
        except RuntimeError as e:
            conflict = str(e)
        print(json.dumps([first is again, conflict]))
    """)
    same, conflict = result_of(done)
    assert same is True
    assert conflict is not None and str(checkout) in conflict and "once" in conflict


def test_not_a_checkout_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="has no log.capnp: give the cereal folder"):
        compat.install(tmp_path)


def test_refuses_when_another_cereal_is_imported(monkeypatch: pytest.MonkeyPatch,
                                                 checkout: Path) -> None:
    real = types.ModuleType("cereal")
    real.__file__ = "/somewhere/openpilot/cereal/__init__.py"
    monkeypatch.setitem(sys.modules, "cereal", real)
    with pytest.raises(RuntimeError, match="already imported .*/somewhere/openpilot/cereal"):
        compat.install(checkout)
    assert sys.modules["cereal"] is real


def test_a_registry_of_another_schema_is_refused(checkout: Path) -> None:
    (checkout / "services.py").write_text(
        "class Service:\n"
        "  def __init__(self, port, should_log, frequency, decimation=None):\n"
        "    self.port, self.should_log = port, should_log\n"
        "    self.frequency, self.decimation = frequency, decimation\n"
        "SERVICE_LIST = {'carState': Service(8001, True, 100.0)}\n")
    done = run_python(f"""
        import sys
        from msgq.compat.cereal import install
        try:
            install({str(checkout)!r})
        except ValueError as e:
            print(e)
        print("cereal" in sys.modules)
    """)
    assert done.returncode == 0, done.stderr
    message, imported = done.stdout.strip().splitlines()
    assert "carState" in message and "another schema" in message
    assert imported == "False"


@pytest.mark.multiprocess
def test_script_runs_cereal_style_tests(checkout: Path) -> None:
    """scripts/cereal-tests.sh runs the checkout's messaging tests through the shim, from
    a scratch folder, and passes pytest's verdict on."""
    tests = checkout / "messaging" / "tests"
    (tests / "test_messaging.py").write_text(textwrap.dedent("""
        import unittest

        from cereal import log
        import cereal.messaging as messaging
        from cereal.services import SERVICE_LIST

        events = [e for e in log.Event.schema.union_fields if e in SERVICE_LIST]


        class TestMessaging(unittest.TestCase):
            def test_pub_sub(self):
                pub = messaging.pub_sock("armState")
                sub = messaging.sub_sock("armState", timeout=1000)
                msg = messaging.new_message("armState")
                msg.armState.speedLimit = 4.0
                pub.send(msg.to_bytes())
                self.assertEqual(messaging.recv_one(sub).armState.speedLimit, 4.0)

            def test_events(self):
                self.assertEqual(len(events), 10)
    """))
    (tests / "test_pub_sub_master.py").write_text(textwrap.dedent("""
        import unittest

        import cereal.messaging as messaging
        from cereal.messaging.tests.test_messaging import events


        class TestSubMaster(unittest.TestCase):
            def test_init(self):
                sm = messaging.SubMaster(events)
                self.assertEqual(len(sm.alive), len(events))

            def test_fails(self):
                self.assertEqual(messaging.new_message("imu").valid, True)
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    done = subprocess.run([str(SCRIPT), str(checkout)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 3 passed" in done.stdout, done.stdout
    assert "test_pub_sub_master.py::TestSubMaster::test_fails" in done.stdout
    assert not list(tests.glob("__pycache__"))  # the checkout is left as it was


def test_shim_command_refuses_a_folder_that_is_not_a_checkout(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "msgq.compat.cereal", str(tmp_path),
                           str(tmp_path / "shim")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: {tmp_path} has no log.capnp: give the cereal "
                                   "folder (the one with log.capnp and services.py, "
                                   "openpilot/cereal)")
    assert not (tmp_path / "shim").exists()
