"""The ZMQ backend's own behaviour: addressing, port conflicts, options, foreign input.

The socket contract itself runs on ZMQ through the ``backend`` fixture of the core suite;
these tests cover what only this backend has. Every test gets its own MSGQ_PREFIX (the
autouse fixture in conftest), which also moves its ports (the prefix is hashed in).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers import wait_until

import msgq
from msgq import zmq as zmq_backend
from msgq.zmq import ENDPOINT_PROPERTY, endpoint_port

pytestmark = pytest.mark.timeout(60)

SPAWN = mp.get_context("spawn")
#: The folder of the ZMQ backend's modules.
PACKAGE = Path(zmq_backend.__file__).parent


@pytest.fixture(autouse=True)
def zmq_selected(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Selects the ZMQ backend through the environment, as users do."""
    monkeypatch.setenv("MSGQ_BACKEND", "zmq")
    # the port range is the suite's (conftest.zmq_port_range: one slice per xdist worker)
    for name in ("ZMQ", "CEREAL_FAKE", "MSGQ_ZMQ_BIND", "MSGQ_ZMQ_SNDHWM", "MSGQ_ZMQ_RCVHWM",
                 "MSGQ_ZMQ_LINGER"):
        monkeypatch.delenv(name, raising=False)
    yield


def subscribed_pair(endpoint: str, **sub_kwargs: object) -> tuple[object, object]:
    """A publisher, then a subscriber that the publisher has seen subscribe."""
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint, **sub_kwargs)  # type: ignore[arg-type]
    assert pub.wait_until_read(10)
    return pub, sub


# --- basic behaviour --------------------------------------------------------------------

def test_messages_sent_after_sub_sock_returns_arrive_in_order(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint, timeout=5000)
    # No probing: connect() waited for the publisher, send() for the subscription.
    msgs = [b"%d" % i for i in range(200)]
    for m in msgs:
        assert pub.send(m) == len(m)
    assert [sub.receive() for _ in msgs] == msgs
    assert pub.num_readers == 1
    assert pub.wait_until_read(10)  # the subscriber's read acknowledgement travels too
    assert pub.all_readers_updated()


def test_sockets_are_the_zmq_classes(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint)
    assert isinstance(pub, zmq_backend.PubSocket) and isinstance(pub, msgq.PubSocket)
    assert isinstance(sub, zmq_backend.SubSocket) and isinstance(sub, msgq.SubSocket)
    assert pub.endpoint == sub.endpoint == endpoint
    assert pub.port == sub.port == endpoint_port(endpoint)


