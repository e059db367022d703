"""openpilot's route layout read as is (``<route>--<n>/rlog.zst``, ``qlog.zst``): the
``route`` and ``segment`` columns, rlog or qlog, globs over routes; and the planner that
packs many small segment files into a few tasks, a file's events never split."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from msgq.logs import LogReader, LogWriter
from msgq.messaging import new_message

pytestmark = pytest.mark.spark

BASE = 20_000_000_000
MS = 1_000_000


def _record(folder: Path, services: tuple[str, ...], seconds: int) -> None:
    with LogWriter(str(folder), rotate_seconds=1.0) as writer:
        for i in range(seconds * 20):
            for service in services:
                writer.write(new_message(service, logMonoTime=BASE + i * 50 * MS + 1,
                                         valid=True).to_bytes())


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two routes of 3 segments: rlog.zst holds two services, qlog.zst one (the
    decimated copy loggerd writes beside it)."""
    root = tmp_path_factory.mktemp("routes")
    for name in ("dongle|2026-11-26--10-00-00", "dongle|2026-11-26--11-00-00"):
        for kind, services in (("rlog", ("vehicleState", "can")), ("qlog", ("vehicleState",))):
            tmp = root / f"tmp-{kind}"
            _record(tmp, services, 3)
            for n, segment in enumerate(sorted(tmp.glob("segment-*"))):
                folder = root / f"{name}--{n}"
                folder.mkdir(exist_ok=True)
                shutil.move(str(segment), folder / f"{kind}.zst")
            shutil.rmtree(tmp)
    (root / "notes.txt").write_text("not a route")
    return root


def test_route_folders_give_route_and_segment_columns(spark: Any, routes: Path) -> None:
    from msgq.spark import read_logs

    df = read_logs(spark, str(routes / "*--*"), data=False)
    got = {(r.route, r.segment, os.path.basename(r.file), r.service): r["count"]
           for r in df.groupBy("route", "segment", "file", "service").count().collect()}
    want = {}
    for name in ("dongle|2026-11-26--10-00-00", "dongle|2026-11-26--11-00-00"):
        for n in range(3):
            path = str(routes / f"{name}--{n}" / "rlog.zst")
            for event in LogReader(path).raw():
                key = (name, n, "rlog.zst", event.service)
                want[key] = want.get(key, 0) + 1
    assert got == want and len(got) == 2 * 3 * 3  # vehicleState, can, logStart
    # the parent folder reads the same routes; a route by its name
    assert read_logs(spark, str(routes), data=False).count() == sum(want.values())
    one = df.where(df.route == "dongle|2026-11-26--11-00-00").where(df.segment >= 1)
    assert one.count() == sum(v for k, v in want.items()
                              if k[0].endswith("11-00-00") and k[1] >= 1)


def test_rlog_or_qlog_is_chosen_by_option_log(spark: Any, routes: Path) -> None:
    import msgq.spark

    msgq.spark.register(spark)

    def services(log: str | None) -> dict[str, int]:
        reader = spark.read.format("msgqlog")
        if log is not None:
            reader = reader.option("log", log)
        df = reader.load(str(routes / "dongle|2026-11-26--10-00-00--*"))
        files = {os.path.basename(r.file) for r in df.select("file").distinct().collect()}
        assert len(files) == 1, files
        return {r.service: r["count"] for r in df.groupBy("service").count().collect()}

    rlog = services(None)
    assert rlog == services("rlog") and set(rlog) == {"logStart", "vehicleState", "can"}
    qlog = services("qlog")
    assert set(qlog) == {"logStart", "vehicleState"}
    assert qlog["vehicleState"] == rlog["vehicleState"]
    with pytest.raises(Exception, match="option log must be one of"):
        services("blog")


def test_many_small_files_are_packed_into_few_tasks(tmp_path: Path) -> None:
    from msgq.spark.datasource import MIN_TASK_BYTES, SegmentPartition, pack_segments

    files = []
    for i in range(300):
        path = tmp_path / f"segment-{i:05d}.log"
        path.write_bytes(b"x" * (40_000 + i))
        files.append(SegmentPartition(str(path), i))
    packed = pack_segments(files, parallelism=2)
    assert [f.segment for p in packed for f in p.files] == list(range(300))  # once, in order
    # 12 MB over 2 cores: two tasks of half of it each (to a file; over MIN_TASK_BYTES),
    # not two full ones and a small third (two rounds on two cores)
    sizes = [sum(os.path.getsize(f.path) for f in p.files) for p in packed]
    assert len(packed) == 2 and all(MIN_TASK_BYTES < s and abs(s - sum(sizes) / 2) < 41_000
                                    for s in sizes)
    huge = tmp_path / "huge.log"
    with open(huge, "wb") as f:
        f.truncate(300 << 20)
    alone = pack_segments([files[0], SegmentPartition(str(huge), 1), files[1]],
                          parallelism=2)
    assert [[f.segment for f in p.files] for p in alone] == [[0], [1], [1]]
    assert pack_segments([], 4) == []
