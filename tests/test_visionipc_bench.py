"""The VisionIPC benchmark program runs end to end: a tiny run prints a row per path with
no drops, the handshake row, and writes its JSON. Not a timed test: it checks the
program, not the speed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess


@pytest.mark.slow
def test_tiny_run_prints_every_path_without_drops(tmp_path: Path) -> None:
    out_json = tmp_path / "vipc.json"
    cmd = [
        sys.executable,
        "-m",
        "msgq.bench.visionipc",
        "--sizes",
        "64x48",
        "--clients",
        "1,2",
        "--seconds",
        "0.05",
        "--repeat",
        "1",
        "--hostile",
        "60",
        "--silent",
        "5",
        "--json",
        str(out_json),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [re.split(r"\s{2,}", line.strip()) for line in proc.stdout.splitlines()]
    for path in ("copy", "zero-copy", "msgq socket"):
        for clients in ("1", "2"):
            assert len([r for r in rows if r[:3] == [path, "64x48", clients]]) == 1, proc.stdout
    assert len([r for r in rows if r[:3] == ["good client", "60", "5"]]) == 1, proc.stdout
    document = json.loads(out_json.read_text())
    cells = document["cells"]
    assert len(cells) == 6
    for c in cells:
        assert c["error"] is None and c["drops"] == 0, c
        assert c["fps"] > 0 and 0 < c["p50_us"] <= c["p99_us"], c
    handshakes = document["handshakes"]
    assert handshakes["error"] is None and handshakes["handshakes"] >= 20, handshakes
    assert 0 < handshakes["p50_ms"] <= handshakes["p99_ms"] <= handshakes["max_ms"], handshakes


def test_bad_options_are_usage_errors() -> None:
    for args in (["--sizes", "64by48"], ["--paths", "carrier-pigeon"], ["--buffers", "1"],
                 ["--hostile", "-1"]):
        proc = subprocess.run(
            [sys.executable, "-m", "msgq.bench.visionipc", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