def test_zmq_1_selects_the_backend(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    monkeypatch.delenv("MSGQ_BACKEND")
    monkeypatch.setenv("ZMQ", "1")
    assert isinstance(msgq.pub_sock(endpoint), zmq_backend.PubSocket)
    monkeypatch.setenv("ZMQ", "0")
    assert not isinstance(msgq.sub_sock(endpoint), zmq_backend.SubSocket)


def test_unknown_backend_lists_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_BACKEND", "zmqq")
    with pytest.raises(ValueError, match=r"'zmqq'.*choose one of: msgq, zmq"):
        msgq.SubSocket()


def test_subscriber_started_first_gets_messages_once_connected(endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint, timeout=100)
    pub = msgq.pub_sock(endpoint)
    # ZMQ reconnects in the background; the publisher counts it once subscribed.
    wait_until(lambda: sub.receive(non_blocking=True) is None and pub.num_readers == 1,
               what="subscriber reconnected")
    pub.send(b"late")
    sub.setTimeout(5000)
    assert sub.receive() == b"late"


def test_closed_publisher_can_be_replaced_at_once(endpoint: str) -> None:
    pub, sub = subscribed_pair(endpoint, timeout=5000)
    pub.send(b"first")
    pub.close()
    pub2 = msgq.pub_sock(endpoint)  # binds although ZMQ releases the port asynchronously
    assert sub.receive() == b"first"
    wait_until(lambda: sub.receive(non_blocking=True) is None and pub2.num_readers == 1,
               what="subscriber reconnected to the new publisher")
    pub2.send(b"second")
    assert sub.receive() == b"second"


def test_receive_into_too_small_keeps_the_message(endpoint: str) -> None:
    pub, sub = subscribed_pair(endpoint, timeout=5000)
    pub.send(b"0123456789")
    with pytest.raises(ValueError, match="10 bytes"):
        sub.receive_into(bytearray(4))
    buf = bytearray(16)
    assert sub.receive_into(buf) == 10
    assert bytes(buf[:10]) == b"0123456789"


def test_stalled_subscriber_does_not_block_the_publisher(endpoint: str) -> None:
    pub = msgq.PubSocket(sndhwm=10)
    pub.connect(msgq.context, endpoint)
    sub = msgq.SubSocket(rcvhwm=10)
    sub.connect(msgq.context, endpoint)
    assert pub.wait_until_read(10)
    payload = b"x" * 4096
    for _ in range(20000):  # far beyond both high-water marks and the socket buffers
        pub.send(payload)
    # The subscriber never read; it holds a bounded number of messages, newest dropped.
    got = 0
    while sub.receive(non_blocking=True) is not None:
        got += 1
    assert got < 20000


def test_publisher_after_fork_is_refused_in_the_child(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)
    ctx = mp.get_context("fork")
    result = ctx.Queue()
    child = ctx.Process(target=_send_from_forked_child, args=(pub, result))
    child.start()
    child.join(30)
    assert "after fork" in result.get(timeout=10)
    pub.send(b"parent still works")


def _send_from_forked_child(pub, result) -> None:
    try:
        pub.send(b"x")
        result.put("sent")
    except msgq.IpcError as e:
        result.put(str(e))


def test_forked_child_makes_its_own_context(endpoint: str) -> None:
    pub = msgq.pub_sock(endpoint)  # the parent's ZMQ context exists before the fork
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    result = ctx.Queue()
    child = ctx.Process(target=_subscribe_and_report, args=(endpoint, "127.0.0.1", 3, ready,
                                                            result))
    child.start()
    try:
        assert ready.wait(20)
        assert pub.wait_until_read(10)
        for i in range(3):
            pub.send(b"%d" % i)
        assert result.get(timeout=20) == [b"0", b"1", b"2"]
    finally:
        child.join(30)
    assert child.exitcode == 0


def test_send_during_an_open_reservation_raises_as_on_shared_memory(endpoint: str) -> None:
    # The shared-memory backend refuses a send while a reservation is open (the message
    # would land between the reserved room and its commit); ZMQ sent it before.
    pub, sub = subscribed_pair(endpoint, timeout=5000)
    reservation = pub.reserve(4)
    with pytest.raises(RuntimeError, match="a reservation is open on this socket; commit "
                                           "it first"):
        pub.send(b"early")
    with reservation as buf:
        buf[:] = b"room"
    pub.send(b"next")
    assert [sub.receive(), sub.receive()] == [b"room", b"next"]
    assert sub.receive(non_blocking=True) is None


def test_all_readers_updated_waits_for_every_reader_to_read(endpoint: str) -> None:
    # As on shared memory: "every reader, and at least one, has read everything" (ZMQ
    # has no read acknowledgements; msgq's subscribers send one upstream).
    pub = msgq.pub_sock(endpoint)
    plain = msgq.sub_sock(endpoint, timeout=5000)
    newest = msgq.sub_sock(endpoint, timeout=5000, conflate=True)
    assert pub.wait_until_read(10) and pub.num_readers == 2  # nothing sent yet
    for i in range(3):
        pub.send(b"m%d" % i)
    assert not pub.all_readers_updated()
    assert [plain.receive() for _ in range(3)] == [b"m0", b"m1", b"m2"]
    assert not pub.wait_until_read(0.2)  # the conflating reader has read nothing
    while newest.receive() != b"m2":
        pass
    assert pub.wait_until_read(10)
    pub.send(b"m3")
    assert plain.receive() == b"m3"
    assert not pub.wait_until_read(0.2)
    newest.close()  # a reader that leaves no longer counts
    assert pub.wait_until_read(10)
    # a plain ZMQ subscriber tells nothing of its reads: it counts once subscribed
    foreign = zmq.Context.instance().socket(zmq.SUB)
    foreign.setsockopt(zmq.LINGER, 0)
    foreign.setsockopt(zmq.SUBSCRIBE, b"")
    foreign.connect(f"tcp://127.0.0.1:{endpoint_port(endpoint)}")
    try:
        wait_until(lambda: pub.num_readers == 2, what="the plain ZMQ subscriber joined")
        pub.send(b"m4")
        assert plain.receive() == b"m4"
        assert pub.wait_until_read(10)
    finally:
        foreign.close()


# --- addressing --------------------------------------------------------------------------

def _subscribe_and_report(endpoint: str, address: str, count: int, ready, result) -> None:
    """Child: subscribe at an explicit address, report ``count`` messages."""
    sub = msgq.sub_sock(endpoint, addr=address, timeout=10000)
    ready.set()
    result.put([sub.receive() for _ in range(count)])


@pytest.mark.multiprocess
@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2"])
def test_subscriber_in_another_process_connects_by_address(endpoint: str, address: str) -> None:
    pub = msgq.PubSocket(bind_address=address)  # as a publisher on that machine would be
    pub.connect(msgq.context, endpoint)
    ready, result = SPAWN.Event(), SPAWN.Queue()
    child = SPAWN.Process(target=_subscribe_and_report,
                          args=(endpoint, address, 50, ready, result))
    child.start()
    try:
        assert ready.wait(30), "child never subscribed"
        assert pub.wait_until_read(10)
        msgs = [random.Random(i).randbytes(100 * i) for i in range(50)]
        for m in msgs:
            pub.send(m)
        assert result.get(timeout=30) == msgs
    finally:
        child.join(30)
    assert child.exitcode == 0


def test_binding_one_address_leaves_the_others_free(endpoint: str) -> None:
    # Bound on one address, a publisher owns the port on that address only: a publisher of
    # the same endpoint may bind another address, and subscribers reach the one whose
    # address they name. A publisher bound on every address (the default) conflicts.
    pub2 = msgq.PubSocket(bind_address="127.0.0.2")
    pub2.connect(msgq.context, endpoint)
    pub3 = msgq.PubSocket(bind_address="127.0.0.3")
    pub3.connect(msgq.context, endpoint)
    with pytest.raises(msgq.MultiplePublishersError):
        msgq.pub_sock(endpoint)
    sub2 = msgq.sub_sock(endpoint, addr="127.0.0.2", timeout=5000)
    sub3 = msgq.sub_sock(endpoint, addr="127.0.0.3", timeout=5000)
    assert pub2.wait_until_read(10) and pub3.wait_until_read(10)
    pub2.send(b"from .2")
    pub3.send(b"from .3")
    assert sub2.receive() == b"from .2"
    assert sub3.receive() == b"from .3"
    assert sub2.receive(non_blocking=True) is None


def test_bind_address_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                           endpoint: str) -> None:
    monkeypatch.setenv("MSGQ_ZMQ_BIND", "127.0.0.2")
    pub = msgq.pub_sock(endpoint)
    assert pub.bind_address == "127.0.0.2"
    sub = msgq.sub_sock(endpoint, addr="127.0.0.2", timeout=5000)
    assert pub.wait_until_read(10)
    pub.send(b"hi")
    assert sub.receive() == b"hi"


