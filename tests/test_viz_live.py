"""``msgq foxglove``: the live server against real publishers in other processes, checked
with a WebSocket client written here from RFC 6455 and Foxglove's WebSocket protocol
(advertise, subscribe, binary message data), so that what a viewer sees is what is
tested: channels advertised with their JSON Schemas, messages that decode with them at
the decimated rate, SubMaster health, cameras as JPEG, a stalled viewer that does not slow
the publishers, and recovery from a viewer that leaves and a publisher that restarts."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from schema_profiles import ROBOT_SCHEMA, ROBOT_SERVICES
from test_viz_export import validate

from msgq.schemas import Schema

pytest.importorskip("foxglove")

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# --- a Foxglove WebSocket client --------------------------------------------------------------


class FoxgloveClient:
    """A viewer: RFC 6455 framing over a plain socket, Foxglove's protocol on top."""

    def __init__(self, port: int, receive_buffer: int | None = None,
                 timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                           "Sec-WebSocket-Protocol: foxglove.sdk.v1\r\n\r\n").encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        self.channels: dict[int, dict[str, Any]] = {}  # id -> advertised channel
        self.server_info: dict[str, Any] | None = None
        self._subscriptions: dict[int, int] = {}  # subscription id -> channel id
        self._next_subscription = 1

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection")
        return data

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self.buffer += self._recv()
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def frame(self) -> tuple[int, bytes]:
        """The next whole message: (opcode, payload); pings are answered."""
        opcode, payload = None, b""
        while True:
            b0, b1 = self._read(2)
            length = b1 & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(length)
            if mask:
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
            code = b0 & 0x0F
            if code == 9:  # ping
                self._send(10, data)
                continue
            if code == 8:
                raise ConnectionError("close frame")
            if code != 0:
                opcode = code
            payload += data
            if b0 & 0x80:
                assert opcode is not None
                return opcode, payload

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def send_json(self, value: dict[str, Any]) -> None:
        self._send(1, json.dumps(value).encode())

    def next(self) -> tuple[str, Any]:
        """The next protocol message: ("json", dict) for text messages (advertise and
        serverInfo are also remembered), ("data", (channel, log time ns, payload)) for
        message data, ("binary", bytes) for other binary messages."""
        opcode, payload = self.frame()
        if opcode == 1:
            message = json.loads(payload)
            if message.get("op") == "advertise":
                for channel in message["channels"]:
                    self.channels[channel["id"]] = channel
            elif message.get("op") == "unadvertise":
                for channel_id in message["channelIds"]:
                    self.channels.pop(channel_id, None)
            elif message.get("op") == "serverInfo":
                self.server_info = message
            return "json", message
        if payload[0] == 1:  # message data: subscription id, log time, payload
            subscription, log_time = struct.unpack_from("<IQ", payload, 1)
            return "data", (self._subscriptions[subscription], log_time, payload[13:])
        return "binary", payload

    def wait_for(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        """Reads messages until ``condition()`` holds."""
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            self.next()

    def channel(self, topic: str) -> dict[str, Any]:
        self.wait_for(lambda: any(c["topic"] == topic for c in self.channels.values()))
        return next(c for c in self.channels.values() if c["topic"] == topic)

    def subscribe(self, *topics: str) -> None:
        subscriptions = []
        for topic in topics:
            channel = self.channel(topic)
            subscription = self._next_subscription
            self._next_subscription += 1
            self._subscriptions[subscription] = channel["id"]
            subscriptions.append({"id": subscription, "channelId": channel["id"]})
        self.send_json({"op": "subscribe", "subscriptions": subscriptions})

    def messages(self, seconds: float) -> list[tuple[str, int, bytes]]:
        """The message data received in the next ``seconds``: (topic, log time, payload)."""
        out = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            kind, value = self.next()
            if kind == "data":
                channel_id, log_time, payload = value
                out.append((self.channels[channel_id]["topic"], log_time, payload))
        return out

    def close(self) -> None:
        self.sock.close()


# --- publishers in other processes ------------------------------------------------------------

PUBLISHER = textwrap.dedent("""
    import sys, time
    from msgq.messaging import PubMaster, new_message
    service, field, rate, seconds, offset = sys.argv[1], sys.argv[2], float(sys.argv[3]), \\
        float(sys.argv[4]), int(sys.argv[5])
    pm = PubMaster([service])
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        msg = new_message(service, valid=True)
        setattr(getattr(msg, service), field, (offset + n) * 0.5)
        pm.send(service, msg)
        n += 1
        if rate:
            time.sleep(max(0.0, start + n / rate - time.monotonic()))
    print(n, n / (time.monotonic() - start), flush=True)
""")

# msgq's schema: vehicleState.speed; the robot schema: armState.speedLimit (both floats
# that hold n * 0.5 exactly).
PROFILE = {"msgq": ("vehicleState", "speed"), "robot": ("armState", "speedLimit")}


def start_publisher(service: str, field: str, rate: float, seconds: float,
                    offset: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([PYTHON, "-c", PUBLISHER, service, field, str(rate),
                             str(seconds), str(offset)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)


def finish(process: subprocess.Popen[str]) -> tuple[int, float]:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    n, rate = out.split()
    return int(n), float(rate)


def profile_name(schema: Schema) -> str:
    return "robot" if schema.path.endswith("robot.capnp") else "msgq"


# --- tests ---------------------------------------------------------------------------------


def test_channels_values_rates_and_health(schema_profile: Schema) -> None:
    from msgq.viz.live import HEALTH_TOPIC, LiveServer

    service, field = PROFILE[profile_name(schema_profile)]
    publisher = start_publisher(service, field, 100.0, 4.0)
    server = LiveServer([service], port=0, max_rate=20.0, health_rate=5.0).start()
    client = FoxgloveClient(server.port)
    try:
        channel = client.channel(f"/{service}")
        assert channel["encoding"] == "json" and channel["schemaEncoding"] == "jsonschema"
        assert channel["schemaName"] == f"Event.{service}"
        json_schema = json.loads(channel["schema"])
        health_schema = json.loads(client.channel(HEALTH_TOPIC)["schema"])
        client.subscribe(f"/{service}", HEALTH_TOPIC)
        # the publisher started: health says alive, at its rate
        healthy: list[dict[str, Any]] = []

        def alive_and_in_band() -> bool:
            for topic, _, payload in client.messages(0.2):
                if topic == HEALTH_TOPIC:
                    healthy.append(json.loads(payload))
            return bool(healthy) and healthy[-1]["services"][service]["freq_ok"]

        client.wait_for(alive_and_in_band, timeout=10)
        messages = client.messages(1.0)
        data = [(t, p) for topic, t, p in messages if topic == f"/{service}"]
        # decimated to --max-rate (20 Hz) of a 100 Hz publisher
        assert 12 <= len(data) <= 24, len(data)
        values = []
        for log_time, payload in data:
            value = json.loads(payload)
            validate(value, json_schema, json_schema)
            assert value["logMonoTime"] == log_time and value["_which"] == service
            values.append(value[service][field])
        steps = [round((b - a) / 0.5) for a, b in zip(values, values[1:], strict=False)]
        assert all(v * 2 == int(v * 2) for v in values) and min(steps) >= 1
        assert 3 <= sum(steps) / len(steps) <= 8  # about every fifth message
        health = healthy[-1]
        validate(health, health_schema, health_schema)
        entry = health["services"][service]
        assert entry["alive"] and entry["valid"] and entry["expected_hz"] == 100.0
        assert 80 <= entry["freq_hz"] <= 120, entry
        assert entry["received"] > entry["sent"] > 0
    finally:
        client.close()
        server.stop()
        publisher.kill()
        publisher.wait()


FLOOD = textwrap.dedent("""
    import sys, time
    from msgq.messaging import PubMaster, new_message
    seconds, size = float(sys.argv[1]), int(sys.argv[2])
    pm = PubMaster(["cameraFrame"])
    image = bytes(range(256)) * (size // 256)
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        msg = new_message("cameraFrame", valid=True)
        msg.cameraFrame.frameId = n
        msg.cameraFrame.image = image
        pm.send("cameraFrame", msg)
        n += 1
    print(n, n / (time.monotonic() - start), flush=True)
""")


def flood_rate(seconds: float, size: int, during: Callable[[], None] | None = None
               ) -> float:
    """Messages a second a publisher in another process sends of cameraFrame events with
    ``size`` bytes of image, as fast as it can, for ``seconds``; ``during`` runs while it
    sends."""
    process = subprocess.Popen([PYTHON, "-c", FLOOD, str(seconds), str(size)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert process.stdout is not None and process.stdin is not None
        assert process.stdout.readline().strip() == "ready"
        process.stdin.write("go\n")
        process.stdin.flush()
        if during is not None:
            during()
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    return float(out.split()[1])


@pytest.mark.slow
def test_a_stalled_viewer_slows_neither_the_publisher_nor_other_viewers(robot: Schema
                                                                        ) -> None:
    """A viewer that stops reading (a small receive buffer, never read) while a publisher
    floods 32 KiB frames: the publisher's send rate is the one it has with only a
    reading viewer, the server goes on sending to the reading viewer at its rate, and the
    stalled viewer gets a bounded part of the stream."""
    from msgq.viz.live import LiveServer

    server = LiveServer(["cameraFrame"], port=0, max_rate=200.0, backlog=16).start()
    reader = FoxgloveClient(server.port)
    stalled = None
    try:
        reader.subscribe("/cameraFrame")
        received: list[int] = []

        def read_for(seconds: float) -> Callable[[], None]:
            def read() -> None:
                received.append(len([m for m in reader.messages(seconds)
                                     if m[0] == "/cameraFrame"]))
            return read

        # best of two runs each: the machine is shared, and the rates are of a process
        rate_alone = max(flood_rate(1.0, 32 * 1024, read_for(1.0)) for _ in range(2))
        stalled = FoxgloveClient(server.port, receive_buffer=4096)
        stalled.subscribe("/cameraFrame")
        sent_before = server.stats.sent["cameraFrame"]
        rate_stalled = max(flood_rate(1.0, 32 * 1024, read_for(1.0)) for _ in range(2))
        sent_during = server.stats.sent["cameraFrame"] - sent_before
        print(f"publisher: {rate_alone:.0f} msg/s with a reading viewer, "
              f"{rate_stalled:.0f} msg/s with a stalled one too; server sent "
              f"{sent_during} while stalled; the reader got {received}")
        assert rate_stalled > 0.5 * rate_alone, (rate_alone, rate_stalled)
        # the loop never waited for the stalled viewer: the reading one got its share
        assert min(received[2:]) > 0.5 * max(received[:2]) and min(received) > 60, received
        # what the stalled viewer can still read is bounded (its queue dropped the rest)
        stalled.sock.settimeout(0.5)
        backlog = 0
        try:
            while True:
                kind, _ = stalled.next()
                backlog += kind == "data"
        except (TimeoutError, OSError):
            pass
        assert backlog < sent_during / 2, (backlog, sent_during)
    finally:
        reader.close()
        if stalled is not None:
            stalled.close()
        server.stop()


def test_survives_a_viewer_leaving_and_a_publisher_restarting() -> None:
    from msgq.viz.live import HEALTH_TOPIC, LiveServer

    first = start_publisher("vehicleState", "speed", 100.0, 20.0, offset=0)
    server = LiveServer(["vehicleState"], port=0, max_rate=50.0, health_rate=10.0).start()
    second = None
    try:
        leaving = FoxgloveClient(server.port)
        leaving.subscribe("/vehicleState")
        assert any(t == "/vehicleState" for t, _, _ in leaving.messages(0.5))
        leaving.sock.close()  # gone without a close frame, mid-stream
        first.kill()
        first.wait()
        second = start_publisher("vehicleState", "speed", 100.0, 20.0, offset=100_000)
        viewer = FoxgloveClient(server.port)
        viewer.subscribe("/vehicleState", HEALTH_TOPIC)
        restarted: list[float] = []
        health: list[dict[str, Any]] = []

        def new_values_and_alive() -> bool:
            for topic, _, payload in viewer.messages(0.2):
                value = json.loads(payload)
                if topic == HEALTH_TOPIC:
                    health.append(value["services"]["vehicleState"])
                elif value["vehicleState"]["speed"] >= 50_000:
                    restarted.append(value["vehicleState"]["speed"])
            return len(restarted) >= 5 and bool(health) and health[-1]["alive"]

        viewer.wait_for(new_values_and_alive, timeout=15)
        assert server._thread is not None and server._thread.is_alive()
        viewer.close()
    finally:
        server.stop()
        for process in (first, second):
            if process is not None:
                process.kill()
                process.wait()


def _protobuf_fields(data: bytes) -> dict[int, list[Any]]:
    """The top-level fields of a protobuf message (varints and length-delimited)."""
    fields: dict[int, list[Any]] = {}
    at = 0

    def varint() -> int:
        nonlocal at
        value = shift = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while at < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields.setdefault(number, []).append(varint())
        elif wire == 2:
            n = varint()
            fields.setdefault(number, []).append(data[at:at + n])
            at += n
        else:
            raise AssertionError(f"wire type {wire} not expected")
    return fields


def test_cameras_arrive_as_jpeg() -> None:
    """The demo robot's camera process (VisionIPC, 640x480 NV12): frames arrive as
    foxglove.CompressedImage holding a JPEG of --camera-width, at about --camera-rate."""
    from PIL import Image

    from msgq.viz.live import LiveServer

    camera = subprocess.Popen([PYTHON, "-c", "from msgq.demo.robot import run_camera; "
                               "run_camera(15.0)"], cwd=REPO, stderr=subprocess.PIPE)
    server = LiveServer(["roadCameraState"], port=0, cameras=[("camerad", 0)],
                        camera_rate=5.0, camera_width=320).start()
    viewer = FoxgloveClient(server.port)
    try:
        channel = viewer.channel("/camera/camerad/0")
        assert channel["schemaName"] == "foxglove.CompressedImage"
        assert channel["encoding"] == "protobuf"
        viewer.subscribe("/camera/camerad/0")
        frames: list[bytes] = []

        def two_seconds_of_frames() -> bool:
            frames.extend(p for t, _, p in viewer.messages(0.25)
                          if t == "/camera/camerad/0")
            return len(frames) >= 3

        viewer.wait_for(two_seconds_of_frames, timeout=15)
        start = len(frames)
        frames.extend(p for t, _, p in viewer.messages(2.0) if t == "/camera/camerad/0")
        assert 6 <= len(frames) - start <= 12  # 5 a second
        fields = _protobuf_fields(frames[-1])
        jpeg = next(v for values in fields.values() for v in values
                    if isinstance(v, bytes) and v.startswith(b"\xff\xd8"))
        assert b"jpeg" in [v for values in fields.values() for v in values]
        import io

        image = Image.open(io.BytesIO(jpeg))
        assert image.format == "JPEG" and image.size == (320, 240)
    finally:
        viewer.close()
        server.stop()
        camera.kill()
        camera.wait()


def test_cli_serves_the_schema_in_force() -> None:
    """``msgq foxglove --schema ... --registry ...``: the robot's channels, named and
    typed by its schema; the command stops after --duration with exit code 0."""
    process = subprocess.Popen(
        [PYTHON, "-m", "msgq", "foxglove", "--schema", ROBOT_SCHEMA, "--registry",
         ROBOT_SERVICES, "--services", "armState,imu", "--port", "0", "--duration", "3"],
        stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "serving 2 services on ws://127.0.0.1:" in line, line
        port = int(line.split("ws://127.0.0.1:")[1].split()[0])
        viewer = FoxgloveClient(port)
        topics = {viewer.channel(t)["schemaName"] for t in ("/armState", "/imu")}
        assert topics == {"Event.armState", "Event.imu"}
        assert "/msgq/health" in {c["topic"] for c in viewer.channels.values()}
        viewer.close()
        assert process.wait(timeout=20) == 0
        assert "received" in process.stderr.read()
    finally:
        process.kill()
        process.wait()
