"""Every Python block of README.md and docs/*.md runs as a test, on each backend profile:
shared memory, ZMQ (``ZMQ=1``, the upstream way) and the fake layer (``CEREAL_FAKE=1``).

Each profile is one pytest run with pytest-markdown-docs over the Markdown files, in a
subprocess (the backend is chosen by the environment, as users choose it). Blocks mark
what they need with fixtures of ``tests/doc_examples.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

PROFILES = {
    "msgq": {"MSGQ_BACKEND": "msgq"},
    "zmq": {"ZMQ": "1"},
    "fake": {"MSGQ_BACKEND": "msgq", "CEREAL_FAKE": "1"},
}


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_documented_examples_run(profile: str) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MSGQ_BACKEND", "ZMQ", "CEREAL_FAKE", "CEREAL_FAKE_PREFIX",
                        "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    env.update(PROFILES[profile])
    env["MSGQ_DOCS_PROFILE"] = profile
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "doc_examples",
         "--markdown-docs", "-m", "markdown-docs", "--timeout", "240", "-rs", *DOCS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    report = done.stdout[-12000:] + done.stderr[-4000:]
    assert done.returncode == 0, f"examples failed on the {profile} profile:\n{report}"
    assert " passed" in done.stdout, report