def test_bad_addresses_are_value_errors(endpoint: str) -> None:
    for bad in ["", "two words", "a/b"]:
        with pytest.raises(ValueError):
            msgq.sub_sock(endpoint, addr=bad)
    with pytest.raises(TypeError):
        msgq.SubSocket().connect(msgq.context, endpoint, 127)


def test_unusable_bind_address_is_a_clear_error(endpoint: str) -> None:
    pub = msgq.PubSocket(bind_address="192.0.2.1")  # TEST-NET-1: not on this machine
    with pytest.raises(msgq.IpcError, match="bind_address"):
        pub.connect(msgq.context, endpoint)


# --- port mapping ------------------------------------------------------------------------

def test_port_mapping_is_stable_and_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MSGQ_PREFIX", "MSGQ_ZMQ_BASE_PORT", "MSGQ_ZMQ_PORT_SPAN"):
        monkeypatch.delenv(name, raising=False)
    # FNV-1a 64 of the name, modulo the span, plus the base (docs/backends.md).
    h = 0xCBF29CE484222325
    for byte in b"carState":
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    assert endpoint_port("carState") == 8023 + h % 24745
    assert endpoint_port(b"carState") == endpoint_port("carState")
    ports = {endpoint_port(f"service{i}") for i in range(500)}
    assert all(8023 <= p <= 32767 for p in ports)


