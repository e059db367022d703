"""Shared pieces of the chaos matrix (tests/chaos): the time budget of each test and the
table of trials and outcomes that scripts/chaos.sh prints.

Every chaos test runs for ``chaos_budget`` seconds: MSGQ_CHAOS_SECONDS when set (the
long profile of ``scripts/chaos.sh --minutes N``), else the test's own short CI budget.
A test records its trials and outcomes with ``chaos_report(name, trials, **outcomes)``;
when MSGQ_CHAOS_REPORT names a file, one JSON line per call is appended to it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest


@pytest.fixture
def chaos_budget() -> Callable[[float], float]:
    """``chaos_budget(ci_seconds)``: seconds this test may run."""

    def budget(ci_seconds: float) -> float:
        value = os.environ.get("MSGQ_CHAOS_SECONDS", "").strip()
        return float(value) if value else ci_seconds

    return budget


@pytest.fixture
def chaos_report() -> Callable[..., None]:
    """``chaos_report(name, trials, **outcomes)``: one row of the chaos table."""

    def report(name: str, trials: int, **outcomes: object) -> None:
        row = {"test": name, "trials": trials, "outcomes": outcomes}
        print(f"chaos: {json.dumps(row)}")
        path = os.environ.get("MSGQ_CHAOS_REPORT")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")

    return report
