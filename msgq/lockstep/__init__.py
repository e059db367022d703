"""Deterministic lockstep replay: run a process under test against logged inputs, one
trigger event at a time, and compare what it publishes.

* :func:`run_lockstep` / :class:`LockstepProcess` (:mod:`msgq.lockstep.harness`) — the
  harness;
* :mod:`msgq.lockstep.clock` — the simulated clock a service reads (replayed time under
  the harness, the real clock otherwise);
* :func:`diff_outputs` / :func:`assert_outputs_equal` (:mod:`msgq.lockstep.diff`) —
  comparing two output streams with tolerances and ignored fields;
* :mod:`msgq.lockstep.pytest_plugin` — the ``lockstep`` fixture;
* :mod:`msgq.lockstep.example_controller` — an example service.

See docs/lockstep.md. Only the clock is imported eagerly (:mod:`msgq.clock` plus
``new_message``); the rest loads on first use.

Layer: a tool — over the services (:mod:`msgq.logs`), the package's sockets, the
fake-event backend, the queue namespace, the Event layer and the clock.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from msgq.lockstep import clock

if TYPE_CHECKING:
    from msgq.lockstep.diff import (
        DEFAULT_IGNORE,
        Difference,
        OutputDiff,
        assert_outputs_equal,
        canonical_bytes,
        diff_outputs,
    )
    from msgq.lockstep.harness import (
        InputEvent,
        LockstepError,
        LockstepProcess,
        LockstepProcessError,
        LockstepResult,
        LockstepTimeoutError,
        OutputEvent,
        StepOutput,
        input_events,
        remove_stale_runs,
        run_lockstep,
    )

__all__ = [
    "DEFAULT_IGNORE",
    "Difference",
    "InputEvent",
    "LockstepError",
    "LockstepProcess",
    "LockstepProcessError",
    "LockstepResult",
    "LockstepTimeoutError",
    "OutputDiff",
    "OutputEvent",
    "StepOutput",
    "assert_outputs_equal",
    "canonical_bytes",
    "clock",
    "diff_outputs",
    "input_events",
    "remove_stale_runs",
    "run_lockstep",
]

_HOME = {
    "DEFAULT_IGNORE": "diff",
    "Difference": "diff",
    "OutputDiff": "diff",
    "assert_outputs_equal": "diff",
    "canonical_bytes": "diff",
    "diff_outputs": "diff",
    "InputEvent": "harness",
    "LockstepError": "harness",
    "LockstepProcess": "harness",
    "LockstepProcessError": "harness",
    "LockstepResult": "harness",
    "LockstepTimeoutError": "harness",
    "OutputEvent": "harness",
    "StepOutput": "harness",
    "input_events": "harness",
    "remove_stale_runs": "harness",
    "run_lockstep": "harness",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'msgq.lockstep' has no attribute {name!r}")

    value = getattr(importlib.import_module(f"msgq.lockstep.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
