"""VisionIPC: servers and clients over real memfd buffers, Unix sockets and msgq queues,
in one process and across processes."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest
from helpers import open_fds

import msgq
from msgq.visionipc import (
    FRAME_ID_WRITING,
    VisionBuf,
    VisionIpcClient,
    VisionIpcServer,
    VisionStreamType,
    available_streams,
    get_endpoint_name,
)
from msgq.visionipc.names import socket_path
from msgq.visionipc.packet import pack_frame_packet

SPAWN = mp.get_context("spawn")
NAME = "camerad"


def frame_bytes(seed: int, frame_id: int, size: int) -> np.ndarray:
    """The deterministic content of frame ``frame_id``."""
    return np.random.default_rng([seed, frame_id]).integers(0, 256, size, dtype=np.uint8)


def digest(data: object) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()  # type: ignore[arg-type]


def recv_frame(client: VisionIpcClient, timeout_s: float = 10.0) -> VisionBuf:
    """The next frame, failing the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        buf = client.recv(100)
        if buf is not None:
            return buf
    raise AssertionError("no frame arrived")


@pytest.fixture
def server():
    with VisionIpcServer(NAME) as s:
        yield s


def connected_client(stream: int, conflate: bool = False) -> VisionIpcClient:
    client = VisionIpcClient(NAME, stream, conflate)
    assert client.connect(False)
    return client


# --------------------------------------------------------------------------- one process


def test_connect_geometry_nv12_as_upstream(server: VisionIpcServer) -> None:
    server.create_buffers(VisionStreamType.VISION_STREAM_ROAD, 5, 1928, 1208)
    server.start_listener()
    client = VisionIpcClient(NAME, VisionStreamType.VISION_STREAM_ROAD, True)
    assert not client.is_connected() and client.width is None and client.num_buffers == 0
    assert client.connect(True)
    assert client.is_connected()
    assert (client.width, client.height, client.stride) == (1928, 1208, 1928)
    assert client.uv_offset == 1928 * 1208
    assert client.buffer_len == 1928 * 1208 * 3 // 2
    assert client.num_buffers == 5
    assert [b.idx for b in client.buffers] == list(range(5))
    assert len({b.fd for b in client.buffers}) == 5
    client.close()


def test_connect_without_server_is_false_and_recv_times_out() -> None:
    client = VisionIpcClient(NAME, 0, False)
    assert not client.connect(False)
    started = time.monotonic()
    assert client.recv(60) is None
    assert 0.05 <= time.monotonic() - started < 2.0
    client.close()


