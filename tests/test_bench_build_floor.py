"""The lake build's floor benchmark (``python -m msgq.bench.build_floor``): its passes read
every event, write every service's Parquet table readable with the lake's columns, and its
table prints the parts it measured."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

from msgq.bench import build_floor  # noqa: E402
from msgq.bench.spark import make_recording  # noqa: E402
from msgq.logs import LogReader, segment_paths  # noqa: E402


def test_the_write_pass_writes_every_event_of_every_service(tmp_path: Path) -> None:
    """One pass per part: each reads every event; the write pass's files hold every
    event of its service once, with the lake's columns and values."""
    recording = str(tmp_path / "rec")
    make_recording(recording, 8, 4)
    counts: dict[str, int] = {}
    for event in LogReader(recording).raw():
        counts[event.service] = counts.get(event.service, 0) + 1
    out = tmp_path / "out"
    out.mkdir()
    floor = build_floor._Floor(str(out))
    for stage in ("read", "decode", "write"):
        assert floor.run(segment_paths(recording), stage) == sum(counts.values())
    got: dict[str, int] = {}
    for path in out.iterdir():
        service = path.name.split("-")[0]
        table = pq.read_table(path)
        assert table.column_names[:7] == ["logMonoTime", "valid", "segment", "file",
                                          "offset", "size", "problem"]
        got[service] = got.get(service, 0) + table.num_rows
        if service == "gpsLocation":
            assert table.column("gpsLocation").null_count == 0
    assert got == counts


def test_main_prints_each_part_and_writes_json(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The table names each part, the floor and its wall; the JSON has the numbers."""
    recording = str(tmp_path / "rec")
    make_recording(recording, 8, 4)
    report = tmp_path / "floor.json"
    assert build_floor.main([recording, "--cores", "2", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    for label, _ in build_floor.rows(json.loads(report.read_text())):
        assert label in out
    result: dict[str, Any] = json.loads(report.read_text())
    assert result["events"] > 0 and result["segments"] >= 2 and result["cores"] == 2
    assert result["floor_cpu_per_m"] == pytest.approx(
        result["read_cpu_per_m"] + result["decode_cpu_per_m"] + result["write_cpu_per_m"])
    assert result["floor_wall_s"] > 0 and result["parquet_bytes"] > 0
    assert not [n for n in os.listdir(tmp_path) if n.startswith("msgq-build-floor-")]


def test_a_folder_without_segments_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No segment files: one line on stderr, exit status 1."""
    assert build_floor.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no log files" in err
