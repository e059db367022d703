"""Fixtures for running the Python blocks of README.md and docs/*.md as tests.

Loaded by ``tests/test_docs.py`` as a plugin (``-p doc_examples``) into a pytest run with
pytest-markdown-docs (``--markdown-docs``), once per backend profile. Every block runs in
a fresh queue namespace and a fresh working folder. A block names what it needs in its
info string (GitHub ignores everything after the language):

* ```` ```python fixture:drive_log ```` — ``logs/drive1``, a short recorded drive, exists;
* ```` ```python fixture:once ```` — the block does not depend on the transport (Spark,
  logs on disk): it runs in the shared-memory profile only;
* ```` ```python notest ```` — a fragment that is not run (say so in the text);
* ```` ```python continuation ```` — continues the block before it (same globals).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The profile the outer test selected: msgq, zmq or fake.
PROFILE = os.environ.get("MSGQ_DOCS_PROFILE", "msgq")


@pytest.fixture(autouse=True)
def _doc_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh namespace (MSGQ_PREFIX) and working folder for each block."""
    prefix = f"docs_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MSGQ_PREFIX", prefix)
    monkeypatch.chdir(tmp_path)
    yield
    shutil.rmtree(os.path.join(os.environ.get("MSGQ_SHM_DIR", "/dev/shm"), prefix),
                  ignore_errors=True)


@pytest.fixture
def once() -> None:
    """Blocks that do not depend on the transport run in the shared-memory profile only."""
    if PROFILE != "msgq":
        pytest.skip("transport-independent example: runs in the msgq profile")


@pytest.fixture
def drive_log(_doc_namespace: None) -> str:
    """``logs/drive1`` in the block's working folder: 60 steps of a drive (vehicleState
    with sensor samples), the log the lockstep examples replay."""
    from test_lockstep import write_drive

    return str(write_drive(Path("logs/drive1"), steps=60))
