"""A SparkSession for msgq's tools: local by default, a cluster when given its master URL.

Local sessions (``local``, ``local[N]``, ``local[*]``) get small-machine settings: no web
UI, no progress bars, loopback networking, the current Python interpreter for the Python
workers (so they import the same msgq), a few shuffle partitions. Cluster sessions keep
the cluster's own settings apart from the quiet logging; their executors need Java 17+,
Python with msgq installed (``pip install 'msgq[spark]'``) and the log files at the same
paths (see docs/spark.md).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_MASTER", "JavaMissingError", "check_java", "spark_session"]

#: The master used when none is given: every core of this machine.
DEFAULT_MASTER = "local[*]"
_MIN_JAVA = 17

# Log4j 2 configuration of quiet sessions: errors only, on stderr, from the first line
# the JVM prints (setLogLevel alone takes effect only after start-up).
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


class JavaMissingError(RuntimeError):
    """No Java runtime (17 or newer) to start Spark with."""


def _java_command() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def check_java() -> int:
    """The major version of the Java runtime Spark will use; JavaMissingError (saying how
    to install one) when there is none or it is older than 17."""
    hint = ("Spark needs Java 17 or newer: run scripts/ensure_env.sh as root, or "
            "apt-get install openjdk-17-jre-headless (or set JAVA_HOME)")
    java = _java_command()
    if java is None:
        raise JavaMissingError(f"no java found; {hint}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True,
                             timeout=30).stderr
    except (OSError, subprocess.SubprocessError) as e:
        raise JavaMissingError(f"{java} -version failed ({e}); {hint}") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise JavaMissingError(f"cannot tell the version of {java}; {hint}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_..." is Java 8
        major = int(match.group(2))
    if major < _MIN_JAVA:
        raise JavaMissingError(f"{java} is Java {major}; {hint}")
    return major


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def _quiet_log_config() -> str:
    folder = tempfile.mkdtemp(prefix="msgq-spark-")
    atexit.register(shutil.rmtree, folder, True)  # read once, when the JVM starts
    path = os.path.join(folder, "log4j2.properties")
    with open(path, "w") as f:
        f.write(_LOG4J2)
    return path


def spark_session(
    master: str | None = None,
    app_name: str = "msgq",
    config: Mapping[str, str] | None = None,
    quiet: bool = True,
) -> Any:
    """A SparkSession on ``master`` (default ``local[*]``), the msgqlog source registered.

    An active session is returned as it is (Spark allows one per process): stop it first
    to change the master. ``config`` entries override the defaults. ``quiet`` logs errors
    only (from JVM start-up on, when this call starts the JVM).
    """
    master = master or DEFAULT_MASTER
    if _is_local(master):
        check_java()  # a clear message instead of the launcher's
    from pyspark.sql import SparkSession

    import msgq.spark

    settings: dict[str, str] = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if _is_local(master):
        cores = os.cpu_count() or 1
        settings.update({
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.shuffle.partitions": str(max(2, 2 * cores)),
        })
        # The Python workers must import the msgq this process imports: PySpark takes
        # their interpreter from PYSPARK_PYTHON (default "python3" on the PATH).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if quiet and SparkSession.getActiveSession() is None:
        settings["spark.driver.extraJavaOptions"] = \
            f"-Dlog4j2.configurationFile=file:{_quiet_log_config()}"
        # pyspark's notice about the pandas release is not the user's concern here
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                                category=FutureWarning)
    settings.update(config or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    msgq.spark.register(spark)
    return spark
