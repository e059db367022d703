"""docs/compat.md is true: every upstream name it lists exists with a compatible signature,
on every backend's class. The table is the source: a row added there is checked here."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shutil
from collections.abc import Iterator
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import msgq
from msgq import shm_backend, sockets
from msgq import zmq as zmq_backend
from msgq.messaging import PubMaster, SubMaster, new_message

COMPAT = Path(__file__).resolve().parent.parent / "docs" / "compat.md"
ROW = re.compile(r"^\| `(?P<name>[\w.]+)` \| `(?P<sig>[^`]*)` \| (?P<status>\w+) \|")
STATUSES = {"same", "extended", "renamed", "differs"}

#: The protocol classes of msgq: a row about one of them is checked on every backend.
BACKEND_CLASSES: dict[str, list[Any]] = {
    "Context": [shm_backend.Context, zmq_backend.Context],
    "PubSocket": [shm_backend.PubSocket, zmq_backend.PubSocket],
    "SubSocket": [shm_backend.SubSocket, zmq_backend.SubSocket, sockets.FakeSubSocket],
    "Poller": [shm_backend.Poller, zmq_backend.Poller, sockets.FakePoller],
}


def rows() -> list[tuple[str, str, str]]:
    found = []
    for line in COMPAT.read_text().splitlines():
        m = ROW.match(line)
        if m:
            found.append((m["name"], m["sig"], m["status"]))
    return found


ROWS = rows()


def test_the_table_covers_upstream() -> None:
    names = {name for name, _, _ in ROWS}
    # every name of upstream msgq/__init__.py's __all__ and of cereal's messaging module
    upstream_msgq = {
        "Context", "Poller", "SubSocket", "PubSocket", "SocketEventHandle",
        "MultiplePublishersError", "IpcError", "toggle_fake_events", "set_fake_prefix",
        "get_fake_prefix", "delete_fake_prefix", "wait_for_one_event", "NO_TRAVERSAL_LIMIT",
        "context", "fake_event_handle", "pub_sock", "sub_sock", "drain_sock_raw"}
    cereal = {"new_message", "log_from_bytes", "pub_sock", "sub_sock", "drain_sock_raw",
              "drain_sock", "recv_sock", "recv_one", "recv_one_or_none", "recv_one_retry",
              "SubMaster", "PubMaster", "log", "NO_TRAVERSAL_LIMIT"}
    assert not {f"msgq.{n}" for n in upstream_msgq} - names
    assert not {f"msgq.messaging.{n}" for n in cereal} - names
    assert len(ROWS) >= 90 and {s for _, _, s in ROWS} <= STATUSES


def resolve(name: str) -> list[Any]:
    """The objects a row speaks of: one, or one per backend for the protocol classes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        rest = parts[i:]
        if obj is msgq and rest and rest[0] in BACKEND_CLASSES:
            targets = BACKEND_CLASSES[rest[0]]
            rest = rest[1:]
            if not rest:  # the constructor: the fake layer wraps a made socket instead
                targets = [t for t in targets if t.__module__ != sockets.__name__]
        else:
            targets = [obj]
        out = []
        for target in targets:
            for attr in rest:
                target = inspect.getattr_static(target, attr) if inspect.isclass(target) \
                    and attr == rest[-1] else getattr(target, attr)
            out.append(target)
        return out
    raise ImportError(name)


def upstream_signature(sig: str) -> inspect.Signature:
    namespace: dict[str, Any] = {}
    exec(f"def f{sig}: pass", namespace)  # noqa: S102 - the table's own text
    return inspect.signature(namespace["f"])


