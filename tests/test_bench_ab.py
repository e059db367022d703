"""scripts/bench-ab.sh's table (msgq.bench.ab): medians, spreads, the ratio and the verdict
on whether the spreads separate the sides; and the counted loop's sizes."""

from __future__ import annotations

import subprocess
import sys

from msgq.bench import ab


def _row(ref: list[float], new: list[float], higher_is_better: bool = True,
         unit: str = "msgs/s") -> list[str]:
    row = ab.Row("r", unit, higher_is_better)
    for v in ref:
        row.add("REF", v)
    for v in new:
        row.add("NEW", v)
    return ab.summary(row, "REF", "NEW")


def test_spreads_that_overlap_do_not_separate() -> None:
    cells = _row([100, 120, 140], [130, 150, 170])
    assert cells[2] == "120 [100-140]"
    assert cells[3] == "150 [130-170]"
    assert cells[4] == "1.250"
    assert cells[5] == "no"


def test_separated_spreads_say_which_side_is_better() -> None:
    assert _row([100, 110], [200, 210])[5] == "yes: NEW better"
    assert _row([200, 210], [100, 110])[5] == "yes: NEW worse"
    # lower is better (µs per tick, instructions): fewer is the better side
    assert _row([200, 210], [100, 110], higher_is_better=False)[5] == "yes: NEW better"


def test_counts_are_exact_and_a_missing_side_is_not_a_ratio() -> None:
    assert _row([337.0], [331.0], unit="instr/msg")[5] == "exact"
    cells = _row([], [90.0], higher_is_better=False, unit="µs/tick")
    assert cells[2] == "n/a" and cells[4] == "-"


def test_large_payloads_are_counted_over_fewer_messages() -> None:
    assert ab.count_of(8, 1, ab.COUNT_C) == ab.COUNT_C
    assert ab.count_of(65536, 4, ab.COUNT_C) < ab.COUNT_C
    assert ab.count_of(1 << 20, 4, ab.COUNT_C) == 100


def test_the_counted_loop_sends_and_receives_every_message(prefix: str) -> None:
    done = subprocess.run([sys.executable, "-P", ab.__file__, "--count", "64", "2", "50"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_unknown_row_groups_are_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "msgq.bench.ab", "--rows", "core,nope"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown row group 'nope'" in done.stderr
