"""ZMQ contexts of a process (made again after fork, ended at exit so that messages
sent just before exit still go out), the options every socket shares, and the monitor
sockets that report connections and handshakes."""

from __future__ import annotations

import atexit
import itertools
import os
import time
import weakref
from typing import TYPE_CHECKING, Any, NoReturn

import zmq
from zmq.utils.monitor import parse_monitor_message

from msgq.errors import IpcError
from msgq.zmq.options import _HEARTBEAT_IVL_MS, _HEARTBEAT_TIMEOUT_MS, _slice_ms
from msgq.zmq.ports import _check_segment_size, _endpoint_str, endpoint_port
from msgq.zmq.security import _HANDSHAKE_FAILED, stop_zap_handler

if TYPE_CHECKING:
    from msgq.zmq.publisher import PubSocket

# This process's id, kept current across fork() without a getpid() call per message.
_process_id = os.getpid()


def _forked_child() -> None:
    global _process_id
    _process_id = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX: Windows has no fork (nor forked children)
    os.register_at_fork(after_in_child=_forked_child)


class Context:
    """A zmq.Context, made on first use and made again in a forked child (a ZMQ context
    must not cross a fork).

    At normal exit (and at the end of a multiprocessing child) every context is ended, so
    messages sent just before exit still go out, waiting at most each socket's linger.
    """

    def __init__(self) -> None:
        self._ctx: zmq.Context | None = None
        self._pid = 0

    @property
    def zmq_context(self) -> zmq.Context:
        """The zmq.Context of this process."""
        if self._ctx is None or self._pid != os.getpid() or self._ctx.closed:
            self._ctx = zmq.Context(io_threads=1)
            self._pid = os.getpid()
            _live_contexts.add(self)
            _register_exit_flush()
        return self._ctx

    def term(self) -> None:
        """Closes every socket made with this context and ends it; unsent messages get at
        most each socket's linger to go out."""
        if self._ctx is not None and self._pid == os.getpid() and not self._ctx.closed:
            stop_zap_handler(self._ctx)
            self._ctx.destroy()
        self._ctx = None


_live_contexts: weakref.WeakSet[Context] = weakref.WeakSet()
# Connected publishers, closed (each within its linger) before the contexts at exit.
_live_publishers: weakref.WeakSet[PubSocket] = weakref.WeakSet()
_exit_flush_pid = 0


#: While the process exits: when every publisher's wait for its readers ends (one
#: linger for all of them, not one each in turn).
exit_deadline: float | None = None


def _flush_at_exit() -> None:
    global exit_deadline
    publishers = [p for p in list(_live_publishers) if p._pid == os.getpid()]
    lingers = [p.linger for p in publishers]
    exit_deadline = time.monotonic() + max(lingers, default=0) / 1000
    for publisher in publishers:  # each waits for its readers first
        try:
            publisher.close()
        except Exception:
            pass
    for context in list(_live_contexts):
        if context._pid == os.getpid():
            try:
                context.term()
            except Exception:
                pass


def _register_exit_flush() -> None:
    # pyzmq does not end contexts at exit, and a process exiting with a live context
    # loses what its I/O thread had not sent yet. atexit covers ordinary exits; the
    # multiprocessing finalizer covers fork/forkserver children (they leave via os._exit).
    global _exit_flush_pid
    if _exit_flush_pid == os.getpid():
        return
    _exit_flush_pid = os.getpid()
    atexit.register(_flush_at_exit)
    import multiprocessing.util  # only where needed: it is slow to import

    multiprocessing.util.Finalize(None, _flush_at_exit, exitpriority=10)


default_context = Context()


def _new_socket(
    context: Any, endpoint: Any, segment_size: Any, kind: int, linger: int
) -> tuple[str, int, zmq.Socket]:
    """Checks the arguments every socket takes and makes a ZMQ socket with the options
    both ends share (linger, heartbeats): the endpoint name, its port and the socket."""
    name = _endpoint_str(endpoint)
    _check_segment_size(name, segment_size)
    port = endpoint_port(name)
    sock = _zmq_context(context).socket(kind)
    try:
        sock.setsockopt(zmq.LINGER, linger)
        sock.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)
    except BaseException:
        sock.close(linger=0)
        raise
    return name, port, sock


