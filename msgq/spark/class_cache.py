"""A class-data-sharing archive for the driver's JVM, so short Spark commands start faster.

A Spark driver loads about 15 000 classes before its first job: parsing and verifying
them is most of the JVM's share of a command's start-up. Java (13 and later) can write
the classes a run loaded to an archive at exit (``-XX:ArchiveClassesAtExit``) and map
them from it in later runs (``-XX:SharedArchiveFile``). Measured on the reference
machine with a 15 k-event recording (``msgq logstats``, ``local[1]``): session start
5.1 → 2.8 s, and the whole command about 3 s shorter.

:func:`jvm_flags` picks the flags for a driver about to start. The archive lives under
``$XDG_CACHE_HOME/msgq`` (else ``~/.cache/msgq``), one file per Java runtime, Spark
installation and pyspark version (the name says which), about 170 MB; the
:data:`KEEP_ARCHIVES` used last are kept, so several virtual environments on one machine
do not take turns rewriting one. The first run
writes it when its JVM exits: that JVM goes on for some seconds after the command
returned (in the background), and a ``.writing`` marker (the JVM's pid, from
:func:`record_writer`) stops other runs from writing the same archive meanwhile. A
damaged, partial or mismatched archive is not an error: the JVM checks it (CRCs
included) when it starts and runs without it (its CDS messages are turned off).
Archives and their folder are used only when they belong to this user and nobody else
may write them: the archive holds code the JVM runs. ``MSGQ_SPARK_CLASS_CACHE=0`` turns
the cache off; ``MSGQ_SPARK_CLASS_CACHE=read`` maps an archive that is there but never
writes one (the demo of ``./run.sh``: on a fresh machine writing it would add more to
that run than it saves).
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import time
from importlib import metadata

from msgq.queues import process_alive

__all__ = ["archive_path", "cache_folder", "enabled", "jvm_flags", "record_writer",
           "spark_home", "wait_for_archive", "writes_archive", "writes_missing"]

#: A ``.writing`` marker older than this is left over from a run that died: ignored.
WRITE_TIMEOUT_S = 120.0
#: Archives kept (the ones used last): one per Java runtime and Spark installation in
#: use, e.g. a project's virtual environment beside a clean clone's.
KEEP_ARCHIVES = 3
_QUIET = "-Xlog:cds*=off"
#: The JVM checks the archive's CRCs when it maps it (free here: 0.1 s or less) and runs
#: without it when they do not match; unchecked, a damaged archive crashes the JVM.
_VERIFY = "-XX:+VerifySharedSpaces"


def enabled() -> bool:
    """Whether the archive is used (``MSGQ_SPARK_CLASS_CACHE`` is not 0)."""
    return os.environ.get("MSGQ_SPARK_CLASS_CACHE", "1").strip() not in ("0", "false", "no")


def writes_missing() -> bool:
    """Whether a missing archive is written at the JVM's exit (``MSGQ_SPARK_CLASS_CACHE``
    is not ``read``)."""
    return os.environ.get("MSGQ_SPARK_CLASS_CACHE", "1").strip() != "read"


def cache_folder() -> str:
    """Where the archives are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "msgq")


