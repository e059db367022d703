"""scripts/bench-ab.sh's table (msgq.bench.ab): medians, spreads, the ratio and the verdict
on whether the spreads separate the sides; and the counted loop's sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from msgq.bench import ab
from msgq.bench.messaging import script_command


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
    assert cells[2] == "3/3"  # runs of each side
    assert cells[3] == "120 [100-140]"
    assert cells[4] == "150 [130-170]"
    assert cells[5] == "1.250"
    assert cells[6] == "no"


def test_separated_spreads_say_which_side_is_better() -> None:
    assert _row([100, 110], [200, 210])[6] == "yes: NEW better"
    assert _row([200, 210], [100, 110])[6] == "yes: NEW worse"
    # lower is better (µs per tick, instructions): fewer is the better side
    assert _row([200, 210], [100, 110], higher_is_better=False)[6] == "yes: NEW better"


def test_counts_are_exact_and_a_missing_side_is_not_a_ratio() -> None:
    assert _row([337.0], [331.0], unit="instr/msg")[6] == "exact"
    cells = _row([], [90.0], higher_is_better=False, unit="µs/tick")
    assert cells[2] == "0/1" and cells[3] == "n/a" and cells[5] == "-"


def test_rounds_alternate_which_side_runs_first() -> None:
    ref, new = ab.Side("REF", ""), ab.Side("NEW", "")
    firsts = [ab.round_order(r, ref, new)[0].label for r in range(4)]
    assert firsts == ["REF", "NEW", "REF", "NEW"]
    assert {s.label for s in ab.round_order(1, ref, new)} == {"REF", "NEW"}


def test_the_submaster_row_has_at_least_six_pairs_whatever_the_rounds() -> None:
    for rounds in (1, 2, 5, 6, 9):
        pairs = ab.submaster_pairs(rounds)
        assert pairs == max(6, rounds)
        spread = [ab.pairs_in_round(pairs, rounds, r) for r in range(rounds)]
        assert sum(spread) == pairs
        assert max(spread) - min(spread) <= 1
    assert ab.submaster_pairs(5, asked=3) == 3


def test_the_pairs_ratio_is_the_median_of_each_pairs_own_ratio() -> None:
    # the load doubled between pairs 2 and 3: each pair's ratio is 0.5 all the same
    assert ab.pair_ratio([100, 110, 200, 220], [50, 55, 100, 110]) == 0.5
    assert ab.pair_ratio([100, 200, 300], [40, 120, 120]) == 0.4
    assert ab.pair_ratio([100, 200], [40]) is None  # unpaired samples


def test_the_placement_line_names_the_pinned_cpu_and_the_pairs() -> None:
    line = ab.placement_line(["core", "onecpu", "submaster"], [0, 1], 1, 6)
    assert "placed by the OS on CPUs 0,1" in line
    assert "every process of a run on CPU 1" in line
    assert "SubMaster: 6 pairs" in line
    assert "SubMaster" not in ab.placement_line(["core"], [0, 1], 1, 6)


def test_a_pinned_run_and_the_processes_it_starts_stay_on_that_cpu() -> None:
    cpu = max(os.sched_getaffinity(0))
    program = ("import os, subprocess, sys; print(sorted(os.sched_getaffinity(0))); "
               "print(subprocess.run([sys.executable, '-c', 'import os; "
               "print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True)"
               ".stdout.strip())")
    done = ab.run([sys.executable, "-c", program], ab.Side("X", ""), timeout=60, cpus={cpu})
    assert done.stdout.split() == [f"[{cpu}]", f"[{cpu}]"]


def test_large_payloads_are_counted_over_fewer_messages() -> None:
    assert ab.count_of(8, 1, ab.COUNT_C) == ab.COUNT_C
    assert ab.count_of(65536, 4, ab.COUNT_C) < ab.COUNT_C
    assert ab.count_of(1 << 20, 4, ab.COUNT_C) == 100


def test_the_counted_loop_sends_and_receives_every_message(prefix: str) -> None:
    done = subprocess.run(
        script_command(sys.executable, ab.__file__, "--count", "64", "2", "50"),
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_program_run_by_path_imports_neither_its_folder_nor_the_current_one(
        tmp_path: Path) -> None:
    """script_command: python -P's sys.path on every Python (-P itself is 3.11+), the
    arguments passed on and the exit status kept."""
    program, cwd = tmp_path / "program", tmp_path / "cwd"
    program.mkdir()
    cwd.mkdir()
    (program / "beside_the_program.py").write_text("")
    (cwd / "in_the_current_folder.py").write_text("")
    (program / "main.py").write_text(
        "import importlib.util, sys\n"
        "found = [m for m in ('beside_the_program', 'in_the_current_folder')\n"
        "         if importlib.util.find_spec(m)]\n"
        "print(__name__, sys.argv[1:], found)\n"
        "sys.exit(int(sys.argv[1]))\n")
    done = subprocess.run(script_command(sys.executable, str(program / "main.py"), "3", "x"),
                          capture_output=True, text=True, timeout=60, cwd=cwd)
    assert done.returncode == 3, done.stderr
    assert done.stdout.strip() == "__main__ ['3', 'x'] []"


def test_the_script_runs_the_default_rows_of_msgq_bench_ab() -> None:
    """scripts/bench-ab.sh passes its own default to --rows: it must be ab's."""
    script = (Path(__file__).parent.parent / "scripts" / "bench-ab.sh").read_text()
    defaults = [line for line in script.splitlines() if line.startswith("rows=")]
    assert defaults == [f'rows="{",".join(ab.DEFAULT_ROWS)}"']


def test_unknown_row_groups_are_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "msgq.bench.ab", "--rows", "core,nope"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown row group 'nope'" in done.stderr


def test_a_cpu_this_process_may_not_use_is_refused() -> None:
    outside = max(os.sched_getaffinity(0)) + 1
    done = subprocess.run([sys.executable, "-m", "msgq.bench.ab", "--rows", "onecpu",
                           "--pin-cpu", str(outside)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"--pin-cpu {outside}: this process may run only on CPUs" in done.stderr
