"""A live view of a running system: every service served over Foxglove's WebSocket
protocol (with ``foxglove-sdk``), on the same JSON channels as the MCAP export, plus the
SubMaster health of every service as a channel of its own.

It is a subscriber like any other, and a careful one:

* its sockets conflate (a SubMaster's): it reads the newest message of each service, so a
  publisher never waits for it (msgq's ring never waits for readers anyway) and a burst
  costs it one message, not a backlog;
* each service goes out at most ``max_rate`` times a second (the newest message when the
  slot is due; the others are counted, not converted), and only while a viewer is
  subscribed to it — a service nobody watches costs a peek at its bytes;
* the SDK keeps a bounded queue per viewer (``backlog`` messages) and drops the oldest
  data when a viewer falls behind: a stalled viewer never blocks the loop;
* a viewer that disconnects is simply gone; a publisher that restarts is read again as
  soon as it sends (the sockets stay subscribed).

Health (``/msgq/health``, ``health_rate`` times a second, stamped with the newest
logMonoTime received, so that it shares the data's timeline, a replay's too): per
service ``alive``,
``valid``, ``freq_ok``, the measured rate (``freq_hz``, SubMaster's average) beside the
expected one (``expected_hz``), and what the server received, sent and dropped by
decimation.

Cameras (``cameras``: VisionIPC ``(server name, stream id)`` pairs): the newest frame of
each stream, at most ``camera_rate`` a second, scaled down to ``camera_width`` and
JPEG-compressed with Pillow, as ``foxglove.CompressedImage`` on ``/camera/<name>/<stream>``.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from msgq import clock
from msgq.errors import MessageDecodeError
from msgq.messaging import SubMaster
from msgq.schemas import Schema, schema_in_force
from msgq.visionipc import VisionIpcClient
from msgq.viz import require
from msgq.viz.json_schema import encode_json, event_converter

__all__ = ["HEALTH_TOPIC", "LiveServer", "LiveStats", "health_json_schema"]

#: The topic of the health channel.
HEALTH_TOPIC = "/msgq/health"


@dataclass
class LiveStats:
    """What the server has done so far, per service."""

    received: dict[str, int] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    decimated: dict[str, int] = field(default_factory=dict)  # received, not sent
    bad: dict[str, int] = field(default_factory=dict)  # not an Event of the service
    frames_sent: int = 0
    loops: int = 0


def health_json_schema(services: list[str]) -> dict[str, Any]:
    """The JSON Schema of the health channel's messages for ``services``."""
    entry = {
        "type": "object",
        "properties": {
            "alive": {"type": "boolean"}, "valid": {"type": "boolean"},
            "freq_ok": {"type": "boolean"},
            "freq_hz": {"type": "number", "description": "measured receive rate (SubMaster)"},
            "expected_hz": {"type": "number", "description": "the registry's rate (0: "
                                                             "event-driven)"},
            "received": {"type": "integer"}, "sent": {"type": "integer"},
            "decimated": {"type": "integer"}, "bad": {"type": "integer"},
        },
        "required": ["alive", "valid", "freq_ok", "freq_hz", "expected_hz", "received",
                     "sent", "decimated", "bad"],
    }
    return {
        "type": "object", "title": "msgq.Health",
        "properties": {
            "all_alive": {"type": "boolean"}, "all_freq_ok": {"type": "boolean"},
            "all_valid": {"type": "boolean"},
            "services": {"type": "object",
                         "properties": {s: entry for s in services},
                         "additionalProperties": False},
        },
        "required": ["all_alive", "all_freq_ok", "all_valid", "services"],
    }


