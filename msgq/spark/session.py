"""A SparkSession for msgq's tools: local by default, a cluster when given its master URL.

Local sessions (``local``, ``local[N]``, ``local[*]``) get small-machine settings: no web
UI, no progress bars, loopback networking, the current Python interpreter for the Python
workers (so they import the same msgq), a few shuffle partitions. Cluster sessions keep
the cluster's own settings apart from the quiet logging; their executors need Java 17+,
Python with msgq installed (``pip install 'msgq-shm[spark]'``) and the log files at the same
paths (see docs/spark.md).
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import msgq.spark
import msgq.spark.class_cache
import msgq.spark.connect
from msgq.spark.worker_daemon import installed_first

__all__ = ["DEFAULT_MASTER", "INCUBATOR_NOTICE", "ExecutorPythonError", "JavaMissingError",
           "check_java", "probe_executors", "probed_executors", "server_settings",
           "spark_session", "worker_python"]

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


class ExecutorPythonError(RuntimeError):
    """The executors' Python cannot run msgq's reader (probe_executors says which
    interpreter, where, and what to set)."""


#: The JVM's notice at start-up when Spark enables an incubator module (the Vector API):
#: nothing a user can act on, printed on every run. Only this exact line is dropped.
INCUBATOR_NOTICE = b"WARNING: Using incubator modules: jdk.incubator.vector"


def _java_command() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def check_java() -> int:
    """The major version of the Java runtime Spark will use; JavaMissingError (saying how
    to install one) when there is none or it is older than 17."""
    return _java_runtime()[2]


def _java_runtime() -> tuple[str, str, int]:
    """The java command Spark will use, its ``-version`` text and its major version;
    JavaMissingError as for :func:`check_java`."""
    hint = ("Spark needs Java 17 or newer: run scripts/ensure_env.sh as root, or "
            "apt-get install openjdk-17-jre-headless (or set JAVA_HOME)")
    java = _java_command()
    if java is None:
        raise JavaMissingError(f"no java found; {hint}")
    out = _java_version_text(java)
    if out is None:
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True,
                                 timeout=30).stderr
        except (OSError, subprocess.SubprocessError) as e:
            raise JavaMissingError(f"{java} -version failed ({e}); {hint}") from None
        _remember_java_version(java, out)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise JavaMissingError(f"cannot tell the version of {java}; {hint}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_..." is Java 8
        major = int(match.group(2))
    if major < _MIN_JAVA:
        raise JavaMissingError(f"{java} is Java {major}; {hint}")
    return java, out, major


#: The file remembering ``java -version`` of the runtime last used (in the class archive's
#: folder): a JVM started for every command only to print its version costs 0.1-0.4 s.
_JAVA_VERSION_FILE = "java-version.json"
#: What else ``java -version`` prints depends on ("Picked up JAVA_TOOL_OPTIONS: ...").
_JAVA_ENVIRONMENT = ("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS")


def _java_key(java: str) -> str | None:
    """What identifies a Java runtime's ``-version`` text: the real path of its java,
    that file's size and modification time, and the variables the JVM reads at start."""
    try:
        real = os.path.realpath(java)
        info = os.stat(real)
    except OSError:
        return None
    return "\n".join([real, str(info.st_size), str(info.st_mtime_ns),
                      *(os.environ.get(name, "") for name in _JAVA_ENVIRONMENT)])


def _java_version_text(java: str) -> str | None:
    """The remembered ``java -version`` text of ``java``, or None (not remembered, another
    runtime, or a file that is not this user's alone)."""
    key = _java_key(java)
    path = os.path.join(msgq.spark.class_cache.cache_folder(), _JAVA_VERSION_FILE)
    try:
        info = os.stat(path)
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            return None
        with open(path) as f:
            remembered = json.load(f)
    except (OSError, ValueError):
        return None
    if key is None or not isinstance(remembered, dict) or remembered.get("key") != key:
        return None
    text = remembered.get("text")
    return text if isinstance(text, str) else None


