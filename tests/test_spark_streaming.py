"""Structured Streaming over a growing recording: a writer process records for 30 s while
a streaming query follows the folder into a parquet sink; the query is stopped mid-way
and restarted from its checkpoint; at the end the sink holds every event once (per-service
counts equal a batch read of the finished recording) and the offsets are the batch
read's. The latency from write to a row in the sink is measured and printed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

WRITER = textwrap.dedent("""
    import os, sys, time
    from msgq.logs import LogWriter
    from msgq.messaging import new_message

    folder, seconds, go = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    # the recorder's writer: 5 s segments, a frame flushed every 0.25 s
    with LogWriter(folder, rotate_seconds=5.0, flush_seconds=0.25) as writer:
        writer.write(new_message("deviceState", valid=True, logMonoTime=time.monotonic_ns()))
        writer.flush()  # the folder has a segment: a stream can start on it
        while not os.path.exists(go):
            time.sleep(0.05)
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            for service in ("vehicleState", "can"):
                writer.write(new_message(service, valid=i % 9 != 0,
                                         logMonoTime=time.monotonic_ns()).to_bytes())
            if i % 10 == 0:
                writer.write(new_message("gpsLocation", valid=True,
                                         logMonoTime=time.monotonic_ns()).to_bytes())
            i += 1
            time.sleep(0.01)
""")


def _wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_stream_follows_a_live_recording_across_a_restart(
        spark: Any, tmp_path: Path) -> None:
    import msgq.spark
    from msgq.spark import read_logs

    folder = tmp_path / "live"
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    go = tmp_path / "go"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), "30", str(go)])
    try:
        _wait_for(lambda: folder.is_dir() and any(folder.glob("segment-*")), 30,
                  "the first segment")
        msgq.spark.register(spark)

        def start() -> Any:
            rows = (spark.readStream.format("msgqlog").option("data", "false")
                    .load(str(folder))
                    .select("file", "offset", "logMonoTime", "service", "valid", "problem"))
            return (rows.writeStream.format("parquet").option("path", str(sink))
                    .option("checkpointLocation", str(checkpoint))
                    .trigger(processingTime="1 second").start())

        def sunk() -> Any:
            return spark.read.schema("file string, offset bigint, logMonoTime bigint, "
                                     "service string, valid boolean, problem string") \
                .parquet(str(sink))

        query = start()
        _wait_for(lambda: (sink / "_spark_metadata" / "0").exists(), 120,
                  "a first micro-batch committed")
        go.touch()  # 30 s of recording from now
        started = time.monotonic()
        _wait_for(lambda: (sink / "_spark_metadata" / "2").exists(), 25,
                  "two more micro-batches")
        query.stop()  # mid-recording; the writer goes on
        stopped = time.monotonic() - started
        assert sunk().count() > 1 and writer.poll() is None
        query = start()  # from the checkpoint
        latencies = []
        while writer.poll() is None:  # write -> row in the sink, sampled
            time.sleep(2)
            newest = sunk().agg({"logMonoTime": "max"}).first()[0]
            if newest is not None:
                latencies.append((time.monotonic_ns() - newest) / 1e9)
        assert writer.wait() == 0
        query.processAllAvailable()
        query.stop()
    finally:
        if writer.poll() is None:
            writer.kill()
    got = sunk()
    batch = read_logs(spark, str(folder), data=False)
    count = {r.service: r["count"] for r in got.groupBy("service").count().collect()}
    want = {r.service: r["count"] for r in batch.groupBy("service").count().collect()}
    assert count == want and want["can"] > 1000  # none lost, none repeated
    keys = got.select("file", "offset").distinct().count()
    assert keys == got.count() == batch.count()  # each event once, at the batch offsets
    assert set(got.select("file", "offset").collect()) == \
        set(batch.select("file", "offset").collect())
    latencies.sort()
    print(f"\nstopped {stopped:.1f} s into the recording, restarted from the checkpoint; "
          f"write -> row latency over {len(latencies)} samples: min {latencies[0]:.2f} s, "
          f"median {latencies[len(latencies) // 2]:.2f} s, max {latencies[-1]:.2f} s")
    assert latencies[len(latencies) // 2] < 20


def test_logstats_follow_prints_the_tables_of_what_arrived(tmp_path: Path) -> None:
    import json
    import os

    from msgq.logs import LogReader, LogWriter
    from msgq.messaging import new_message

    folder = tmp_path / "rec"
    writer = LogWriter(str(folder), rotate_seconds=2.0)
    for i in range(600):  # 6 s at 100 Hz, and a 10 Hz service; the writer stays open
        writer.write(new_message("can", logMonoTime=10**9 + i * 10**7, valid=i % 5 != 0))
        if i % 10 == 0:
            writer.write(new_message("gpsLocation", logMonoTime=10**9 + i * 10**7 + 1,
                                     valid=True))
    writer.flush()
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    done = subprocess.run([sys.executable, "-m", "msgq", "logstats", str(folder), "--follow",
                           "--every", "1", "--duration", "45", "--json"],
                          capture_output=True, text=True, env=env, timeout=240,
                          input="")
    writer.close()
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.strip().splitlines()[-1])
    got = {r["service"]: (r["count"], r["invalid_fraction"]) for r in last["services"]}
    events = list(LogReader(str(folder)).raw())
    assert got["can"] == (600, 0.2) and got["gpsLocation"][0] == 60
    assert sum(c for c, _ in got.values()) == len(events)
    can = next(r for r in last["services"] if r["service"] == "can")
    assert abs(can["measured_hz"] - 100) < 1e-6 and can["gaps"] == 0


LOGGERD_WRITER = textwrap.dedent("""
    import os, sys, time
    import zstandard
    from msgq.messaging import new_message

    root, segments = sys.argv[1], int(sys.argv[2])
    route = "dongle|2026-11-28--10-00-00"
    i = 0
    for n in range(segments):
        folder = os.path.join(root, f"{route}--{n}")
        os.makedirs(folder)
        lock = os.path.join(folder, "rlog.lock")
        open(lock, "w").close()  # loggerd's: the segment is being written
        with open(os.path.join(folder, "rlog.zst"), "wb") as f:
            writer = zstandard.ZstdCompressor(level=3).stream_writer(f)
            for _ in range(6):  # the file grows in pieces: an unfinished zstd stream
                for _ in range(50):
                    for service in ("vehicleState", "can"):
                        writer.write(new_message(service, valid=True,
                                                 logMonoTime=10**9 + i * 10**6).to_bytes())
                    i += 1
                writer.flush(zstandard.FLUSH_BLOCK)
                f.flush()
                time.sleep(0.3)
            writer.flush(zstandard.FLUSH_FRAME)
        os.remove(lock)
