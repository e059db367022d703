"""The msgqlog source's rows made from the log scanner's batches (issues 28 and 31): the
pushed event filter as numpy masks decides as the per-event test does, and a segment's
rows are those the per-event reader gives (no Spark session: the executor side only)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from msgq.logs import LogReader, LogWriter
from msgq.messaging import new_message
from msgq.spark import datasource as ds
from msgq.spark.pushdown import EventFilter

pytestmark = [pytest.mark.spark,  # the damaged segment's problems are warnings to LogReader
              pytest.mark.filterwarnings("ignore::msgq.logs.CorruptLogWarning"),
              pytest.mark.filterwarnings("ignore::msgq.logs.TruncatedLogWarning")]

BASE = 10_000_000_000
MS = 1_000_000
LONG = (1 << 63) - 1

FILTERS = [  # filters that test events (checks_events)
    EventFilter(valid=True),
    EventFilter(valid=False, min_mono=BASE),
    EventFilter(min_mono=BASE + 5, max_mono=BASE + 9),
    EventFilter(max_mono=BASE),
    EventFilter(max_mono=-3),
    EventFilter(min_mono=LONG + 1),
    EventFilter(min_mono=0),
    EventFilter(monos=frozenset({BASE, BASE + 7, -1, LONG + 5})),
    EventFilter(monos=frozenset({BASE + 7}), valid=True, max_mono=BASE + 7),
    EventFilter(none=True),
]


@pytest.mark.parametrize("where", FILTERS)
def test_event_mask_decides_as_event_test(where: EventFilter) -> None:
    monos = [0, 1, BASE - 1, BASE, BASE + 5, BASE + 7, BASE + 9, BASE + 10, LONG, LONG + 1,
             (1 << 64) - 1]
    mono = np.array(monos * 2, np.uint64)
    valid = np.array([True] * len(monos) + [False] * len(monos))
    assert where.checks_events
    test = where.event_test()
    expected = [test(int(m), bool(v)) for m, v in zip(mono.tolist(), valid.tolist(),
                                                         strict=True)]
    assert where.event_mask(mono, valid).tolist() == expected


def _recording(folder: Path) -> list[str]:
    """Two segments of 3000 events each (over a chunk and a batch of rows), the second
    with a damaged frame in the middle and cut short."""
    with LogWriter(str(folder), rotate_seconds=1.0, frame_bytes=2048) as writer:
        for i in range(6000):
            service = ("vehicleState", "can", "deviceState")[i % 3]
            writer.write(new_message(service, logMonoTime=BASE + i * MS // 3,
                                     valid=i % 5 != 1).to_bytes())
    files = sorted(str(p) for p in folder.glob("segment-*"))
    data = bytearray(Path(files[1]).read_bytes())
    data[len(data) // 2: len(data) // 2 + 16] = b"\xee" * 16
    Path(files[1]).write_bytes(bytes(data))
    with open(files[1], "r+b") as f:
        f.truncate(os.path.getsize(files[1]) * 80 // 100)
    return files


def _rows(options: ds.ReadOptions, path: str) -> list[dict[str, Any]]:
    schema = ds.output_schema(options)
    rows = []
    for batch in ds._SegmentRead(options, schema, path, 0).batches():
        assert batch.num_rows <= 4096
        rows += batch.to_pylist()
    return rows


@pytest.mark.parametrize("where", [None, EventFilter(valid=True, min_mono=BASE + 400 * MS,
                                                     events_only=True)])
def test_rows_are_the_event_readers(tmp_path: Path, where: EventFilter | None) -> None:
    files = _recording(tmp_path)
    options = ds.ReadOptions.parse({"path": str(tmp_path), "services": "vehicleState,can",
                                    "decode": "vehicleState"})
    if where is not None:
        options = replace(options, where=where)
    test = where.event_test() if where is not None else None
    for path in files:
        rows = _rows(options, path)
        reader = LogReader([], services=("vehicleState", "can"), skip_corrupt=True,
                           schema=options.schema,
                           start_mono_ns=None if where is None else where.min_mono)
        events = [e for e in reader.segment_events(path)
                  if test is None or test(e.mono_ns, e.valid)]
        event_rows = [r for r in rows if r["service"] is not None]
        assert len(event_rows) == len(events) > 500
        decoder = ds._decoders_for(options)["vehicleState"]
        kind = to_arrow_schema(ds.output_schema(options)).field("vehicleState").type
        for row, event in zip(event_rows, events, strict=True):
            assert (row["offset"], row["logMonoTime"], row["service"], row["valid"],
                    row["size"], row["data"]) == \
                (event.offset, event.mono_ns, event.service, bool(event.valid),
                 len(event.data), event.data)
            if event.service == "vehicleState":
                value = decoder.value(event.data, options.schema)
                assert row["vehicleState"] == pa.array([value], kind).to_pylist()[0]
            else:
                assert row["vehicleState"] is None
        problems = [r for r in rows if r["service"] is None]
        if where is not None or path == files[0]:
            assert problems == []
        else:  # the damaged segment: its corrupt frame and its cut, by the reader's offsets
            assert [r["offset"] for r in problems] == \
                sorted(p.offset for p in reader.corrupt + reader.truncated)
            assert len(problems) >= 2
            assert all(r["problem"] for r in problems)



def test_a_filter_without_conditions_passes_every_event() -> None:
    """event_test and event_mask agree on the empty filter too (event_test compared valid
    with None and so refused every event)."""
    where = EventFilter()
    mono = np.array([0, BASE, LONG], np.uint64)
    valid = np.array([True, False, True])
    assert [where.event_test()(int(m), bool(v)) for m, v in zip(mono.tolist(), valid.tolist(),
                                                                 strict=True)] == [True] * 3
    assert where.event_mask(mono, valid).tolist() == [True] * 3


@pytest.mark.parametrize("services", [None, "vehicleState,can"])
def test_a_tasks_files_share_batches_with_the_same_rows(tmp_path: Path,
                                                        services: str | None) -> None:
    """The files of a task fill shared batches (file, segment and route per row; data
    gathered from the scanner's buffers, back to back or picked): the rows are those of
    each file read alone, damage included, in file order."""
    files = _recording(tmp_path)
    options = ds.ReadOptions.parse({"path": str(tmp_path), "decode": "vehicleState"}
                                   | ({} if services is None else {"services": services}))
    schema = ds.output_schema(options)
    alone = []
    for n, path in enumerate(files + files[:1]):
        for batch in ds._SegmentRead(options, schema, path, n).batches():
            alone += batch.to_pylist()
    parts = [ds.SegmentPartition(path, n) for n, path in enumerate(files + files[:1])]
    shared = []
    batches = list(ds._task_batches(options, schema, parts))
    for batch in batches:
        assert batch.num_rows <= 4096 and batch.schema == to_arrow_schema(schema)
        shared += batch.to_pylist()
    assert shared == alone and len(shared) > 6000 * (2 if services else 3) // 3 * 0.9
    assert len(batches) < 4  # not a batch (or more) per file
    assert {r["segment"] for r in shared} == {0, 1, 2}
    assert any(r["problem"] and r["service"] is None for r in shared)


def test_the_schema_check_runs_again_only_when_a_file_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning checks a read's files against its schema once per planning process while
    they are unchanged; a file rewritten (size or time) is checked again."""
    files = _recording(tmp_path)
    checked: list[int] = []
    monkeypatch.setattr(ds, "check_paths", lambda paths, schema: checked.append(len(paths)))
    monkeypatch.setattr(ds, "_checked", {})
    options = ds.ReadOptions.parse({"path": str(tmp_path)})
    ds._check_paths(files, options)
    ds._check_paths(files, options)
    assert checked == [2]
    stat = os.stat(files[0])
    os.utime(files[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    ds._check_paths(files, options)
    ds._check_paths(files[:1], options)
    assert checked == [2, 2, 1]
    index = tmp_path / "index.json"
    index.write_text(index.read_text() + " ")  # the index changed: checked again
    ds._check_paths(files[:1], options)
    assert checked == [2, 2, 1, 1]
