"""The fake deterministic layer: events, handles, gated subscribers and pollers, lockstep
stepping across processes, and cleanup.

Every test has its own MSGQ_PREFIX (autouse fixture in conftest), which is also where the
fake event files live.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import child_env

import msgq
from msgq import fake_events, queues
from msgq.sockets import FakePoller, FakeSubSocket

pytestmark = pytest.mark.timeout(60)

WAIT = 10  # seconds; generous, only reached when something is broken
START_METHODS = ["fork", "spawn", "forkserver"]


@pytest.fixture(autouse=True)
def fake_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fake events on, no fake prefix, default backend unless a test picks one."""
    monkeypatch.setenv("CEREAL_FAKE", "1")
    monkeypatch.delenv("CEREAL_FAKE_PREFIX", raising=False)
    monkeypatch.delenv("MSGQ_BACKEND", raising=False)
    monkeypatch.delenv("ZMQ", raising=False)
    yield


def fake_files(endpoint: str | None = None) -> list[str]:
    """The fake-event files in this test's queue folder (of one endpoint if given)."""
    folder = os.path.dirname(queues.queue_path("x"))
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith("msgq-fake.")
                  and (endpoint is None or f".{endpoint}." in n))


# --- events ------------------------------------------------------------------------------

def test_event_set_peek_clear(endpoint: str) -> None:
    event = msgq.fake_event_handle(endpoint).recv_called_event
    assert not event.peek()
    event.set()
    event.set()
    assert event.peek()
    assert event.clear() == 2
    assert not event.peek()
    assert event.clear() == 0


def test_wait_does_not_consume(endpoint: str) -> None:
    event = msgq.fake_event_handle(endpoint).recv_ready_event
    event.set()
    event.wait(WAIT)
    event.wait(0)
    assert event.peek()


def test_wait_times_out_with_runtime_error(endpoint: str) -> None:
    event = msgq.fake_event_handle(endpoint).recv_called_event
    with pytest.raises(RuntimeError):
        event.wait(0)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out"):
        event.wait(0.1)
    assert time.monotonic() - start >= 0.09
    assert not event.peek()


def test_fd_is_pollable(endpoint: str) -> None:
    import select

    event = msgq.fake_event_handle(endpoint).recv_called_event
    assert event.fd >= 0
    assert select.select([event.fd], [], [], 0)[0] == []
    event.set()
    assert select.select([event.fd], [], [], WAIT)[0] == [event.fd]


def test_wait_for_one_event(endpoint: str) -> None:
    handles = [msgq.fake_event_handle(f"{endpoint}_{i}") for i in range(3)]
    events = [h.recv_called_event for h in handles]
    events[2].set()
    assert msgq.wait_for_one_event(events, WAIT) == 2
    events[1].set()
    assert msgq.wait_for_one_event(events, WAIT) == 1
    for e in events:
        e.clear()
    with pytest.raises(RuntimeError):
        msgq.wait_for_one_event(events, 0.05)


def test_wait_is_interruptible(endpoint: str) -> None:
    event = msgq.fake_event_handle(endpoint).recv_ready_event
    main = threading.main_thread().ident
    assert main is not None

    def waiting() -> bool:  # the main thread is inside Event.wait
        frame = sys._current_frames().get(main)
        while frame is not None:
            if frame.f_code is fake_events.Event.wait.__code__:
                return True
            frame = frame.f_back
        return False

    def interrupt() -> None:  # SIGINT once the wait has begun, not before
        deadline = time.monotonic() + WAIT
        while not waiting() and time.monotonic() < deadline:
            time.sleep(0.002)
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            event.wait()
    finally:
        thread.join(WAIT)
    assert any(entry.name == "wait" for entry in info.traceback[1:])  # raised inside it


def test_wait_releases_the_gil(endpoint: str) -> None:
    event = msgq.fake_event_handle(endpoint).recv_ready_event
    counted = []

    def count() -> None:  # pure Python: runs only while the main thread lets go of the GIL
        n = 0
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            n += 1
        counted.append(n)
        event.set()

    thread = threading.Thread(target=count)
    thread.start()
    event.wait(WAIT)
    thread.join()
    assert counted and counted[0] > 1000


