"""A small viewer of Foxglove's WebSocket protocol (``foxglove.sdk.v1`` subprotocol):
RFC 6455 framing over a plain socket, and the protocol's advertise / subscribe / message
data on top. What the tests and ``python -m msgq.bench.export --live`` use to see what a
Foxglove viewer sees; handy to check a ``msgq foxglove`` server from a script::

    client = FoxgloveClient(8765)
    client.subscribe("/vehicleState")
    for topic, log_time, payload in client.messages(1.0):
        print(topic, json.loads(payload))

Plain ``ws://`` only (no TLS), no compression extension; client frames are masked as
RFC 6455 requires.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

__all__ = ["FoxgloveClient"]



class FoxgloveClient:
    """A viewer connected to the server at ``host:port``. ``receive_buffer``: the
    socket's receive buffer (bytes; small to play a slow viewer). Raises ConnectionError
    when the server refuses the WebSocket upgrade or closes the connection."""

    def __init__(self, port: int, receive_buffer: int | None = None,
                 timeout: float = 5.0, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                           "Sec-WebSocket-Protocol: foxglove.sdk.v1\r\n\r\n").encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"no WebSocket upgrade: {head[:80]!r}")
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

    def _parse(self) -> tuple[int, int, bytes] | None:
        """(fin and opcode byte, opcode, payload) of the whole frame at the start of the
        buffer, consumed; None (nothing consumed) while it is incomplete."""
        buf = self.buffer
        if len(buf) < 2:
            return None
        b0, b1 = buf[0], buf[1]
        length, at = b1 & 0x7F, 2
        if length == 126:
            if len(buf) < 4:
                return None
            length, at = struct.unpack_from(">H", buf, 2)[0], 4
        elif length == 127:
            if len(buf) < 10:
                return None
            length, at = struct.unpack_from(">Q", buf, 2)[0], 10
        mask = None
        if b1 & 0x80:
            if len(buf) < at + 4:
                return None
            mask, at = buf[at:at + 4], at + 4
        if len(buf) < at + length:
            return None
        data = buf[at:at + length]
        self.buffer = buf[at + length:]
        if mask:
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
        return b0, b0 & 0x0F, data

    def frame(self) -> tuple[int, bytes]:
        """The next whole message: (opcode, payload); pings are answered. A socket
        timeout leaves a partly received frame buffered for the next call."""
        opcode, payload = None, b""
        while True:
            parsed = self._parse()
            if parsed is None:
                self.buffer += self._recv()
                continue
            b0, code, data = parsed
            if code == 9:  # ping
                self._send(10, data)
                continue
            if code == 8:
                raise ConnectionError("the server closed the WebSocket")
            if code != 0:
                opcode = code
            payload += data
            if b0 & 0x80 and opcode is not None:
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
        """Sends a protocol message (a text frame)."""
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
        """Reads messages until ``condition()`` holds; TimeoutError after ``timeout``
        seconds."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no such state after {timeout:g} s")
            self.next()

    def channel(self, topic: str) -> dict[str, Any]:
        """The advertised channel of ``topic`` (waits for its advertisement)."""
        self.wait_for(lambda: any(c["topic"] == topic for c in self.channels.values()))
        return next(c for c in self.channels.values() if c["topic"] == topic)

    def subscribe(self, *topics: str) -> None:
        """Subscribes to ``topics`` (waits for their advertisements)."""
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
        timeout = self.sock.gettimeout()
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                try:
                    kind, value = self.next()
                except TimeoutError:
                    break
                if kind == "data":
                    channel_id, log_time, payload = value
                    out.append((self.channels[channel_id]["topic"], log_time, payload))
        finally:
            self.sock.settimeout(timeout)
        return out

    def close(self) -> None:
        """Closes the connection (without a close frame: as a viewer that goes away)."""
        self.sock.close()
