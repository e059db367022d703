"""``msgq bridge`` between two "machines": processes in separate OPENPILOT_PREFIX
namespaces, ZMQ on loopback. Services arrive byte for byte; VisionIPC frames arrive with
their bytes, frame ids and timestamps."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import free_port_pair, wait_until

pytestmark = pytest.mark.multiprocess

# The robot: vehicleState with speed = i (fixed logMonoTime, so bytes are reproducible)
# at 100 Hz, and a VisionIPC server "camerad" sending 320x240 frames whose bytes derive
# from their frame id, at 20 fps.
ROBOT = textwrap.dedent("""
    import time
    import numpy as np
    from msgq.messaging import PubMaster, new_message
    from msgq.visionipc import VisionIpcServer
    pm = PubMaster(["vehicleState"])
    server = VisionIpcServer("camerad")
    server.create_buffers(0, 4, 320, 240)
    server.start_listener()
    print("ready", flush=True)
    i = 0
    start = time.monotonic()
    while True:
        msg = new_message("vehicleState", valid=True, logMonoTime=1000 + i)
        msg.vehicleState.speed = float(i)
        pm.send("vehicleState", msg)
        if i % 5 == 0:
            frame = np.random.default_rng(i).integers(0, 256, 320 * 240 * 3 // 2,
                                                      dtype=np.uint8)
            server.send(0, frame, frame_id=i, timestamp_sof=10 * i, timestamp_eof=10 * i + 7)
        i += 1
        time.sleep(max(0.0, start + i / 100 - time.monotonic()))
