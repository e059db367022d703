"""The README's main job runs end to end and leaves other namespaces alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import msgq
from msgq import shm_backend

pytestmark = pytest.mark.multiprocess


def test_demo_reports_every_message_and_keeps_the_callers_queues(endpoint: str) -> None:
    mine = msgq.pub_sock(endpoint)  # a queue in the caller's namespace (MSGQ_PREFIX)
    proc = subprocess.run(
        [sys.executable, "-m", "msgq.demo.throughput", "--seconds", "0.3", "--subscribers", "2"],
        capture_output=True, text=True, timeout=120, env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in map(str.split, proc.stdout.splitlines()) if r[:1] in (["sub0"], ["sub1"])]
    assert len(rows) == 2
    published = int(proc.stdout.split("published ")[1].split()[0])
    assert published > 0
    for name, received, _rate, _mbs, lost, damaged in rows:
        assert (int(received), int(lost), int(damaged)) == (published, 0, 0), name
    assert os.path.exists(shm_backend.queue_path(endpoint))  # the demo used its own prefix
    mine.send(b"still here")