# --- handles -------------------------------------------------------------------------------

def test_new_handle_is_disabled_with_valid_fds(endpoint: str) -> None:
    handle = msgq.fake_event_handle(endpoint, override=True)
    assert not handle.enabled
    assert handle.recv_called_event.fd >= 0
    assert handle.recv_ready_event.fd >= 0
    handle.enabled = True
    assert msgq.fake_event_handle(endpoint, override=False).enabled


def test_handle_of_unowned_endpoint(endpoint: str) -> None:
    msgq.pub_sock(endpoint)  # sockets never create fake event state
    msgq.sub_sock(endpoint)
    handle = msgq.fake_event_handle(endpoint, override=False)
    assert not handle.enabled
    assert handle.recv_called_event.fd == -1
    assert handle.recv_ready_event.fd == -1
    with pytest.raises(RuntimeError, match="fake_event_handle"):
        handle.enabled = True
    with pytest.raises(RuntimeError):
        handle.recv_called_event.set()
    assert fake_files(endpoint) == []


def test_cereal_handle_of_unowned_endpoint_reads_fd_0_and_touches_no_descriptor(
        endpoint: str, tmp_path) -> None:
    # cereal's test_fake.py (before msgq was split out of cereal) expects fd 0 where no
    # state exists (it mapped a zero-filled state); upstream msgq 1.0 expects -1. The
    # cereal variant reads 0 but must never use descriptor 0 (standard input).
    from msgq.compat import cereal

    assert cereal.MESSAGING_NAMES["fake_event_handle"] is fake_events.cereal_fake_event_handle
    msgq.pub_sock(endpoint)
    handle = fake_events.cereal_fake_event_handle(endpoint, override=False)
    assert not handle.enabled
    assert handle.recv_called_event.fd == 0
    assert handle.recv_ready_event.fd == 0
    assert not handle.recv_called_event.is_valid()
    stdin = tmp_path / "stdin"
    stdin.write_bytes(b"untouched")
    saved = os.dup(0)
    try:
        with open(stdin, "r+b") as f:
            os.dup2(f.fileno(), 0)  # descriptor 0 is a file: a write or read would show
        for call in (handle.recv_called_event.set, handle.recv_ready_event.clear,
                     handle.recv_called_event.peek, lambda: handle.recv_ready_event.wait(0)):
            with pytest.raises(RuntimeError, match="no file descriptor"):
                call()
        assert os.lseek(0, 0, os.SEEK_CUR) == 0
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert stdin.read_bytes() == b"untouched"
    assert fake_files(endpoint) == []
    owner = fake_events.cereal_fake_event_handle(endpoint, enable=True)  # managed: real fds
    assert owner.recv_called_event.fd > 0 and owner.recv_called_event.is_valid()
    assert handle.enabled and handle.recv_called_event.fd > 0  # follows the new state
    owner.close()


def test_sockets_do_not_change_a_managed_state(endpoint: str) -> None:
    handle = msgq.fake_event_handle(endpoint)
    handle.enabled = True
    before = (handle.enabled, handle.recv_called_event.fd, handle.recv_ready_event.fd)
    msgq.pub_sock(endpoint)
    msgq.sub_sock(endpoint)
    assert (handle.enabled, handle.recv_called_event.fd, handle.recv_ready_event.fd) == before


def test_fake_prefix_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert msgq.get_fake_prefix() == ""
    msgq.set_fake_prefix("abc")
    assert os.environ["CEREAL_FAKE_PREFIX"] == "abc" and msgq.get_fake_prefix() == "abc"
    msgq.delete_fake_prefix()
    assert msgq.get_fake_prefix() == ""
    msgq.set_fake_prefix("x")
    msgq.set_fake_prefix("")
    assert "CEREAL_FAKE_PREFIX" not in os.environ