""")


def _env(prefix: str) -> dict[str, str]:
    env = os.environ.copy()
    env.pop("MSGQ_PREFIX", None)
    env["OPENPILOT_PREFIX"] = prefix
    return env


@pytest.fixture
def machines(prefix: str) -> Iterator[tuple[str, str, list[subprocess.Popen[str]]]]:
    robot, laptop = f"{prefix}_robot", f"{prefix}_laptop"
    procs: list[subprocess.Popen[str]] = []
    yield robot, laptop, procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    shm = os.environ.get("MSGQ_SHM_DIR", "/dev/shm")
    for name in (robot, laptop):
        shutil.rmtree(os.path.join(shm, name), ignore_errors=True)


def _expected_frame(frame_id: int) -> str:
    import numpy as np

    data = np.random.default_rng(frame_id).integers(0, 256, 320 * 240 * 3 // 2, dtype=np.uint8)
    return hashlib.sha256(data.tobytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("compress", ["none", "zstd", "keys"])
def test_bridge_carries_services_and_frames(machines: tuple[str, str, list[subprocess.Popen[str]]],
                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                            compress: str) -> None:
    robot, laptop, procs = machines
    port = free_port_pair()
    serve_keys: list[str] = []
    connect_keys: list[str] = []
    if compress == "keys":  # CurveZMQ, a client allowed exactly what is carried
        from msgq.zmq.security import create_keys

        create_keys(tmp_path / "keys", ["laptop"])
        (tmp_path / "keys" / "permissions.toml").write_text(
            '[clients.laptop]\nservices = ["vehicleState"]\nvision = ["camerad/0"]\n')
        serve_keys = ["--keys", str(tmp_path / "keys")]
        connect_keys = [*serve_keys, "--client", "laptop"]
        compress = "none"
    pub = subprocess.Popen([sys.executable, "-c", ROBOT], stdout=subprocess.PIPE, text=True,
                           env=_env(robot))
    procs.append(pub)
    assert pub.stdout is not None and pub.stdout.readline().strip() == "ready"
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "msgq", "bridge", "serve", "vehicleState", "--vision",
         "camerad:0", "--port", str(port), "--compress", compress, *serve_keys],
        env=_env(robot),
        stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "msgq", "bridge", "connect", "127.0.0.1", "--port", str(port),
         *connect_keys], env=_env(laptop), stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL))

    # This test process is on the laptop now.
    monkeypatch.delenv("MSGQ_PREFIX")
    monkeypatch.setenv("OPENPILOT_PREFIX", laptop)
    import msgq
    from msgq.messaging import log_from_bytes, new_message
    from msgq.visionipc import VisionIpcClient

    sub = msgq.sub_sock("vehicleState", timeout=200)
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 100 and time.monotonic() < deadline:
        data = sub.receive()
        if data is not None:
            got.append(data)
    assert len(got) == 100, "services did not cross the bridge"
    speeds = [log_from_bytes(d).vehicleState.speed for d in got]
    first = int(speeds[0])
    assert speeds == [float(first + k) for k in range(100)]  # none lost, in order
    for k, data in enumerate(got):  # byte for byte what the robot sent
        expected = new_message("vehicleState", valid=True, logMonoTime=1000 + first + k)
        expected.vehicleState.speed = float(first + k)
        assert data == expected.to_bytes()

    client = VisionIpcClient("camerad", 0, conflate=False)
    frames = []
    deadline = time.monotonic() + 30
    while len(frames) < 10 and time.monotonic() < deadline:
        buf = client.recv(200)
        if buf is None:
            continue
        digest = hashlib.sha256(bytes(buf.data)).hexdigest()
        if buf.is_current():
            frames.append((client.frame_id, client.timestamp_sof, client.timestamp_eof, digest))
    assert len(frames) == 10, "frames did not cross the bridge"
    assert client.width == 320 and client.height == 240
    ids = [f[0] for f in frames]
    assert ids == sorted(ids) and len(set(ids)) == 10
    for frame_id, sof, eof, digest in frames:
        assert frame_id % 5 == 0
        assert (sof, eof) == (10 * frame_id, 10 * frame_id + 7)
        assert digest == _expected_frame(frame_id)
    client.close()


@pytest.mark.slow
def test_bridge_drops_garbage_on_the_wire(prefix: str) -> None:
    import zmq

    from msgq.bridge import Inbound
    from msgq.bridge.wire import FrameHeader, service_topic, vision_topic

    port = free_port_pair()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    vis = ctx.socket(zmq.PUB)
    vis.bind(f"tcp://127.0.0.1:{port + 1}")
    inbound = Inbound("127.0.0.1", port)
    import threading

    thread = threading.Thread(target=inbound.run)
    thread.start()
    try:
        from msgq.messaging import new_message

        good = new_message("gpsLocation", valid=True).to_bytes()
        bad = [
            [b"sgpsLocation", b"garbage bytes!!!"],
            [b"snotAService", good],
            [b"x", good],
            [b"s\xff\xfe", good],
            [b"sgpsLocation"],
            [b"svehicleState", good],  # right bytes, wrong service
            [b"sgpsLocation", good + bytes(8)],  # an Event with bytes after its end
        ]
        header = FrameHeader(0, 1, 4, 4, 4, 16, 24, 0, 0, True).pack()
        bad_frames = [
            [vision_topic("cam", 0), header, b"short"],
            [vision_topic("cam", 0), b"\x00" * 8, b"x" * 24],
            [b"vcam/notanumber", header, b"x" * 24],
            [vision_topic("cam", 0), FrameHeader(1, 1, 4, 4, 4, 16, 24, 0, 0, True).pack(),
             b"not zstd"],
            [vision_topic("cam", 0), FrameHeader(0, 1, 9, 4, 4, 16, 24, 0, 0, True).pack(),
             b"x" * 24],  # stride < width: VisionIPC refuses the geometry
        ]
        import msgq

        sub = msgq.sub_sock("gpsLocation", timeout=100)

        def every_kind_counted() -> bool:
            return (inbound.counts["bad_messages"] >= 4
                    and inbound.counts["mislabeled"] >= 1  # right bytes, wrong service
                    and inbound.counts["unknown_services"] >= 1
                    and inbound.counts["bad_frames"] >= 5)

        # Batches of bad input, each followed by a good message, until the good one came
        # through and every kind of bad input was counted. The frames socket is separate
        # and may subscribe later than the services socket: batches sent before that are
        # lost on the way, not counted, so one batch is not enough.
        deadline = time.monotonic() + 30
        received = None
        while received is None or not every_kind_counted():
            assert time.monotonic() < deadline, f"bad input not counted: {inbound.counts}"
            for parts in bad:
                pub.send_multipart(parts)
            for parts in bad_frames:
                vis.send_multipart(parts)
            pub.send_multipart([service_topic("gpsLocation"), good])
            data = sub.receive()
            if data is not None:
                assert data == good  # only the good message is re-published
                received = data
        assert inbound.counts["frames"] == 0
    finally:
        inbound.stop()
        thread.join(10)
        inbound.close()
        pub.close()
        vis.close()
        ctx.term()


@pytest.mark.slow
def test_bridge_command_errors() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "msgq", "bridge", *args],
                              capture_output=True, text=True, timeout=30)

    out = run("serve", "vehicleStat")
    assert out.returncode == 2 and "did you mean 'vehicleState'" in out.stderr
    out = run("serve")
    assert out.returncode == 2 and "name services" in out.stderr
    out = run("serve", "--vision", "camerad")
    assert out.returncode == 2 and "NAME:STREAM" in out.stderr
    out = run("--help")
    assert out.returncode == 0 and "msgq bridge connect 192.168.1.10" in out.stdout


def _speed_message(i: int) -> bytes:
    from msgq.messaging import new_message

    msg = new_message("vehicleState", valid=True, logMonoTime=1000 + i)
    msg.vehicleState.speed = float(i)
    return msg.to_bytes()


def _speed(data: bytes) -> int:
    from msgq.messaging import log_from_bytes

    return int(log_from_bytes(data).vehicleState.speed)


@pytest.mark.slow
def test_bridge_reconnects_when_either_side_restarts(
        machines: tuple[str, str, list[subprocess.Popen[str]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import msgq

    robot, laptop, procs = machines
    port = free_port_pair()

    def start(side: list[str], prefix: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", "msgq", "bridge", *side, "--port",
                                 str(port)], env=_env(prefix), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    def serve() -> subprocess.Popen[str]:
        return start(["serve", "vehicleState"], robot)

    def connect() -> subprocess.Popen[str]:
        return start(["connect", "127.0.0.1", "vehicleState", "--no-vision"], laptop)

    # This test process publishes on the robot and subscribes on the laptop.
    monkeypatch.setenv("MSGQ_PREFIX", robot)
    pub = msgq.pub_sock("vehicleState")
    monkeypatch.setenv("MSGQ_PREFIX", laptop)
    sub = msgq.sub_sock("vehicleState", timeout=20)
    sent = 0

    def flows(after: str) -> None:
        """Publishes until a message sent from now on crosses, then checks that 50 more
        cross complete and in order."""
        nonlocal sent
        first = sent
        deadline = time.monotonic() + 30
        got: list[int] = []
        while not got or got[-1] < first:
            assert time.monotonic() < deadline, f"nothing crossed the bridge {after}"
            pub.send(_speed_message(sent))
            sent += 1
            data = sub.receive()
            if data is not None:
                got.append(_speed(data))
        crossed_at = sent
        for _ in range(50):
            pub.send(_speed_message(sent))
            sent += 1
        while got[-1] < sent - 1:
            assert time.monotonic() < deadline, f"messages lost {after}: last {got[-1]}"
            data = sub.receive()
            if data is not None:
                got.append(_speed(data))
        after_crossing = [i for i in got if i >= crossed_at]
        assert after_crossing == list(range(crossed_at, sent)), after

    robot_side, laptop_side = serve(), connect()
    flows("at start")
    robot_side.kill()  # no goodbye on the wire; the laptop side keeps running
    robot_side.wait()
    robot_side = serve()
    flows("after the robot side restarted")
    laptop_side.kill()  # its local publisher dies with it; a new one takes the endpoint
    laptop_side.wait()
    laptop_side = connect()
    flows("after the laptop side restarted")
    assert robot_side.poll() is None and laptop_side.poll() is None


FRAME_W, FRAME_H = 64, 32
FRAME_SIZE = FRAME_W * FRAME_H * 3 // 2


def _frame(frame_id: int) -> Any:
    import numpy as np

    return np.random.default_rng(frame_id).integers(0, 256, FRAME_SIZE, dtype=np.uint8)


class RobotBridge:
    """In this process: a PubMaster of vehicleState, a VisionIPC server "camerad" (stream
    0, 4 buffers), the robot side of the bridge (a thread) and raw ZMQ receivers of the
    bridge's wire, one services and one frames socket per name in ``receivers``."""

    def __init__(self, receivers: list[str]) -> None:
        import threading

        import zmq

        from msgq.bridge import Outbound
        from msgq.messaging import PubMaster
        from msgq.visionipc import VisionIpcServer

        port = free_port_pair()
        self.server = VisionIpcServer("camerad")
        self.server.create_buffers(0, 4, FRAME_W, FRAME_H)
        self.server.start_listener()
        self.pm = PubMaster(["vehicleState"])
        self.outbound = Outbound(["vehicleState"], [("camerad", [0])], bind="127.0.0.1",
                                 port=port)
        self.thread = threading.Thread(target=self.outbound.run)
        self.thread.start()
        self.ctx = zmq.Context()
        self.sockets: dict[tuple[str, str], Any] = {}
        for who in receivers:
            for kind, p in (("services", port), ("frames", port + 1)):
                sock = self.ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                # services and frames (not the schema announcements, b"h")
                sock.setsockopt(zmq.SUBSCRIBE, b"s" if kind == "services" else b"v")
                sock.connect(f"tcp://127.0.0.1:{p}")
                self.sockets[who, kind] = sock
        # Until every receiver gets both kinds (ids from 10_000: not part of a test's run).
        deadline = time.monotonic() + 30
        joined: set[tuple[str, str]] = set()
        probe = 10_000
        while len(joined) < len(self.sockets):
            assert time.monotonic() < deadline, f"only {joined} joined"
            self.send(probe)
            probe += 1
            for key in self.sockets:
                if self.take(key, 0 if key in joined else 20) is not None:
                    joined.add(key)
        wait_until(lambda: all(self.take(key, 200) is None for key in self.sockets),
                   what="the probes drained")

    def send(self, i: int) -> None:
        self.pm.send("vehicleState", _speed_message(i))
        self.server.send(0, _frame(i), frame_id=i)

    def take(self, key: tuple[str, str], timeout_ms: int) -> list[bytes] | None:
        sock = self.sockets[key]
        return sock.recv_multipart() if sock.poll(timeout_ms) else None

    def drain(self, key: tuple[str, str]) -> list[list[bytes]]:
        out = []
        while (parts := self.take(key, 0)) is not None:
            out.append(parts)
        return out

    @staticmethod
    def frame_id(parts: list[bytes]) -> int:
        """The frame id of a frame message, after checking its bytes are that frame's."""
        from msgq.bridge.wire import FrameHeader

        frame_id = FrameHeader.unpack(parts[1], FRAME_SIZE).frame_id
        assert parts[2] == _frame(frame_id).tobytes(), f"frame {frame_id} damaged"
        return frame_id

    def close(self) -> None:
        self.outbound.stop()
        self.thread.join(10)
        self.outbound.close()
        for sock in self.sockets.values():
            sock.close()
        self.ctx.term()
        self.pm.close()
        self.server.close()


