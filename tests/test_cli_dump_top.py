"""``msgq dump`` and ``msgq top`` run as subprocesses against real publisher processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from helpers import interrupt, run_cli

from msgq.messaging import log_from_bytes

pytestmark = pytest.mark.multiprocess

def _msgq(*args: str, timeout: float = 30,
          expect: int | None = 0) -> subprocess.CompletedProcess[str]:
    """``msgq ARGS``; any exit code but ``expect`` fails with its stdout and stderr."""
    return run_cli(*args, timeout=timeout, expect=expect)


Publisher = Callable[..., subprocess.Popen[str]]  # the publisher fixture of conftest.py
#: What the publisher writes into vehicleState: speed = message number, gear = drive.
VEHICLE = ("--value", "speed", "--text", "gear=drive")


def test_dump_prints_the_values_sent(publisher: Publisher) -> None:
    publisher(*VEHICLE, vehicleState=100)
    out = _msgq("dump", "vehicleState", "--values", "speed", "--count", "20")
    values = [float(line) for line in out.stdout.split()]
    assert len(values) == 20
    # consecutive messages, none skipped or repeated
    assert values == [values[0] + i for i in range(20)]


def test_dump_text_json_and_raw(publisher: Publisher) -> None:
    publisher(*VEHICLE, vehicleState=100)
    text = _msgq("dump", "vehicleState", "--count", "1")
    assert text.stdout.startswith("vehicleState logMonoTime=")
    assert "gear = drive" in text.stdout
    js = _msgq("dump", "vehicleState", "--json", "--count", "3")
    docs = [json.loads(line) for line in js.stdout.splitlines()]
    assert len(docs) == 3 and all(d["service"] == "vehicleState" and d["valid"] for d in docs)
    speeds = [d["vehicleState"]["speed"] for d in docs]
    assert speeds == [speeds[0], speeds[0] + 1, speeds[0] + 2]
    raw = _msgq("dump", "vehicleState", "--raw", "--count", "1")
    service, hexdata = raw.stdout.split()
    assert service == "vehicleState"
    msg = log_from_bytes(bytes.fromhex(hexdata))
    assert msg.which() == "vehicleState" and msg.vehicleState.gear == "drive"


def test_dump_errors() -> None:
    unknown = _msgq("dump", "vehicleStat", expect=2)
    assert "did you mean 'vehicleState'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    silent = _msgq("dump", "gpsLocation", "--timeout", "0.5", expect=1)
    assert "no message on gpsLocation" in silent.stderr


@pytest.mark.slow
def test_dump_waiting_names_its_namespace(prefix: str) -> None:
    # after 2 s without a message, one line says where it listens and what to check
    waited = _msgq("dump", "gpsLocation", "--timeout", "2.5", expect=1)
    assert waited.stderr.splitlines()[0] == (
        f"msgq dump: waiting for gpsLocation in namespace {prefix!r} (MSGQ_PREFIX): no "
        "publisher yet? (a publisher needs the same MSGQ_PREFIX)")


def test_dump_values_of_no_such_field_lists_the_fields() -> None:
    # pycapnp's own error for an unknown field is C++ text with stack addresses: the
    # command checks the path against the schema before subscribing, one line, exit 2.
    for path, expected in [
        ("nosuchfield", "vehicleState has no field 'nosuchfield' (its fields: speed, "),
        ("cruiseState.sped", "did you mean 'setSpeed'? (its fields: enabled, available, "),
        ("speed.unit", "vehicleState.speed is a float, not a struct"),
    ]:
        proc = _msgq("dump", "vehicleState", "--values", path, expect=2)
        line = proc.stderr.strip()
        assert "\n" not in line and expected in line, line
        assert "0x" not in line and "kj/" not in line and "capnp/" not in line


def test_dump_stops_on_ctrl_c(publisher: Publisher) -> None:
    publisher(*VEHICLE, vehicleState=50)
    proc = subprocess.Popen([sys.executable, "-m", "msgq", "dump", "vehicleState",
                             "--values", "speed"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    assert proc.stdout is not None
    proc.stdout.readline()  # it is printing
    interrupt(proc, 130)


@pytest.mark.slow
def test_top_reports_rates_readers_and_liveness(publisher: Publisher) -> None:
    import msgq

    publisher(*VEHICLE, vehicleState=100, gpsLocation=10)
    extra_reader = msgq.sub_sock("gpsLocation")
    out = _msgq("top", "--once", "--json", "--interval", "3")
    doc = json.loads(out.stdout)
    rows = {r["service"]: r for r in doc["services"]}
    assert set(rows) == {"vehicleState", "gpsLocation"}
    # The publisher keeps its schedule (a late one sends everything due at once), so over
    # 3 s top counts the rate; load can only delay messages past the window's end or
    # stretch the measured interval, both of which lower the figure, never raise it.
    assert 70 <= rows["vehicleState"]["measured_hz"] <= 110, rows["vehicleState"]
    assert 7 <= rows["gpsLocation"]["measured_hz"] <= 11, rows["gpsLocation"]
    assert rows["vehicleState"]["expected_hz"] == 100.0
    assert rows["gpsLocation"]["readers"] == 1 and rows["vehicleState"]["readers"] == 0
    assert rows["vehicleState"]["alive"] and rows["gpsLocation"]["alive"]
    assert rows["vehicleState"]["bytes_per_s"] > 100 * 50
    extra_reader.close()


@pytest.mark.slow  # four commands and a ZMQ publisher: 8 s
def test_dump_and_top_read_the_publisher_at_addr(publisher: Publisher,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # --addr is the publisher's host on the ZMQ backend: 127.0.0.1 reaches ours, an
    # address of TEST-NET-1 (RFC 5737, never routed) reaches nobody
    monkeypatch.setenv("MSGQ_BACKEND", "zmq")
    monkeypatch.delenv("ZMQ", raising=False)
    publisher(*VEHICLE, vehicleState=100)
    out = _msgq("dump", "vehicleState", "--addr", "127.0.0.1", "--values", "speed",
                "--count", "3")
    values = [float(v) for v in out.stdout.split()]
    assert values == [values[0], values[0] + 1, values[0] + 2]
    nowhere = _msgq("dump", "vehicleState", "--addr", "192.0.2.1", "--timeout", "0.5",
                    expect=1)
    assert "no message on vehicleState" in nowhere.stderr
    here = json.loads(_msgq("top", "--once", "--json", "--addr", "127.0.0.1", "--interval",
                            "0.5", "--services", "vehicleState").stdout)
    (row,) = here["services"]
    assert here["backend"] == "zmq" and row["messages"] > 0 and row["alive"], row
    away = json.loads(_msgq("top", "--once", "--json", "--addr", "192.0.2.1", "--interval",
                            "0.5", "--services", "vehicleState").stdout)
    assert away["services"] == []


def test_top_table_and_dead_publisher(publisher: Publisher) -> None:
    proc = publisher(*VEHICLE, vehicleState=100)
    table = _msgq("top", "--once", "--interval", "0.5")
    lines = table.stdout.splitlines()
    assert lines[1].split()[:3] == ["service", "expected", "Hz"]
    assert any(line.startswith("vehicleState") and "yes" in line for line in lines)
    assert "\x1b[" not in table.stdout  # no colour when not on a terminal
    proc.kill()
    proc.wait()
    gone = json.loads(_msgq("top", "--once", "--json", "--interval", "0.3").stdout)
    assert gone["services"] == []
    listed = json.loads(_msgq("top", "--once", "--json", "--all", "--interval", "0.3").stdout)
    row = next(r for r in listed["services"] if r["service"] == "vehicleState")
    assert row["alive"] is False and row["measured_hz"] == 0


def test_top_unknown_service() -> None:
    out = _msgq("top", "--once", "--services", "gyroscop", expect=2)
    assert "did you mean 'gyroscope'" in out.stderr


def _damaged_inside(service: str = "logMessage") -> bytes:
    """A message whose root reads but whose text pointer is damaged: pycapnp only finds
    out while formatting it."""
    import random

    from msgq.messaging import MessageDecodeError, decode_event, new_message

    msg = new_message(service, logMonoTime=3)
    msg.logMessage.text = "hello" * 5
    base = msg.to_bytes()
    rng = random.Random(1)
    while True:
        data = bytearray(base)
        data[rng.randrange(8, len(data))] = rng.randrange(256)
        try:
            decoded = decode_event(bytes(data))
        except MessageDecodeError:
            continue
        failures = 0
        for form in (decoded.to_dict, decoded.logMessage.__str__):
            try:
                form()
            except Exception:
                failures += 1
        if failures == 2:  # fails as JSON and as text
            return bytes(data)


def test_dump_shows_a_message_damaged_inside_as_undecodable() -> None:
    # The root decoded, so dump went on to format the message and pycapnp's exception
    # (KjException, UnicodeDecodeError) came out as a traceback.
    import time

    import msgq
    from msgq.messaging import new_message

    bad = _damaged_inside()
    message = new_message("logMessage", logMonoTime=4)
    message.logMessage.text = "fine"
    good = message.to_bytes()
    for form in ("--json", None):
        proc = subprocess.Popen([sys.executable, "-m", "msgq", "dump", "logMessage",
                                 "--count", "4", *([form] if form else [])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=os.environ.copy())
        pub = msgq.pub_sock("logMessage")
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            pub.send(bad)
            pub.send(good)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0 and "Traceback" not in err, out + err
        assert "logMessage: undecodable message" in out and "fine" in out, out
        assert "stack:" not in out and "c++" not in out  # one line, no C++ locations
        pub.close()