def test_toggle_affects_sockets_created_after(endpoint: str) -> None:
    msgq.toggle_fake_events(False)
    try:
        plain = msgq.sub_sock(endpoint)
        assert not isinstance(plain, FakeSubSocket)
        assert not isinstance(msgq.Poller(), FakePoller)
        msgq.toggle_fake_events(True)
        wrapped = msgq.sub_sock(endpoint)
        assert isinstance(wrapped, FakeSubSocket) and isinstance(wrapped, msgq.SubSocket)
        assert isinstance(msgq.Poller(), FakePoller)
        assert isinstance(msgq.pub_sock(endpoint), msgq.PubSocket)  # publishers unwrapped
    finally:
        msgq.toggle_fake_events(True)


def test_bad_endpoint_is_value_error() -> None:
    with pytest.raises(ValueError):
        msgq.fake_event_handle("../etc")
    with pytest.raises(TypeError):
        msgq.SocketEventHandle("ok", identifier=3)  # type: ignore[arg-type]


# --- gated sockets, both backends ----------------------------------------------------------

def test_enabled_and_disabled_sockets(backend: str, endpoint: str) -> None:
    handle = msgq.fake_event_handle(endpoint, enable=True)
    called, ready = handle.recv_called_event, handle.recv_ready_event
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint, timeout=WAIT * 1000)
    pub.wait_for_readers(WAIT)

    ready.set()
    pub.send(b"gated")
    assert sub.receive() == b"gated"
    assert called.peek()  # receive() signalled the harness
    assert not ready.peek()  # ... and consumed its permission
    called.clear()

    handle.enabled = False
    pub.send(b"free")
    assert sub.receive() == b"free"  # no permission needed
    assert not called.peek()


def test_gated_receive_waits_for_ready(backend: str, endpoint: str) -> None:
    handle = msgq.fake_event_handle(endpoint, enable=True)
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint, timeout=WAIT * 1000)
    pub.wait_for_readers(WAIT)
    pub.send(b"held")
    got: list[bytes | None] = []
    thread = threading.Thread(target=lambda: got.append(sub.receive()))
    thread.start()
    handle.recv_called_event.wait(WAIT)
    assert got == []  # held at the gate although the message is there
    handle.recv_ready_event.set()
    thread.join(WAIT)
    assert got == [b"held"]


def test_receive_into_is_gated_too(endpoint: str) -> None:
    handle = msgq.fake_event_handle(endpoint, enable=True)
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint)
    handle.recv_ready_event.set()
    pub.send(b"abc")
    buf = bytearray(8)
    assert sub.receive_into(buf) == 3
    assert handle.recv_called_event.peek()


@pytest.mark.parametrize("case", ["identifier", "namespace"])
def test_prefixes_never_see_each_other(monkeypatch: pytest.MonkeyPatch, endpoint: str,
                                       case: str) -> None:
    handle = msgq.fake_event_handle(endpoint, identifier="harness_a", enable=True)
    namespace = os.environ["MSGQ_PREFIX"]
    if case == "identifier":
        monkeypatch.setenv("CEREAL_FAKE_PREFIX", "harness_b")
    else:
        monkeypatch.setenv("CEREAL_FAKE_PREFIX", "harness_a")
        monkeypatch.setenv("MSGQ_PREFIX", namespace + "_other")
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint, timeout=WAIT * 1000)
    assert not sub.gate_enabled
    pub.send(b"x")
    assert sub.receive() == b"x"
    assert not handle.recv_called_event.peek()
    # The same identifier in the same namespace does see them.
    monkeypatch.setenv("MSGQ_PREFIX", namespace)
    monkeypatch.setenv("CEREAL_FAKE_PREFIX", "harness_a")
    assert msgq.sub_sock(endpoint).gate_enabled
    if case == "namespace":
        shutil.rmtree(os.path.join(os.environ.get("MSGQ_SHM_DIR", "/dev/shm"),
                                   namespace + "_other"), ignore_errors=True)