def _remember_java_version(java: str, text: str) -> None:
    key = _java_key(java)
    folder = msgq.spark.class_cache.cache_folder()
    if key is None:
        return
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        temporary = os.path.join(folder, f"{_JAVA_VERSION_FILE}.{os.getpid()}.tmp")
        with open(temporary, "w") as f:
            json.dump({"key": key, "text": text}, f)
        os.replace(temporary, os.path.join(folder, _JAVA_VERSION_FILE))
    except OSError:
        pass


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def _local_cores(master: str) -> int:
    """The cores a local master runs tasks on: N of ``local[N]`` (or ``local[N,F]``),
    every core for ``local[*]``, one for ``local``."""
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master)
    if match is None:
        return 1
    return os.cpu_count() or 1 if match.group(1) == "*" else int(match.group(1))


def _local_settings() -> dict[str, str]:
    """The small-machine settings of a local driver (module docstring)."""
    cores = os.cpu_count() or 1
    return {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(max(2, 2 * cores)),
        # the driver's interpreter runs the workers here, so msgq is importable
        "spark.python.daemon.module": "msgq.spark.worker_daemon",
    }


def _quiet_log_config() -> str:
    folder = tempfile.mkdtemp(prefix="msgq-spark-")
    atexit.register(shutil.rmtree, folder, True)  # read once, when the JVM starts
    path = os.path.join(folder, "log4j2.properties")
    with open(path, "w") as f:
        f.write(_LOG4J2)
    return path


def worker_python(config: Mapping[str, str] | None = None) -> str:
    """The Python interpreter of the Python workers, executors' and driver's alike:
    ``spark.pyspark.python`` from ``config``, else $PYSPARK_PYTHON, else this process's
    interpreter (which imports this msgq)."""
    return ((config or {}).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
            or sys.executable)


#: The wrapper folders of :func:`_installed_pyspark_first` (then the owner's pid, for
#: whoever looks at the temp folder; their lock, not the pid, says whether it lives).
_WRAPPER_PREFIX = "msgq-spark-python-"
#: In each wrapper folder: a file its process holds an flock on while it lives.
_WRAPPER_LOCK = ".lock"


def _hold_wrapper_folder(folder: str) -> None:
    """Takes the folder's lock for the life of this process (a lock dies with its
    process, whatever pid namespace the process runs in); at exit the folder goes."""
    lock = os.open(os.path.join(folder, _WRAPPER_LOCK), os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    atexit.register(_release_wrapper_folder, folder, lock, os.getpid())


def _release_wrapper_folder(folder: str, lock: int, owner: int) -> None:
    """At exit, in the process that made the folder only: a forked child that exits
    through its exit handlers leaves its parent's folder alone."""
    if os.getpid() == owner:
        os.close(lock)
        shutil.rmtree(folder, ignore_errors=True)


def _remove_dead_wrappers() -> None:
    """Removes the wrapper folders of processes that died before their exit handlers ran
    (a SIGKILL): this user's folders whose lock nobody holds any more. A pid alone would
    not do: a process in another pid namespace sharing this temp folder looks dead."""
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), _WRAPPER_PREFIX + "*")):
        try:
            info = os.lstat(folder)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(folder, _WRAPPER_LOCK), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # not ours, or a folder without a lock: left alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its process lives
        finally:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)  # links inside are removed, not followed