def test_prefix_moves_the_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_PREFIX", "run_a")
    a = [endpoint_port(f"s{i}") for i in range(20)]
    monkeypatch.setenv("MSGQ_PREFIX", "run_b")
    b = [endpoint_port(f"s{i}") for i in range(20)]
    monkeypatch.delenv("MSGQ_PREFIX")
    monkeypatch.setenv("OPENPILOT_PREFIX", "run_a")
    assert [endpoint_port(f"s{i}") for i in range(20)] == a
    assert a != b
    assert endpoint_port("s1", prefix="") != endpoint_port("s1", prefix="run_a")


def test_port_range_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_ZMQ_BASE_PORT", "40000")
    monkeypatch.setenv("MSGQ_ZMQ_PORT_SPAN", "10")
    assert {endpoint_port(f"s{i}") for i in range(200)} <= set(range(40000, 40010))
    monkeypatch.setenv("MSGQ_ZMQ_PORT_SPAN", "30000")
    with pytest.raises(ValueError, match="65535"):
        endpoint_port("s")
    monkeypatch.setenv("MSGQ_ZMQ_BASE_PORT", "eighty")
    with pytest.raises(ValueError, match="MSGQ_ZMQ_BASE_PORT"):
        endpoint_port("s")


# --- conflicts -----------------------------------------------------------------------------

def hold_port(endpoint: str, host: str, listening: bool,
              reuse_address: bool = False) -> tuple[str, socket.socket]:
    """A plain TCP socket bound on the port of an endpoint named after ``endpoint`` (a
    variant whose port is not in TIME_WAIT from earlier runs), and that name.

    ``reuse_address`` sets SO_REUSEADDR, as servers do: the connections it accepts inherit
    it, so those it closed first (left in FIN_WAIT or TIME_WAIT for up to a minute) do not
    keep a publisher (libzmq binds with SO_REUSEADDR too) off the port once it has left.
    """
    for i in range(20):
        name = f"{endpoint}_{i}"
        holder = socket.socket()
        if reuse_address:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind((host, endpoint_port(name)))
        except OSError:
            holder.close()
            continue
        if listening:
            holder.listen()
        return name, holder
    raise RuntimeError("no free port found")


def test_second_publisher_names_endpoint_and_port(endpoint: str) -> None:
    first = msgq.pub_sock(endpoint)
    with pytest.raises(msgq.MultiplePublishersError) as info:
        msgq.pub_sock(endpoint)
    assert endpoint in str(info.value) and str(endpoint_port(endpoint)) in str(info.value)
    first.send(b"the first one keeps the endpoint")