def test_every_frame_reaches_a_receiver_that_keeps_up(prefix: str) -> None:
    bridge = RobotBridge(["laptop"])
    try:
        for i in range(60):
            bridge.send(i)
            parts = bridge.take(("laptop", "frames"), 3000)
            assert parts is not None, f"frame {i} was lost"
            assert bridge.frame_id(parts) == i
    finally:
        bridge.close()


def test_a_stalled_receiver_loses_no_service_and_holds_back_no_other(prefix: str) -> None:
    """Two receivers on the robot's bridge: one reads as things arrive, one stalls for the
    whole run. The fast one gets every service message as it is sent; the stalled one,
    once it reads, gets every service message in order and only whole frames in order, and
    then follows new frames again."""
    n = 40
    bridge = RobotBridge(["fast", "stalled"])
    try:
        fast_frames = []
        for i in range(n):
            bridge.send(i)
            parts = bridge.take(("fast", "services"), 10_000)
            assert parts is not None and _speed(parts[1]) == i
            fast_frames += bridge.drain(("fast", "frames"))
        while (parts := bridge.take(("fast", "frames"), 500)) is not None:
            fast_frames.append(parts)  # the frames still in flight
        services = [_speed(parts[1]) for parts in bridge.drain(("stalled", "services"))]
        assert services == list(range(n))
        for who, frames in (("fast", fast_frames),
                            ("stalled", bridge.drain(("stalled", "frames")))):
            ids = [bridge.frame_id(parts) for parts in frames]
            assert ids == sorted(set(ids)) and set(ids) <= set(range(n)), (who, ids)
            assert ids, f"no frame reached the {who} receiver"
        # Caught up: the stalled receiver gets frames sent from now on.
        deadline = time.monotonic() + 30
        got = None
        while got is None or bridge.frame_id(got) < n:
            assert time.monotonic() < deadline, "the stalled receiver never caught up"
            bridge.send(n)
            got = bridge.take(("stalled", "frames"), 200)
    finally:
        bridge.close()


