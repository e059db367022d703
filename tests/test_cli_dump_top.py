"""``msgq dump`` and ``msgq top`` run as subprocesses against real publisher processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from helpers import interrupt, run_cli

from msgq.messaging import log_from_bytes

pytestmark = pytest.mark.multiprocess

PUBLISHER = textwrap.dedent("""
    import sys, time
    from msgq.messaging import PubMaster, new_message
    rates = {name: float(hz) for name, hz in (a.split("=") for a in sys.argv[1:])}
    pm = PubMaster(list(rates))
    start = time.monotonic()
    sent = dict.fromkeys(rates, 0)
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        for name, hz in rates.items():
            if now - start >= sent[name] / hz:
                msg = new_message(name, valid=True)
                if name == "vehicleState":
                    msg.vehicleState.speed = float(sent[name])
                    msg.vehicleState.gear = "drive"
                pm.send(name, msg)
                sent[name] += 1
        time.sleep(0.0005)
""")


def _msgq(*args: str, timeout: float = 30,
          expect: int | None = 0) -> subprocess.CompletedProcess[str]:
    """``msgq ARGS``; any exit code but ``expect`` fails with its stdout and stderr."""
    return run_cli(*args, timeout=timeout, expect=expect)


@pytest.fixture
def publisher() -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start(**rates: float) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, *(f"{k}={v}" for k, v in rates.items())],
            stdout=subprocess.PIPE, text=True, env=os.environ.copy())
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_dump_prints_the_values_sent(publisher: object) -> None:
    publisher(vehicleState=100)  # type: ignore[operator]
    out = _msgq("dump", "vehicleState", "--values", "speed", "--count", "20")
    values = [float(line) for line in out.stdout.split()]
    assert len(values) == 20
    # consecutive messages, none skipped or repeated
    assert values == [values[0] + i for i in range(20)]


def test_dump_text_json_and_raw(publisher: object) -> None:
    publisher(vehicleState=100)  # type: ignore[operator]
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


def test_dump_stops_on_ctrl_c(publisher: object) -> None:
    publisher(vehicleState=50)  # type: ignore[operator]
    proc = subprocess.Popen([sys.executable, "-m", "msgq", "dump", "vehicleState",
                             "--values", "speed"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    assert proc.stdout is not None
    proc.stdout.readline()  # it is printing
    interrupt(proc, 130)


@pytest.mark.slow
def test_top_reports_rates_readers_and_liveness(publisher: object) -> None:
    import msgq

    publisher(vehicleState=100, gpsLocation=10)  # type: ignore[operator]
    extra_reader = msgq.sub_sock("gpsLocation")
    out = _msgq("top", "--once", "--json", "--interval", "3")
    doc = json.loads(out.stdout)
    rows = {r["service"]: r for r in doc["services"]}
    assert set(rows) == {"vehicleState", "gpsLocation"}
    assert rows["vehicleState"]["measured_hz"] == pytest.approx(100, rel=0.1)
    assert rows["gpsLocation"]["measured_hz"] == pytest.approx(10, rel=0.1)
    assert rows["vehicleState"]["expected_hz"] == 100.0
    assert rows["gpsLocation"]["readers"] == 1 and rows["vehicleState"]["readers"] == 0
    assert rows["vehicleState"]["alive"] and rows["gpsLocation"]["alive"]
    assert rows["vehicleState"]["bytes_per_s"] > 100 * 50
    extra_reader.close()


def test_top_table_and_dead_publisher(publisher: object) -> None:
    proc = publisher(vehicleState=100)  # type: ignore[operator]
    table = _msgq("top", "--once", "--interval", "0.5")
    lines = table.stdout.splitlines()
    assert lines[1].split()[:3] == ["service", "expected", "Hz"]
    assert any(line.startswith("vehicleState") and "yes" in line for line in lines)
    assert "\x1b[" not in table.stdout  # no colour when not on a terminal
    proc.kill()  # type: ignore[attr-defined]
    proc.wait()  # type: ignore[attr-defined]
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