@pytest.mark.parametrize("listening", [True, False], ids=["listening", "bound-only"])
def test_port_held_by_an_unrelated_program(endpoint: str, listening: bool) -> None:
    endpoint, holder = hold_port(endpoint, "0.0.0.0", listening)
    port = endpoint_port(endpoint)
    try:
        with pytest.raises(msgq.IpcError) as info:
            msgq.pub_sock(endpoint)
    finally:
        holder.close()
    assert not isinstance(info.value, msgq.MultiplePublishersError)
    text = str(info.value)
    assert endpoint in text and str(port) in text and "not a ZMQ publisher" in text


def test_names_sharing_a_port_never_mix_messages(monkeypatch: pytest.MonkeyPatch,
                                                endpoint: str) -> None:
    monkeypatch.setenv("MSGQ_ZMQ_PORT_SPAN", "1")  # every name maps to the same port
    pub_x = msgq.pub_sock(endpoint + "_x")
    with pytest.raises(msgq.MultiplePublishersError):
        msgq.pub_sock(endpoint + "_y")
    sub_y = msgq.sub_sock(endpoint + "_y")
    assert pub_x.wait_until_read(10)
    pub_x.send(b"for x only")

    def dropped() -> bool:
        assert sub_y.receive(non_blocking=True) is None
        return sub_y.dropped_messages == 1

    wait_until(dropped, what="message of the other endpoint dropped")


# --- foreign input -------------------------------------------------------------------------

def test_garbage_from_a_foreign_zmq_publisher(endpoint: str) -> None:
    ctx = zmq.Context.instance()
    foreign = ctx.socket(zmq.XPUB)
    foreign.setsockopt(zmq.LINGER, 0)
    foreign.bind(f"tcp://127.0.0.1:{endpoint_port(endpoint)}")
    try:
        sub = msgq.sub_sock(endpoint, timeout=5000)
        assert foreign.recv() == b"\x01"  # our subscription arrived
        noise = random.Random(3).randbytes(3000)
        foreign.send_multipart([b"part one", b"part two", b"part three"])
        foreign.send(noise)
        foreign.send_multipart([b"\x00", b""])
        foreign.send(b"")
        foreign.send(b"last")
        # Single frames are messages (msgq carries bytes); multi-part ones are dropped.
        assert sub.receive() == noise
        assert sub.receive() == b""
        assert sub.receive() == b"last"
        assert sub.dropped_messages == 2
    finally:
        foreign.close(0)


def test_poller_does_not_report_a_message_that_will_be_dropped(endpoint: str) -> None:
    ctx = zmq.Context.instance()
    foreign = ctx.socket(zmq.XPUB)
    foreign.setsockopt(zmq.LINGER, 0)
    foreign.bind(f"tcp://127.0.0.1:{endpoint_port(endpoint)}")
    try:
        poller = msgq.Poller()
        sub = msgq.sub_sock(endpoint, poller=poller, timeout=5000)
        assert foreign.recv() == b"\x01"  # our subscription arrived
        foreign.send_multipart([b"dropped", b"multi-part"])
        wait_until(lambda: sub.has_data(), what="the foreign message")
        assert poller.poll(200) == []  # nothing a receive would return
        assert sub.dropped_messages == 1
        foreign.send(b"kept")
        assert poller.poll(5000) == [sub]
        assert sub.receive(non_blocking=True) == b"kept"
    finally:
        foreign.close(0)


def test_conflating_subscriber_after_poll_gets_the_newest(endpoint: str) -> None:
    poller = msgq.Poller()
    sub = msgq.sub_sock(endpoint, poller=poller, conflate=True, timeout=5000)
    pub = msgq.pub_sock(endpoint)
    deadline = time.monotonic() + 10
    ready: list[object] = []
    while not ready:  # until the subscription is up (ZMQ joins take a moment)
        assert time.monotonic() < deadline, "subscriber never connected"
        pub.send(b"old")
        ready = poller.poll(50)
    assert ready == [sub]  # the poll holds "old" for the receive
    pub.send(b"new")
    wait_until(lambda: sub._sock.poll(0, zmq.POLLIN), what="the newer message")
    assert sub.receive(non_blocking=True) == b"new"


