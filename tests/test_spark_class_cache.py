"""The driver JVM's class-data-sharing archive (msgq.spark.class_cache): which flags a
starting driver gets, and real ``msgq logstats`` runs that write the archive, map it, and
shrug off a damaged one with the same results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from msgq.spark import class_cache  # noqa: E402
from msgq.spark.session import _java_runtime  # noqa: E402

JAVA = "/opt/java/bin/java"
VERSION = 'openjdk version "17.0.1"\n'


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MSGQ_SPARK_CLASS_CACHE", raising=False)
    return tmp_path / "msgq"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_first_run_writes_the_archive_and_later_runs_map_it(cache: Path) -> None:
    path = class_cache.archive_path(JAVA, VERSION)
    assert os.path.dirname(path) == str(cache)
    flags = class_cache.jvm_flags(JAVA, VERSION)
    assert flags == [f"-XX:ArchiveClassesAtExit={path}", "-Xlog:cds*=off"]
    assert class_cache.writes_archive(flags)
    # While its JVM (alive: this process stands in for it) writes, nobody else does.
    class_cache.record_writer(JAVA, VERSION, os.getpid())
    assert class_cache.jvm_flags(JAVA, VERSION) == []
    Path(path).write_bytes(b"half an archive")
    assert class_cache.jvm_flags(JAVA, VERSION) == []  # there, but not whole yet
    # Its writer died: what does not start like an archive is written again.
    class_cache.record_writer(JAVA, VERSION, _dead_pid())
    assert class_cache.jvm_flags(JAVA, VERSION)[0] == f"-XX:ArchiveClassesAtExit={path}"
    assert not os.path.exists(path)
    # The writer is gone and left an archive: it is used and the marker cleared.
    Path(path).write_bytes((0xF00BABA8).to_bytes(4, sys.byteorder) + b"the rest")
    class_cache.record_writer(JAVA, VERSION, _dead_pid())
    flags = class_cache.jvm_flags(JAVA, VERSION)
    assert flags == [f"-XX:SharedArchiveFile={path}", "-XX:+VerifySharedSpaces",
                     "-Xlog:cds*=off"]
    assert not class_cache.writes_archive(flags)
    assert not os.path.exists(path + ".writing")
    assert class_cache.wait_for_archive(JAVA, VERSION, timeout_s=1)
    # Nobody writing and nothing there: no wait at all.
    os.remove(path)
    assert not class_cache.wait_for_archive(JAVA, VERSION, timeout_s=60)


def test_archives_of_other_runtimes_stay_up_to_a_few_used_last(cache: Path) -> None:
    """Two virtual environments on one machine (another Spark home, another runtime) do
    not take turns rewriting one archive: the archives used last are kept, up to
    KEEP_ARCHIVES; one being written is never removed."""
    cache.mkdir(parents=True)
    versions = [f'openjdk version "{major}.0.1"\n' for major in (11, 17, 21, 22, 23)]
    paths = [class_cache.archive_path(JAVA, v) for v in versions]
    assert len(set(paths)) == len(paths)
    for age, path in enumerate(paths[:3]):  # paths[0] used last, paths[2] longest ago
        Path(path).write_bytes((0xF00BABA8).to_bytes(4, sys.byteorder))
        os.utime(path, (1000 - age, 1000 - age))
    being_written = paths[3]
    Path(being_written).write_bytes(b"half")
    Path(being_written + ".writing").write_text(f"{os.getpid()}\n")
    stale_marker = paths[2] + ".writing"
    Path(stale_marker).write_text(f"{_dead_pid()}\n")
    os.utime(stale_marker, (1, 1))
    dead_writer = paths[1] + ".writing"  # fresh, but its writer is gone
    Path(dead_writer).write_text(f"{_dead_pid()}\n")

    new = paths[4]
    assert class_cache.jvm_flags(JAVA, versions[4])[0] == f"-XX:ArchiveClassesAtExit={new}"
    assert os.path.exists(paths[0]) and os.path.exists(paths[1])  # used last: kept
    assert not os.path.exists(paths[2]) and not os.path.exists(stale_marker)
    assert not os.path.exists(dead_writer)
    assert os.path.exists(being_written)

    # Mapping an archive dates it: it is among those used last from then on.
    assert class_cache.jvm_flags(JAVA, versions[1])[0] == f"-XX:SharedArchiveFile={paths[1]}"
    assert os.stat(paths[1]).st_mtime > os.stat(paths[0]).st_mtime


def test_cache_off_or_unwritable_means_no_flags(cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_SPARK_CLASS_CACHE", "0")
    assert class_cache.jvm_flags(JAVA, VERSION) == []
    monkeypatch.delenv("MSGQ_SPARK_CLASS_CACHE")
    cache.parent.chmod(0o500)
    try:
        if os.access(cache.parent, os.W_OK):  # root writes anyway: a file in the way
            cache.parent.chmod(0o700)
            cache.write_bytes(b"not a folder")
        assert class_cache.jvm_flags(JAVA, VERSION) == []
    finally:
        cache.parent.chmod(0o700)


def test_what_is_not_an_archive_is_never_mapped(cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = class_cache.archive_path(JAVA, VERSION)
    cache.mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("MSGQ_SPARK_CLASS_CACHE", "read")  # nor is one written instead
    Path(path).write_bytes(b"garbage")
    assert class_cache.jvm_flags(JAVA, VERSION) == []
    assert not os.path.exists(path)  # removed: the next run that may write does
    monkeypatch.delenv("MSGQ_SPARK_CLASS_CACHE")
    Path(path).write_bytes(b"garbage")
    assert class_cache.jvm_flags(JAVA, VERSION)[0] == f"-XX:ArchiveClassesAtExit={path}"
    assert not os.path.exists(path)


def test_an_archive_others_may_write_is_not_loaded(cache: Path) -> None:
    path = class_cache.archive_path(JAVA, VERSION)
    cache.mkdir(parents=True, mode=0o700)
    Path(path).write_bytes((0xF00BABA8).to_bytes(4, sys.byteorder))
    os.chmod(path, 0o666)
    assert class_cache.jvm_flags(JAVA, VERSION) == []
    os.chmod(path, 0o444)
    assert class_cache.jvm_flags(JAVA, VERSION)[0] == f"-XX:SharedArchiveFile={path}"
    cache.chmod(0o777)
    assert class_cache.jvm_flags(JAVA, VERSION) == []
    cache.chmod(0o700)


def test_a_marker_left_by_a_run_that_died_long_ago_is_ignored(cache: Path) -> None:
    path = class_cache.archive_path(JAVA, VERSION)
    cache.mkdir(parents=True)
    Path(path + ".writing").write_text(f"{os.getpid()}\n")
    os.utime(path + ".writing", (1, 1))  # older than WRITE_TIMEOUT_S
    assert class_cache.writes_archive(class_cache.jvm_flags(JAVA, VERSION))


def _logstats(folder: str, cache_home: Path) -> dict:
    """``msgq logstats --json`` with the cache in ``cache_home``."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    env.pop("MSGQ_SPARK_CLASS_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-m", "msgq", "logstats", "--master", "local[1]", "--json", folder],
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # nothing of the JVM's on stdout


@pytest.mark.timeout(600)
def test_logstats_writes_maps_and_survives_a_damaged_archive(tmp_path: Path) -> None:
    from msgq.bench.spark import make_recording

    folder = str(tmp_path / "log")
    make_recording(folder, seconds=20, rotate_seconds=60)
    home = tmp_path / "cache"
    java, version, _ = _java_runtime()
    os.environ["XDG_CACHE_HOME"] = str(home)
    try:
        path = class_cache.archive_path(java, version)
        first = _logstats(folder, home)
        assert class_cache.wait_for_archive(java, version)  # written by the first JVM
        assert os.path.getsize(path) > 10 << 20
        assert _logstats(folder, home) == first  # mapped
        os.chmod(path, 0o600)
        with open(path, "r+b") as f:  # damaged: the JVM runs without it
            f.seek(4096)
            f.write(os.urandom(1 << 16))
        assert _logstats(folder, home) == first
        # (a file that does not start like an archive never reaches a JVM:
        # test_what_is_not_an_archive_is_never_mapped)
    finally:
        del os.environ["XDG_CACHE_HOME"]
