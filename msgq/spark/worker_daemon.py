"""PySpark's Python worker daemon, importing the installed pyspark instead of Spark's zip.

Spark starts its Python workers (the executors' and the driver-side ones that plan a
Python data source) with ``pyspark.zip`` and ``py4j-*-src.zip`` first on PYTHONPATH.
Python caches no compiled bytecode for modules imported from a zip, so every daemon, and
every worker it forks, compiles pyspark's modules from source again: about a second of
CPU per daemon and a fraction per worker, before any work. When the interpreter has the
same pyspark (and py4j) installed, this daemon drops the zips from ``sys.path`` first,
so those imports load cached bytecode; then it runs ``pyspark.daemon`` unchanged. When
the versions differ, or nothing is installed, the path stays as Spark set it.

Local sessions of :func:`msgq.spark.session.spark_session` use it
(``spark.python.daemon.module``): there the workers run the driver's interpreter, which
imports msgq by definition. Nothing else is imported before the fork (pyspark's daemon
forbids threads there, which pyarrow and pandas start).
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import zipfile
from importlib import metadata

__all__ = ["installed_first"]


def _zip_version(path: str) -> str | None:
    """The version of the pyspark or py4j a Spark zip holds."""
    name = os.path.basename(path)
    match = re.fullmatch(r"py4j-(.+)-src\.zip", name)
    if match:
        return match.group(1)
    if name != "pyspark.zip":
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            text = archive.read("pyspark/version.py").decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    match = re.search(r"__version__[^=]*=\s*['\"]([^'\"]+)['\"]", text)
    return match.group(1) if match else None


def installed_first(path: list[str]) -> list[str]:
    """``path`` without Spark's pyspark/py4j zips whose versions are installed (the
    distribution's metadata says so); the zips stay otherwise."""
    keep = []
    for entry in path:
        name = os.path.basename(entry)
        package = "py4j" if name.startswith("py4j-") else "pyspark"
        version = _zip_version(entry) if entry.endswith(".zip") else None
        if version is not None:
            try:
                if metadata.version(package) == version:
                    continue
            except metadata.PackageNotFoundError:
                pass
        keep.append(entry)
    return keep


def main() -> None:
    """Runs pyspark's daemon with the installed pyspark when it is Spark's own version."""
    sys.path[:] = installed_first(sys.path)
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