@contextlib.contextmanager
def subscriber_meeting_garbage(endpoint: str) -> Iterator[tuple[str, Any]]:
    """A program that is not ZMQ listens on the port of an endpoint named after
    ``endpoint`` and answers every connection with bytes that are not ZMTP; yields that
    name and a subscriber (timeout 300 ms) that has counted the garbage as dropped. The
    program leaves when the block ends."""
    # Whether the server or the subscriber closes each connection first is a race; the
    # reused address makes the later publisher's bind independent of who wins it.
    name, server = hold_port(endpoint, "127.0.0.1", listening=True, reuse_address=True)
    stop = threading.Event()
    thread = spew_garbage_on(server, stop)
    try:
        sub = msgq.sub_sock(name, timeout=300)
        wait_until(lambda: sub.receive(non_blocking=True) is None and sub.dropped_messages > 0,
                   what="the foreign frames counted as dropped")
        yield name, sub
    finally:
        stop.set()
        thread.join(5)
        server.close()


def spew_garbage_on(server: socket.socket, stop: threading.Event) -> threading.Thread:
    """A thread answering every connection to ``server`` with bytes that are not ZMTP."""

    def spew() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + bytes(range(256)) * 8)
                except OSError:
                    pass

    thread = threading.Thread(target=spew, daemon=True)
    thread.start()
    return thread


def test_non_zmq_server_on_the_port_does_not_break_a_subscriber(endpoint: str) -> None:
    # libzmq takes such a byte stream for a legacy ZMTP 1.0 peer and parses frames out of
    # it; the subscriber drops them, since they lack ZMTP 3 metadata: it did read the
    # foreign frames (they are counted), and returns none of them.
    with subscriber_meeting_garbage(endpoint) as (_, sub):
        assert sub.receive() is None
        assert sub.receive(non_blocking=True) is None and sub.dropped_messages > 0


def test_subscriber_reaches_the_publisher_after_a_non_zmq_server_left(endpoint: str) -> None:
    with subscriber_meeting_garbage(endpoint) as (endpoint, sub):
        pass
    # The program leaves and a real publisher takes the port: the subscriber reconnects
    # by itself (as it does after a publisher restart) and gets its messages.
    pub = msgq.pub_sock(endpoint)
    wait_until(lambda: sub.receive(non_blocking=True) is None and pub.num_readers == 1,
               timeout=5.0, what="subscriber reconnected to the publisher")
    pub.send(b"real")
    sub.setTimeout(5000)
    assert sub.receive() == b"real"


def test_foreign_clients_do_not_disturb_a_publisher(endpoint: str) -> None:
    pub, sub = subscribed_pair(endpoint, timeout=5000)
    port = endpoint_port(endpoint)
    # A raw TCP client writing garbage, and a ZMQ client sending data and odd frames up.
    raw = socket.create_connection(("127.0.0.1", port))
    raw.sendall(b"\xff" + bytes(range(256)) * 4)
    ctx = zmq.Context.instance()
    peer = ctx.socket(zmq.XSUB)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(f"tcp://127.0.0.1:{port}")
    peer.send_multipart([b"\x05not a subscription", b"more"])
    peer.send(b"\x02")
    peer.send(b"\x01")  # a real subscription, to everything
    try:
        wait_until(lambda: pub.num_readers == 2, what="the foreign subscription")
        for i in range(50):
            pub.send(b"%d" % i)
        assert [sub.receive() for _ in range(50)] == [b"%d" % i for i in range(50)]
        assert peer.poll(5000)
        frame = peer.recv(copy=False)
        assert frame.get(ENDPOINT_PROPERTY).endswith(endpoint)
    finally:
        raw.close()
        peer.close(0)


# --- options -------------------------------------------------------------------------------

