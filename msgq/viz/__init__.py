"""Looking at data with the tools robotics engineers already use: recordings exported to
MCAP (:mod:`msgq.viz.mcap_export`) and a running system served live over Foxglove's
WebSocket protocol (:mod:`msgq.viz.live`), both with JSON channels whose JSON Schema is
derived from the Cap'n Proto schema in force (:mod:`msgq.viz.json_schema`);
:mod:`msgq.viz.ws_client` is a small client of Foxglove's protocol (tests, benchmarks,
scripts).

Needs the ``viz`` extra (``pip install msgq-shm[viz]``: the ``mcap`` and ``foxglove-sdk``
libraries); :func:`require` says so in one line when they are missing.

Layer: tools — over logs, messaging, VisionIPC and the Event layer; imported by the CLI
and the benchmarks.
"""

from __future__ import annotations

import importlib

__all__ = ["MissingExtraError", "require"]

#: What to install when a library of the extra is missing.
INSTALL_HINT = "install msgq-shm[viz] (pip install 'msgq-shm[viz]')"


class MissingExtraError(ImportError):
    """A library of the ``viz`` extra is not installed."""


def require(module: str) -> object:
    """Imports ``module`` (``mcap`` or ``foxglove``); a missing one raises
    :class:`MissingExtraError` saying what to install, in one line."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(f"{module} is missing ({e.name or module}): "
                                f"{INSTALL_HINT}") from None
