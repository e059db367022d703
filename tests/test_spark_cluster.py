"""``msgq logstats`` on a real Spark standalone cluster: a master and two workers started
with pyspark's own ``spark-class`` on free ports (tests/spark_cluster.py), the command run
as a user runs it (its own process, PYSPARK_PYTHON unset). Its results must equal local
mode's; executors may run this interpreter or a packed copy of this venv
(``msgq spark pack-env`` + spark.archives); executors that cannot import msgq give one
line naming the interpreter, never a traceback. The lake (``msgq lake build`` and ``msgq
lake sql`` with ``--master``, and ``msgq logstats`` of the lake) gives local mode's tables
and answers on the same cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from msgq.spark.standalone import Cluster, start_cluster  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

_NOTICE = "Using incubator modules"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    running = start_cluster(str(tmp_path_factory.mktemp("cluster")), workers=2, cores=1)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> str:
    from msgq.bench.spark import make_recording

    folder = str(tmp_path_factory.mktemp("cluster-logs") / "recording")
    make_recording(folder, 12.0, 3.0, drop=0.01)
    last = sorted(n for n in os.listdir(folder) if n.startswith("segment-"))[-1]
    with open(os.path.join(folder, last), "r+b") as f:  # damage: a problem row
        f.truncate(os.path.getsize(os.path.join(folder, last)) // 2)
    return folder


@pytest.fixture(scope="module")
def local_stats(spark: Any, recording: str) -> dict[str, Any]:
    """Local mode's log_stats of the recording (computed once for the module)."""
    return _local_stats(spark, recording)


def _msgq(argv: list[str], cwd: Path, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYSPARK_PYTHON", None)  # as a user's shell has it
    return subprocess.run([sys.executable, "-m", "msgq", *argv], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=timeout)


def _logstats_json(argv: list[str], cwd: Path, cluster: Cluster) -> dict[str, Any]:
    done = _msgq(["logstats", *argv, "--json"], cwd)
    if done.returncode != 0:
        pytest.fail(f"msgq logstats exited {done.returncode}; stderr:\n{done.stderr}\n"
                    f"cluster logs:\n{cluster.logs()}")
    assert _NOTICE not in done.stderr
    return dict(json.loads(done.stdout))


def _local_stats(spark: Any, folder: str) -> dict[str, Any]:
    from msgq.spark import read_logs
    from msgq.spark.analyses import log_stats

    stats = log_stats(read_logs(spark, folder, data=False))
    try:
        return dict(json.loads(json.dumps(stats.to_dict())))
    finally:
        stats.unpersist()


def _assert_same(doc: dict[str, Any], want: dict[str, Any]) -> None:
    assert want["services"] and want["problems"] and want["gaps"]
    for table in ("services", "segments", "gaps", "problems"):
        assert doc[table] == want[table], table


def _executor_folders(cluster: Cluster, before: Collection[str] = ()) -> set[str]:
    """The worker folders that ran an executor of an application not in ``before`` (the
    module's tests share the cluster: each asks about its own applications)."""
    out = set()
    for worker in ("work0", "work1"):
        root = Path(cluster.folder) / worker
        if root.is_dir() and any(app.is_dir() and any(app.iterdir()) and
                                 app.name not in before for app in root.glob("app-*")):
            out.add(worker)
    return out


def _applications(cluster: Cluster) -> set[str]:
    """The ids of every application the master has seen (running or finished)."""
    state = cluster.state()
    return {app["id"] for key in ("activeapps", "completedapps")
            for app in state.get(key, [])}


def test_logstats_on_a_standalone_cluster_equals_local_mode(
        cluster: Cluster, recording: str, local_stats: dict[str, Any], tmp_path: Path) -> None:
    before = _applications(cluster)
    doc = _logstats_json([recording, "--master", cluster.url], tmp_path, cluster)
    _assert_same(doc, local_stats)
    # the executors ran the interpreter of the command (PYSPARK_PYTHON was unset)
    assert doc["executors"] and all(e["python"] == sys.executable for e in doc["executors"])
    # both workers took part
    assert _executor_folders(cluster, before) == {"work0", "work1"}


def test_executors_from_a_packed_environment(
        cluster: Cluster, recording: str, local_stats: dict[str, Any], tmp_path: Path) -> None:
    archive = tmp_path / "msgq-env.tar.gz"
    done = _msgq(["spark", "pack-env", str(archive)], tmp_path)
    assert done.returncode == 0, done.stderr
    # the driver's folder has no ./environment: the data source's driver side must
    # still find msgq, the executors theirs in the unpacked archive. The recording is
    # named relative to the user's folder (the JVM runs in a private one, where Spark
    # plans the read: the path is the user's all the same)
    relative = os.path.relpath(recording, tmp_path)
    assert not os.path.isabs(relative)
    doc = _logstats_json([relative, "--master", cluster.url,
                          "--conf", "spark.archives=msgq-env.tar.gz#environment",
                          "--conf", "spark.pyspark.python=./environment/bin/python"],
                         tmp_path, cluster)
    _assert_same(doc, local_stats)
    for executor in doc["executors"]:
        python = executor["python"]
        assert python.endswith("/environment/bin/python"), python
        assert python.startswith(cluster.folder), python  # in a worker's folder


def test_executors_without_msgq_fail_in_one_line(cluster: Cluster, recording: str,
                                                 tmp_path: Path) -> None:
    # the base interpreter of this venv: the same Python, without msgq (or pyspark)
    base = os.path.realpath(sys.executable)
    check = subprocess.run([base, "-c", "import msgq"], capture_output=True, cwd=tmp_path)
    if check.returncode == 0:
        pytest.skip(f"{base} imports msgq: no interpreter without it here")
    done = _msgq(["logstats", recording, "--master", cluster.url,
                  "--conf", f"spark.pyspark.python={base}"], tmp_path)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines()
             if line.strip() and " ERROR " not in line]  # Spark's own log lines aside
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("msgq logstats: error: ") and base in lines[0]
    assert "spark.pyspark.python" in lines[0] and "Traceback" not in done.stderr


