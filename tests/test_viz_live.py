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