def test_poller_under_the_fake_layer(backend: str, endpoint: str) -> None:
    handle = msgq.fake_event_handle(endpoint + "_gated", enable=True)
    poller = msgq.Poller()
    pub_free = msgq.pub_sock(endpoint + "_free")  # first, so that ZMQ subscribers connect
    gated = msgq.sub_sock(endpoint + "_gated", poller=poller)
    free = msgq.sub_sock(endpoint + "_free", poller=poller, timeout=WAIT * 1000)
    pub_free.wait_for_readers(WAIT)
    # The gated socket is returned at once, data or not: the harness decides via the gate.
    assert poller.poll(WAIT * 1000) == [gated]
    pub_free.send(b"data")
    deadline = time.monotonic() + WAIT
    while (ready := poller.poll(100)) != [gated, free]:
        assert time.monotonic() < deadline, ready
    assert free.receive() == b"data"
    # Disabled: the backend's poll, unchanged (times out when nothing is there).
    handle.enabled = False
    assert poller.poll(50) == []


# --- across processes ----------------------------------------------------------------------

def _in_env(env: dict[str, str]) -> None:
    for name in ("MSGQ_PREFIX", "MSGQ_BACKEND", "CEREAL_FAKE", "CEREAL_FAKE_PREFIX"):
        os.environ.pop(name, None)
    os.environ.update(env)


def _set_called(env: dict[str, str], endpoint: str, identifier: str) -> None:
    _in_env(env)
    msgq.fake_event_handle(endpoint, identifier=identifier, override=False) \
        .recv_called_event.set()


@pytest.mark.multiprocess
@pytest.mark.parametrize("identifier", ["", "harness"], ids=["no-prefix", "prefix"])
@pytest.mark.parametrize("method", START_METHODS)
def test_event_across_processes(endpoint: str, method: str, identifier: str) -> None:
    handle = msgq.fake_event_handle(endpoint, identifier=identifier)
    child = mp.get_context(method).Process(target=_set_called,
                                           args=(child_env(), endpoint, identifier))
    child.start()
    try:
        handle.recv_called_event.wait(WAIT)
    finally:
        child.join(WAIT)
    assert child.exitcode == 0
    assert handle.recv_called_event.peek()


def _republish(env: dict[str, str], sub_endpoint: str, pub_endpoint: str) -> None:
    """Child: receive on A, republish on B with a counter of its own."""
    _in_env(env)
    pub = msgq.pub_sock(pub_endpoint)
    sub = msgq.sub_sock(sub_endpoint, timeout=WAIT * 1000)
    count = 0
    while True:
        msg = sub.receive()
        if msg is None:
            continue
        pub.send(msg + b"|%d" % count)
        count += 1


def _lockstep_run(endpoint: str, steps: int, method: str) -> list[bytes]:
    a, b = endpoint + "_A", endpoint + "_B"
    handle = msgq.fake_event_handle(a, enable=True)
    called, ready = handle.recv_called_event, handle.recv_ready_event
    pub = msgq.pub_sock(a)
    child = mp.get_context(method).Process(target=_republish, args=(child_env(), a, b),
                                           daemon=True)
    child.start()
    try:
        called.wait(WAIT)  # the child is at its first receive(); its B publisher exists
        sub = msgq.sub_sock(b, timeout=WAIT * 1000)
        out = []
        for i in range(steps):
            called.wait(WAIT)
            called.clear()
            pub.send(b"frame%d" % i)
            ready.set()
            called.wait(WAIT)  # the child republished and is back at the gate
            out.append(sub.receive())
        assert sub.receive(non_blocking=True) is None  # nothing extra, nothing late
        return out
    finally:
        child.kill()
        child.join(WAIT)
        handle.close()
        pub.close()


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["spawn"])
def test_lockstep_1000_steps_in_order_exactly_once(backend: str, endpoint: str,
                                                   method: str) -> None:
    expected = [b"frame%d|%d" % (i, i) for i in range(1000)]
    first = _lockstep_run(endpoint + "_1", 1000, method)
    assert first == expected
    second = _lockstep_run(endpoint + "_2", 1000, method)
    assert second == first


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_lockstep_with_other_start_methods(endpoint: str, method: str) -> None:
    assert _lockstep_run(endpoint, 50, method) == [b"frame%d|%d" % (i, i) for i in range(50)]