class _OneThreadAtATime:
    """What both socket classes share: a turn held by the one thread inside a call that
    uses the ZMQ socket. libzmq sockets are not thread-safe, and closing one while
    another thread sleeps in it (a receive, a poll, a wait for readers) aborts or
    crashes the process in libzmq; so the turn is taken without waiting, and a call
    that finds it taken raises IpcError, as the shared-memory sockets do.

    The turn is a list holding one token: ``pop()`` takes it (IndexError: another
    thread has it), ``append(True)`` gives it back. Both are single operations on the
    list, atomic under the GIL (and under the list's own lock without one), and cost a
    quarter of a threading.Lock's acquire and release (32 against 115 ns), which a
    0.7 us send notices.
    """

    _role = "socket"
    #: What close and connect say another thread is doing while they refuse.
    _busy_doing = "using"
    endpoint: str | None
    _sock: zmq.Socket | None
    _monitor: zmq.Socket | None
    _pid: int

    def _init_guard(self) -> None:
        self._turn: list[bool] = [True]

    def _check_connected(self) -> zmq.Socket:
        return _usable(self._sock, self._pid, self.endpoint, self._role)

    def _enter(self) -> zmq.Socket:
        """Takes the turn for a call from this thread (give it back with
        ``_turn.append(True)``): the ZMQ socket, or IpcError when it is not connected
        or another thread is inside a call on it."""
        try:
            self._turn.pop()
        except IndexError:
            self._refuse()
        try:
            return self._check_connected()
        except BaseException:
            self._turn.append(True)
            raise

    def _refuse(self) -> NoReturn:
        """Raises the IpcError of a call that found the turn taken."""
        self._check_connected()  # a copy inherited through fork() says so first
        raise IpcError(f"endpoint {self.endpoint!r}: another thread is inside a call on "
                       f"this {self._role}; a ZMQ socket serves one thread at a time")

    def _claim(self) -> None:
        """Takes the turn for close or connect (give it back after), or raises IpcError
        while another thread is inside a call on it. A copy inherited through fork() is
        never busy: the thread that held it did not come along."""
        if self._pid and self._pid != os.getpid():
            self._forget_parent()
            self._turn = [True]
        try:
            self._turn.pop()
        except IndexError:
            raise IpcError(f"endpoint {self.endpoint!r}: another thread is "
                           f"{self._busy_doing} on this socket; close or reconnect it when "
                           "that call has returned") from None

    def close(self) -> None:
        """Closes the socket (see the class's own notes for what a close lets go out);
        it can connect again. Raises IpcError while another thread is inside a call on
        it (a send or receive, a wait, a Poller's poll)."""
        self._claim()
        try:
            self._close_socket()
        finally:
            self._turn.append(True)

    def _close_socket(self) -> None:
        raise NotImplementedError

    def _forget_parent(self) -> None:
        """Drops the parent's ZMQ state in a forked child (not ours to close)."""
        self._sock = self._monitor = None


def _usable(sock: zmq.Socket | None, pid: int, endpoint: Any, role: str) -> zmq.Socket:
    """``sock`` if it is connected and was made in this process, else IpcError."""
    if sock is None:
        raise IpcError("socket is not connected; call connect() first")
    if pid != _process_id:
        raise IpcError(f"endpoint {endpoint!r}: a ZMQ socket cannot be used after fork; "
                       f"create the {role} in the process that uses it")
    return sock


def _zmq_context(context: Any) -> zmq.Context:
    # msgq.context (a ProcessContext) or another backend's context means "this process's
    # default ZMQ context".
    if isinstance(context, Context):
        return context.zmq_context
    return default_context.zmq_context


_monitor_ids = itertools.count()


def _open_monitor(sock: zmq.Socket, events: int) -> zmq.Socket:
    """A monitor socket of ``sock`` for ``events`` whose queue has no limit.

    libzmq's side of a monitor sends blocking, in the I/O thread: with pyzmq's
    get_monitor_socket (a queue of ~2000 messages) a publisher that is not reading its
    monitor — idle between sends — stopped accepting connections after a few hundred
    connection attempts (a flood of them locked out its real subscribers). The events
    are read at each send (or look); what waits meanwhile is a few dozen bytes each.
    """
    address = f"inproc://msgq-monitor-{os.getpid()}-{next(_monitor_ids)}"
    sock.monitor(address, events)
    monitor = sock.context.socket(zmq.PAIR)
    try:
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.setsockopt(zmq.RCVHWM, 0)
        monitor.connect(address)
    except BaseException:
        monitor.close(0)
        sock.disable_monitor()
        raise
    return monitor


def _close_monitor(sock: zmq.Socket, monitor: zmq.Socket | None) -> None:
    """Stops ``sock``'s monitor and closes the monitor socket (nothing when ``monitor`` is
    None); a socket whose monitor is already gone is fine."""
    if monitor is None:
        return
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    monitor.close(0)


def _wait_monitor(monitor: zmq.Socket, wanted: int, deadline: float,
                  failed: Any = None) -> int:
    """Waits on a monitor socket for an event in ``wanted``; returns it, or 0 at the
    deadline. A failed handshake is passed to ``failed(event, value)`` first."""
    while True:
        slice_ms = _slice_ms(deadline)
        if not slice_ms:
            return 0
        if monitor.poll(slice_ms):
            message = parse_monitor_message(monitor.recv_multipart())
            event = int(message["event"])
            if failed is not None and event & _HANDSHAKE_FAILED:
                failed(event, int(message["value"]))
            if event & wanted:
                return event
