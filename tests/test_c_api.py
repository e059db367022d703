"""The C API (msgq.h, libmsgq; visionipc.h, libvisionipc) talks to Python: the C examples
in examples/c are compiled with the flags ``python -m msgq.cflags`` prints and run
against Python publishers and subscribers (PubMaster → C subscriber, pub_sock → C
subscriber, C publisher → sub_sock) and VisionIPC (C camera producer → Python
VisionIpcClient, Python VisionIpcServer → C consumer), linked both to the shared and to
the static libraries."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import fnv1a

import msgq
from msgq import cflags, messaging
from msgq.visionipc import VisionIpcClient, VisionIpcServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "c"

pytestmark = pytest.mark.multiprocess


@pytest.fixture(autouse=True, scope="module")
def c_toolchain() -> None:
    """gcc, binutils and libmsgq are part of the product's set-up (scripts/ensure_env.sh
    installs them): one missing is a broken build that fails these tests, not a skip."""
    for tool in ("gcc", "nm"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run ./test.sh (scripts/ensure_env.sh installs it)")
    missing = cflags.missing()
    if missing:
        pytest.fail(f"msgq was built without its C library ({', '.join(map(str, missing))}): "
                    "rebuild with .venv/bin/python setup.py build_ext --inplace")


def flags(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "msgq.cflags", *args], check=True,
                         capture_output=True, text=True).stdout
    return out.split()


@pytest.fixture(scope="module", params=["shared", "static"])
def programs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    """The C examples, built as a user would build them."""
    out = tmp_path_factory.mktemp(f"c_examples_{request.param}")
    link = ["--libs", "--visionipc"] + (["--static"] if request.param == "static" else [])
    built = {}
    for name in ("raw_publisher", "raw_subscriber", "camera_producer", "camera_consumer"):
        exe = out / name
        cmd = ["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror",
               str(EXAMPLES / f"{name}.c"), *flags("--cflags"), *flags(*link), "-o", str(exe)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        built[name] = exe
    return built


def start_subscriber(exe: Path, endpoint: str, count: int) -> subprocess.Popen[str]:
    """Starts raw_subscriber and returns once it is connected (it prints "ready")."""
    proc = subprocess.Popen([str(exe), endpoint, str(count), "10000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


def finish(proc: subprocess.Popen[str]) -> list[str]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.splitlines()


def test_flags_name_installed_files() -> None:
    assert (cflags.include_dir() / "msgq.h").is_file()
    assert f"-I{cflags.include_dir()}" in flags("--cflags")
    assert "-lmsgq" in flags("--libs")
    assert str(cflags.lib_dir() / "libmsgq.a") in flags("--libs", "--static")


def test_python_pub_sock_to_c_subscriber(programs: dict[str, Path], endpoint: str) -> None:
    sub = start_subscriber(programs["raw_subscriber"], endpoint, 50)
    pub = msgq.pub_sock(endpoint)
    pub.wait_for_readers(timeout=10)
    sent = [bytes([i]) * i for i in range(50)]  # sizes 0..49, the empty message included
    for data in sent:
        pub.send(data)
    assert finish(sub) == [f"{len(d)} {fnv1a(d)}" for d in sent]


def test_pub_master_to_c_subscriber(programs: dict[str, Path]) -> None:
    service = "vehicleState"
    sub = start_subscriber(programs["raw_subscriber"], service, 20)
    pm = messaging.PubMaster([service])
    sent = []
    for i in range(20):
        msg = messaging.new_message(service)
        msg.vehicleState.speed = float(i)
        data = msg.to_bytes()
        pm.send(service, data)
        sent.append(data)
    assert finish(sub) == [f"{len(d)} {fnv1a(d)}" for d in sent]
    # The C side saw exactly the Event bytes: they decode as sent.
    assert messaging.log_from_bytes(sent[-1]).vehicleState.speed == 19.0


def test_c_publisher_to_python_sub_sock(programs: dict[str, Path], endpoint: str) -> None:
    sub = msgq.sub_sock(endpoint, timeout=10000)
    proc = subprocess.Popen([str(programs["raw_publisher"]), endpoint, "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = [sub.receive() for _ in range(100)]
    assert finish(proc) == ["sent 100"]
    assert got == [f"{endpoint} {i}".encode() for i in range(100)]


def test_c_zero_copy_publisher_to_python(programs: dict[str, Path], endpoint: str) -> None:
    size = 100_000
    sub = msgq.sub_sock(endpoint, timeout=10000, segment_size=16 * size)  # holds all five
    proc = subprocess.Popen([str(programs["raw_publisher"]), endpoint, "5", str(size)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = [sub.receive() for _ in range(5)]
    assert finish(proc) == ["sent 5"]
    for i, data in enumerate(got):
        expected = bytes((i + j) % 251 for j in range(size))
        assert data is not None
        assert hashlib.sha256(data).digest() == hashlib.sha256(expected).digest()


def test_c_camera_producer_to_python_client(programs: dict[str, Path]) -> None:
    name, stream, width, height, count = "ccamera", 0, 64, 48, 6
    proc = subprocess.Popen(
        [str(programs["camera_producer"]), name, str(stream), str(width), str(height),
         str(count), "8"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("ready"), proc.stderr.read() if proc.stderr else ""
    assert VisionIpcClient.available_streams(name, False) == {stream}
    client = VisionIpcClient(name, stream, conflate=False)
    try:
        assert client.connect(True)
        assert (client.width, client.height, client.num_buffers) == (width, height, 8)
        assert client.buffer_len == width * height * 3 // 2
        offsets = np.arange(client.buffer_len, dtype=np.uint64)
        for i in range(count):
            buf = client.recv(timeout_ms=5000)
            assert buf is not None
            assert (client.frame_id, client.timestamp_sof, client.timestamp_eof) == (
                i, 1000 + i, 2000 + i)
            assert client.valid
            expected = ((i + offsets) % 251).astype(np.uint8)
            assert np.array_equal(np.frombuffer(buf.data, dtype=np.uint8), expected)
            assert buf.is_current()
        assert proc.stdout.readline().strip() == f"sent {count}"
    finally:
        client.close()
        out, err = proc.communicate("done\n", timeout=30)
    assert proc.returncode == 0, err


def test_python_server_to_c_camera_consumer(programs: dict[str, Path]) -> None:
    name, stream, width, height, count = "pycamera", 3, 64, 48, 5
    with VisionIpcServer(name) as server:
        server.create_buffers(stream, 8, width, height)
        server.start_listener()
        proc = subprocess.Popen([str(programs["camera_consumer"]), name, str(stream),
                                 str(count)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        assert proc.stdout.readline().split()[:2] == ["connected", f"{width}x{height}"]
        size = width * height * 3 // 2
        frames = [bytes([(i * 37 + j) % 256 for j in range(256)]) * (size // 256)
                  for i in range(count)]
        for i, frame in enumerate(frames):
            if i % 2:
                server.send(stream, frame, frame_id=i, timestamp_sof=10 + i,
                            timestamp_eof=20 + i)
            else:  # zero copy
                buf = server.get_buffer(stream)
                buf.data[:] = frame
                server.send(stream, buf, frame_id=i, timestamp_sof=10 + i,
                            timestamp_eof=20 + i)
        lines = finish(proc)
    assert lines == [f"{i} {10 + i} {20 + i} {size} {fnv1a(f)} 1"
                         for i, f in enumerate(frames)]


def test_libvisionipc_uses_only_the_public_msgq_api() -> None:
    """libvisionipc links libmsgq through msgq.h alone: every msgq symbol it needs is
    declared there (a C program can swap libmsgq builds without surprises)."""
    needed = subprocess.run(
        ["nm", "-D", "--undefined-only", str(cflags.lib_dir() / "libvisionipc.so")],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    header = (cflags.include_dir() / "msgq.h").read_text()
    symbols = [s for s in needed if s.startswith(("msgq_", "os_"))]
    assert symbols and all(f"{s}(" in header for s in symbols), symbols
