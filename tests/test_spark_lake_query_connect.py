"""A lake's compact read on a Spark Connect session (a real ``msgq spark serve`` server on a
free loopback port): the read of the compact table is a GroupableRead over a Connect
DataFrame (nothing set on the frame, which answers unknown attribute names with a
Column), used as that frame, and ``log_stats`` groups it in the tasks that read it with
the local session's answers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from helpers import MSGQ, child_env, free_port, run_cli  # noqa: E402
from test_spark_stats import RATES, write_corner_recordings  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

#: Long enough for the server's JVM and warm-up query on a loaded two-core machine.
START_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``msgq spark serve`` on a free loopback port; its URL, stopped at the end."""
    port = free_port()
    proc = subprocess.Popen([*MSGQ, "spark", "serve", "--port", str(port)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout is not None and proc.stderr is not None
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True).start()
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    url = lines[0].strip() if lines else ""
    if not url.startswith("sc://"):
        proc.kill()
        proc.wait()
        pytest.fail(f"msgq spark serve printed no URL within {START_TIMEOUT_S:g} s "
                    f"(exit {proc.returncode}):\n{''.join(errors)[-3000:]}")
    try:
        yield url
    finally:
        run_cli("spark", "serve", "--stop", "--port", str(port), expect=None, timeout=90)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


#: Run in a child process (a process holds a classic session or a Connect one, not both):
#: the lake's compact read on the Connect session, its checks, and log_stats's answers.
_ON_CONNECT = """
import json, sys
from msgq.spark import read_logs
from msgq.spark.analyses import log_stats
from msgq.spark.compact import COMPACT_COLUMNS, GroupableRead
from msgq.spark.connect import is_connect
from msgq.spark.session import spark_session

spark = spark_session()
rates = json.loads(sys.argv[2])
read = read_logs(spark, sys.argv[1], compact=True)
assert is_connect(spark) and isinstance(read, GroupableRead), type(read)
assert is_connect(read.frame.sparkSession)
assert tuple(read.columns) == COMPACT_COLUMNS  # used as the frame it holds
assert read.where(read["kind"] == "problem").count() > 0
assert not isinstance(read.select("*"), GroupableRead)
print(json.dumps([log_stats(read, rates).to_dict(),  # grouped in the tasks
                  log_stats(read.select("*"), rates).to_dict()]))  # Spark's shuffle
"""


def test_a_compact_lake_read_on_connect_groups_in_tasks(
        spark: Any, server: str, tmp_path: Path) -> None:
    from msgq.spark import lake as lakes
    from msgq.spark import read_logs
    from msgq.spark.analyses import log_stats

    a, b = tmp_path / "drive-a", tmp_path / "drive b"
    write_corner_recordings(a, b)
    lake = str(tmp_path / "lake")
    lakes.build(spark, [str(a), str(b)], lake)
    stats = log_stats(read_logs(spark, lake, compact=True), RATES)
    local = json.loads(json.dumps(stats.to_dict()))
    done = subprocess.run([sys.executable, "-c", _ON_CONNECT, lake, json.dumps(RATES)],
                          capture_output=True, text=True, timeout=300,
                          env=child_env(MSGQ_SPARK_REMOTE=server))
    assert done.returncode == 0, done.stderr[-3000:]
    grouped, shuffled = json.loads(done.stdout)
    assert local["services"] and grouped == local and shuffled == local
