"""``msgq info``: what a recording holds, from its index, without Spark — run as users run
it (``python -m msgq info``, a separate process, with pyspark made unimportable) on
recordings written by LogWriter and on loggerd routes that have no index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from schema_profiles import ROBOT_SCHEMA, ROBOT_SERVICES, robot_schema, write_loggerd_log

from msgq.logs import LogWriter
from msgq.schemas import new_message

SECOND = 1_000_000_000
START = 10 * SECOND


def no_spark_env(tmp_path: Path) -> dict[str, str]:
    """The test's environment with a ``pyspark`` that fails to import: ``msgq info``
    must never need it."""
    blocker = tmp_path / "no_spark"
    (blocker / "pyspark").mkdir(parents=True, exist_ok=True)
    (blocker / "pyspark" / "__init__.py").write_text(
        "raise ImportError('msgq info imported pyspark')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), *filter(None, [env.get("PYTHONPATH")])])
    env["NO_COLOR"] = "1"
    return env


def info(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "msgq", "info", *args],
                          env=no_spark_env(tmp_path), capture_output=True, text=True,
                          timeout=120)


def info_json(tmp_path: Path, *args: str) -> dict[str, Any]:
    done = info(tmp_path, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def record(folder: Path, seconds: int = 5, clocks: bool = True) -> None:
    """vehicleState at 100 Hz and clocks at 1 Hz for ``seconds`` from START, in
    two-second segments."""
    with LogWriter(str(folder), rotate_seconds=2.0) as writer:
        for i in range(seconds * 100):
            mono = START + i * 10_000_000
            if clocks and i % 100 == 0:
                writer.write(new_message("clocks", logMonoTime=mono, valid=True))
            writer.write(new_message("vehicleState", logMonoTime=mono, valid=True))


def test_lists_services_counts_duration_and_segments_from_the_index(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    record(rec)
    doc = info_json(tmp_path, str(rec))
    assert doc["services"] == [
        {"service": "clocks", "events": 5, "mean_hz": pytest.approx(5 / 4.99)},
        {"service": "vehicleState", "events": 500, "mean_hz": pytest.approx(500 / 4.99)},
    ]  # logStart, the segments' bookkeeping, is not a service
    assert doc["events"] == 505
    assert doc["duration_s"] == pytest.approx(4.99)
    assert [s["from"] for s in doc["segments"]] == ["index"] * 3
    assert [s["events"] for s in doc["segments"]] == [203, 203, 102]  # with their logStart
    assert doc["complete"] is True and doc["compression"] == "zstd"
    assert doc["schema_fingerprint"] == doc["schema_in_force"]
    index = json.loads((rec / "index.json").read_text())
    assert doc["recording_id"] == index["recording_id"]
    assert doc["schema_fingerprint"] == index["schema_fingerprint"]

    done = info(tmp_path, str(rec), "--segments")
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == f"recording  {rec} (complete)"
    assert f"schema     {index['schema_fingerprint']} (the schema in force)" in lines
    assert "duration   5.0 s" in lines
    assert "events     505 in 2 services" in lines
    assert any(line.split() == ["vehicleState", "500", "100.2"] for line in lines)
    assert "logStart" not in done.stdout
    assert sum(1 for line in lines if line.endswith(" index")) == 3  # --segments rows


def test_one_service_one_segment_reads_in_the_singular(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    record(rec, seconds=1, clocks=False)
    done = info(tmp_path, str(rec))
    assert done.returncode == 0, done.stderr
    assert "events     100 in 1 service\n" in done.stdout
    assert "\nsegments   1 (zstd), " in done.stdout


def test_an_index_entry_edited_by_hand_is_not_believed(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    record(rec)
    index_path = rec / "index.json"
    index = json.loads(index_path.read_text())
    index["segments"][1]["counts"]["vehicleState"] = 9999  # its seal no longer matches
    index_path.write_text(json.dumps(index))
    doc = info_json(tmp_path, str(rec))
    assert [s["from"] for s in doc["segments"]] == ["index", "read", "index"]
    assert {s["service"]: s["events"] for s in doc["services"]} == \
        {"clocks": 5, "vehicleState": 500}


def test_a_recording_being_written_is_read_where_its_index_may_still_change(
        tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    writer = LogWriter(str(rec), rotate_seconds=2.0, flush_seconds=0)
    try:
        for i in range(300):  # 3 s: one closed segment, one still open
            writer.write(new_message("vehicleState", logMonoTime=START + i * 10_000_000,
                                     valid=True))
        writer.flush()
        doc = info_json(tmp_path, str(rec))
    finally:
        writer.close()
    assert doc["complete"] is False
    assert [s["from"] for s in doc["segments"]] == ["index", "read"]
    assert doc["services"][0]["events"] == 300
    text = info(tmp_path, str(rec)).stdout
    assert "(complete)" in text  # closed since


def test_a_loggerd_route_without_index_is_read_with_the_schema_in_force(
        tmp_path: Path) -> None:
    robot = robot_schema()
    route = tmp_path / "route"
    for segment, compression in enumerate(("zstd", "bz2")):
        events = []
        for i in range(50):
            mono = START + (segment * 50 + i) * 20_000_000
            events.append(new_message("imu", logMonoTime=mono, schema=robot))
            if i % 10 == 0:
                events.append(new_message("armState", logMonoTime=mono, schema=robot))
        name = "rlog.zst" if compression == "zstd" else "rlog.bz2"
        write_loggerd_log(str(route / f"2026-01-01--12-00-00--{segment}" / name), events,
                          compression)
    doc = info_json(tmp_path, "--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES,
                    str(route))
    assert {s["service"]: s["events"] for s in doc["services"]} == {"armState": 10, "imu": 100}
    assert [s["from"] for s in doc["segments"]] == ["read", "read"]
    assert doc["schema_fingerprint"] is None
    assert doc["duration_s"] == pytest.approx(99 * 0.02)
    text = info(tmp_path, "--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES,
                str(route)).stdout
    assert "no index.json: every segment was read" in text
    assert "schema     unknown (no index); read with the schema in force" in text


def test_a_recording_of_another_schema_is_said_never_mislabeled(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    record(rec)
    # Everything from the sealed index: shown, with the schema it was written with.
    done = info(tmp_path, "--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES, str(rec))
    assert done.returncode == 0, done.stderr
    assert "not the schema in force" in done.stdout
    assert "--schema FILE.capnp" in done.stdout
    # A segment that must be read with a schema it was not written with: refused.
    index_path = rec / "index.json"
    index = json.loads(index_path.read_text())
    index["segments"][0]["events"] += 1
    index_path.write_text(json.dumps(index))
    done = info(tmp_path, "--schema", ROBOT_SCHEMA, "--registry", ROBOT_SERVICES, str(rec))
    assert done.returncode == 1
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("msgq info: error: ")
    assert "1 segment must be read" in line and "--schema" in line


def test_a_path_that_names_no_log_is_a_one_line_error(tmp_path: Path) -> None:
    done = info(tmp_path, str(tmp_path / "nothing-here"))
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("msgq info: error: no log file or folder matches")
