"""A packed copy of this virtual environment for Spark executors that lack msgq:
``msgq spark pack-env OUT.tar.gz``, then ``spark.archives=OUT.tar.gz#environment`` and
``spark.pyspark.python=./environment/bin/python`` (PySpark's packed-virtualenv route).

The archive holds the venv (``bin/``, ``lib/``, ``pyvenv.cfg`` at its top, as venv-pack
writes them: Spark unpacks it into the folder the ``#`` fragment names) minus what
executors never use: pyspark's jars (the executors run their own Spark's),
``__pycache__`` folders and the editable-install hooks; an editable (development) msgq
is copied in as a regular package, with its compiled extensions and schema files, so
the archive works where the source tree is absent. Like venv-pack's archives,
``bin/python`` stays a link to the base interpreter: every executor needs that Python
(same version, same path), nothing else.

Zips given to ``--py-files`` cannot carry msgq: Python imports no compiled extension from
a zip, and msgq's schema files must be real files for pycapnp.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tarfile
from collections.abc import Callable

__all__ = ["ARCHIVE_ROOT", "pack_env"]

#: The folder name the docs and messages give the archive (``#environment``).
ARCHIVE_ROOT = "environment"

_SKIP_DIRS = {"__pycache__"}


def _editable_packages() -> dict[str, str]:
    """msgq's packages that live outside the venv (an editable install): import name ->
    folder, empty for a regular install."""
    out = {}
    for name in ("msgq", "msgq.schemas", "msgq.visionipc"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        folder = os.path.realpath(list(spec.submodule_search_locations)[0])
        if not folder.startswith(os.path.realpath(sys.prefix) + os.sep):
            out[name] = folder
    return out


def _site_packages() -> str:
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return os.path.join("lib", version, "site-packages")


def pack_env(output: str, progress: Callable[[str], None] | None = None) -> dict[str, object]:
    """Writes this virtual environment (with msgq) to the gzipped tar ``output``; returns
    what it holds (path, bytes, files, python). ValueError outside a virtual
    environment (a system Python cannot be moved)."""
    prefix = os.path.realpath(sys.prefix)
    if os.path.realpath(sys.base_prefix) == prefix:
        raise ValueError(f"{sys.executable} is not in a virtual environment: create one "
                         "(python -m venv), pip install 'msgq-shm[spark]' in it, and pack that")
    editable = _editable_packages()
    site = _site_packages()
    jars = os.path.join(site, "pyspark", "jars")
    files = 0

    def skip(relative: str) -> bool:
        name = os.path.basename(relative)
        return (relative == jars or relative.startswith(jars + os.sep)
                or (bool(editable) and name.startswith("__editable__")))

    def add_tree(tar: tarfile.TarFile, folder: str, arcname: str,
                 excluded: Callable[[str], bool]) -> None:
        nonlocal files
        for root, dirs, names in os.walk(folder):
            relative_root = os.path.relpath(root, folder)
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS
                             and not excluded(os.path.normpath(os.path.join(relative_root, d))))
            for name in sorted(names):
                relative = os.path.normpath(os.path.join(relative_root, name))
                if excluded(relative) or name.endswith(".pyc"):
                    continue
                tar.add(os.path.join(root, name), os.path.join(arcname, relative),
                        recursive=False)
                files += 1

    folder = os.path.dirname(os.path.abspath(output))
    os.makedirs(folder, exist_ok=True)
    partial = output + ".part"
    with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
        if progress:
            progress(f"packing {prefix}")
        add_tree(tar, prefix, "", skip)
        # an editable msgq: its packages as regular ones (the sub-packages msgq maps in
        # from elsewhere go inside it, as a wheel installs them)
        for name, source in editable.items():
            target = os.path.join(site, *name.split("."))
            if progress:
                progress(f"adding {name} from {source}")
            nested = [editable[n] for n in editable if n.startswith(name + ".")]
            add_tree(tar, source, target,
                     lambda relative, source=source, nested=nested: any(
                         os.path.join(source, relative).startswith(n + os.sep)
                         or os.path.join(source, relative) == n for n in nested))
    os.replace(partial, output)
    return {"path": output, "bytes": os.path.getsize(output), "files": files,
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "base_python": os.path.realpath(sys.executable)}
