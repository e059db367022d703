"""A real Spark standalone cluster on this machine, for tests and the benchmark: one
master and workers started with pyspark's own ``spark-class`` (the launcher a cluster
uses), on free loopback ports, each stopped by its process id; every wait is bounded.

::

    cluster = start_cluster("/tmp/cluster", workers=2, cores=1)
    try:
        ...  # spark_session(cluster.url), msgq logstats --master URL
    finally:
        cluster.stop()
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Cluster", "free_port", "start_cluster"]


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """A running cluster: its master URL, web UI, folder (logs, work dirs), daemons."""

    url: str  # spark://127.0.0.1:PORT
    web: str  # the master's web UI (its /json/ tells the workers and applications)
    folder: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """The master's view (``/json/``): status, alive workers, applications."""
        with urllib.request.urlopen(self.web + "/json/", timeout=10) as response:
            return dict(json.load(response))

    def logs(self) -> str:
        """The tail of every daemon's log, for a failing test's message."""
        out = []
        for name in sorted(os.listdir(self.folder)):
            if name.endswith(".log"):
                with open(os.path.join(self.folder, name), errors="replace") as f:
                    out.append(f"== {name}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def stop(self) -> None:
        """Stops every daemon by its process id (SIGTERM, SIGKILL after 20 s)."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _start(cluster: Cluster, name: str, args: list[str], env: dict[str, str]) -> None:
    # pyspark: the optional spark extra, imported when Spark is used
    import pyspark

    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    log = open(os.path.join(cluster.folder, f"{name}.log"), "wb")  # noqa: SIM115
    with log:  # spark-class execs the JVM: the process id is the daemon's
        cluster.processes.append(subprocess.Popen([spark_class, *args], stdout=log,
                                                  stderr=subprocess.STDOUT, env=env,
                                                  cwd=cluster.folder))


def _wait(what: str, cluster: Cluster, ready: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        for process in cluster.processes:
            if process.poll() is not None:
                raise RuntimeError(f"a Spark daemon exited ({process.returncode}) while "
                                   f"waiting for {what}:\n{cluster.logs()}")
        try:
            if ready():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s:g} s:\n{cluster.logs()}")
        time.sleep(0.5)


def start_cluster(folder: str, workers: int = 2, cores: int = 1, memory: str = "1g",
                  timeout_s: float = 180.0) -> Cluster:
    """Starts a master and ``workers`` workers of ``cores`` cores each; returns once the
    master counts them all alive. Stop it with :meth:`Cluster.stop`."""
    # pyspark: the optional spark extra, imported when Spark is used
    import pyspark

    os.makedirs(folder, exist_ok=True)
    port, web = free_port(), free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web}", folder)
    env = dict(os.environ, SPARK_HOME=os.path.dirname(pyspark.__file__),
               SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
               SPARK_LOG_DIR=folder, SPARK_WORKER_DIR=os.path.join(folder, "work"))
    env.pop("PYSPARK_PYTHON", None)  # what the executors run is the application's choice
    try:
        _start(cluster, "master", ["org.apache.spark.deploy.master.Master", "--host",
                                   "127.0.0.1", "--port", str(port), "--webui-port", str(web)],
               env)
        _wait("the master", cluster, lambda: cluster.state().get("status") == "ALIVE",
              timeout_s)
        for i in range(workers):
            _start(cluster, f"worker{i}", [
                "org.apache.spark.deploy.worker.Worker", cluster.url, "--host", "127.0.0.1",
                "--port", str(free_port()), "--webui-port", str(free_port()),
                "--cores", str(cores), "--memory", memory,
                "--work-dir", os.path.join(folder, f"work{i}")], env)
        _wait(f"{workers} workers", cluster,
              lambda: cluster.state().get("aliveworkers") == workers, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster
