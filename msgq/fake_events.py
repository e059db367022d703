"""Fake events: let a test harness step subscribers of any backend in lockstep.

Upstream msgq/cereal API and semantics. A :class:`SocketEventHandle` for an endpoint owns
two :class:`Event` s, ``recv_called`` and ``recv_ready``, and an ``enabled`` flag. When
``CEREAL_FAKE=1``, subscribers are wrapped (:mod:`msgq.sockets`): while their
endpoint's handle is enabled, ``receive()`` first sets ``recv_called``, waits for
``recv_ready``, clears it, and only then receives.

Design (Linux and other POSIX systems; processes need share nothing but names):

* Everything of one (namespace prefix, identifier, endpoint) lives in the queue folder of
  the shared-memory backend (``$MSGQ_SHM_DIR``, default ``/dev/shm``, plus the
  ``MSGQ_PREFIX``/``OPENPILOT_PREFIX`` folder), under names starting ``msgq-fake.``:

  - ``msgq-fake.<h>.<endpoint>.state`` — a 1 KiB mapped state file: magic, version,
    generation, ``enabled``, the owner's pid, a ``closed`` flag and the names of the two
    FIFOs. ``<h>`` is the 64-bit FNV-1a hash of the identifier (``CEREAL_FAKE_PREFIX``).
  - ``msgq-fake.<h>.<endpoint>.<pid>-<n>.called`` / ``.ready`` — the two events, named
    pipes (FIFOs) made by the owning process.

* An :class:`Event` is a FIFO opened read-write and non-blocking. ``set`` writes a byte,
  ``clear`` reads every byte, ``peek`` and ``wait`` poll for input (``wait`` does not
  consume; it waits in ``poll(2)`` with the GIL released, in 50 ms slices so Ctrl-C is
  answered). ``fd`` is that real, pollable descriptor.
* ``SocketEventHandle(override=True)`` makes the state (or takes over an existing one:
  new FIFOs, generation + 1, ``enabled`` False). Others (``override=False`` handles and
  wrapped subscribers) map the state when it exists and follow the generation; they
  never create anything. A state whose owner process has died is treated as disabled.
* The owner removes its state file and FIFOs in ``close()``, when it is garbage
  collected, and at normal exit (also in multiprocessing children started with fork or
  forkserver, which leave through ``os._exit``). A forked copy of a handle never removes
  its parent's files.
* After a crash (SIGKILL, power loss) the state file and two FIFOs stay. They are
  harmless (a dead owner's state counts as disabled), the next owner of the same name
  takes them over and deletes the dead owner's FIFOs, and :func:`remove_stale_files`
  (or ``rm /dev/shm/msgq-fake.*``, or removing the prefix folder) cleans them up.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import itertools
import mmap
import os
import re
import select
import stat
import sys
import time
import weakref
from collections.abc import Sequence
from typing import Any

from msgq.queues import fnv1a_64, process_alive, queue_dir, queue_file_mode, validate_endpoint

__all__ = [
    "Event",
    "SocketEventHandle",
    "cereal_fake_event_handle",
    "delete_fake_prefix",
    "fake_event_handle",
    "get_fake_prefix",
    "remove_stale_files",
    "set_fake_prefix",
    "toggle_fake_events",
    "wait_for_one_event",
]

RECV_CALLED = 0
RECV_READY = 1

_FILE_PREFIX = "msgq-fake."
_STATE_SIZE = 1024
_MAGIC = 0x4546514D  # "MQFE"
_VERSION = 1
# u32 word indexes of the state header
_W_MAGIC, _W_VERSION, _W_GENERATION, _W_ENABLED, _W_OWNER, _W_CLOSED = range(6)
_PATHS_OFFSET = 64
_PATH_MAX = 256
_SLICE_S = 0.05
# How often a gated receive re-checks that its handle is still there and enabled.
_GATE_CHECK_S = 1.0
_fifo_counter = itertools.count()


# --- environment ---------------------------------------------------------------------

def toggle_fake_events(enabled: bool) -> None:
    """Sets (or unsets) ``CEREAL_FAKE`` for this process and the children it starts;
    sockets created afterwards are wrapped in fake events (or not)."""
    if enabled:
        os.environ["CEREAL_FAKE"] = "1"
    else:
        os.environ.pop("CEREAL_FAKE", None)


def set_fake_prefix(prefix: str) -> None:
    """Sets the fake-event identifier (``CEREAL_FAKE_PREFIX``); ``""`` unsets it."""
    if prefix:
        os.environ["CEREAL_FAKE_PREFIX"] = prefix
    else:
        os.environ.pop("CEREAL_FAKE_PREFIX", None)


def get_fake_prefix() -> str:
    """The fake-event identifier (``CEREAL_FAKE_PREFIX``), ``""`` when unset."""
    return os.environ.get("CEREAL_FAKE_PREFIX", "")


def delete_fake_prefix() -> None:
    """Unsets ``CEREAL_FAKE_PREFIX``."""
    os.environ.pop("CEREAL_FAKE_PREFIX", None)


# --- events --------------------------------------------------------------------------

def _poll_fds(fds: Sequence[int], timeout: float | None) -> int:
    """Index of the first fd with input, waiting at most ``timeout`` s (None or negative:
    no limit); -1 when the time passed."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
    while True:
        slice_s = _SLICE_S
        if deadline is not None:
            slice_s = min(slice_s, max(0.0, deadline - time.monotonic()))
        ready = {fd for fd, ev in poller.poll(slice_s * 1000) if ev & select.POLLIN}
        if ready:
            return next(i for i, fd in enumerate(fds) if fd in ready)
        if deadline is not None and time.monotonic() >= deadline:
            return -1


class Event:
    """A level-triggered event shared between processes (a FIFO): ``set`` raises it,
    ``clear`` lowers it, ``peek``/``wait`` look at it without changing it."""

    def __init__(self, fd: int = -1) -> None:
        self._fd = fd
        self._state: _State | None = None
        self._which = 0
        self._owner: Any = None
        self._absent_fd = -1  # what ``fd`` reads while there is no event

    @classmethod
    def _of(cls, state: _State | None, which: int, owner: Any, absent_fd: int = -1) -> Event:
        event = cls(-1)
        event._state, event._which = state, which
        event._owner = owner  # keeps the handle (and so the descriptor) alive
        event._absent_fd = absent_fd
        return event

    def _own_fd(self) -> int:
        """The event's descriptor; -1 when there is no event."""
        if self._state is not None:
            return self._state.fifo_fds[self._which] if not self._state.released else -1
        return self._fd

    @property
    def fd(self) -> int:
        """The pollable file descriptor (readable while set); -1 when there is no event
        (0 for the events of :func:`cereal_fake_event_handle`, as cereal reports them)."""
        fd = self._own_fd()
        return fd if fd >= 0 else self._absent_fd

    def is_valid(self) -> bool:
        """True when the event has a file descriptor."""
        return self._own_fd() >= 0

    def _check(self) -> int:
        fd = self._own_fd()  # never the 0 shown for cereal: that is stdin
        if fd < 0:
            raise RuntimeError(
                "event has no file descriptor: no fake event state exists for its endpoint; "
                "create one with fake_event_handle(endpoint) (override=True)")
        return fd

    def set(self) -> None:
        """Sets the event (a no-op when the FIFO is full, i.e. long set)."""
        fd = self._check()
        try:
            os.write(fd, b"\x01")
        except BlockingIOError:
            pass

    def clear(self) -> int:
        """Clears the event; returns how many times it had been set."""
        fd = self._check()
        total = 0
        while True:
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                return total
            if not chunk:
                return total
            total += len(chunk)

    def peek(self) -> bool:
        """True when the event is set."""
        return _poll_fds([self._check()], 0) == 0

    def wait(self, timeout: float | None = -1) -> None:
        """Waits until the event is set (without clearing it); ``timeout`` in seconds
        (negative or None: no limit). Raises RuntimeError when the time passed."""
        if _poll_fds([self._check()], timeout) < 0:
            raise RuntimeError(f"event timed out after {timeout} s (pid {os.getpid()})")

    def __repr__(self) -> str:
        return f"Event(fd={self.fd})"


def wait_for_one_event(events: Sequence[Event], timeout: float | None = -1) -> int:
    """Index of the first of ``events`` that is set, waiting at most ``timeout`` seconds
    (negative or None: no limit); RuntimeError when the time passed."""
    fds = [e._check() for e in events]
    if not fds:
        raise ValueError("wait_for_one_event() needs at least one event")
    index = _poll_fds(fds, timeout)
    if index < 0:
        raise RuntimeError(f"no event was set within {timeout} s (pid {os.getpid()})")
    return index


