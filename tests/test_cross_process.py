"""Behaviour across real processes and real sockets that the per-module suites do not
reach: SubMaster's rate verdict at the edges of its band and after the publisher stops,
publisher takeover between processes, PubMaster/SubMaster and VisionIPC with ``ZMQ=1``,
and a Poller over many sockets.

The publishers live in child processes that act on commands (a pipe), so every test knows
exactly what was sent when; nothing waits on a sleep.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import msgq

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

SPAWN = mp.get_context("spawn")
REPLY_TIMEOUT_S = 30.0


# --------------------------------------------------------------------------- the worker


def _worker(env: dict[str, str], conn: Any) -> None:
    """Child: applies ``env``, then runs commands from ``conn`` and answers each.

    ("pub", endpoint)            make a publisher of a raw endpoint
    ("send", endpoint, data)     send bytes on it
    ("pm", services)             make a PubMaster
    ("event", service, value)    send an Event of ``service`` carrying ``value``
    ("vipc", name, w, h, n)      make a VisionIPC server with stream 0
    ("frame", frame_id)          send frame ``frame_id`` (bytes from frame_bytes)
    ("exit",)                    leave

    Each answer is "ok" or the exception as "TypeName: message".
    """
    os.environ.update(env)
    for name in ("MSGQ_BACKEND", "ZMQ", "MSGQ_LOCKSTEP_CLOCK"):
        if name not in env:
            os.environ.pop(name, None)
    pubs: dict[str, Any] = {}
    pm = server = None
    size = 0
    while True:
        command, *args = conn.recv()
        try:
            if command == "exit":
                conn.send("ok")
                return
            if command == "pub":
                pubs[args[0]] = msgq.pub_sock(args[0])
            elif command == "send":
                pubs[args[0]].send(args[1])
            elif command == "pm":
                from msgq.messaging import PubMaster

                pm = PubMaster(args[0])
            elif command == "event":
                assert pm is not None
                pm.send(args[0], _event(*args))
            elif command == "vipc":
                from msgq.visionipc import VisionIpcServer

                name, w, h, n = args
                server = VisionIpcServer(name)
                server.create_buffers(0, n, w, h)
                server.start_listener()
                size = w * h * 3 // 2
            elif command == "frame":
                assert server is not None
                server.send(0, frame_bytes(args[0], size), frame_id=args[0])
            else:
                raise ValueError(f"unknown command {command!r}")
            conn.send("ok")
        except Exception as e:  # noqa: BLE001 - reported to the test
            conn.send(f"{type(e).__name__}: {e}")


def _event(service: str, value: float) -> Any:
    from msgq.messaging import new_message

    msg = new_message(service, valid=True)
    if service == "gpsLocation":
        msg.gpsLocation.latitudeDeg = value
    elif service == "vehicleState":
        msg.vehicleState.speed = value
    return msg


def frame_bytes(frame_id: int, size: int) -> np.ndarray:
    return np.random.default_rng(frame_id).integers(0, 256, size, dtype=np.uint8)


class Worker:
    """A child process running :func:`_worker` in the test's environment (plus
    ``env``)."""

    def __init__(self, **env: str) -> None:
        base = {k: v for k, v in os.environ.items()
                if (k.startswith(("MSGQ_", "OPENPILOT_")) or k == "ZMQ")
                and k != "MSGQ_LOCKSTEP_CLOCK"}
        base.update(env)
        self.conn, child = SPAWN.Pipe()
        self.proc = SPAWN.Process(target=_worker, args=(base, child), daemon=True)
        self.proc.start()
        child.close()

    def ask(self, *command: Any) -> str:
        self.conn.send(command)
        if not self.conn.poll(REPLY_TIMEOUT_S):
            raise TimeoutError(f"the worker did not answer {command[0]!r}")
        return self.conn.recv()

    def do(self, *command: Any) -> None:
        answer = self.ask(*command)
        assert answer == "ok", answer

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                self.ask("exit")
            except (OSError, EOFError, TimeoutError):
                pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        assert self.proc.exitcode in (0, -9), self.proc.exitcode


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


def start_worker(workers: list[Worker], **env: str) -> Worker:
    worker = Worker(**env)
    workers.append(worker)
    return worker


# --------------------------------------------------------------------------- SubMaster rates


@pytest.fixture
def simulated_clock(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """This process's msgq clock, set by the test (SubMaster reads it at each update);
    started publishers keep the real clock."""
    from msgq.lockstep import clock

    file = clock.ClockFile(str(tmp_path / "clock"), mono_ns=1000 * 10**9)
    monkeypatch.setenv(clock.CLOCK_ENV, file.path)
    clock.reload()
    yield file
    monkeypatch.delenv(clock.CLOCK_ENV)
    clock.reload()
    file.close()


def feed(sm: Any, worker: Worker, service: str, clock_file: Any, start_s: float,
         rate_hz: float, count: int) -> float:
    """``count`` messages of ``service`` from ``worker``, each taken by one ``sm.update``
    at simulated times ``start_s + k / rate_hz``; returns the time of the last one."""
    t = start_s
    for k in range(count):
        t = start_s + k / rate_hz
        clock_file.set(int(t * 1e9))
        worker.do("event", service, float(k))
        sm.update(10_000)
        assert sm.updated[service], f"message {k} did not arrive"
    return t


# (SubMaster arguments, the service whose rate is checked, the band's low and high edge)
BANDS = {
    # the polled service must arrive at its own rate: 10 Hz, band [0.8, 1.2] x 10
    "polled 10 Hz": (dict(services=["gpsLocation"], poll="gpsLocation"), "gpsLocation",
                     8.0, 12.0),
    # a 100 Hz service read by a 20 Hz loop is seen at the loop's rate: [0.8, 1.2] x 20
    "100 Hz read at 20 Hz": (dict(services=["vehicleState"], frequency=20.0),
                             "vehicleState", 16.0, 24.0),
}


@pytest.mark.parametrize("case", list(BANDS))
def test_freq_ok_at_the_edges_of_the_band(case: str, simulated_clock: Any,
                                          workers: list[Worker]) -> None:
    from msgq.messaging import SubMaster

    kwargs, service, low, high = BANDS[case]
    worker = start_worker(workers)
    worker.do("pm", [service])
    rates = {low * 1.01: True, high * 0.99: True, low * 0.99: False, high * 1.01: False}
    start = 1000.0
    for rate, expected in rates.items():
        sm = SubMaster(**kwargs)
        # 12 s of messages: both averaging windows (10 s and 1 s) see only this rate.
        start = feed(sm, worker, service, simulated_clock, start + 100, rate,
                     int(12 * rate)) + 100
        assert sm.freq[service] == pytest.approx(rate)
        assert sm.freq_ok[service] is expected, (case, rate, sm.summary())
        assert sm.alive[service] and sm.valid[service]
        assert sm.all_checks() is expected
        sm.close()


def test_freq_ok_after_the_publisher_stops_and_comes_back(simulated_clock: Any,
                                                          workers: list[Worker]) -> None:
    from msgq.messaging import SubMaster

    sm = SubMaster(["gpsLocation"], poll="gpsLocation")
    first = start_worker(workers)
    first.do("pm", ["gpsLocation"])
    last = feed(sm, first, "gpsLocation", simulated_clock, 1000.0, 10.0, 30)
    assert sm.freq_ok["gpsLocation"] and sm.alive["gpsLocation"]
    first.stop()  # the publisher's process is gone

    def at(t: float) -> None:
        simulated_clock.set(int(t * 1e9))
        sm.update(0)
        assert not sm.updated["gpsLocation"]

    at(last + 0.5)  # less than 10 periods: nothing to report yet
    assert sm.alive["gpsLocation"] and sm.freq_ok["gpsLocation"]
    at(last + 10.5)  # dead, so not at its rate (cereal would keep its last verdict)
    assert not sm.alive["gpsLocation"] and not sm.freq_ok["gpsLocation"]
    assert not sm.all_checks()
    # the averages are of the intervals received (cereal's), not of the silence
    assert sm.freq["gpsLocation"] == pytest.approx(10.0)

    second = start_worker(workers)  # a new publisher process takes the service over
    second.do("pm", ["gpsLocation"])
    feed(sm, second, "gpsLocation", simulated_clock, last + 20.0, 10.0, 15)
    assert sm.alive["gpsLocation"] and sm.freq_ok["gpsLocation"] and sm.all_checks()
    sm.close()


# --------------------------------------------------------------------------- takeover


def test_a_publisher_in_another_process_takes_the_endpoint_over(
        backend: str, endpoint: str, workers: list[Worker]) -> None:
    first, second = start_worker(workers), start_worker(workers)
    first.do("pub", endpoint)
    sub = msgq.sub_sock(endpoint, timeout=100)
    if backend == "zmq":  # delivery starts once the subscription reached the publisher
        deadline = time.monotonic() + 30
        while sub.receive() is None:
            assert time.monotonic() < deadline, "the subscription never joined"
            first.do("send", endpoint, b"probe")
    sub.setTimeout(10_000)

    def receive() -> bytes | None:
        """The next message that is not a probe still in flight."""
        while (msg := sub.receive()) == b"probe":
            pass
        return msg

    first.do("send", endpoint, b"from the first")
    assert receive() == b"from the first"

    answer = second.ask("pub", endpoint)
    if backend == "zmq":
        # ZMQ (like upstream's): the port is taken, the newcomer is refused and the first
        # publisher keeps the endpoint.
        assert answer.startswith("MultiplePublishersError"), answer
        first.do("send", endpoint, b"still the first")
        assert receive() == b"still the first"
        return
    # Shared memory: the newcomer takes over; the first one's next send is refused and
    # the subscriber follows the new publisher without reconnecting.
    assert answer == "ok", answer
    second.do("send", endpoint, b"from the second")
    answer = first.ask("send", endpoint, b"lost")
    assert answer.startswith("MultiplePublishersError"), answer
    second.do("send", endpoint, b"again from the second")
    assert receive() == b"from the second"
    assert receive() == b"again from the second"
    assert sub.receive(non_blocking=True) is None


# --------------------------------------------------------------------------- ZMQ=1


@pytest.fixture
def zmq_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """ZMQ=1 in this process and in the workers it starts, the way upstream users set it."""
    monkeypatch.delenv("MSGQ_BACKEND", raising=False)
    monkeypatch.setenv("ZMQ", "1")


def test_pub_master_and_sub_master_over_zmq(zmq_1: None, workers: list[Worker]) -> None:
    from msgq.messaging import SubMaster

    worker = start_worker(workers)
    worker.do("pm", ["vehicleState", "gpsLocation"])
    sm = SubMaster(["vehicleState", "gpsLocation"])
    assert isinstance(sm.sock["vehicleState"], msgq.zmq.SubSocket)
    deadline = time.monotonic() + 30
    while not (sm.seen["vehicleState"] and sm.seen["gpsLocation"]):  # subscriptions join
        assert time.monotonic() < deadline, "nothing arrived over ZMQ"
        worker.do("event", "vehicleState", -1.0)
        worker.do("event", "gpsLocation", -1.0)
        sm.update(100)
    for k in range(20):
        worker.do("event", "vehicleState", float(k))
        worker.do("event", "gpsLocation", k / 8)
        deadline = time.monotonic() + 30
        while sm["vehicleState"].speed != k or sm["gpsLocation"].latitudeDeg != k / 8:
            assert time.monotonic() < deadline, f"update {k} did not arrive"
            sm.update(100)
        assert sm.valid["vehicleState"] and sm.valid["gpsLocation"]
    sm.close()


def test_visionipc_announcements_over_zmq_between_processes(
        zmq_1: None, workers: list[Worker]) -> None:
    from msgq import queues
    from msgq import zmq as zmq_backend
    from msgq.visionipc import VisionIpcClient, get_endpoint_name

    w, h = 64, 48
    size = w * h * 3 // 2
    server = start_worker(workers)
    server.do("vipc", "camerad", w, h, 4)
    client = VisionIpcClient("camerad", 0, False)
    try:
        assert client.connect(True) and (client.width, client.height) == (w, h)
        deadline = time.monotonic() + 30
        probe = 1_000  # probe frames: ids from 1000
        while client.recv(100) is None:  # until the subscription reached the server
            assert time.monotonic() < deadline, "no frame announcement arrived"
            server.do("frame", probe)
            probe += 1
        # The server sends a frame only after the client has the previous one, so no
        # buffer is refilled while the client checks it.
        for frame_id in range(10):
            server.do("frame", frame_id)
            buf = None
            deadline = time.monotonic() + 30
            while buf is None or client.frame_id >= 1_000:  # the announcement of a probe
                assert time.monotonic() < deadline, f"frame {frame_id} never arrived"
                buf = client.recv(100)
            assert client.frame_id == buf.frame_id == frame_id and buf.is_current()
            assert bytes(buf.data) == frame_bytes(frame_id, size).tobytes()
        assert client.bad_packets == 0
        # The announcements went over ZMQ: no shared-memory queue was made for them.
        endpoint = get_endpoint_name("camerad", 0)
        assert zmq_backend.endpoint_port(endpoint) > 0
        assert not os.path.exists(queues.queue_path(endpoint))
    finally:
        client.close()


# --------------------------------------------------------------------------- Poller


def test_poller_with_many_sockets_ready_at_once_and_one_closed(
        backend: str, endpoint: str, workers: list[Worker]) -> None:
    n = 40
    names = [f"{endpoint}_{i}" for i in range(n)]
    worker = start_worker(workers)
    for name in names:
        worker.do("pub", name)
    poller = msgq.Poller()
    subs = [msgq.sub_sock(name, poller=poller) for name in names]
    # Until every subscription is live (ZMQ subscriptions take a moment to join).
    joined: set[int] = set()
    deadline = time.monotonic() + 30
    while len(joined) < n:
        assert time.monotonic() < deadline, f"only {len(joined)} of {n} subscribed"
        for i, name in enumerate(names):
            if i not in joined:
                worker.do("send", name, b"probe")
        for sock in poller.poll(100):
            joined.add(subs.index(sock))
            while sock.receive(non_blocking=True) is not None:
                pass
    for sock in subs:
        while sock.receive(non_blocking=True) is not None:
            pass

    for i, name in enumerate(names):
        worker.do("send", name, b"to %d" % i)
    deadline = time.monotonic() + 30
    while not all(s.has_data() for s in subs):  # ZMQ: still in flight
        assert time.monotonic() < deadline, "messages never arrived"
        time.sleep(0.005)
    ready = poller.poll(0)
    assert sorted(subs.index(s) for s in ready) == list(range(n))  # one poll, all of them
    for i, sock in enumerate(subs):
        sock.setTimeout(10_000)
        while (msg := sock.receive()) == b"probe":  # ZMQ: a probe still in flight
            pass
        assert msg == b"to %d" % i
    assert poller.poll(0) == []

    # A socket registered with the Poller is closed: polling says so, instead of waiting
    # on a dead socket; the others keep working with a Poller of their own.
    subs[7].close()
    with pytest.raises(msgq.IpcError, match="closed"):
        poller.poll(0)
    rest = msgq.Poller()
    for i, sock in enumerate(subs):
        if i != 7:
            rest.registerSocket(sock)
    worker.do("send", names[n - 1], b"after the close")
    deadline = time.monotonic() + 30
    ready = []
    while not ready:
        assert time.monotonic() < deadline
        ready = rest.poll(100)
    assert ready == [subs[n - 1]]
    assert subs[n - 1].receive(non_blocking=True) == b"after the close"
