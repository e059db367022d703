"""msgq's optional extras (``spark``, ``viz``, ``bench``, ...): the one way code loads a
library that only an extra installs, so that a missing one is one line naming what to
install, never a traceback.

:func:`require` imports the library (or says which extra brings it); every caller that
needs pyspark, mcap, foxglove-sdk or a benchmark peer goes through it, and the CLI prints
its :class:`MissingExtraError` as ``msgq <command>: error: <the line>``, exit code 1.

Layer: foundation; imports the standard library and :mod:`msgq.version` only.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from msgq.version import DISTRIBUTION

__all__ = ["MissingExtraError", "install_hint", "require"]


class MissingExtraError(ImportError):
    """A library of one of msgq's extras is not installed; the message is one line that
    names the extra and the ``pip install`` command for this distribution."""


def install_hint(extra: str) -> str:
    """``this needs the <extra> extra: pip install '<distribution>[<extra>]'``."""
    return f"this needs the {extra} extra: pip install '{DISTRIBUTION}[{extra}]'"


def require(extra: str, module: str) -> ModuleType:
    """Imports ``module`` (e.g. ``pyspark``, ``mcap``) and returns it; when it (or a
    library it needs) is missing, raises :class:`MissingExtraError`:
    ``mcap is not installed; this needs the viz extra: pip install 'msgq-shm[viz]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = e.name or module
        what = (f"{module} is not installed" if missing.split(".")[0] == module.split(".")[0]
                else f"{module} cannot be imported ({missing} is missing)")
        raise MissingExtraError(f"{what}; {install_hint(extra)}", name=missing) from None