# --- state files ---------------------------------------------------------------------

class _Names:
    """Where the files of one (prefix, identifier, endpoint) live."""

    def __init__(self, endpoint: str, identifier: str) -> None:
        validate_endpoint(endpoint)
        if not isinstance(identifier, str):
            raise TypeError(f"identifier must be str, not {type(identifier).__name__}")
        name = endpoint.decode("utf-8") if isinstance(endpoint, bytes) else endpoint
        self.dir = queue_dir()  # honours MSGQ_SHM_DIR and the prefix
        self.base = f"{_FILE_PREFIX}{fnv1a_64(identifier.encode('utf-8')):016x}.{name}"
        self.state = os.path.join(self.dir, self.base + ".state")

    def fifo_ok(self, path: str) -> bool:
        """True when ``path`` (read from shared memory) names one of this key's FIFOs."""
        head, tail = os.path.split(path)
        return (head == self.dir and tail.startswith(self.base + ".")
                and re.fullmatch(r"\d+-\d+\.(called|ready)", tail[len(self.base) + 1:])
                is not None)


def _open_fifo(path: str) -> int:
    """Opens an event FIFO read-write, non-blocking; -1 when it is gone or not a FIFO."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return -1
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        return -1
    return fd


class _State:
    """A mapped state file, plus this process's descriptors of its two FIFOs."""

    def __init__(self, names: _Names, fd: int, mm: mmap.mmap) -> None:
        self.names = names
        self.fd = fd
        self.mm = mm
        self.words = memoryview(mm).cast("I")
        self.generation = -1
        self.fifo_fds = [-1, -1]
        self.fifo_paths = ["", ""]
        self.released = False

    # header fields: aligned 32-bit words, read and written with single loads/stores
    @property
    def enabled(self) -> bool:
        return self.words[_W_ENABLED] != 0

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self.words[_W_ENABLED] = 1 if value else 0

    @property
    def owner_pid(self) -> int:
        pid = self.words[_W_OWNER]
        return pid if pid < 2**31 else 0

    @property
    def retired(self) -> bool:
        """True when the owner closed this state (it is no longer at its path)."""
        return self.words[_W_CLOSED] != 0 or self.words[_W_MAGIC] != _MAGIC

    def _read_paths(self) -> list[str]:
        paths = []
        for i in range(2):
            off = _PATHS_OFFSET + i * _PATH_MAX
            raw = bytes(self.mm[off : off + _PATH_MAX]).split(b"\0", 1)[0]
            name = raw.decode("utf-8", "replace")
            path = os.path.join(self.names.dir, name)
            paths.append(path if "/" not in name and self.names.fifo_ok(path) else "")
        return paths

    def _write_paths(self, paths: Sequence[str]) -> None:
        for i, path in enumerate(paths):
            raw = os.path.basename(path).encode("utf-8")  # the folder is known to readers
            if len(raw) >= _PATH_MAX:
                raise ValueError(f"fake event path too long: {path}")
            off = _PATHS_OFFSET + i * _PATH_MAX
            self.mm[off : off + _PATH_MAX] = raw.ljust(_PATH_MAX, b"\0")

    def follow(self) -> None:
        """Reopens the FIFOs when an owner took over (the generation changed)."""
        generation = self.words[_W_GENERATION]
        if generation == self.generation:
            return
        fcntl.flock(self.fd, fcntl.LOCK_SH)
        try:
            generation = self.words[_W_GENERATION]
            paths = self._read_paths()
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        self._close_fifos()
        self.fifo_paths = paths
        self.fifo_fds = [_open_fifo(p) if p else -1 for p in paths]
        self.generation = generation

    def _close_fifos(self) -> None:
        for fd in self.fifo_fds:
            if fd >= 0:
                os.close(fd)
        self.fifo_fds = [-1, -1]

    def release(self) -> None:
        """Closes descriptors and the mapping (removes nothing)."""
        if self.released:
            return
        self.released = True
        self._close_fifos()
        self.words.release()
        self.mm.close()
        os.close(self.fd)

    @classmethod
    def attach(cls, names: _Names) -> _State | None:
        """Maps an existing, complete, open state; None when there is none."""
        try:
            fd = os.open(names.state, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size < _STATE_SIZE:
                os.close(fd)
                return None
            mm = mmap.mmap(fd, _STATE_SIZE)
        except OSError:
            os.close(fd)
            return None
        state = cls(names, fd, mm)
        if state.retired or state.words[_W_VERSION] != _VERSION:
            state.release()
            return None
        state.follow()
        return state

    @classmethod
    def create(cls, names: _Names) -> _State:
        """Makes the state and two new FIFOs owned by this process, taking over an
        existing state of the same name."""
        mode = queue_file_mode()
        queue_dir(create=True)  # the prefix folder, as the shared-memory core makes it
        pid = os.getpid()
        stem = os.path.join(names.dir, f"{names.base}.{pid}-{next(_fifo_counter)}")
        paths = [stem + ".called", stem + ".ready"]
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            os.mkfifo(path, mode)
        try:
            return cls._install(names, paths, mode)
        except BaseException:
            for path in paths:
                _unlink_quiet(path)
            raise

    @classmethod
    def _install(cls, names: _Names, paths: list[str], mode: int) -> _State:
        while True:
            try:
                fd = os.open(names.state,
                             os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                             mode)
                os.fchmod(fd, mode)
            except FileExistsError:
                try:
                    fd = os.open(names.state, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
                except FileNotFoundError:
                    continue  # its owner just removed it: make a new one
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                # The owner may have removed the file between our open and our lock.
                try:
                    at_path = os.stat(names.state, follow_symlinks=False)
                except FileNotFoundError:
                    at_path = None
                mine = os.fstat(fd)
                if at_path is None or (at_path.st_dev, at_path.st_ino) != (mine.st_dev,
                                                                            mine.st_ino):
                    continue
                if not stat.S_ISREG(mine.st_mode):
                    raise RuntimeError(f"{names.state} is not a regular file; remove it")
                if mine.st_size < _STATE_SIZE:
                    os.ftruncate(fd, _STATE_SIZE)
                state = cls(names, fd, mmap.mmap(fd, _STATE_SIZE))
                generation = 0
                if state.words[_W_MAGIC] == _MAGIC and state.words[_W_VERSION] == _VERSION:
                    generation = state.words[_W_GENERATION]
                    old_owner = state.owner_pid
                    if not process_alive(old_owner):
                        for old in state._read_paths():
                            if old:
                                _unlink_quiet(old)
                state.words[_W_MAGIC] = 0  # attachers ignore it while we write
                state._write_paths(paths)
                state.words[_W_VERSION] = _VERSION
                state.words[_W_ENABLED] = 0
                state.words[_W_OWNER] = os.getpid()
                state.words[_W_CLOSED] = 0
                state.words[_W_GENERATION] = (generation + 1) & 0xFFFFFFFF
                state.words[_W_MAGIC] = _MAGIC
                fd = -1  # the state owns it now
            finally:
                if fd >= 0:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
            fcntl.flock(state.fd, fcntl.LOCK_UN)
            state.follow()
            return state

    def retire(self, own_paths: Sequence[str], own_generation: int) -> None:
        """The owner's close: removes the state file (unless another owner took it over)
        and this owner's FIFOs."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            if (self.owner_pid == os.getpid() and self.words[_W_GENERATION] == own_generation
                    and not self.retired):
                self.words[_W_CLOSED] = 1
                try:
                    at_path = os.stat(self.names.state, follow_symlinks=False)
                    mine = os.fstat(self.fd)
                    if (at_path.st_dev, at_path.st_ino) == (mine.st_dev, mine.st_ino):
                        os.unlink(self.names.state)
                except FileNotFoundError:
                    pass
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        for path in own_paths:
            _unlink_quiet(path)


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise


class _StateView:
    """A non-owner's view of a state: attaches when the state exists, follows
    take-overs, lets go when its owner closed it."""

    def __init__(self, names: _Names) -> None:
        self.names = names
        self.state: _State | None = None

    def current(self) -> _State | None:
        state = self.state
        if state is not None and state.retired:
            state.release()
            state = self.state = None
        if state is None:
            state = self.state = _State.attach(self.names)
            if state is None:
                return None
        state.follow()
        return state

    def release(self) -> None:
        if self.state is not None:
            self.state.release()
            self.state = None


# --- handles -------------------------------------------------------------------------

_owned: weakref.WeakSet[SocketEventHandle] = weakref.WeakSet()


class SocketEventHandle:
    """The fake events of one endpoint for one identifier.

    ``override=True`` makes (or takes over) the state: new events, ``enabled`` False; the
    handle removes them again in ``close()``. ``override=False`` looks at a state someone
    else made; while there is none, ``enabled`` is False and the events' fds are -1.
    """

    def __init__(self, endpoint: str, identifier: str = "", override: bool = True) -> None:
        self.endpoint = endpoint
        self.identifier = identifier
        self._names = _Names(endpoint, identifier)
        self._pid = os.getpid()
        self._own_paths: list[str] = []
        self._own_generation = -1
        self._view = _StateView(self._names)
        self._closed = False
        if override:
            state = _State.create(self._names)
            self._view.state = state
            self._own_paths = list(state.fifo_paths)
            self._own_generation = state.generation
            _owned.add(self)
            _register_exit_cleanup()

    @property
    def owner(self) -> bool:
        """True when this handle made the state and removes it on close."""
        return bool(self._own_paths)

    def _state(self) -> _State | None:
        if self._closed:
            raise RuntimeError(f"fake event handle of {self.endpoint!r} is closed")
        return self._view.current()

    @property
    def enabled(self) -> bool:
        """Whether subscribers of the endpoint are gated by the events."""
        state = self._state()
        return state is not None and state.enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        state = self._state()
        if state is None:
            raise RuntimeError(
                f"no fake event state exists for endpoint {self.endpoint!r} (identifier "
                f"{self.identifier!r}); create it with fake_event_handle(endpoint) first")
        state.enabled = bool(value)

    #: What the events' ``fd`` reads while no state exists (see cereal_fake_event_handle).
    _absent_fd = -1

    def _event(self, which: int) -> Event:
        return Event._of(self._state(), which, self, self._absent_fd)

    @property
    def recv_called_event(self) -> Event:
        """Set by a gated subscriber when its ``receive()`` was called."""
        return self._event(RECV_CALLED)

    @property
    def recv_ready_event(self) -> Event:
        """Set by the harness to let a gated ``receive()`` go on."""
        return self._event(RECV_READY)

    def close(self) -> None:
        """Lets go of the state; the owner (in the process that made it) removes it."""
        if self._closed:
            return
        self._closed = True
        state = self._view.state
        try:
            if state is not None and self._own_paths and self._pid == os.getpid():
                state.retire(self._own_paths, self._own_generation)
        finally:
            self._view.release()

    def __enter__(self) -> SocketEventHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"SocketEventHandle({self.endpoint!r}, identifier={self.identifier!r}, "
                f"owner={self.owner})")


def fake_event_handle(
    endpoint: str, identifier: str | None = None, override: bool = True, enable: bool = False
) -> SocketEventHandle:
    """A handle of ``endpoint``'s fake events (``identifier`` default: the fake prefix);
    with ``override`` the handle makes the events and sets ``enabled`` to ``enable``."""
    return _new_handle(SocketEventHandle, endpoint, identifier, override, enable)


def _new_handle(cls: type[SocketEventHandle], endpoint: str, identifier: str | None,
                override: bool, enable: bool) -> SocketEventHandle:
    handle = cls(endpoint, identifier or get_fake_prefix(), override)
    if override:
        handle.enabled = enable
    return handle


class _CerealSocketEventHandle(SocketEventHandle):
    _absent_fd = 0


def cereal_fake_event_handle(
    endpoint: str, identifier: str | None = None, override: bool = True, enable: bool = False
) -> SocketEventHandle:
    """:func:`fake_event_handle` as cereal's messaging module (before msgq was split out
    of it) reports it, for code written against cereal (``msgq.compat.cereal``): where no
    state exists (an ``override=False`` handle of an endpoint nobody manages) the events'
    ``fd`` reads 0, not -1, because cereal mapped a zero-filled state file and returned
    its descriptor fields as they were (upstream msgq 1.0 says -1). Only the number
    differs: such an event still refuses ``set``/``clear``/``wait`` (RuntimeError), so
    nothing is ever written to or read from descriptor 0."""
    return _new_handle(_CerealSocketEventHandle, endpoint, identifier, override, enable)


class SocketEventGate:
    """What a wrapped subscriber does before each receive (see :mod:`msgq.sockets`)."""

    def __init__(self, endpoint: str, identifier: str) -> None:
        self._view = _StateView(_Names(endpoint, identifier))

    def enabled(self) -> bool:
        """True when the endpoint's events exist, are enabled and their owner lives."""
        state = self._view.current()
        return (state is not None and state.enabled and state.fifo_fds[RECV_READY] >= 0
                and process_alive(state.owner_pid))

    def pass_gate(self) -> None:
        """Signals ``recv_called`` and waits for ``recv_ready`` when enabled. Stops
        waiting when the handle is disabled, closed or its owner died meanwhile."""
        if not self.enabled():
            return
        state = self._view.state
        assert state is not None
        Event(state.fifo_fds[RECV_CALLED]).set()
        while True:
            try:
                Event(state.fifo_fds[RECV_READY]).wait(_GATE_CHECK_S)
            except RuntimeError:
                if not self.enabled() or self._view.state is not state:
                    return
                continue
            Event(state.fifo_fds[RECV_READY]).clear()
            return

    async def pass_gate_async(self) -> None:
        """:meth:`pass_gate` for a task: the wait for ``recv_ready`` is the event loop's
        watch of that FIFO (no thread, no polling); cancelling it leaves the event set."""
        if not self.enabled():
            return
        state = self._view.state
        assert state is not None
        import asyncio  # imported already: a loop is running (msgq.aio.running_loop)

        Event(state.fifo_fds[RECV_CALLED]).set()
        ready = Event(state.fifo_fds[RECV_READY])
        loop = asyncio.get_running_loop()
        while True:
            if ready.peek():
                ready.clear()
                return
            woken = loop.create_future()
            loop.add_reader(ready.fd, _resolve_once, woken)
            try:
                await asyncio.wait_for(woken, _GATE_CHECK_S)
            except asyncio.TimeoutError:
                if not self.enabled() or self._view.state is not state:
                    return
            finally:
                loop.remove_reader(ready.fd)

    def close(self) -> None:
        self._view.release()


def _resolve_once(future: Any) -> None:
    if not future.done():
        future.set_result(None)


# --- cleanup -------------------------------------------------------------------------

_exit_cleanup_pid = 0


def _close_owned() -> None:
    for handle in list(_owned):
        if handle._pid == os.getpid():
            try:
                handle.close()
            except Exception:
                pass


def _register_exit_cleanup() -> None:
    """Closes owned handles at normal exit: atexit for ordinary exits, and a
    multiprocessing finalizer for fork/forkserver children (they leave via os._exit)."""
    global _exit_cleanup_pid
    if _exit_cleanup_pid == os.getpid():
        return
    _exit_cleanup_pid = os.getpid()
    atexit.register(_close_owned)
    import multiprocessing.util  # only where needed: it is slow to import

    multiprocessing.util.Finalize(None, _close_owned, exitpriority=100)


def remove_stale_files(directory: str | None = None) -> list[str]:
    """Removes fake-event files left by crashed processes in ``directory`` (default: the
    current queue folder) and returns their paths: state files whose owner is gone and
    FIFOs whose creating process is gone."""
    if directory is None:
        directory = queue_dir()
    removed = []
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return removed
    fifo = re.compile(r"\.(\d+)-\d+\.(called|ready)$")
    for entry in entries:
        if not entry.startswith(_FILE_PREFIX):
            continue
        path = os.path.join(directory, entry)
        if entry.endswith(".state"):
            dead = _state_owner_dead(path)
        else:
            m = fifo.search(entry)
            dead = m is not None and not process_alive(int(m.group(1)))
        if dead:
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
    return removed


def _state_owner_dead(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        raw = os.pread(fd, 4 * (_W_OWNER + 1), 0)
    finally:
        os.close(fd)
    if len(raw) < 4 * (_W_OWNER + 1):
        return True
    pid = int.from_bytes(raw[4 * _W_OWNER : 4 * _W_OWNER + 4], sys.byteorder)
    return pid >= 2**31 or not process_alive(pid)
