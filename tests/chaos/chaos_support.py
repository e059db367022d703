"""Shared pieces of the chaos matrix (tests/chaos): the time budget of each test and the
table of trials and outcomes that scripts/chaos.sh prints. A plain module imported by name,
as tests/helpers.py is: a second conftest.py would shadow the first.

Every chaos test runs for ``budget(ci_seconds)`` seconds: MSGQ_CHAOS_SECONDS when set
(the long profile of ``scripts/chaos.sh --minutes N``), else its own short CI budget. A
test records its trials and outcomes with ``report(name, trials, **outcomes)``; when
MSGQ_CHAOS_REPORT names a file, one JSON line per call is appended to it."""

from __future__ import annotations

import json
import os


def budget(ci_seconds: float) -> float:
    """Seconds this test may run."""
    value = os.environ.get("MSGQ_CHAOS_SECONDS", "").strip()
    return float(value) if value else ci_seconds


def report(name: str, trials: int, **outcomes: object) -> None:
    """One row of the chaos table (printed, and appended to MSGQ_CHAOS_REPORT)."""
    row = {"test": name, "trials": trials, "outcomes": outcomes}
    print(f"chaos: {json.dumps(row)}")
    path = os.environ.get("MSGQ_CHAOS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