def test_schema_announcements_tell_the_same_schema_grown_from_another() -> None:
    import json

    from msgq.bridge.wire import WireError, parse_hello, schema_difference, schema_hello
    from msgq.schemas import msgq_schema

    ours = parse_hello(schema_hello(msgq_schema()))
    assert ours["members"][:2] == ["logStart", "gyroscope"] and ours["root"] == "Event"
    assert schema_difference(ours, dict(ours)) is None
    grown = dict(ours, members=[*ours["members"], "newService"])
    assert schema_difference(ours, grown) is None and schema_difference(grown, ours) is None
    swapped = dict(ours, members=[ours["members"][1], ours["members"][0],
                                  *ours["members"][2:]])
    assert schema_difference(ours, swapped) == \
        "its union member #0 is 'gyroscope', this side's 'logStart'"
    moved = dict(ours, layout=[*ours["layout"][:1], ours["layout"][1] + 1,
                               *ours["layout"][2:]])
    assert "other places" in schema_difference(ours, moved)
    assert "root struct is 'Log'" in schema_difference(ours, dict(ours, root="Log"))
    for bad in (b"not json", json.dumps({"root": "Event"}).encode(), b"[1]",
                json.dumps({"root": "Event", "members": [1], "layout": []}).encode()):
        with pytest.raises(WireError):
            parse_hello(bad)


