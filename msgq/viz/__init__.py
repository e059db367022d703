"""Looking at data with the tools robotics engineers already use: recordings exported to
MCAP (:mod:`msgq.viz.mcap_export`) and a running system served live over Foxglove's
WebSocket protocol (:mod:`msgq.viz.live`), both with JSON channels whose JSON Schema is
derived from the Cap'n Proto schema in force (:mod:`msgq.viz.json_schema`);
:mod:`msgq.viz.ws_client` is a small client of Foxglove's protocol (tests, benchmarks,
scripts).

Needs the ``viz`` extra (``pip install msgq-shm[viz]``: the ``mcap`` and ``foxglove-sdk``
libraries); :func:`require` loads them through :func:`msgq.extras.require`, which says so
in one line when they are missing.

Layer: tools — over logs, messaging, VisionIPC and the Event layer; imported by the CLI
and the benchmarks.
"""

from __future__ import annotations

from types import ModuleType

from msgq import extras
from msgq.extras import MissingExtraError

__all__ = ["MissingExtraError", "require"]


def require(module: str) -> ModuleType:
    """Imports ``module`` (``mcap`` or ``foxglove``), a library of the ``viz`` extra; a
    missing one raises :class:`msgq.extras.MissingExtraError` saying what to install."""
    return extras.require("viz", module)