# --- cleanup -------------------------------------------------------------------------------

def test_close_removes_the_files(endpoint: str) -> None:
    handle = msgq.fake_event_handle(endpoint)
    files = fake_files(endpoint)
    assert [f.rsplit(".", 1)[-1] for f in files] == ["called", "ready", "state"]
    handle.close()
    assert fake_files(endpoint) == []
    handle.close()  # twice is fine


def test_garbage_collection_removes_the_files(endpoint: str) -> None:
    msgq.fake_event_handle(endpoint)  # dropped at once
    assert fake_files(endpoint) == []


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", START_METHODS)
def test_normal_exit_removes_the_files(endpoint: str, method: str) -> None:
    ctx = mp.get_context(method)
    ready = ctx.Event()
    child = ctx.Process(target=_own_and_keep, args=(child_env(), endpoint, ready))
    child.start()
    assert ready.wait(WAIT)
    child.join(WAIT)
    assert child.exitcode == 0
    assert fake_files(endpoint) == []


_kept: list[object] = []


def _own_and_keep(env: dict[str, str], endpoint: str, ready) -> None:
    """Child: owns a handle that is still referenced when the process exits."""
    _in_env(env)
    _kept.append(msgq.fake_event_handle(endpoint, enable=True))
    ready.set()


def _own_and_hang(env: dict[str, str], endpoint: str, ready) -> None:
    _in_env(env)
    _kept.append(msgq.fake_event_handle(endpoint, enable=True))
    ready.set()
    time.sleep(600)


@pytest.mark.multiprocess
@pytest.mark.crash
def test_crash_leaves_files_that_are_harmless_and_removable(endpoint: str) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_own_and_hang, args=(child_env(), endpoint, ready))
    child.start()
    assert ready.wait(WAIT)
    sub = msgq.sub_sock(endpoint)
    assert sub.gate_enabled
    child.kill()
    child.join(WAIT)
    assert len(fake_files(endpoint)) == 3  # state + two FIFOs stay behind
    # A dead owner gates nobody.
    assert not sub.gate_enabled
    assert sub.receive(non_blocking=True) is None
    removed = fake_events.remove_stale_files()
    assert len(removed) == 3 and fake_files(endpoint) == []


@pytest.mark.multiprocess
@pytest.mark.crash
def test_new_owner_takes_over_a_crashed_state(endpoint: str) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_own_and_hang, args=(child_env(), endpoint, ready))
    child.start()
    assert ready.wait(WAIT)
    child.kill()
    child.join(WAIT)
    handle = msgq.fake_event_handle(endpoint, enable=True)
    assert len(fake_files(endpoint)) == 3  # the dead owner's FIFOs were removed
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint)
    handle.recv_ready_event.set()
    pub.send(b"after takeover")
    assert sub.receive() == b"after takeover"
    assert handle.recv_called_event.peek()
    handle.close()
    assert fake_files(endpoint) == []


def test_take_over_in_one_process(endpoint: str) -> None:
    first = msgq.fake_event_handle(endpoint, enable=True)
    second = msgq.fake_event_handle(endpoint)  # override: new events, disabled
    assert not second.enabled and not first.enabled  # one shared state
    second.enabled = True
    first.close()  # not the owner any more: leaves the state alone
    assert second.enabled
    assert msgq.fake_event_handle(endpoint, override=False).enabled
    second.close()
    assert fake_files(endpoint) == []


def test_stale_subscriber_follows_a_new_owner(endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint)
    pub = msgq.pub_sock(endpoint)
    first = msgq.fake_event_handle(endpoint, enable=True)
    assert sub.gate_enabled
    first.close()
    assert not sub.gate_enabled
    second = msgq.fake_event_handle(endpoint, enable=True)
    assert sub.gate_enabled
    second.recv_ready_event.set()
    pub.send(b"y")
    assert sub.receive() == b"y"
    assert second.recv_called_event.peek()