#: Runs ``msgq`` commands one after the other in one process, as a user's script calling
#: msgq.cli.main would: the first starts the Spark session (its JVM, an application on
#: the cluster), the later ones run on it (msgq.spark.session: an active session is
#: returned as it is). argv[1]: a JSON list of argument lists; argv[2]: where each
#: command's exit code and stdout go (JSON), the JVM's own output kept out of it.
COMMANDS = textwrap.dedent("""
    import contextlib, io, json, sys
    from msgq.cli import main

    results = []
    for argv in json.loads(sys.argv[1]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(argv)
        results.append([code, out.getvalue()])
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
""")


def test_the_lake_on_a_standalone_cluster_equals_local_mode(
        spark: Any, cluster: Cluster, recording: str, local_stats: dict[str, Any],
        tmp_path: Path) -> None:
    """msgq lake build, msgq lake sql and msgq logstats with --master, in one driver (one
    application on the cluster), give local mode's tables and answers."""
    from msgq.spark import lake

    query = "SELECT route, count(*) AS n, sum(offset) AS s FROM can GROUP BY route"
    on_cluster = str(tmp_path / "lake")
    commands = [["lake", "build", recording, "--to", on_cluster, "--master", cluster.url,
                 "--json"],
                ["lake", "sql", query, on_cluster, "--master", cluster.url, "--json"],
                ["logstats", on_cluster, "--master", cluster.url, "--json"]]
    before = _applications(cluster)
    env = dict(os.environ)
    env.pop("PYSPARK_PYTHON", None)  # as a user's shell has it
    done = subprocess.run([sys.executable, "-c", COMMANDS, json.dumps(commands),
                           str(tmp_path / "results.json")], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, f"{done.stderr}\n{cluster.logs()}"
    results = json.loads((tmp_path / "results.json").read_text())
    for argv, (code, _) in zip(commands, results, strict=True):
        assert code == 0, f"msgq {argv[0]} {argv[1]} exited {code}:\n{done.stderr}"
    assert len(_applications(cluster) - before) == 1  # the three commands, one driver
    assert _executor_folders(cluster, before) == {"work0", "work1"}
    built, answer, stats = (json.loads(out) for _, out in results)
    assert built["events"] > 0
    local_lake = tmp_path / "local-lake"
    lake.build(spark, [recording], local_lake)
    assert answer == [r.asDict() for r in lake.sql(spark, local_lake, query).collect()]
    for table in ("can", "vehicleState", "gpsLocation"):
        cluster_rows = lake.read_table(spark, on_cluster, table).drop("file").collect()
        local_rows = lake.read_table(spark, local_lake, table).drop("file").collect()

        def key(row: Any) -> tuple[int, int]:
            return (row.segment, row.offset)

        assert sorted(cluster_rows, key=key) == sorted(local_rows, key=key) and local_rows
    # logstats of the lake on the cluster: the raw recording's, in local mode
    _assert_same(stats, local_stats)
