"""Runs each fuzz harness (atheris, coverage-guided) for a bounded number of inputs, in a
process of its own, from its seed corpus; and each one again against a sabotaged, lax
parser, which it must catch (so its assertions are known to bite). Longer runs:
``scripts/fuzz.sh --seconds N`` or ``MSGQ_FUZZ_SECONDS=N`` here.

Also the regression tests of the bugs the fuzzers found."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from msgq.bridge import wire

pytestmark = pytest.mark.fuzz

HERE = Path(__file__).resolve().parent
HARNESSES = ("packet", "handshake", "wire", "logs")
#: Inputs per harness in CI; MSGQ_FUZZ_SECONDS=N runs each for N seconds instead.
CI_RUNS = 4000
FUZZ_SECONDS = int(os.environ.get("MSGQ_FUZZ_SECONDS") or 0)


def _fuzz(name: str, corpus: Path, *flags: str, sabotage: bool = False,
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    script = str(HERE / f"fuzz_{name}.py")
    subprocess.run([sys.executable, script, "--seeds-into", str(corpus)], check=True,
                   timeout=60)
    env = dict(os.environ)
    env.pop("MSGQ_FUZZ_SABOTAGE", None)
    if sabotage:
        env["MSGQ_FUZZ_SABOTAGE"] = "1"
    artifacts = corpus.parent / "artifacts"
    artifacts.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, script, "-seed=1", "-rss_limit_mb=2048",
                           "-timeout=20", f"-artifact_prefix={artifacts}/", *flags,
                           str(corpus)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-6000:]


@pytest.mark.parametrize("name", HARNESSES)
def test_fuzz_harness_finds_nothing(name: str, tmp_path: Path) -> None:
    budget = [f"-max_total_time={FUZZ_SECONDS}"] if FUZZ_SECONDS else \
        [f"-runs={CI_RUNS}", "-max_total_time=30"]
    proc = _fuzz(name, tmp_path / "corpus", *budget, timeout=max(120, FUZZ_SECONDS * 2))
    assert proc.returncode == 0, f"fuzz_{name} found a failing input:\n{_tail(proc)}"
    assert "DONE" in proc.stderr, _tail(proc)


@pytest.mark.parametrize("name", HARNESSES)
def test_fuzz_harness_catches_a_lax_parser(name: str, tmp_path: Path) -> None:
    proc = _fuzz(name, tmp_path / "corpus", "-runs=200000", "-max_total_time=60",
                 sabotage=True)
    assert proc.returncode != 0, f"fuzz_{name} accepted a lax parser:\n{_tail(proc)}"
    assert "AssertionError" in proc.stdout + proc.stderr, _tail(proc)


# --- found by the fuzzers ------------------------------------------------------------


def _header(**changes: object) -> bytes:
    fields = dict(compression=wire.COMPRESSION_NONE, frame_id=1, width=16, height=8,
                  stride=64, uv_offset=512, size=768, timestamp_sof=1, timestamp_eof=2,
                  valid=True)
    fields.update(changes)
    return wire.FrameHeader(**fields).pack()  # type: ignore[arg-type]


def test_frame_header_refuses_nonzero_reserved_bytes() -> None:
    # unpack ignored the padding and took any nonzero 'valid' byte for True, so headers
    # that are not what any sender writes were accepted as if they were.
    good = _header()
    assert wire.FrameHeader.unpack(good, 1 << 20).pack() == good
    for at, value in ((49, 1), (55, 0x80), (48, 2)):  # padding bytes; valid = 2
        bad = bytearray(good)
        bad[at] = value
        with pytest.raises(wire.WireError, match="reserved"):
            wire.FrameHeader.unpack(bytes(bad), 1 << 20)


def test_vision_topic_has_one_spelling() -> None:
    # "camerad/01" was read as stream 1, a second topic for a stream the sender never
    # spells that way.
    assert wire.parse_vision_topic(b"vcamerad/0") == ("camerad", 0)
    assert wire.parse_vision_topic(b"vcamerad/10") == ("camerad", 10)
    for topic in (b"vcamerad/01", b"vcamerad/00", b"vcamerad/0001"):
        with pytest.raises(wire.WireError, match="leading zeros"):
            wire.parse_vision_topic(topic)