def test_topics_parse_back_to_their_names_and_never_hold_a_nul() -> None:
    """Topics with keys end in a NUL byte, so a name holding one would read two ways (a
    fuzzer found ``s\\x14`` + seven NULs parsed as a name of seven characters): refused."""
    from msgq.bridge import wire

    for terminated in (False, True):
        assert wire.parse_service_topic(wire.service_topic("gps", terminated)) == "gps"
        assert wire.parse_vision_topic(wire.vision_topic("cam", 3, terminated)) == ("cam", 3)
    for topic in (b"s\x14" + bytes(7), b"sa\x00b", b"sa\x00b\x00"):
        with pytest.raises(wire.WireError, match="NUL"):
            wire.parse_service_topic(topic)
    for topic in (b"va\x00b/0", b"va\x00b/0\x00"):
        with pytest.raises(wire.WireError, match="NUL"):
            wire.parse_vision_topic(topic)


def _listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses on which TCP ``port`` listens here (from /proc/net/tcp: the test
    looks at the kernel's sockets, not at what the bridge says)."""
    found = set()
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            local, state = line.split()[1], line.split()[3]
            address, local_port = local.split(":")
            if state == "0A" and int(local_port, 16) == port:  # 0A: LISTEN
                found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


@pytest.mark.slow
def test_bridge_serve_binds_only_the_address_given(prefix: str) -> None:
    import zmq

    import msgq
    from msgq.bridge.wire import service_topic

    port = free_port_pair()
    serve = subprocess.Popen(
        [sys.executable, "-m", "msgq", "bridge", "serve", "vehicleState", "--bind", "127.0.0.1",
         "--port", str(port), "--duration", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        wait_until(lambda: _listening_addresses(port) and _listening_addresses(port + 1),
                   what="the bridge's two ports listening")
        assert _listening_addresses(port) == {"127.0.0.1"}
        assert _listening_addresses(port + 1) == {"127.0.0.1"}
        # ... and it serves there: a raw ZMQ subscriber gets the service's bytes unchanged.
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt(zmq.SUBSCRIBE, service_topic("vehicleState"))
        pub = msgq.pub_sock("vehicleState")
        data = _speed_message(7)
        received: list[list[bytes]] = []

        def arrived() -> bool:  # the subscription takes a moment to reach the bridge
            pub.send(data)
            if sub.poll(20):
                received.append(sub.recv_multipart())
            return bool(received)

        wait_until(arrived, what="a message through the bridge")
        assert received[0] == [service_topic("vehicleState"), data]
    finally:
        sub.close(0)
        ctx.term()
        serve.terminate()
        _, err = serve.communicate(timeout=30)
    assert "serving 127.0.0.1 unauthenticated" in err

    # An address that is not this machine's: one line that says what --bind takes.
    out = subprocess.run(
        [sys.executable, "-m", "msgq", "bridge", "serve", "vehicleState", "--bind", "192.0.2.1",
         "--port", str(port), "--duration", "5"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"msgq bridge: error: cannot bind 192.0.2.1 on ports {port}/{port + 1}: Cannot assign "
        "requested address (--bind takes an address of this machine, * for every interface; "
        "--port another port)"]