def spark_home() -> str:
    """Spark's installation folder: $SPARK_HOME, else the pip pyspark package."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return os.path.realpath(home)
    import pyspark  # the pip installation is Spark's home when SPARK_HOME is unset

    return os.path.realpath(os.path.dirname(pyspark.__file__))


def archive_path(java: str, java_version: str) -> str:
    """The archive for this Java runtime (its path and ``java -version`` text) and this
    Spark installation (its folder, its jars, the pyspark version)."""
    home = spark_home()
    jars = sorted(glob.glob(os.path.join(home, "jars", "*.jar")))
    try:
        pyspark_version = metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        pyspark_version = "?"
    key = "\n".join([os.path.realpath(java), java_version, home, pyspark_version,
                     *(os.path.basename(j) for j in jars)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(cache_folder(), f"spark-{pyspark_version}-{digest}.jsa")


def _fresh(path: str) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime < WRITE_TIMEOUT_S
    except OSError:
        return False


def jvm_flags(java: str, java_version: str, write: bool = True) -> list[str]:
    """The JVM flags of a driver about to start: map the archive when there is one; else
    write it at exit (unless :func:`writes_missing` says not, or ``write`` is false: a
    Spark Connect server, whose exit is no moment to spend seconds writing). No flags
    while another run writes it, when the cache is off, or when its folder cannot be
    written. A file there that does not even start like an archive (garbage, or the start
    of one whose writer was killed) is written again."""
    if not enabled():
        return []
    path = archive_path(java, java_version)
    marker = path + ".writing"
    if os.path.isfile(path):
        if _writing(path):
            return []  # not whole yet
        if os.path.exists(marker):
            _remove(marker)
        if not _private(path) or not _private(cache_folder()):
            return []  # classes another user could have written are not loaded
        if _starts_like_an_archive(path):
            _mark_used(path)
            return [f"-XX:SharedArchiveFile={path}", _VERIFY, _QUIET]
        _remove(path)
    elif _fresh(marker):
        return []
    if not write or not writes_missing():
        return []
    try:
        os.makedirs(cache_folder(), mode=0o700, exist_ok=True)
        if not _private(cache_folder()):
            return []
        with open(marker, "w") as f:
            f.write(f"{os.getpid()}\n")  # the JVM's pid replaces it once it runs
    except OSError:
        return []
    _remove_unused_archives(keep=path)
    return [f"-XX:ArchiveClassesAtExit={path}", _QUIET]


def writes_archive(flags: list[str]) -> bool:
    """Whether ``flags`` (from :func:`jvm_flags`) make the JVM write the archive."""
    return any(flag.startswith("-XX:ArchiveClassesAtExit=") for flag in flags)


def record_writer(java: str, java_version: str, pid: int) -> None:
    """Records the pid of the JVM that writes the archive at its exit (after this
    process may be gone), for :func:`wait_for_archive` and other runs."""
    try:
        with open(archive_path(java, java_version) + ".writing", "w") as f:
            f.write(f"{pid}\n")
    except OSError:
        pass


#: The first word of a dynamic CDS archive (host byte order), as JDK 13 and later write it.
_DYNAMIC_ARCHIVE_MAGIC = 0xF00BABA8


def _starts_like_an_archive(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and int.from_bytes(head, sys.byteorder) == _DYNAMIC_ARCHIVE_MAGIC


def _mark_used(path: str) -> None:
    """Dates the archive now: the archives used last are the ones kept."""
    try:
        os.utime(path)
    except OSError:
        pass


def _remove_unused_archives(keep: str) -> None:
    """Makes room for ``keep`` (about to be written): of the other archives, the ones
    used last stay, up to :data:`KEEP_ARCHIVES` in all; one being written stays; markers
    left by runs that died go."""
    folder = cache_folder()
    others = []
    for old in glob.glob(os.path.join(folder, "spark-*.jsa")):
        if old == keep or _writing(old):
            continue
        try:
            others.append((os.stat(old).st_mtime, old))
        except OSError:
            continue
    others.sort(reverse=True)
    for _, old in others[KEEP_ARCHIVES - 1:]:
        _remove(old)
    for marker in glob.glob(os.path.join(folder, "spark-*.jsa.writing")):
        archive = marker[: -len(".writing")]
        if archive != keep and not _writing(archive):
            _remove(marker)


def _private(path: str) -> bool:
    """Whether ``path`` is this user's and nobody else may write it: the archive holds
    code the JVM runs."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def wait_for_archive(java: str, java_version: str, timeout_s: float = WRITE_TIMEOUT_S) -> bool:
    """Waits until nobody writes the archive (a benchmark does, so that no JVM writes it
    in the background of what it times); True when it is there, whole."""
    path = archive_path(java, java_version)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _writing(path):  # done, or nobody is writing it (then it stays missing)
            return os.path.isfile(path)
        time.sleep(0.2)
    return os.path.isfile(path) and not _writing(path)


def _writing(path: str) -> bool:
    """Whether the JVM (or, before it started, the run) that announced it writes
    ``path`` is still alive."""
    try:
        with open(path + ".writing") as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return False
    return _fresh(path + ".writing") and process_alive(pid)