def test_watermarks_and_linger_from_environment_and_keywords(
    monkeypatch: pytest.MonkeyPatch, endpoint: str
) -> None:
    monkeypatch.setenv("MSGQ_ZMQ_SNDHWM", "7")
    monkeypatch.setenv("MSGQ_ZMQ_RCVHWM", "9")
    monkeypatch.setenv("MSGQ_ZMQ_LINGER", "0")
    pub = msgq.pub_sock(endpoint)
    sub = msgq.sub_sock(endpoint)
    assert pub._sock.getsockopt(zmq.SNDHWM) == 7
    assert pub._sock.getsockopt(zmq.LINGER) == 0
    assert sub._sock.getsockopt(zmq.RCVHWM) == 9
    assert sub._sock.getsockopt(zmq.LINGER) == 0
    pub.close()
    pub = msgq.PubSocket(sndhwm=3, linger=20)  # keywords win over the environment
    pub.connect(msgq.context, endpoint)
    assert (pub._sock.getsockopt(zmq.SNDHWM), pub._sock.getsockopt(zmq.LINGER)) == (3, 20)


def test_defaults_bound_memory_and_closing() -> None:
    pub, sub = msgq.PubSocket(), msgq.SubSocket()
    assert (pub.sndhwm, sub.rcvhwm) == (1000, 1000)
    assert pub.linger == sub.linger == 1000


@pytest.mark.parametrize("value", ["lots", "-1", "1.5"])
def test_bad_option_values_name_the_variable(monkeypatch: pytest.MonkeyPatch,
                                             value: str) -> None:
    monkeypatch.setenv("MSGQ_ZMQ_SNDHWM", value)
    with pytest.raises(ValueError, match="MSGQ_ZMQ_SNDHWM"):
        msgq.PubSocket()
    with pytest.raises(ValueError, match="sndhwm"):
        zmq_backend.PubSocket(sndhwm=-5)


def test_context_term_does_not_hang_with_a_stalled_subscriber(endpoint: str) -> None:
    context = msgq.Context()
    pub = msgq.PubSocket(linger=50)
    pub.connect(context, endpoint)
    sub = msgq.SubSocket(rcvhwm=1)
    sub.connect(context, endpoint)
    assert pub.wait_until_read(10)
    for _ in range(5000):
        pub.send(b"y" * 4096)
    context.term()  # bounded by the linger, whatever is still queued
    pub.close()
    sub.close()


# --- Ctrl-C --------------------------------------------------------------------------------

def interrupt_main_thread_inside(function: str) -> threading.Thread:
    """A thread that sends SIGINT to the main thread once the main thread is running
    ``function`` of the ZMQ backend (seen in its stack), not before."""
    main = threading.main_thread().ident
    assert main is not None

    def inside() -> bool:
        frame = sys._current_frames().get(main)
        while frame is not None:
            code = frame.f_code
            if code.co_name == function and Path(code.co_filename).parent == PACKAGE:
                return True
            frame = frame.f_back
        return False

    def interrupt() -> None:
        wait_until(inside, timeout=30, what=f"main thread inside {function}")
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("call", ["receive", "poll", "wait_until_read"])
def test_blocking_calls_are_interruptible(endpoint: str, call: str) -> None:
    pub = msgq.pub_sock(endpoint + "_pub")
    sub = msgq.sub_sock(endpoint)
    poller = msgq.Poller()
    poller.registerSocket(sub)
    # A connection that never subscribes keeps wait_for_readers waiting.
    blocker = socket.create_connection(("127.0.0.1", endpoint_port(endpoint + "_pub")))
    wait_until(lambda: not pub.all_readers_updated(), what="connection accepted")
    interrupter = interrupt_main_thread_inside(call)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            if call == "receive":
                sub.receive()
            elif call == "poll":
                poller.poll(-1)
            else:
                pub.wait_until_read()
    finally:
        interrupter.join(30)
        blocker.close()
    # Raised from inside the blocking call, not before it started.
    assert any(entry.name == call for entry in info.traceback[1:])
