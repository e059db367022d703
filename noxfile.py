"""Every Python that ``requires-python`` claims, tested: nox sessions that build msgq's
sdist, install it (with the ``test`` extra) into a fresh virtual environment of each
Python, and run ``./test.sh --quick``'s pytest selection against that installation, plus
the tests marked ``pythons`` (tests/conftest.py: the Spark data source, pyspark and py4j
on that Python, too slow for the quick tier itself).

    ./test.sh --pythons                  all four, one after the other (nox from PyPI in
                                         build/nox-venv, environments in build/nox)
    nox -s "quick-3.12"                  one of them (nox installed by hand)

The interpreters are found on PATH as ``python3.X``; pyenv's versions are put in front of
it when there are some (``~/.pyenv/versions/3.X.*/bin``). The tests run from the
unpacked sdist's ``tests/`` with the current folder outside it, so that the installed
msgq is imported, never the sdist's source tree. 3.14 and the free-threaded builds are
built by cibuildwheel but not tested here.
"""

from __future__ import annotations

import glob
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
#: The Pythons that requires-python claims and this machine tests.
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
#: ./test.sh --quick's pytest selection, and the tests each Python adds to it.
QUICK = "quick or not slow or pythons"

nox.options.sessions = ["quick"]
nox.options.envdir = str(ROOT / "build" / "nox")
nox.options.reuse_existing_virtualenvs = False

# pyenv's interpreters, when there are some, before whatever PATH finds.
_pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[0-9]*/bin")))
if _pyenv:
    os.environ["PATH"] = os.pathsep.join([*_pyenv, os.environ.get("PATH", "")])

_sdist: list[Path] = []

#: The test extra's tools the quick tier does not use: the fuzzer (a C++ build on every
#: Python without a wheel; the fuzz tests are not in the quick tier), the C build and the
#: linter (./test.sh runs them once, on the default Python) and the in-place build tools.
NOT_IN_QUICK_TIER = {"atheris", "scons", "ruff", "cython", "setuptools"}


def quick_tier_tools() -> list[str]:
    """The test extra's requirements that the quick tier needs, read from pyproject.toml
    (msgq's own extras left out: they come with the sdist)."""
    import re

    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        test = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    name = re.compile(r"^\s*([A-Za-z0-9_.-]+)")
    return [req for req in test
            if not req.startswith("msgq-shm")
            and name.match(req)[1].lower() not in NOT_IN_QUICK_TIER]  # type: ignore[index]


def sdist(session: nox.Session) -> Path:
    """The sdist of this checkout's committed tree (HEAD: what a clean clone builds, not
    the files being edited), built once per nox run in the first session's environment
    (the build itself is isolated)."""
    if not _sdist:
        out = ROOT / "build" / "nox-dist"
        tree = ROOT / "build" / "nox-head"
        for old in out.glob("*.tar.gz"):
            old.unlink()
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"],
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree)  # our own commit
        session.install("build")
        session.run("python", "-m", "build", "--sdist", "-o", str(out), str(tree), silent=True)
        [built] = out.glob("*.tar.gz")
        _sdist.append(built)
    return _sdist[0]


@nox.session(python=PYTHONS)
def quick(session: nox.Session) -> None:
    """The sdist installed with the test extra, and the quick tier's tests run on it."""
    archive = sdist(session)
    # pip builds the wheel from the sdist (the C core and every extension) for this Python;
    # the spark and viz extras and the test extra's tools the quick tier uses come with it.
    session.install(f"{archive}[spark,viz]", *quick_tier_tools())
    unpacked = Path(session.create_tmp()) / "src"
    if not unpacked.exists():
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked)  # our own sdist, just built
    [tree] = unpacked.iterdir()
    home = Path(session.create_tmp()) / "home"
    home.mkdir(exist_ok=True)
    session.chdir(home)
    workers = os.environ.get("MSGQ_TEST_WORKERS", "3")
    session.run("python", "-c", "import msgq, sys; assert 'site-packages' in msgq.__file__, "
                "msgq.__file__; print('msgq from', msgq.__file__, 'on', sys.version.split()[0])")
    # PYTHON: the interpreter scripts/*.sh run foreign tests with (else .venv's). Nothing
    # puts the unpacked tree on sys.path (the tests run programs by module name or with
    # msgq.bench.messaging.script_command, never from inside the tree), so every Python
    # imports the installed msgq alike; `-P`/PYTHONSAFEPATH (3.11+) is not needed.
    python = str(Path(session.virtualenv.location) / "bin" / "python")
    session.run("pytest", str(tree / "tests"), "-m", QUICK, "-q", "-p", "no:cacheprovider",
                *(["-n", workers, "--dist", "loadfile", "--no-loadscope-reorder"]
                  if workers != "1" else []), *session.posargs,
                env={"MSGQ_TEST_WORKERS": workers, "PYTHON": python})