def our_signature(obj: Any) -> inspect.Signature:
    if isinstance(obj, (staticmethod, classmethod)):
        return inspect.signature(obj.__func__)
    sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    params = list(sig.parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return sig.replace(parameters=params)


def check_signature(name: str, ours: inspect.Signature, upstream: inspect.Signature,
                    status: str) -> None:
    theirs = list(upstream.parameters.values())
    positional = [p for p in ours.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    others = [p for p in ours.parameters.values() if p not in positional]
    assert len(positional) >= len(theirs), f"{name}{ours}: fewer parameters than {upstream}"
    for up, mine in zip(theirs, positional[: len(theirs)], strict=True):
        if status != "renamed":
            assert mine.name == up.name, f"{name}{ours}: {mine.name!r} is {up.name!r} upstream"
        if up.default is not up.empty:
            assert mine.default == up.default, \
                f"{name}{ours}: {mine.name}={mine.default!r}, upstream {up.default!r}"
        elif status == "same":
            assert mine.default is mine.empty, f"{name}{ours}: {mine.name} has a default"
    extra = positional[len(theirs):] + [p for p in others if p.kind is not p.VAR_KEYWORD]
    if status == "same":
        assert not extra, f"{name}{ours}: parameters upstream lacks: {extra}"
    for p in extra:
        assert p.default is not p.empty, f"{name}{ours}: {p.name} is required, upstream lacks it"


@pytest.fixture(scope="module")
def instances() -> Iterator[dict[str, Any]]:
    """Real objects for the property rows: a VisionIPC server, a connected client and a
    received buffer, a fake-events handle (in a namespace of their own: this fixture
    outlives the per-test one)."""
    from msgq.visionipc import VisionIpcClient, VisionIpcServer

    with pytest.MonkeyPatch.context() as env:
        env.setenv("MSGQ_PREFIX", f"compat_{os.getpid()}")
        yield from _instances(VisionIpcServer, VisionIpcClient)
    shutil.rmtree(os.path.join(os.environ.get("MSGQ_SHM_DIR", "/dev/shm"),
                               f"compat_{os.getpid()}"), ignore_errors=True)


def _instances(server_class: Any, client_class: Any) -> Iterator[dict[str, Any]]:
    VisionIpcServer, VisionIpcClient = server_class, client_class  # noqa: N806
    server = VisionIpcServer("compat_check")
    server.create_buffers(0, 2, 16, 8)
    server.start_listener()
    client = VisionIpcClient("compat_check", 0, False)
    assert client.connect(True)
    server.send(0, np.zeros(16 * 8 * 3 // 2, dtype=np.uint8), frame_id=3)
    buf = client.recv(5000)
    assert buf is not None
    handle = msgq.SocketEventHandle("compat_ep", "compat", True)
    yield {
        "msgq.visionipc.VisionIpcClient": client,
        "msgq.visionipc.VisionBuf": buf,
        "msgq.SocketEventHandle": handle,
        "msgq.Event": handle.recv_called_event,
    }
    client.close()
    server.close()


@pytest.mark.parametrize(("name", "sig", "status"), ROWS, ids=[r[0] for r in ROWS])
def test_upstream_name_is_compatible(name: str, sig: str, status: str,
                                     instances: dict[str, Any]) -> None:
    if sig == "property":
        owner, attr = name.rsplit(".", 1)
        if status == "differs":
            return  # the note says why it is not there
        assert hasattr(instances[owner], attr), f"{name}: no such attribute"
        getattr(instances[owner], attr)
        return
    targets = resolve(name)
    if sig == "constant":
        assert targets[0] is not None
        return
    if sig.startswith("class("):
        base = sig[len("class("):-1]
        bases = {"Exception": Exception, "IpcError": msgq.IpcError, "IntEnum": IntEnum}
        assert all(issubclass(t, bases[base]) for t in targets), name
        return
    for target in targets:
        label = f"{name} ({getattr(target, '__qualname__', target)})"
        if inspect.isclass(target) and not inspect.isfunction(target.__init__):
            # an extension type without its own __init__: upstream's () must construct it
            assert sig == "()", f"{label}: cannot read the constructor's signature"
            made = target()
            getattr(made, "close", getattr(made, "term", lambda: None))()
            continue
        check_signature(label, our_signature(target), upstream_signature(sig), status)


def test_the_constants_keep_upstream_values() -> None:
    assert msgq.NO_TRAVERSAL_LIMIT == 2**64 - 1
    from msgq import messaging

    assert messaging.NO_TRAVERSAL_LIMIT == 2**64 - 1
    assert messaging.log.Event.schema.node.displayName.endswith("Event")


def test_all_freq_ok_skips_ignore_alive_services_as_cereal() -> None:
    # a service that need not be alive need not keep its rate either (cereal); before, a
    # stopped ignore_alive service made all_freq_ok() and all_checks() False
    sm = SubMaster(["vehicleState", "gpsLocation"], ignore_alive=["gpsLocation"])
    try:
        t = 0.0
        for _ in range(300):
            t += 0.01
            msg = new_message("vehicleState", logMonoTime=int(t * 1e9), valid=True)
            sm.update_msgs(t, [msg])
        assert not sm.freq_ok["gpsLocation"] and sm.freq_ok["vehicleState"]
        assert sm.all_freq_ok() and sm.all_alive()
        assert sm.all_freq_ok(["gpsLocation"])  # the ignore list applies to a given list too
    finally:
        sm.close()


def test_pub_master_waits_for_a_reader(endpoint: str) -> None:
    pm = PubMaster(["vehicleState"])
    try:
        assert pm.all_readers_updated("vehicleState") is False  # nobody connected yet
        assert pm.wait_for_readers_to_update("vehicleState", 0.05) is False
        sm = SubMaster(["vehicleState"])
        assert pm.wait_for_readers_to_update("vehicleState", 5.0) is True
        sm.close()
    finally:
        pm.close()


def test_every_duration_parameter_states_its_unit() -> None:
    # sub_sock(timeout=) is milliseconds (upstream), everything else of ours is seconds:
    # each public call that takes a duration says which in its docstring, unless the
    # parameter's name already does (timeout_ms, rotate_seconds, ...).
    import pkgutil

    duration = re.compile(r"timeout|interval|duration|deadline|period|^dt$")
    named_unit = re.compile(r"(_ms|_s|_ns|_us|seconds)$")
    unit_words = re.compile(r"\bms\b|millisecond|second|\bs\b")
    skip = (".bench", ".demo", ".cli", ".spark", "__main__", "example_controller")
    modules = [msgq] + [importlib.import_module(m.name)
                        for m in pkgutil.walk_packages(msgq.__path__, "msgq.")
                        if not any(s in m.name for s in skip)]
    missing = []
    for module in modules:
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            members = [(name, obj)]
            if inspect.isclass(obj):
                members += [(f"{name}.{k}", v.__func__ if isinstance(v, staticmethod) else v)
                            for k, v in vars(obj).items()
                            if not k.startswith("_") and callable(v)
                            or isinstance(v, staticmethod)]
            for qual, member in members:
                try:
                    params = inspect.signature(member).parameters
                except (TypeError, ValueError):
                    continue
                timed = [p for p in params if duration.search(p) and not named_unit.search(p)]
                if timed and not unit_words.search(inspect.getdoc(member) or ""):
                    missing.append(f"{module.__name__}.{qual}{timed}")
    assert not missing, f"docstrings that do not state the unit: {missing}"
