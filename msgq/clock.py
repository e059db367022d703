"""The simulated clock: replayed time under the lockstep harness, the real clock otherwise.

A service that wants its timing-dependent logic (integrators, rate limits, timeouts,
``dt``) to replay deterministically reads time from here instead of :mod:`time`::

    from msgq.lockstep import clock  # this module, plus new_message stamped by it

    now = clock.monotonic()          # seconds, like time.monotonic()
    now_ns = clock.monotonic_ns()    # like time.monotonic_ns()

Outside the harness these are ``time.monotonic()`` / ``time.monotonic_ns()`` (CLOCK_MONOTONIC)
and ``time.time()`` / ``time.time_ns()``. Under the harness (:mod:`msgq.lockstep.harness`)
they return the replayed time: while the process handles a step, ``monotonic_ns()`` is the
``logMonoTime`` of that step's trigger event; before the first step it is the time of the
first input event. ``time_ns()`` is that plus the log's wall-clock offset (``wallTimeNs -
monoTimeNs`` of its ``logStart`` event; 0 when the inputs have none). The replayed time
stands still within a step: a step is one instant.

How the time gets there: the harness makes a small file in the run's shared-memory folder
(:class:`ClockFile`), names it in ``MSGQ_LOCKSTEP_CLOCK`` in the environment of the
process under test, and writes the trigger's time into it before it lets the process's
receive return. The process maps the file read-only on first use; reading the clock is one
load from that mapping. The harness writes only while the process waits at its gated
receive, so a process never sees a time change inside a step.

Layer: the bottom. This module imports nothing but the standard library, so every layer
(the Event layer's ``new_message`` first) can read time from it.
The environment is read once, at the first call (:func:`reload` reads it again).
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Callable

__all__ = [
    "CLOCK_ENV",
    "ClockFile",
    "is_simulated",
    "monotonic",
    "monotonic_ns",
    "reload",
    "time_ns",
    "wall_time",
]

#: Environment variable naming the clock file of the harness that runs this process.
CLOCK_ENV = "MSGQ_LOCKSTEP_CLOCK"

# The clock file: 64 bytes, little-endian.
#   0  u32 magic "MQLC"    4  u32 version
#   8  u64 monotonic ns   16  i64 wall-clock offset ns (wall = mono + offset)
#  24  u64 step number (steps started so far)
_MAGIC = 0x434C514D
_VERSION = 1
_SIZE = 64
_HEADER = struct.Struct("<II")
_W_MONO, _W_OFFSET, _W_STEP = 1, 2, 3  # u64/i64 word indexes


class _Reader:
    """This process's read-only view of a clock file."""

    def __init__(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise RuntimeError(
                f"{CLOCK_ENV}={path!r} names a lockstep clock file that cannot be opened "
                f"({e.strerror}); unset {CLOCK_ENV} outside the lockstep harness") from None
        try:
            self._map = mmap.mmap(fd, _SIZE, prot=mmap.PROT_READ)
        except (OSError, ValueError) as e:
            raise RuntimeError(f"{CLOCK_ENV}={path!r} is not a lockstep clock file: {e}") \
                from None
        finally:
            os.close(fd)
        magic, version = _HEADER.unpack_from(self._map, 0)
        if magic != _MAGIC or version != _VERSION:
            self._map.close()
            raise RuntimeError(f"{CLOCK_ENV}={path!r} is not a lockstep clock file "
                               f"(magic {magic:#x}, version {version})")
        self.path = path
        self._u64 = memoryview(self._map).cast("Q")
        self._i64 = memoryview(self._map).cast("q")

    def monotonic_ns(self) -> int:
        return int(self._u64[_W_MONO])

    def time_ns(self) -> int:
        return int(self._u64[_W_MONO]) + int(self._i64[_W_OFFSET])

    def step(self) -> int:
        return int(self._u64[_W_STEP])


_reader: _Reader | None = None
_resolved = False


def _source() -> _Reader | None:
    global _reader, _resolved
    if not _resolved:
        path = os.environ.get(CLOCK_ENV, "")
        _reader = _Reader(path) if path else None
        _resolved = True
        _bind(_reader is None)
    return _reader


def reload() -> None:
    """Reads ``MSGQ_LOCKSTEP_CLOCK`` again at the next call (for tests that change it).
    Read the clock as ``clock.monotonic()`` then: a function imported by name after the
    first call outside the harness is :mod:`time`'s own and stays so."""
    global _reader, _resolved
    _reader = None
    _resolved = False
    _bind(False)


def is_simulated() -> bool:
    """True when this process runs under the lockstep harness (time is replayed)."""
    return _source() is not None


def _resolving_monotonic_ns() -> int:
    """The replayed time of the current step under the harness, else CLOCK_MONOTONIC (ns)."""
    source = _reader if _resolved else _source()
    return time.monotonic_ns() if source is None else source.monotonic_ns()


def _resolving_monotonic() -> float:
    """:func:`monotonic_ns` in seconds."""
    return _resolving_monotonic_ns() / 1e9


def _resolving_time_ns() -> int:
    """Wall-clock ns since the epoch: the replayed one under the harness (see module doc),
    else ``time.time_ns()``."""
    source = _reader if _resolved else _source()
    return time.time_ns() if source is None else source.time_ns()


def _resolving_wall_time() -> float:
    """:func:`time_ns` in seconds."""
    return _resolving_time_ns() / 1e9


def _bind(real: bool) -> None:
    """Makes this module's clock functions the :mod:`time` module's own once the process
    is known to run on the real clock (``real``; no Python frame between a 100 Hz loop and
    CLOCK_MONOTONIC, read as ``clock.monotonic()``), else the functions that resolve the
    clock at their first call and read the replayed time under the harness."""
    global monotonic, monotonic_ns, time_ns, wall_time
    if real:
        monotonic, monotonic_ns = time.monotonic, time.monotonic_ns
        time_ns, wall_time = time.time_ns, time.time
    else:
        monotonic, monotonic_ns = _resolving_monotonic, _resolving_monotonic_ns
        time_ns, wall_time = _resolving_time_ns, _resolving_wall_time


#: The clock's functions: ``monotonic_ns()`` is the replayed time of the current step
#: under the harness, else CLOCK_MONOTONIC (ns); ``monotonic()`` the same in seconds;
#: ``time_ns()`` / ``wall_time()`` the wall clock (replayed under the harness). Read them
#: as attributes of this module (``clock.monotonic()``): outside the harness they become
#: :mod:`time`'s own functions at the first call (see :func:`_bind`).
monotonic: Callable[[], float]
monotonic_ns: Callable[[], int]
time_ns: Callable[[], int]
wall_time: Callable[[], float]
_bind(False)


class ClockFile:
    """The harness's side: makes the clock file at ``path`` and sets the time in it.

    The file is created exclusively (mode 0600 unless ``mode`` says otherwise) and removed
    by :meth:`close`.
    """

    def __init__(self, path: str, mono_ns: int = 0, wall_offset_ns: int = 0,
                 mode: int = 0o600) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            os.ftruncate(fd, _SIZE)
            self._map = mmap.mmap(fd, _SIZE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        self._u64 = memoryview(self._map).cast("Q")
        self._i64 = memoryview(self._map).cast("q")
        self._u64[_W_MONO] = mono_ns
        self._i64[_W_OFFSET] = wall_offset_ns
        self._u64[_W_STEP] = 0
        _HEADER.pack_into(self._map, 0, _MAGIC, _VERSION)  # last: readers check it
        self.closed = False

    @property
    def monotonic_ns(self) -> int:
        """The time the process under test reads now."""
        return int(self._u64[_W_MONO])

    def set(self, mono_ns: int, step: int | None = None) -> None:
        """Sets the replayed time (and the step counter)."""
        if mono_ns < 0:
            raise ValueError(f"monotonic time must be >= 0 ns, not {mono_ns}")
        self._u64[_W_MONO] = mono_ns
        if step is not None:
            self._u64[_W_STEP] = step

    def set_wall_offset(self, offset_ns: int) -> None:
        """Sets ``wall - monotonic`` (ns) for :func:`time_ns`."""
        self._i64[_W_OFFSET] = offset_ns

    def close(self) -> None:
        """Unmaps and removes the file. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        self._u64.release()
        self._i64.release()
        self._map.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