class LiveServer:
    """Serves ``services`` (default: every service of the registry in force) of the
    current namespace to Foxglove viewers on ``host:port`` (port 0: a free one, see
    :attr:`port`). Call :meth:`run` (blocks until :meth:`stop`) or :meth:`start` (a
    thread). Raises :class:`msgq.viz.MissingExtraError` without ``foxglove-sdk``."""

    def __init__(
        self,
        services: list[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        max_rate: float = 30.0,
        health_rate: float = 2.0,
        backlog: int = 256,
        cameras: list[tuple[str, int]] | None = None,
        camera_rate: float = 5.0,
        camera_width: int = 320,
        schema: Schema | None = None,
        name: str = "msgq",
    ) -> None:
        if max_rate <= 0:
            raise ValueError(f"max_rate must be > 0 Hz, not {max_rate}")
        foxglove = require("foxglove")
        self._foxglove: Any = foxglove
        if cameras:
            require("PIL.Image")  # Pillow compresses the camera frames to JPEG
        self.schema = schema_in_force(schema)
        registry = self.schema.services
        self.services = list(dict.fromkeys(services if services is not None else registry))
        for s in self.services:
            registry[s]  # KeyError naming close matches
        self.max_rate = float(max_rate)
        self.health_rate = float(health_rate)
        self.cameras = list(cameras or [])
        self.camera_rate = float(camera_rate)
        self.camera_width = int(camera_width)
        self.stats = LiveStats()
        self._converter = event_converter(self.schema)
        self._layout = self.schema.layout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sub_master = SubMaster(self.services, schema=self.schema)
        self.context = foxglove.Context()
        self.server = foxglove.start_server(name=name, host=host, port=port,
                                            context=self.context,
                                            message_backlog_size=backlog)
        self.channels: dict[str, Any] = {}
        for s in self.services:
            json_schema = self._converter.json_schema(s)
            self.channels[s] = foxglove.Channel(
                f"/{s}", message_encoding="json", context=self.context,
                schema=foxglove.Schema(name=self._converter.schema_name(s),
                                       encoding="jsonschema",
                                       data=encode_json(json_schema)),
                metadata={"expected_hz": f"{registry[s].frequency:g}"})
        self.health_channel = foxglove.Channel(
            HEALTH_TOPIC, message_encoding="json", context=self.context,
            schema=foxglove.Schema(name="msgq.Health", encoding="jsonschema",
                                   data=encode_json(health_json_schema(self.services))))
        self._camera_channels: dict[tuple[str, int], Any] = {}
        if self.cameras:
            # foxglove-sdk: the viz extra, which require() checked above
            from foxglove.channels import CompressedImageChannel

            for camera in self.cameras:
                self._camera_channels[camera] = CompressedImageChannel(
                    f"/camera/{camera[0]}/{camera[1]}", context=self.context)

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        return int(self.server.port)

    # -- running ----------------------------------------------------------------------

    def start(self) -> LiveServer:
        """Runs :meth:`run` in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.run, name="msgq-foxglove", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the loop and the server (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.server.stop()

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self, duration: float | None = None) -> LiveStats:
        """Serves until :meth:`stop` (or ``duration`` seconds); returns the stats."""
        sm = self.sub_master
        poller = sm.poller
        service_of = {id(sock): s for s, sock in sm.sock.items()}
        period = 1.0 / self.max_rate
        next_due = dict.fromkeys(self.services, 0.0)
        pending: dict[str, tuple[int, bytes]] = {}
        received, decimated, bad = self.stats.received, self.stats.decimated, self.stats.bad
        for s in self.services:
            received[s] = decimated[s] = bad[s] = self.stats.sent[s] = 0
        health_period = 1.0 / self.health_rate if self.health_rate > 0 else None
        next_health = 0.0
        latest_mono = 0  # the newest logMonoTime received: the health's time stamp
        cameras = _Cameras(self) if self.cameras else None
        deadline = None if duration is None else time.monotonic() + duration
        identify = self._layout.identify
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            if self.services:
                ready = poller.poll(20)
            else:  # cameras only: nothing to poll
                ready = []
                time.sleep(0.01)
            now = clock.monotonic()
            peeked = []
            for sock in ready:
                s = service_of[id(sock)]
                data = sock.receive(non_blocking=True)
                if data is None:
                    continue
                identity = identify(data)
                if identity is None or identity[2] != s:
                    bad[s] += 1
                    continue
                received[s] += 1
                peeked.append(_Peeked(s, identity[0], identity[1], data))
                if s in pending:
                    decimated[s] += 1
                pending[s] = (identity[0], data)
                if identity[0] > latest_mono:
                    latest_mono = identity[0]
            sm.update_msgs(now, peeked)
            for s in list(pending):
                if now < next_due[s]:
                    continue
                mono, data = pending.pop(s)
                channel = self.channels[s]
                if not channel.has_sinks():
                    decimated[s] += 1
                    continue
                next_due[s] = max(now, next_due[s] + period)
                self._send(s, channel, mono, data)
            if health_period is not None and now >= next_health:
                next_health = now + health_period
                if self.health_channel.has_sinks():
                    self.health_channel.log(encode_json(self.health()),
                                            log_time=latest_mono or clock.monotonic_ns())
            if cameras is not None:
                cameras.poll(now)
            self.stats.loops += 1
        if cameras is not None:
            cameras.close()
        return self.stats

    def _send(self, service: str, channel: Any, mono: int, data: bytes) -> None:
        try:
            event = self.schema.decode(data)
        except MessageDecodeError:
            self.stats.bad[service] += 1
            return
        channel.log(self._converter.dumps(service, self._converter.to_json(event)),
                    log_time=mono)
        self.stats.sent[service] += 1

    def health(self) -> dict[str, Any]:
        """The health message: SubMaster's flags and rates per service, and the
        server's counts."""
        sm = self.sub_master
        freq = sm.freq
        registry = self.schema.services
        stats = self.stats
        return {
            "all_alive": sm.all_alive(), "all_freq_ok": sm.all_freq_ok(),
            "all_valid": sm.all_valid(),
            "services": {s: {"alive": sm.alive[s], "valid": sm.valid[s],
                             "freq_ok": sm.freq_ok[s], "freq_hz": round(freq[s], 3),
                             "expected_hz": registry[s].frequency,
                             "received": stats.received.get(s, 0),
                             "sent": stats.sent.get(s, 0),
                             "decimated": stats.decimated.get(s, 0),
                             "bad": stats.bad.get(s, 0)}
                         for s in self.services},
        }


class _Peeked:
    """What :meth:`SubMaster.update_msgs` reads of an Event (``which()``, ``logMonoTime``,
    ``valid``, the payload), peeked from its bytes without decoding: the payload is the
    Event's bytes, which SubMaster keeps undecoded until someone reads it."""

    __slots__ = ("_service", "_data", "logMonoTime", "valid")

    def __init__(self, service: str, mono: int, valid: bool, data: bytes) -> None:
        self._service = service
        self._data = data
        self.logMonoTime = mono  # noqa: N815 (the Event's field name)
        self.valid = valid

    def which(self) -> str:
        return self._service

    def __getattr__(self, name: str) -> Any:
        if name == self._service:
            return self._data
        raise AttributeError(name)


class _Cameras:
    """The VisionIPC clients of the server's cameras: the newest frame of each stream at
    most ``camera_rate`` a second, JPEG-compressed."""

    def __init__(self, server: LiveServer) -> None:
        self.server = server
        self.clients = {c: VisionIpcClient(c[0], c[1], True) for c in server.cameras}
        self.next_due = dict.fromkeys(server.cameras, 0.0)
        self.period = 1.0 / server.camera_rate if server.camera_rate > 0 else 1.0

    def poll(self, now: float) -> None:
        for camera, client in self.clients.items():
            if now < self.next_due[camera]:
                continue
            channel = self.server._camera_channels[camera]
            if not client.is_connected() and not client.connect(False):
                self.next_due[camera] = now + 1.0  # try again in a second
                continue
            buf = client.recv(timeout_ms=0)
            if buf is None:
                continue
            self.next_due[camera] = now + self.period
            if not channel.has_sinks():
                continue
            jpeg = nv12_to_jpeg(buf.data, buf.width, buf.height, buf.stride, buf.uv_offset,
                                self.server.camera_width)
            # foxglove-sdk: the viz extra, which require() checked
            from foxglove.messages import CompressedImage, Timestamp

            sof = int(client.timestamp_sof) or clock.monotonic_ns()
            message = CompressedImage(timestamp=Timestamp(sof // 10**9, sof % 10**9),
                                      frame_id=f"{camera[0]}/{camera[1]}", data=jpeg,
                                      format="jpeg")
            channel.log(message, log_time=sof)
            self.server.stats.frames_sent += 1

    def close(self) -> None:
        self.clients.clear()


def nv12_to_jpeg(data: Any, width: int, height: int, stride: int, uv_offset: int,
                 out_width: int, quality: int = 75) -> bytes:
    """A VisionIPC NV12 frame (``data``: its buffer) as JPEG bytes, scaled to
    ``out_width`` pixels wide (aspect kept), with Pillow."""
    # Pillow: only for cameras (LiveServer says what to install without it)
    from PIL import Image

    raw = np.frombuffer(data, dtype=np.uint8)
    y = raw[: stride * height].reshape(height, stride)[:, :width]
    uv = raw[uv_offset: uv_offset + stride * (height // 2)].reshape(height // 2, stride)
    u = uv[:, 0:width:2]
    v = uv[:, 1:width:2]
    # Pillow's YCbCr mode takes full-resolution planes: upsample the chroma 2x2.
    cb = np.repeat(np.repeat(u, 2, axis=0), 2, axis=1)[:height, :width]
    cr = np.repeat(np.repeat(v, 2, axis=0), 2, axis=1)[:height, :width]
    image = Image.merge("YCbCr", [Image.fromarray(np.ascontiguousarray(p)) for p in (y, cb, cr)])
    if out_width and out_width < width:
        image = image.resize((out_width, max(1, height * out_width // width)))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()
