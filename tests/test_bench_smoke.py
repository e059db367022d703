"""The benchmark program runs end to end: a short msgq-only run prints its table with a
throughput row and no drops, writes the JSON, and leaves no queue folder behind. Not a
timed test: it checks that the program works, not how fast msgq is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from msgq.bench._bound import cache_bound, fanout_bound, view_bound

pytestmark = pytest.mark.multiprocess


def _msgq_64k_row(test: str, subs: int) -> tuple[list[str], str]:
    """A short msgq-only run of one 64 KiB row: (its cells, the output on one line)."""
    cmd = [sys.executable, "-m", "msgq.bench", "--backends", "msgq", "--tests", test,
           "--sizes", "64K", "--subs", str(subs), "--repeat", "1", "--duration", "0.1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [re.split(r"\s{2,}", line.strip()) for line in proc.stdout.splitlines()]
    label = f"{subs} sub" if subs == 1 else f"{subs} subs"
    found = [r for r in rows if r[:4] == [test, "64 KiB", label, "msgq"]]
    assert len(found) == 1, proc.stdout
    return found[0], " ".join(proc.stdout.split())


def _assert_ratio_shown(shown: str, mb_per_s: str, bound_mb_s: str) -> None:
    """The "x bound" cell is the row's MB/s over the bound's, computed before either was
    rounded for printing: it lies between the ratios the printed figures allow."""
    mb = float(mb_per_s.replace(",", ""))
    bound = float(bound_mb_s.replace(",", ""))
    mb_step = 0.05 if "." in mb_per_s else 0.5
    bound_step = 0.05 if "." in bound_mb_s else 0.5
    low = (mb - mb_step) / (bound + bound_step)
    high = (mb + mb_step) / max(bound - bound_step, 1e-9)
    assert low - 0.005 <= float(shown) <= high + 0.005, (shown, mb_per_s, bound_mb_s)


def test_quick_msgq_run_prints_a_row_without_drops(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "-m",
        "msgq.bench",
        "--quick",
        "--backends",
        "msgq",
        "--sizes",
        "8",
        "--subs",
        "1",
        "--repeat",
        "1",
        "--duration",
        "0.1",
        "--json",
        str(out_json),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    rows = [re.split(r"\s{2,}", line.strip()) for line in proc.stdout.splitlines()]
    throughput = [r for r in rows if r[:4] == ["throughput", "8 B", "1 sub", "msgq"]]
    assert len(throughput) == 1, proc.stdout
    # msgs/s, MB/s, then drops (the ratio column is empty without pyzmq).
    msgs_per_s, _mb_per_s, drops = throughput[0][4:7]
    assert float(msgs_per_s.replace(",", "")) > 0
    assert drops == "0"
    assert any(r[:4] == ["round trip", "8 B", "1 cpu", "msgq"] for r in rows), proc.stdout
    assert "runs unpinned (the OS places the processes" in proc.stdout
    assert any(r[:4] == ["async trip", "8 B", "1 cpu", "msgq"] for r in rows), proc.stdout

    document = json.loads(out_json.read_text())
    medians = [r["median"] for r in document["results"]]
    assert {(m["kind"], m["backend"]) for m in medians} >= {("throughput", "msgq"), ("rtt", "msgq")}
    assert all(m["error"] is None and m["drops"] == 0 and m["bad"] == 0 for m in medians)
    shm_base = os.environ.get("MSGQ_SHM_DIR", "/dev/shm")
    assert not os.path.exists(os.path.join(shm_base, document["meta"]["prefix"]))


def test_view_rows_read_in_place_without_drops() -> None:
    view, stdout = _msgq_64k_row("view", 1)
    assert float(view[4].replace(",", "")) > 0 and view[6] == "0"
    # The bound's column of a view row: MB/s over the one-copy bound the footnote gives.
    bound = re.search(r"× bound of view rows: .*?64 KiB: ([\d,]+) MB/s", stdout)
    assert bound, stdout
    _assert_ratio_shown(view[-1], view[5], bound.group(1))


@pytest.mark.parametrize("model", [cache_bound, view_bound])
def test_cache_bound_runs_the_model_and_refuses_an_empty_message(model) -> None:
    rate = model(64 * 1024, seconds=0.02, rounds=1)
    assert rate > 0
    with pytest.raises(ValueError, match="size must be >= 1"):
        model(0)


def test_copying_rows_of_several_subscribers_are_shown_against_the_fanout_bound() -> None:
    row, stdout = _msgq_64k_row("recv_into", 2)
    bound = re.search(r"× bound of copying rows with N subscribers: .*?64 KiB × 2: ([\d,]+) MB/s",
                      stdout)
    assert bound, stdout
    _assert_ratio_shown(row[-1], row[5], bound.group(1))


def test_fanout_bound_copies_for_each_subscriber_and_refuses_bad_counts() -> None:
    assert fanout_bound(64 * 1024, 4, seconds=0.02, rounds=1) > 0
    for bad in (0, 17):
        with pytest.raises(ValueError, match="subscribers must be 1..16"):
            fanout_bound(64 * 1024, bad)