def _installed_pyspark_first(python: str) -> str:
    """An interpreter for the Python workers of a local session that imports the
    installed pyspark and py4j ahead of Spark's zips, or ``python`` unchanged.

    The JVM starts the data source's driver-side planner processes (``python -m
    pyspark.sql.worker.lookup_data_sources``, ``create_data_source``,
    ``plan_data_source_read``) with Spark's ``pyspark.zip`` and py4j zip first on
    PYTHONPATH, and the daemon module setting does not reach them: each compiles pyspark
    from the zip (no bytecode is cached for a zip), about 0.4 s of CPU against 0.1 s for
    the installed copy. The wrapper is a two-line shell script in a private folder that
    also holds links to the installed ``pyspark`` and ``py4j`` packages (nothing else,
    so no other installed module moves ahead of the standard library), and puts that
    folder first on PYTHONPATH. It applies only where it changes nothing but the speed:
    POSIX, the workers run this very interpreter, and Spark's zips are the installed
    versions (:func:`msgq.spark.worker_daemon.installed_first` keeps none)."""
    if os.name != "posix" or python != sys.executable:
        return python
    try:
        # the optional spark extra, imported when Spark is used
        import py4j
        import pyspark
    except ImportError:
        return python
    lib = os.path.join(msgq.spark.class_cache.spark_home(), "python", "lib")
    zips = sorted(glob.glob(os.path.join(lib, "*.zip")))
    if not zips or installed_first(zips):
        return python
    _remove_dead_wrappers()
    folder = tempfile.mkdtemp(prefix=f"{_WRAPPER_PREFIX}{os.getpid()}-")
    _hold_wrapper_folder(folder)
    for package in (pyspark, py4j):
        name = package.__name__
        os.symlink(os.path.dirname(os.path.realpath(package.__file__)),
                   os.path.join(folder, name))
    wrapper = os.path.join(folder, "python")
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\nPYTHONPATH={shlex.quote(folder)}${{PYTHONPATH:+:$PYTHONPATH}} "
                f"exec {shlex.quote(python)} \"$@\"\n")
    os.chmod(wrapper, 0o700)
    return wrapper


def _filter_jvm_stderr() -> tuple[int, int]:
    """Points fd 2 at a pipe (the JVM about to start inherits it) whose lines are copied
    to the real stderr, less the incubator notice; returns (saved fd 2, pipe read end)."""
    read_end, write_end = os.pipe()
    saved = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    return saved, read_end


def _copy_jvm_stderr(read_end: int, target: int) -> None:
    def copy() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                if line.rstrip(b"\r\n") != INCUBATOR_NOTICE:
                    os.write(target, line)
        os.close(target)

    threading.Thread(target=copy, name="msgq-jvm-stderr", daemon=True).start()


_PROBE = """
def probe(_):
    import socket, sys
    try:
        import msgq.spark.datasource
        error = None
    except BaseException as e:
        error = type(e).__name__ + ": " + " ".join(str(e).split())
    return [(socket.gethostname(), sys.executable, sys.version.split()[0], error)]
"""


def _probe_function() -> Any:
    # Defined in a namespace that is no importable module, so cloudpickle sends the
    # function by value: unpickling it needs no msgq on the executor (that is what
    # it checks).
    namespace: dict[str, Any] = {"__name__": "msgq_executor_probe"}
    exec(_PROBE, namespace)
    return namespace["probe"]


