"""One socket API on every backend, with and without the fake layer: the calls the README
documents behave the same whichever transport the environment selects."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import connect_pair

import msgq


def test_reserve_commits_in_place(backend: str, fake_layer: bool, endpoint: str) -> None:
    pub, sub = connect_pair(endpoint, timeout=5000)
    with pub.reserve(5) as buf:  # type: ignore[attr-defined]
        buf[:] = b"hello"
    assert sub.receive() == b"hello"  # type: ignore[attr-defined]
    # an exception inside the block abandons the message
    with pytest.raises(KeyError):
        with pub.reserve(3) as buf:  # type: ignore[attr-defined]
            buf[:] = b"bad"
            raise KeyError("abandon")
    with pytest.raises(RuntimeError, match="already open"):
        res = pub.reserve(1)  # type: ignore[attr-defined]
        pub.reserve(1)  # type: ignore[attr-defined]
    res.abort()
    pub.send(b"after")  # type: ignore[attr-defined]
    assert sub.receive() == b"after"  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        pub.reserve(-1)  # type: ignore[attr-defined]


def test_receive_into_on_every_backend(backend: str, fake_layer: bool, endpoint: str) -> None:
    pub, sub = connect_pair(endpoint, timeout=5000)
    buf = bytearray(16)
    pub.send(b"abc")  # type: ignore[attr-defined]
    assert sub.receive_into(buf) == 3 and bytes(buf[:3]) == b"abc"  # type: ignore[attr-defined]
    pub.send(b"x" * 17)  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        sub.receive_into(buf)  # type: ignore[attr-defined]
    assert sub.receive() == b"x" * 17  # type: ignore[attr-defined]  # kept for the next receive
    assert sub.receive_into(buf, non_blocking=True) is None  # type: ignore[attr-defined]


def test_sockets_are_instances_of_the_protocol(backend: str, fake_layer: bool,
                                               endpoint: str) -> None:
    pub, sub = connect_pair(endpoint)
    poller = msgq.Poller()
    assert isinstance(pub, msgq.PubSocket) and isinstance(sub, msgq.SubSocket)
    assert isinstance(poller, msgq.Poller) and isinstance(msgq.context, msgq.Context)
    for name in ("reserve", "all_readers_updated", "wait_for_readers", "wait_until_read"):
        assert callable(getattr(pub, name)), name
    for name in ("receive", "receive_into", "setTimeout", "close"):
        assert callable(getattr(sub, name)), name


def test_subscriber_first_then_wait_for_readers_then_send(backend: str, endpoint: str) -> None:
    # The README's first example: a subscriber made before its publisher, the portable
    # idiom (wait_for_readers), then a send that the subscriber must get on every backend.
    sub = msgq.sub_sock(endpoint, timeout=5000)
    pub = msgq.pub_sock(endpoint)
    pub.wait_for_readers(timeout=10)
    pub.send(b"\x01\x02")
    assert sub.receive() == b"\x01\x02"
    assert sub.receive(non_blocking=True) is None


def test_unknown_backend_fails_at_socket_creation_not_import(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_BACKEND", "bogus")
    probe = subprocess.run(
        [sys.executable, "-c", "import msgq, msgq.messaging, msgq.visionipc; print('ok')"],
        capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.strip() == "ok", probe.stderr
    with pytest.raises(ValueError, match="unknown msgq backend 'bogus'.*msgq, zmq"):
        msgq.pub_sock("anything")
    with pytest.raises(ValueError, match="unknown msgq backend"):
        msgq.SubSocket()


def test_unknown_backend_is_one_line_and_exit_2_in_the_cli(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_BACKEND", "bogus")
    done = subprocess.run([sys.executable, "-m", "msgq", "queues"],
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "unknown msgq backend 'bogus'" in done.stderr
    assert "Traceback" not in done.stderr
    helped = subprocess.run([sys.executable, "-m", "msgq", "--help"],
                            capture_output=True, text=True)
    assert helped.returncode == 0 and "usage: msgq" in helped.stdout, helped.stderr


@pytest.mark.parametrize("kind", ["Context", "PubSocket", "SubSocket", "Poller"])
def test_every_implementation_has_the_whole_protocol(kind: str) -> None:
    """The protocol's abstract classes list the surface every backend shares; the backend
    classes (registered, not inherited, so no ABC check runs) and the fake wrappers must
    each have all of it."""
    from msgq import sockets

    protocol = getattr(sockets, kind)
    backends = [sockets.select_backend(name) for name in msgq.BACKENDS]
    instances = [getattr(module, kind)() for module in backends]  # not connected
    if kind in ("SubSocket", "Poller"):
        instances.append(getattr(sockets, f"Fake{kind}")(getattr(backends[0], kind)()))
    assert protocol.__abstractmethods__
    for obj in instances:
        cls = type(obj)
        missing = sorted(protocol.__abstractmethods__ - set(dir(obj)))
        assert not missing, f"{cls.__module__}.{cls.__qualname__} lacks {missing}"
        assert isinstance(obj, protocol)
        if kind in ("PubSocket", "SubSocket"):
            obj.close()


def test_socket_helpers_are_typed_with_the_protocol() -> None:
    import typing

    hints = typing.get_type_hints(msgq.pub_sock)
    assert hints["return"] is msgq.PubSocket
    assert typing.get_type_hints(msgq.sub_sock)["return"] is msgq.SubSocket


def test_a_backend_that_says_messages_are_queued_on_send_has_them_at_once(
        backend: str, endpoint: str) -> None:
    """``QUEUED_ON_SEND`` (the recorder's stop relies on it): where a backend says a sent
    message is queued when ``send`` returns, a non-blocking receive right after finds it."""
    from msgq import sockets

    queued = sockets.queued_on_send(backend)
    assert queued is (backend == "msgq")  # ZMQ's messages travel after send returns
    if queued:
        pub, sub = connect_pair(endpoint, timeout=5000)
        for i in range(100):
            pub.send(bytes([i]))  # type: ignore[attr-defined]
            assert sub.receive(non_blocking=True) == bytes([i])  # type: ignore[attr-defined]
