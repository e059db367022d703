"""Which msgq this is: the distribution name it is published under and its installed
version, in one place for the CLI, the log writer and the benchmarks.

The import name is ``msgq`` (a drop-in for upstream's); the distribution is published as
``msgq-shm`` (``msgq`` on the package index is another project, and upstream publishes
as ``msgq-ipc``).

Layer: foundation; imports the standard library only.
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "installed_version"]

#: The name msgq is installed under (``pip install msgq-shm``).
DISTRIBUTION = "msgq-shm"


def installed_version() -> str:
    """The installed distribution's version, or "unknown" when msgq runs from a source
    tree that was not installed."""
    # start-up cost: importlib.metadata (9 ms), only when the version is asked for
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"
