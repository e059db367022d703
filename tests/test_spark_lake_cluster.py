"""The lake on a real Spark standalone cluster (a master and two one-core workers started
with pyspark's ``spark-class``, tests/test_spark_cluster.py's way): ``msgq lake build``
and ``msgq lake sql`` with ``--master`` give the tables and answers of local mode, and
``msgq logstats`` of the lake on the cluster equals local mode's on the raw logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from msgq.spark.standalone import start_cluster  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]


def _msgq(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYSPARK_PYTHON", None)  # as a user's shell has it
    return subprocess.run([sys.executable, "-m", "msgq", *argv], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600)


def test_the_lake_on_a_standalone_cluster_equals_local_mode(spark: Any,
                                                            tmp_path: Path) -> None:
    from msgq.bench.spark import make_recording
    from msgq.spark import lake, read_logs
    from msgq.spark.analyses import log_stats

    folder = str(tmp_path / "drive")
    make_recording(folder, 8.0, 2.0, drop=0.01)
    cluster = start_cluster(str(tmp_path / "cluster"), workers=2, cores=1)
    try:
        built = _msgq("lake", "build", folder, "--to", str(tmp_path / "lake"),
                      "--master", cluster.url, "--json", cwd=tmp_path)
        assert built.returncode == 0, f"{built.stderr}\n{cluster.logs()}"
        query = "SELECT route, count(*) AS n, sum(offset) AS s FROM can GROUP BY route"
        on_cluster = _msgq("lake", "sql", query, str(tmp_path / "lake"), "--master",
                           cluster.url, "--json", cwd=tmp_path)
        assert on_cluster.returncode == 0, on_cluster.stderr
        stats = _msgq("logstats", str(tmp_path / "lake"), "--master", cluster.url, "--json",
                      cwd=tmp_path)
        assert stats.returncode == 0, stats.stderr
    finally:
        cluster.stop()
    lake.build(spark, [folder], tmp_path / "local-lake")
    assert json.loads(on_cluster.stdout) == \
        [r.asDict() for r in lake.sql(spark, tmp_path / "local-lake", query).collect()]
    for table in ("can", "vehicleState", "gpsLocation"):
        cluster_rows = lake.read_table(spark, tmp_path / "lake", table).drop("file").collect()
        local_rows = lake.read_table(spark, tmp_path / "local-lake", table).drop("file") \
            .collect()
        def key(row: Any) -> tuple[int, int]:
            return (row.segment, row.offset)

        assert sorted(cluster_rows, key=key) == sorted(local_rows, key=key) and local_rows
    local = log_stats(read_logs(spark, folder, data=False))
    try:
        want = json.loads(json.dumps(local.to_dict()))
    finally:
        local.unpersist()
    got = json.loads(stats.stdout)
    for part in ("services", "segments", "gaps"):
        assert got[part] == want[part], part