""")


def test_a_stream_follows_loggerd_route_segments_as_they_close(
        spark: Any, tmp_path: Path) -> None:
    """Issue 43: ``<route>--<n>/rlog.zst`` folders appearing one by one, each written as
    one zstd stream with loggerd's ``rlog.lock`` beside it: the stream takes each segment
    once it is closed, whole (no problem row from a half-written file), every event once,
    with the route and segment columns of a batch read."""
    import msgq.spark
    from msgq.spark import read_logs

    root = tmp_path / "routes"
    root.mkdir()
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    writer = subprocess.Popen([sys.executable, "-c", LOGGERD_WRITER, str(root), "4"])
    try:
        _wait_for(lambda: any(root.glob("*--0/rlog.zst")), 30, "the first segment")
        msgq.spark.register(spark)
        rows = (spark.readStream.format("msgqlog").option("data", "false").load(str(root))
                .select("file", "offset", "route", "segment", "service", "problem"))
        query = (rows.writeStream.format("parquet").option("path", str(sink))
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(processingTime="1 second").start())
        assert writer.wait(timeout=120) == 0
        _wait_for(lambda: not list(root.glob("*/rlog.lock")), 10, "the last segment closed")
        query.processAllAvailable()
        query.stop()
    finally:
        if writer.poll() is None:
            writer.kill()
    got = spark.read.parquet(str(sink))
    batch = read_logs(spark, str(root), data=False)
    assert got.where("problem IS NOT NULL").count() == 0
    assert got.count() == batch.count() == 4 * 6 * 50 * 2
    columns = ["file", "offset", "route", "segment", "service"]
    assert sorted(got.select(*columns).collect()) == \
        sorted(batch.select(*columns).collect())
    assert {r.segment for r in got.select("segment").collect()} == {0, 1, 2, 3}