def probe_executors(spark: Any, timeout_s: float = 120.0) -> list[tuple[str, str, str]]:
    """Runs a task per executor core that imports msgq's reader; returns (host, python,
    version) of each. ExecutorPythonError, one line naming the interpreter that failed
    and what to set, when a worker cannot start or cannot import msgq, or when no
    executor ran the tasks within ``timeout_s`` (no free cores on the cluster). A Spark
    Connect session has no SparkContext to run it with: ValueError."""
    if msgq.spark.connect.is_connect(spark):
        raise ValueError("probe_executors needs a classic session (SparkContext jobs); a "
                         "Spark Connect server runs its own Python: the one it was started "
                         "with (msgq spark serve: this msgq's)")
    sc = spark.sparkContext
    python = sc.pythonExec
    hint = ("set spark.pyspark.python (msgq logstats --conf spark.pyspark.python=PATH) or "
            "PYSPARK_PYTHON to a Python " + ".".join(map(str, sys.version_info[:2])) +
            " with msgq-shm[spark] installed at that path on every executor, or ship one with "
            "spark.archives: msgq spark pack-env (docs/spark.md)")
    n = max(2, sc.defaultParallelism)
    outcome: dict[str, Any] = {}
    group = f"msgq-probe-{os.getpid()}-{id(outcome)}"

    def run() -> None:
        try:
            sc.setJobGroup(group, "msgq: probe the executors' Python", True)
            outcome["rows"] = sc.parallelize(range(n), n) \
                .mapPartitions(_probe_function()).collect()
        except BaseException as e:  # reported by the caller
            outcome["error"] = e

    thread = threading.Thread(target=run, name="msgq-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        sc.cancelJobGroup(group)
        raise ExecutorPythonError(
            f"no executor ran msgq's probe task within {timeout_s:g} s: does the cluster "
            f"({sc.master}) have workers with free cores and memory for this application?")
    if "error" in outcome:
        reason = _error_line(outcome["error"])
        raise ExecutorPythonError(
            f"the executors could not run a Python task with {python}: {reason}; {hint}")
    rows = outcome["rows"]
    for host, executable, _version, error in rows:
        if error is not None:
            raise ExecutorPythonError(
                f"{executable} on executor host {host} cannot import msgq ({error}); {hint}")
    found = sorted({(host, executable, version) for host, executable, version, _ in rows})
    _probed[sc.applicationId] = found
    return found


_probed: dict[str, list[tuple[str, str, str]]] = {}


def probed_executors(spark: Any) -> list[tuple[str, str, str]] | None:
    """What :func:`probe_executors` found for this session's application: (host,
    python, version) of the executors' workers; None when it did not run (never on a
    Spark Connect session)."""
    if msgq.spark.connect.is_connect(spark):
        return None
    return _probed.get(spark.sparkContext.applicationId)


def _error_line(error: BaseException) -> str:
    """The line of a Spark/Python/Java error that says what went wrong."""
    text = str(error).strip()
    missing = re.search(r'Cannot run program "[^"]*": error=\d+, [^\n;]*', text)
    if missing:  # a Python that is not there: the JVM's words say it best
        return missing.group(0).strip()
    for marker in ("Error:", "Exception:", "error="):
        for line in text.splitlines():
            if marker in line and "Traceback" not in line:
                return " ".join(line.split())
    return text.splitlines()[0] if text else type(error).__name__


_PATH_SETTINGS = ("spark.archives", "spark.files", "spark.jars", "spark.submit.pyFiles")


def _driver_folder(python: str, settings: dict[str, str]) -> str | None:
    """For a worker Python given relative to the executors' working folder (the packed
    venv of spark.archives: ``./environment/bin/python``): a private folder for the
    driver's JVM to start in, where that path leads to this process's venv. The JVM
    starts its driver-side Python workers (the data source's planning) in its own
    working folder with the executors' relative path. None for an absolute or bare
    interpreter. Local paths of the file settings are made absolute (the JVM resolves
    them from the folder it starts in)."""
    if os.path.isabs(python) or "/" not in python:
        return None
    top = os.path.normpath(python).split("/")[0]
    if top in ("", ".", ".."):
        return None
    folder = tempfile.mkdtemp(prefix="msgq-spark-driver-")
    atexit.register(shutil.rmtree, folder, True)
    os.symlink(sys.prefix, os.path.join(folder, top))
    if not os.access(os.path.join(folder, python), os.X_OK):
        raise ExecutorPythonError(
            f"spark.pyspark.python {python} is relative to the executors' folder (a packed "
            f"venv of spark.archives); the driver runs the same path in this Python's venv "
            f"({sys.prefix}), which has no {python.split('/', 1)[1]}: run msgq from a venv")
    for key in _PATH_SETTINGS:
        if settings.get(key):
            settings[key] = ",".join(_absolute(entry) for entry in settings[key].split(","))
    return folder


def _check_py_files(settings: Mapping[str, str]) -> None:
    """A zip of msgq among spark.submit.pyFiles (--py-files) is refused before Spark
    starts: executors would import it ahead of a working installed msgq, and a zip can
    carry neither msgq's compiled extensions nor its schema files (which pycapnp reads
    from real files). Zips of other modules are left alone."""
    for entry in (settings.get("spark.submit.pyFiles") or "").split(","):
        entry = entry.strip()
        if not entry or (uri_scheme := re.match(r"^([A-Za-z][A-Za-z0-9+.-]+):", entry)) \
                and uri_scheme.group(1).lower() != "file":
            continue
        path = os.path.expanduser(re.sub(r"^file:(//)?", "", entry) if uri_scheme else entry)
        if not zipfile.is_zipfile(path):
            continue
        with zipfile.ZipFile(path) as archive:
            if any(name.split("/")[0] == "msgq" for name in archive.namelist()):
                raise ValueError(
                    f"{entry} (spark.submit.pyFiles, --py-files) holds msgq: a zip cannot "
                    "carry msgq's compiled extensions and schema files, and executors "
                    "would import it instead of an installed msgq; leave it out, and "
                    "install msgq-shm[spark] on the executors or ship this venv with "
                    "spark.archives (msgq spark pack-env)")


def _absolute(entry: str) -> str:
    """A comma-list entry of a Spark file setting, a local path made absolute."""
    entry = entry.strip()
    if not entry or re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", entry):
        return entry  # a URI: Spark resolves it
    path, hash_sign, fragment = entry.partition("#")
    return os.path.abspath(os.path.expanduser(path)) + hash_sign + fragment


def server_settings(master: str | None = None, config: Mapping[str, str] | None = None,
                    java_options: Sequence[str] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """(Spark settings, environment) of a Spark Connect server's driver
    (:func:`msgq.spark.server.serve`): a local session's settings (``master``, default
    ``local[*]``) with msgq's interpreter for every Python worker (the data source's
    planners too), the default parallelism of the master's cores set (a Connect client has
    no SparkContext to ask), quiet logging and the class archive mapped when there is one
    (a server is not a short command: none is written, and the JIT is left whole).
    ``java_options`` go to the driver's JVM, ``config`` last. The environment is this
    process's with $PYSPARK_PYTHON set and the Connect client's variables removed."""
    master = master or DEFAULT_MASTER
    config = dict(config or {})
    settings: dict[str, str] = {
        "spark.master": master,
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    flags = [f"-Dlog4j2.configurationFile=file:{_quiet_log_config()}"]
    python = worker_python(config)
    if _is_local(master):
        java, version, _ = _java_runtime()
        settings.update(_local_settings())
        settings["spark.default.parallelism"] = str(_local_cores(master))
        python = _installed_pyspark_first(python)
        flags += msgq.spark.class_cache.jvm_flags(java, version, write=False)
    if not os.path.isabs(python) and "/" in python:
        raise ExecutorPythonError(
            f"spark.pyspark.python {python} is relative (a packed venv of spark.archives): "
            "a Spark Connect server's driver needs an absolute path")
    settings["spark.pyspark.python"] = python
    given = config.pop("spark.driver.extraJavaOptions", "")
    settings["spark.driver.extraJavaOptions"] = " ".join([*flags, *java_options, given]).strip()
    settings.update(config)
    _check_py_files(settings)
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = python
    env["SPARK_CONNECT_MODE"] = "0"  # the server itself is no Connect client
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE",
                 msgq.spark.connect.ENV_REMOTE):
        env.pop(name, None)
    return settings, env


def spark_session(
    master: str | None = None,
    app_name: str = "msgq",
    config: Mapping[str, str] | None = None,
    quiet: bool = True,
    probe: bool | None = None,
    java_options: Sequence[str] = (),
    class_cache: bool = False,
    remote: str | None = None,
) -> Any:
    """A SparkSession on ``master`` (default ``local[*]``), the msgqlog source registered.

    ``remote`` (``sc://HOST:PORT``), else $MSGQ_SPARK_REMOTE when no ``master`` is given:
    a Spark Connect session on that server instead (:mod:`msgq.spark.connect`; ``msgq
    spark serve`` starts one), said on stderr in one line; ``config`` then holds session
    settings, and ``quiet``, ``probe``, ``java_options`` and ``class_cache`` (the local
    JVM's) do not apply. A server that does not answer is
    :class:`msgq.spark.connect.RemoteError`, in one line, within seconds. ``remote`` with
    a ``master`` is a ValueError (one or the other).

    An active session is returned as it is (Spark allows one per process): stop it first
    to change the master. ``config`` entries override the defaults. ``quiet`` logs errors
    only (from JVM start-up on, when this call starts the JVM) and drops the JVM's
    incubator-module notice.

    The Python workers, the executors' and the driver-side process of the data source
    alike, run :func:`worker_python` (``spark.pyspark.python``, else $PYSPARK_PYTHON,
    else this interpreter): pyspark otherwise starts ``python3`` from the PATH, which may
    not have msgq. ``probe`` (default: on for cluster masters) runs
    :func:`probe_executors` before returning.

    A relative worker Python (``./environment/bin/python``, the packed venv of
    ``spark.archives``: msgq spark pack-env) is the executors' path; the driver's JVM
    then starts in a private folder where that path leads to this venv, so the data
    source's driver-side process finds msgq too (local paths of spark.archives,
    spark.files, spark.jars and spark.submit.pyFiles are made absolute first). A zip
    holding msgq among spark.submit.pyFiles is refused (ValueError): it would shadow
    an installed msgq and cannot carry its extensions and schema files.

    ``java_options``: flags for the driver's JVM when this call starts it (before any
    ``spark.driver.extraJavaOptions`` of ``config``, which win), e.g.
    ``-XX:TieredStopAtLevel=1`` for a short command (``msgq logstats``). Local sessions
    run their Python workers under :mod:`msgq.spark.worker_daemon`, which imports the
    installed pyspark instead of compiling Spark's zipped copy in every worker (unless
    ``config`` sets ``spark.python.daemon.module``), and where the workers run this
    interpreter they get a wrapper of it that does the same for the data source's
    driver-side planner processes (:func:`_installed_pyspark_first`).

    ``class_cache``: a local session's JVM maps the classes it needs from the archive of
    :mod:`msgq.spark.class_cache` (written by the first such run when its JVM exits):
    about 3 s less start-up for a short command such as ``msgq logstats``.
    """
    url = msgq.spark.connect.remote_url(remote) if remote is not None or master is None \
        else None
    if url is not None:
        if master is not None:
            raise ValueError(f"a master ({master}) and a Spark Connect server ({url}): "
                             "give one or the other")
        return msgq.spark.connect.connect_session(url, app_name, config)
    master = master or DEFAULT_MASTER
    runtime = None
    if _is_local(master):
        runtime = _java_runtime()  # a clear message instead of the launcher's
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql import SparkSession


    config = dict(config or {})
    settings: dict[str, str] = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if _is_local(master):
        settings.update(_local_settings())
    starting = SparkSession.getActiveSession() is None
    if starting:
        # pyspark gives every Python function the interpreter in $PYSPARK_PYTHON when
        # the context starts (the driver-side planning of a Python data source too);
        # spark.pyspark.python alone does not reach it.
        python = worker_python(config)
        if _is_local(master):
            python = _installed_pyspark_first(python)
        os.environ["PYSPARK_PYTHON"] = python
        settings["spark.pyspark.python"] = python
    cache_flags: list[str] = []
    if class_cache and starting and runtime is not None:
        cache_flags = msgq.spark.class_cache.jvm_flags(runtime[0], runtime[1])
    jvm_flags = [*cache_flags, *java_options] if starting else []
    if quiet and starting:
        jvm_flags.insert(0, f"-Dlog4j2.configurationFile=file:{_quiet_log_config()}")
        # pyspark's notice about the pandas release is not the user's concern here
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                                category=FutureWarning)
    if jvm_flags:  # the caller's own options last: the JVM takes the last of a flag
        given = config.pop("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = " ".join([*jvm_flags, given]).strip()
    settings.update(config)
    _check_py_files(settings)
    folder = _driver_folder(settings["spark.pyspark.python"], settings) if starting else None
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    here = os.getcwd()
    if folder is not None:
        os.chdir(folder)  # the JVM starts here and keeps it as its working folder
    try:
        if quiet and starting:
            saved, read_end = _filter_jvm_stderr()
            try:
                spark = builder.getOrCreate()
            finally:
                os.dup2(saved, 2)
                _copy_jvm_stderr(read_end, saved)
        else:
            spark = builder.getOrCreate()
    finally:
        os.chdir(here)
    if runtime is not None and msgq.spark.class_cache.writes_archive(cache_flags):
        # pyspark: imported above already (the optional spark extra)
        from pyspark import SparkContext

        gateway = getattr(SparkContext, "_gateway", None)
        process = getattr(gateway, "proc", None)
        if process is not None:  # it writes the archive when it exits, maybe after us
            msgq.spark.class_cache.record_writer(runtime[0], runtime[1], process.pid)
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    msgq.spark.register(spark)
    if probe if probe is not None else not _is_local(master):
        probe_executors(spark)
    return spark