def test_geometry_with_sizes_and_plane_views(server: VisionIpcServer) -> None:
    w, h, stride, uv_offset = 100, 20, 128, 128 * 24
    size = uv_offset + stride * (h // 2) + 64
    server.create_buffers_with_sizes(3, 2, w, h, size, stride, uv_offset)
    server.start_listener()
    client = connected_client(3)
    assert (client.width, client.height, client.stride) == (w, h, stride)
    assert (client.uv_offset, client.buffer_len) == (uv_offset, size)
    frame = np.zeros(size, dtype=np.uint8)
    for row in range(h):
        frame[row * stride : row * stride + w] = row + 1
    for row in range(h // 2):
        frame[uv_offset + row * stride : uv_offset + row * stride + w] = 200 + row
    server.send(3, frame)
    buf = recv_frame(client)
    assert buf.y.shape == (h, w) and buf.uv.shape == (h // 2, w)
    assert (buf.y[:, 0] == np.arange(1, h + 1)).all() and (buf.y == buf.y[:, :1]).all()
    assert (buf.uv[:, -1] == 200 + np.arange(h // 2)).all()
    assert not buf.y.flags.writeable and buf.data.readonly
    with pytest.raises(ValueError):
        buf.y[0, 0] = 1


def test_available_streams(server: VisionIpcServer) -> None:
    assert available_streams(NAME, False) == set()
    for stream in (0, 2, 2**32 - 1):
        server.create_buffers(stream, 1, 16, 8)
    server.start_listener()
    assert available_streams(NAME, False) == {0, 2, 2**32 - 1}
    assert available_streams("other", False) == set()


def test_available_streams_blocks_until_the_server_is_up() -> None:
    result: list[set[int]] = []
    waiter = threading.Thread(target=lambda: result.append(available_streams(NAME, True)))
    waiter.start()
    with VisionIpcServer(NAME) as s:
        s.create_buffers(9, 1, 16, 8)
        s.start_listener()
        waiter.join(10)
    assert result == [{9}]


def test_round_trip_with_metadata(server: VisionIpcServer) -> None:
    server.create_buffers(1, 4, 64, 48)
    server.start_listener()
    client = connected_client(1)
    frame = frame_bytes(1, 7, 64 * 48 * 3 // 2)
    server.send(1, frame, frame_id=7, timestamp_sof=123, timestamp_eof=2**64 - 1, valid=False)
    buf = recv_frame(client)
    assert bytes(buf.data) == frame.tobytes()
    assert (client.frame_id, client.timestamp_sof, client.timestamp_eof) == (7, 123, 2**64 - 1)
    assert client.valid is False
    assert buf.frame_id == 7 and buf.is_current()
    assert (buf.width, buf.height, buf.stride, buf.uv_offset) == (64, 48, 64, 64 * 48)
    server.send(1, frame, frame_id=8)
    assert recv_frame(client).frame_id == 8 and client.valid is True


def test_buffer_records_recycling(server: VisionIpcServer) -> None:
    server.create_buffers(0, 3, 16, 8)
    server.start_listener()
    client = connected_client(0)
    frame = np.zeros(16 * 8 * 3 // 2, dtype=np.uint8)
    server.send(0, frame, frame_id=1)
    buf = recv_frame(client)
    assert buf.is_current() and buf.frame_id == 1
    for frame_id in (2, 3):
        server.send(0, frame, frame_id=frame_id)
    assert buf.is_current()  # buffers 1 and 2 were used
    writing = server.get_buffer(0)  # the server takes buffer 0 back for a new frame
    assert writing.idx == buf.idx
    assert not buf.is_current() and buf.frame_id == FRAME_ID_WRITING
    server.send(0, writing, frame_id=4)
    assert not buf.is_current() and buf.frame_id == 4
    assert [recv_frame(client).frame_id for _ in range(3)] == [2, 3, 4]
    assert client.recycled_frames == 0
    for frame_id in range(5, 12):
        server.send(0, frame, frame_id=frame_id)
    # The client lagged a whole pool: as upstream, every announced frame is returned with
    # the frame id announced for it, and is_current() tells which buffers were refilled.
    got = []
    for _ in range(7):
        buf = recv_frame(client)
        got.append((client.frame_id, buf.is_current()))
    assert got == [(5, False), (6, False), (7, False), (8, False),
                   (9, True), (10, True), (11, True)]
    assert client.recycled_frames == 4 and client.skipped_frames == 0
    assert client.recv(0) is None


def test_skip_recycled_skips_refilled_buffers(server: VisionIpcServer) -> None:
    server.create_buffers(0, 3, 16, 8)
    server.start_listener()
    client = VisionIpcClient(NAME, 0, False, skip_recycled=True)
    assert client.connect(True)
    frame = np.zeros(16 * 8 * 3 // 2, dtype=np.uint8)
    for frame_id in range(1, 8):
        server.send(0, frame, frame_id=frame_id)
    got = [recv_frame(client).frame_id for _ in range(3)]
    assert got == [5, 6, 7] and client.skipped_frames == 4 and client.recycled_frames == 0
    assert client.recv(0) is None
    client.close()


def test_frame_id_is_the_one_announced_for_each_receive(server: VisionIpcServer) -> None:
    # upstream's test_no_conflate: one buffer, two sends, two receives
    server.create_buffers(0, 1, 16, 8)
    server.start_listener()
    client = connected_client(0)
    frame = bytearray(client.buffer_len)
    server.send(0, frame, frame_id=1)
    server.send(0, frame, frame_id=2)
    buf = client.recv()
    assert buf is not None and client.frame_id == 1 and not buf.is_current()
    buf = client.recv()
    assert buf is not None and client.frame_id == 2 and buf.is_current()
    assert client.recv(0) is None


def test_available_streams_is_a_static_method_too(server: VisionIpcServer) -> None:
    server.create_buffers(3, 1, 16, 8)
    server.create_buffers(9, 1, 16, 8)
    server.start_listener()
    assert VisionIpcClient.available_streams(NAME, False) == {3, 9}
    assert VisionIpcClient.available_streams(NAME, block=True) == available_streams(NAME)
    assert VisionIpcClient.available_streams(NAME + "_none", False) == set()


def test_conflate_and_non_conflate_side_by_side(server: VisionIpcServer) -> None:
    server.create_buffers(5, 8, 32, 16)
    server.start_listener()
    everything, newest = connected_client(5, False), connected_client(5, True)
    size = 32 * 16 * 3 // 2
    for frame_id in range(6):
        server.send(5, frame_bytes(2, frame_id, size), frame_id=frame_id)
    got = []
    while (buf := everything.recv(0)) is not None:
        got.append((everything.frame_id, digest(buf.data)))
    assert got == [(i, digest(frame_bytes(2, i, size))) for i in range(6)]
    buf = newest.recv(0)
    assert buf is not None and newest.frame_id == 5
    assert newest.recv(0) is None


def test_recv_timeout(server: VisionIpcServer) -> None:
    server.create_buffers(0, 2, 16, 8)
    server.start_listener()
    client = connected_client(0)
    for timeout_ms in (0, 50):
        started = time.monotonic()
        assert client.recv(timeout_ms) is None
        elapsed = time.monotonic() - started
        assert timeout_ms / 1000 <= elapsed + 0.002 and elapsed < timeout_ms / 1000 + 1.0


def test_wrong_size_raises_and_sends_nothing(server: VisionIpcServer) -> None:
    server.create_buffers(0, 2, 16, 8)
    server.start_listener()
    client = connected_client(0)
    size = 16 * 8 * 3 // 2
    for bad in (b"", bytes(size - 1), bytes(size + 1), np.zeros(size, np.uint16)):
        with pytest.raises(ValueError, match="192 bytes"):
            server.send(0, bad)
    with pytest.raises(ValueError, match="contiguous"):
        server.send(0, np.zeros((size, 2), np.uint8)[:, 0])
    with pytest.raises(TypeError):
        server.send(0, "not bytes" * 30)
    with pytest.raises(ValueError):
        server.send(0, bytes(size), frame_id=2**32)
    assert client.recv(20) is None
    assert all(b.sequence == 0 for b in client.buffers)  # no buffer was touched
    server.send(0, np.ones((12, 16), np.uint8), frame_id=3)  # any contiguous shape
    assert recv_frame(client).frame_id == 3


def test_zero_copy_send(server: VisionIpcServer) -> None:
    server.create_buffers(0, 2, 64, 32)
    server.create_buffers(1, 2, 64, 32)
    server.start_listener()
    client = connected_client(0)
    buf = server.get_buffer(0)
    buf.y[:] = 16
    buf.uv[:] = 128
    server.send(0, buf, frame_id=42, timestamp_sof=1)
    got = recv_frame(client)
    assert got.idx == buf.idx and client.frame_id == 42
    assert (got.y == 16).all() and (got.uv == 128).all()
    # No copy on either side: the client's mapping shows the server's memory.
    buf.array[0] = 99
    assert got.array[0] == 99
    with pytest.raises(ValueError, match="not a buffer of stream 1"):
        server.send(1, buf)


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40])
def test_stream_id_out_of_range(server: VisionIpcServer, bad: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        server.create_buffers(bad, 1, 16, 8)
    with pytest.raises(ValueError, match="out of range"):
        VisionIpcClient(NAME, bad, False)
    with pytest.raises(ValueError, match="out of range"):
        get_endpoint_name(NAME, bad)
    with pytest.raises(ValueError):
        server.send(bad, b"")


@pytest.mark.parametrize("bad", [1.5, "0", None, True])
def test_stream_id_of_wrong_type(bad: object) -> None:
    with pytest.raises(TypeError):
        VisionIpcClient(NAME, bad, False)  # type: ignore[arg-type]


def test_endpoint_names_and_socket_path(prefix: str) -> None:
    assert get_endpoint_name("camerad", 2) == "visionipc_camerad_2"
    assert get_endpoint_name("x", 2**32 - 1) == "visionipc_x_4294967295"
    path = socket_path("camerad")
    assert os.path.dirname(path).endswith("/" + prefix)
    assert os.path.basename(path) == "visionipc_camerad.sock"
    for bad in ("", "a/b", "x" * 90, "sp ace", "n\0ul"):
        with pytest.raises(ValueError):
            VisionIpcServer(bad)


def test_socket_path_too_long_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_PREFIX", "p" * 60)
    with pytest.raises(ValueError, match="more than the 107"):
        VisionIpcServer("n" * 60).start_listener()


@pytest.mark.parametrize(
    "geometry",
    [
        (0, 8, 32, 0, 100),  # zero width
        (16, 8, 8, 0, 1000),  # stride < width
        (16, 8, 16, 0, 100),  # Y plane does not fit
        (16, 8, 16, 2000, 1000),  # uv_offset outside
        (16, 8, 16, 128, 2**31),  # too large
    ],
)
def test_impossible_geometry(server: VisionIpcServer, geometry: tuple[int, ...]) -> None:
    w, h, stride, uv_offset, size = geometry
    with pytest.raises(ValueError):
        server.create_buffers_with_sizes(0, 2, w, h, size, stride, uv_offset)


def test_buffer_counts_and_duplicate_streams(server: VisionIpcServer) -> None:
    for n in (0, 129):
        with pytest.raises(ValueError):
            server.create_buffers(0, n, 16, 8)
    server.create_buffers(0, 1, 16, 8)
    with pytest.raises(ValueError, match="already has buffers"):
        server.create_buffers(0, 1, 16, 8)
    with pytest.raises(ValueError, match="create_buffers first"):
        server.send(1, b"")


def test_many_streams_one_server(server: VisionIpcServer) -> None:
    geometries = {0: (16, 8), 1: (32, 16), 7: (64, 8)}
    for stream, (w, h) in geometries.items():
        server.create_buffers(stream, 2, w, h)
    server.start_listener()
    clients = {stream: connected_client(stream) for stream in geometries}
    for stream, (w, h) in geometries.items():
        server.send(stream, frame_bytes(stream, 0, w * h * 3 // 2), frame_id=stream)
    for stream, (w, h) in geometries.items():
        buf = recv_frame(clients[stream])
        assert clients[stream].frame_id == stream and (buf.width, buf.height) == (w, h)
        assert bytes(buf.data) == frame_bytes(stream, 0, w * h * 3 // 2).tobytes()


def test_close_frees_everything() -> None:
    threads_before = set(threading.enumerate())
    fds_before = open_fds()
    server = VisionIpcServer(NAME)
    server.create_buffers(0, 4, 64, 32)
    server.start_listener()
    path = server.socket_path
    client = connected_client(0)
    server.send(0, bytes(64 * 32 * 3 // 2))
    buf = recv_frame(client)
    view = buf.y  # a view the user still holds keeps its mapping valid
    assert os.path.exists(path)
    client.close()
    server.close()
    server.close()  # idempotent
    assert not os.path.exists(path)
    assert set(threading.enumerate()) == threads_before
    assert view.sum() == 0
    del view
    assert open_fds() <= fds_before
    with pytest.raises(ValueError, match="released"):
        _ = buf.data
    with pytest.raises(msgq.IpcError, match="closed"):
        server.send(0, b"")
    with pytest.raises(msgq.IpcError, match="closed"):
        client.recv(0)


def test_newer_server_takes_the_name_over() -> None:
    old = VisionIpcServer(NAME)
    old.create_buffers(0, 2, 16, 8)
    old.start_listener()
    new = VisionIpcServer(NAME)
    new.create_buffers(0, 2, 32, 16)
    new.start_listener()
    client = connected_client(0)
    assert client.width == 32 and client.server_id == new.server_id
    old.close()  # must not remove the newer server's socket
    assert os.path.exists(new.socket_path)
    new.close()
    assert not os.path.exists(new.socket_path)


@pytest.mark.multiprocess
def test_a_forked_copy_closing_leaves_the_parent_serving(server: VisionIpcServer) -> None:
    server.create_buffers(0, 2, 16, 8)
    server.start_listener()
    pid = os.fork()
    if pid == 0:  # the child's copy of the server goes away
        try:
            server.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.path.exists(server.socket_path)
    client = connected_client(0)
    server.send(0, bytes(192), frame_id=3)
    assert recv_frame(client).frame_id == 3


def test_garbage_packets_are_skipped_and_counted() -> None:
    first = VisionIpcServer(NAME)
    first.create_buffers(0, 2, 16, 8)
    first.start_listener()
    client = connected_client(0)
    sid = first.server_id
    first.send(0, np.zeros(16 * 8 * 3 // 2, dtype=np.uint8), frame_id=1)  # buffer 0: seq 1
    assert recv_frame(client) is not None
    # Another process on the endpoint writes everything but valid packets.
    rogue = msgq.pub_sock(get_endpoint_name(NAME, 0))
    good = pack_frame_packet(sid, 1, 0, 0, 0, 0, True)
    garbage = [
        b"",
        b"x",
        good[:-1],
        good + b"\0",
        b"XXXX" + good[4:],
        good[:4] + b"\x02\x00" + good[6:],  # other version
        good[:6] + b"\x02\x00" + good[8:],  # unknown flag
        pack_frame_packet(sid, 2, 2, 0, 0, 0, True),  # no buffer 2
        pack_frame_packet(0, 1, 0, 0, 0, 0, True),  # server id 0
        pack_frame_packet(sid, 0, 0, 0, 0, 0, True),  # sequence 0
        os.urandom(48),
    ]
    for msg in garbage:
        rogue.send(msg)
    rogue.send(pack_frame_packet(sid, 7, 0, 0, 0, 0, True))  # buffer 0 holds no frame 7
    for _ in range(3):
        rogue.send(pack_frame_packet(12345, 1, 0, 0, 0, 0, True))  # no such server
    assert client.recv(50) is None
    assert client.bad_packets == len(garbage) + 1 and client.recycled_frames == 0
    assert client.stale_packets == 3 and client.server_id == sid
    rogue.close()
    first.close()
    # A real server again: frames flow.
    with VisionIpcServer(NAME) as second:
        second.create_buffers(0, 2, 16, 8)
        second.start_listener()
        second.send(0, bytes(192), frame_id=5)
        assert recv_frame(client).frame_id == 5 and client.reconnects == 1


def test_announcements_follow_the_selected_backend(backend: str) -> None:
    with VisionIpcServer(NAME) as s:
        s.create_buffers(0, 2, 16, 8)
        s.start_listener()
        client = connected_client(0)
        deadline = time.monotonic() + 10
        buf = None
        while buf is None:  # ZMQ subscriptions take a moment to reach the publisher
            assert time.monotonic() < deadline
            s.send(0, np.full(192, 9, np.uint8), frame_id=1)
            buf = client.recv(20)
        assert client.frame_id == 1 and bytes(buf.data) == bytes([9]) * 192
        client.close()


# --------------------------------------------------------------------------- processes

FRAME_W, FRAME_H = 320, 240
FRAME_SIZE = FRAME_W * FRAME_H * 3 // 2


def client_hashes_frames(stream: int, n: int, ready, received, results) -> None:
    """Child: receive ``n`` frames, releasing ``received`` after each; report
    (frame_id, sha256) of each and the client's counters."""
    client = VisionIpcClient(NAME, stream, False)
    client.connect(True)
    ready.set()
    got = []
    while len(got) < n:
        buf = client.recv(5000)
        if buf is None:
            break
        got.append((client.frame_id, digest(buf.data), buf.is_current()))
        received.release()
    results.put((got, client.skipped_frames, client.bad_packets))


@pytest.mark.multiprocess
@pytest.mark.parametrize("clients", [1, 2])
def test_frames_to_client_processes_exact_and_in_order(clients: int) -> None:
    n, num_buffers = 100, 4
    with VisionIpcServer(NAME) as s:
        s.create_buffers(0, num_buffers, FRAME_W, FRAME_H)
        s.start_listener()
        results = SPAWN.Queue()
        readies = [SPAWN.Event() for _ in range(clients)]
        # The server never gets more than num_buffers - 1 frames ahead of a client, so no
        # buffer is refilled while a client may still read it.
        received = [SPAWN.Semaphore(num_buffers - 1) for _ in range(clients)]
        children = [
            SPAWN.Process(
                target=client_hashes_frames, args=(0, n, readies[i], received[i], results)
            )
            for i in range(clients)
        ]
        for c in children:
            c.start()
        try:
            for ready in readies:
                assert ready.wait(30)
            for frame_id in range(n):
                for sem in received:
                    assert sem.acquire(timeout=30)
                s.send(0, frame_bytes(3, frame_id, FRAME_SIZE), frame_id=frame_id)
            reports = [results.get(timeout=30) for _ in children]
        finally:
            for c in children:
                c.join(30)
    expected = [(i, digest(frame_bytes(3, i, FRAME_SIZE)), True) for i in range(n)]
    for got, skipped, bad in reports:
        assert got == expected
        assert skipped == 0 and bad == 0
    assert all(c.exitcode == 0 for c in children)


def serve_until_stopped(width: int, height: int, first_frame: int, stop, settle=None,
                        last_frames: int = 0) -> None:
    """Child: a server sending a frame every 2 ms (frame ids from ``first_frame``, bytes
    ``frame_id % 251``) until ``settle`` (if given) or ``stop`` is set. After ``settle``
    it sends ``last_frames`` more frames, ids from 20_000, and nothing else until ``stop``."""
    with VisionIpcServer(NAME) as s:
        s.create_buffers(0, 4, width, height)
        s.start_listener()
        frame_id = first_frame
        until = settle if settle is not None else stop
        while not until.wait(0.002):
            s.send(0, np.full(width * height * 3 // 2, frame_id % 251, np.uint8), frame_id)
            frame_id += 1
        for frame_id in range(20_000, 20_000 + last_frames):
            s.send(0, np.full(width * height * 3 // 2, frame_id % 251, np.uint8), frame_id)
        stop.wait(60)


@pytest.mark.multiprocess
def test_client_survives_server_restarts() -> None:
    # One event per child: setting an Event a SIGKILLed process was waiting on blocks.
    stop_first, stop, settle = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
    first = SPAWN.Process(target=serve_until_stopped, args=(64, 32, 0, stop_first))
    first.start()
    client = VisionIpcClient(NAME, 0, False)
    second = None
    try:
        assert client.connect(True)
        assert client.width == 64
        ids = []
        for _ in range(5):  # the buffer may be refilled meanwhile: take the announced id
            recv_frame(client)
            ids.append(client.frame_id)
        assert ids == sorted(set(ids))
        old_server = client.server_id
        os.kill(first.pid, signal.SIGKILL)  # no cleanup: its socket file stays behind
        first.join(10)
        # The second server streams until the client has followed it, then sends three
        # last frames into its four buffers and stops: none of them can be refilled while
        # the client reads it.
        second = SPAWN.Process(target=serve_until_stopped,
                               args=(128, 64, 10_000, stop, settle, 3))
        second.start()
        deadline = time.monotonic() + 30
        while True:  # frames of the first server may still be queued
            buf = recv_frame(client, 30)
            if client.frame_id >= 10_000:
                break
            assert time.monotonic() < deadline
        assert client.server_id != old_server and client.reconnects == 1
        assert (client.width, client.height, client.buffer_len) == (128, 64, 128 * 64 * 3 // 2)
        assert (buf.width, buf.height) == (128, 64)
        settle.set()
        while client.frame_id < 20_000:
            buf = recv_frame(client)
        last = []
        while True:
            assert bytes(buf.data) == bytes([client.frame_id % 251]) * (128 * 64 * 3 // 2)
            last.append(client.frame_id)
            if len(last) == 3:
                break
            buf = recv_frame(client)
        assert last == [20_000, 20_001, 20_002]
    finally:
        stop.set()
        client.close()
        for p in (first, second):
            if p is not None:
                p.join(10)
                if p.is_alive():
                    p.kill()
    assert second is not None and second.exitcode == 0
