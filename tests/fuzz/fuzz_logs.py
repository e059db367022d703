"""Fuzzes the log framing and segment reader (``schemas/framing.py``,
``msgq/logs/segment.py`` over the C scanner, ``msgq/logs/src/log_scan.c``): the bytes of a
segment file, raw or (chosen by the first byte) compressed with zstd, in one frame or two,
or bz2, so that mutations reach the message splitting inside compressed data too.

Properties: ``message_length`` returns None, a length in bounds (a whole number of words,
at least a header and a word, inside the data) or raises ``FramingError``;
``identify``/``peek`` never raise and name a service of the schema; the schema check's
classifier (``msgq.logs.schema_check``) never raises and agrees with ``peek`` on the
discriminant, and sampling a segment's first events never raises; reading a segment
raises nothing but what ``on_problem`` raises, with skip_corrupt or not; every message
read is identified as an Event, offsets grow, a raw segment's messages are its own bytes
at their offsets, and every problem names an offset inside the data; ``message_extent``
never raises and stays inside the message."""

from __future__ import annotations

import bz2
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zstandard  # noqa: E402
from harness import main, sabotaged  # noqa: E402

from msgq.logs import _scan, schema_check, segment  # noqa: E402
from msgq.messaging import new_message  # noqa: E402
from msgq.schemas import (
    default_schema,  # noqa: E402
    framing,  # noqa: E402
)

LAYOUT = default_schema().layout
SHAPE = schema_check._root_shape(default_schema())
if sabotaged():
    def lax_length(buf: bytes, offset: int) -> int | None:  # does not check the data holds it
        if len(buf) - offset < 8:
            return None
        count = int.from_bytes(buf[offset:offset + 4], "little") + 1
        header = (4 + 4 * count + 7) & ~7
        words = int.from_bytes(buf[offset + 4:offset + 8], "little")
        return header + 8 * max(words, 1)

    framing.message_length = lax_length


class _StopError(Exception):
    pass


def _segment_bytes(data: bytes) -> tuple[bytes, bool]:
    """(the file, whether it is raw: messages at their own offsets)."""
    mode, body = (data[0] % 5, data[1:]) if data else (0, b"")
    if mode == 1:
        return zstandard.ZstdCompressor(write_checksum=True).compress(body), False
    if mode == 2:
        half = len(body) // 2 & ~7
        c = zstandard.ZstdCompressor(write_checksum=True)
        return c.compress(body[:half]) + c.compress(body[half:]), False
    if mode == 3:
        return bz2.compress(body, 1), False
    return body, not body.startswith((segment.ZSTD_MAGIC[:3], b"BZ"))


def test_one_input(data: bytes) -> None:
    for offset in (0, 8, 16):
        try:
            n = framing.message_length(data, offset)
        except framing.FramingError:
            continue
        if n is not None:
            assert n % 8 == 0 and 16 <= n <= len(data) - offset, (offset, n, len(data))
    for found in (LAYOUT.peek(data), LAYOUT.identify(data)):
        if found is not None:
            mono, valid, service = found
            assert 0 <= mono < 2**64 and isinstance(valid, bool)
            assert service in LAYOUT.services
    if LAYOUT.identify(data) is not None:
        assert framing.message_length(data, 0) == len(data)
    verdict = schema_check._classify(data, SHAPE)
    assert verdict in (None, "ok", "foreign", "odd"), verdict
    if LAYOUT.peek(data) is not None:  # a discriminant peek reads is one of the members
        assert verdict in ("ok", "odd"), verdict
    extent = _scan.message_extent(data)
    if extent is not None:  # one segment, and it reaches no further than its size
        assert 1 <= extent <= (len(data) - 8) // 8, (extent, len(data))

    file, raw = _segment_bytes(data)
    sample = schema_check._sample(io.BytesIO(file), default_schema())
    assert 0 <= sample.foreign + sample.odd <= sample.events <= schema_check.SAMPLE_EVENTS
    for skip in (True, False):
        problems: list[segment.LogProblem] = []

        def on_problem(problem: segment.LogProblem, skip: bool = skip,
                       problems: list[segment.LogProblem] = problems) -> None:
            problems.append(problem)
            if problem.kind == "corrupt" and not skip:
                raise _StopError

        last = -1
        try:
            for message in segment.read_messages(io.BytesIO(file), on_problem, skip,
                                                 lambda d: LAYOUT.identify(d, True)):
                assert message.identity is not None
                assert LAYOUT.identify(message.data) == message.identity
                assert message.offset > last
                last = message.offset
                if raw:
                    assert file[message.offset:message.offset + len(message.data)] == \
                        message.data
        except _StopError:
            assert problems and problems[-1].kind == "corrupt"
        for problem in problems:
            assert problem.kind in ("corrupt", "truncated")
            assert 0 <= problem.file_offset <= len(file), (problem, len(file))


def _seeds() -> list[bytes]:
    one = new_message("gyroscope", logMonoTime=5).to_bytes()
    two = new_message("logMessage", logMonoTime=7).to_bytes()
    can = new_message("can", 2, logMonoTime=9).to_bytes()
    stream = one + two + can
    return [bytes([m]) + stream for m in range(4)] + [one, two[:-3], bytes([0]) + one * 3]


if __name__ == "__main__":
    main(test_one_input, _seeds(), [framing, segment])
