"""``python -m msgq`` and the ``msgq`` command: checks that this installation of msgq is
whole, then runs the command line of :mod:`msgq.cli`.

The distribution is ``msgq-shm``; its import package is ``msgq``, as upstream's
(``msgq-ipc``, commaai/msgq) is. Two distributions that install one import package
overwrite each other's files in an environment, and uninstalling either removes files
the other needs, so this one replaces upstream's rather than sitting beside it: a
command run where both are installed says so, in one line, and stops.

Layer: the entry point, over the command line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["DISTRIBUTION", "FOREIGN_DISTRIBUTIONS", "foreign_installations", "main"]

#: The distribution that installs this package (``pip install msgq-shm``).
DISTRIBUTION = "msgq-shm"

#: Distributions that install an import package ``msgq`` of their own: their dist-info
#: folder name (normalized, as pip writes it) and a file of theirs that ours never has.
FOREIGN_DISTRIBUTIONS: dict[str, tuple[str, str]] = {
    "msgq-ipc": ("msgq_ipc-", "ipc_pyx"),
}

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def foreign_installations(package_dir: str = _PACKAGE_DIR) -> list[str]:
    """The distributions of FOREIGN_DISTRIBUTIONS installed over or under this package:
    their metadata beside the package folder (same site-packages), or their files inside
    it. Empty for a whole installation. Costs two directory listings."""
    site_dir = os.path.dirname(package_dir)
    found = []
    try:
        site_names = os.listdir(site_dir)
        package_names = os.listdir(package_dir)
    except OSError:
        return []
    for name, (dist_info_prefix, own_file) in FOREIGN_DISTRIBUTIONS.items():
        has_metadata = any(n.lower().startswith(dist_info_prefix) and n.endswith(".dist-info")
                           for n in site_names)
        has_files = any(n.startswith(own_file) for n in package_names)
        if has_metadata or has_files:
            found.append(name)
    return found


def installation_problem(package_dir: str = _PACKAGE_DIR) -> str | None:
    """One line saying what is wrong with this installation and what to do; None when
    nothing is."""
    foreign = foreign_installations(package_dir)
    if not foreign:
        return None
    names = " ".join(foreign)
    return (f"{', '.join(foreign)} is installed in this environment too "
            f"({os.path.dirname(package_dir)}): it and {DISTRIBUTION} both install the "
            f"import package msgq and overwrite each other's files; keep one: "
            f"pip uninstall -y {names} {DISTRIBUTION} && pip install {DISTRIBUTION}")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``msgq`` command: exit code 1 with one line on stderr when another
    distribution's msgq is mixed into this one, else :func:`msgq.cli.main`'s code."""
    problem = installation_problem()
    if problem is not None:
        print(f"msgq: error: {problem}", file=sys.stderr)
        return 1
    # another msgq: imported after the check, as a mixed installation may not import cleanly
    from msgq.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
