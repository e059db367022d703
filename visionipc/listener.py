"""The server's side of the handshake: one thread, one epoll loop, no blocking calls.

Every connection gets one request (one SEQPACKET message) within a deadline and one reply,
then it is closed. Nothing a client does can block or stall the loop:

* sockets are non-blocking; a reply (at most a few KiB) goes into a fresh connection's
  empty send buffer, and a connection whose buffer is somehow full is dropped;
* a connection that has not sent its request by its deadline (``handshake_timeout_s``) is
  closed; at most ``max_pending`` connections wait at once and the oldest silent one is
  dropped to make room (one whose request has arrived is served instead), so silent
  clients cannot use up the server's file descriptors or crowd out a good client;
* requests are read with room for one byte more than a request, without room for
  ancillary data (file descriptors a client tries to pass are discarded by the kernel),
  and anything that is not exactly a valid request gets a "bad request" reply;
* a peer whose uid the policy does not allow gets a "not allowed" reply to whatever it
  sends (and nothing else);
* an error on one connection closes that connection and is counted, never more.
"""

from __future__ import annotations

import array
import contextlib
import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from msgq.errors import IpcError

from .buffer import BufferGeometry
from .handshake import (
    KIND_LIST,
    REQUEST,
    STATUS_BAD_REQUEST,
    STATUS_NOT_ALLOWED,
    STATUS_UNKNOWN_STREAM,
    HandshakeError,
    decode_request,
    encode_buffers_reply,
    encode_list_reply,
    encode_status_reply,
)
from .peers import PeerPolicy, peer_credentials

__all__ = ["Listener", "StreamExport"]

#: Connections accepted per wake-up before the loop looks at the others again.
ACCEPT_BATCH = 64
LISTEN_BACKLOG = 1024
#: Pause of the loop when the process is out of file descriptors (s).
EMFILE_PAUSE_S = 0.01


@dataclass(frozen=True)
class StreamExport:
    """What a client gets for one stream: the geometry and one fd per buffer."""

    geometry: BufferGeometry
    fds: tuple[int, ...]


class Listener:
    """Serves handshakes on a Unix socket from a thread of its own.

    ``streams`` is read (never written) by the thread: the server adds entries to it as it
    creates buffers. ``stats`` counts what happened, per kind.
    """

    def __init__(
        self,
        path: str,
        server_id: int,
        streams: Mapping[int, StreamExport],
        policy: PeerPolicy,
        socket_mode: int,
        handshake_timeout_s: float = 1.0,
        max_pending: int = 256,
    ) -> None:
        self.path = path
        self.server_id = server_id
        self.streams = streams
        self.policy = policy
        self.socket_mode = socket_mode
        self.handshake_timeout_s = handshake_timeout_s
        self.max_pending = max_pending
        self.stats = {
            "served": 0,
            "refused": 0,
            "bad_requests": 0,
            "unknown_stream": 0,
            "timeouts": 0,
            "evicted": 0,
            "disconnects": 0,
            "errors": 0,
        }
        self._sock: socket.socket | None = None
        self._identity: tuple[int, int] | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._owner_pid = os.getpid()

    # --- life cycle ------------------------------------------------------------------

    def start(self) -> None:
        """Binds the socket (taking the path over from a stale or older server) and
        starts the thread."""
        if self._thread is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            try:
                st = os.lstat(self.path)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISSOCK(st.st_mode):
                    raise IpcError(
                        f"VisionIPC socket path {self.path} exists and is not a socket; "
                        "remove it or use another server name"
                    )
                os.unlink(self.path)  # a crashed server's socket, or an older server's
            sock.bind(self.path)
            os.chmod(self.path, self.socket_mode)
            st = os.lstat(self.path)
            self._identity = (st.st_dev, st.st_ino)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            raise IpcError(f"VisionIPC socket {self.path}: {e.strerror or e}") from None
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._thread = threading.Thread(
            target=self._run,
            name=f"visionipc-listener:{os.path.basename(self.path)}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stops the thread, closes the socket and removes its file if it is still
        ours (a newer server may have taken the path over)."""
        if os.getpid() != self._owner_pid:
            # A forked copy: the thread, the socket file and the wake-up pair belong to the
            # parent; only this process's copies of the descriptors are closed.
            for sock in (self._sock, self._wake_r, self._wake_w):
                if sock is not None:
                    sock.close()
            self._sock = None
            self._thread = None
            return
        self._stopping = True
        thread, self._thread = self._thread, None
        if thread is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
            if thread is not threading.current_thread():
                thread.join()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
            if self._identity is not None:
                with contextlib.suppress(OSError):
                    st = os.lstat(self.path)
                    if (st.st_dev, st.st_ino) == self._identity:
                        os.unlink(self.path)
        self._wake_r.close()
        self._wake_w.close()

    @property
    def running(self) -> bool:
        """True while the thread serves."""
        return self._thread is not None and self._thread.is_alive()

    # --- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        listen = self._sock
        if listen is None:
            return
        selector = selectors.DefaultSelector()
        pending: dict[int, tuple[socket.socket, float]] = {}  # fd -> (conn, deadline)
        try:
            selector.register(listen, selectors.EVENT_READ, "listen")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            while not self._stopping:
                try:
                    if self._step(listen, selector, pending):
                        return
                except Exception:  # noqa: BLE001 - one bad turn must not end the service
                    self.stats["errors"] += 1
                    time.sleep(EMFILE_PAUSE_S)
        finally:
            for conn, _deadline in pending.values():
                conn.close()
            selector.close()

    def _step(
        self,
        listen: socket.socket,
        selector: selectors.BaseSelector,
        pending: dict[int, tuple[socket.socket, float]],
    ) -> bool:
        """One turn of the loop: wait for events or the first deadline, handle them.
        True when asked to stop."""
        timeout = None
        if pending:
            first_deadline = next(iter(pending.values()))[1]
            timeout = max(0.0, first_deadline - time.monotonic())
        for key, _mask in selector.select(timeout):
            if key.data == "wake":
                return True
            if key.data == "listen":
                self._accept(listen, selector, pending)
            else:
                conn = cast(socket.socket, key.fileobj)  # registered by _accept
                entry = pending.get(conn.fileno())
                self._forget(conn, selector, pending)
                if not self._serve(conn, key.data == "allowed"):
                    # Woken without data after all: it keeps waiting until its deadline.
                    try:
                        if entry is None:
                            raise ValueError("not pending")
                        selector.register(conn, selectors.EVENT_READ, key.data)
                        pending[conn.fileno()] = entry
                    except (OSError, ValueError, KeyError):
                        self.stats["errors"] += 1
                        conn.close()
        self._expire(selector, pending)
        return False

    def _accept(
        self,
        listen: socket.socket,
        selector: selectors.BaseSelector,
        pending: dict[int, tuple[socket.socket, float]],
    ) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = listen.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of fds (EMFILE/ENFILE) or a connection that died in the queue: make
                # room by dropping the oldest silent client, or pause a moment.
                self.stats["errors"] += 1
                if pending:
                    self._make_room(selector, pending)
                else:
                    time.sleep(EMFILE_PAUSE_S)
                return
            try:
                conn.setblocking(False)
                # A refused peer still gets to send its request and gets its answer to it
                # (closing on an unread request would reset the connection instead).
                allowed = self.policy.allows(peer_credentials(conn))
            except OSError:
                self.stats["errors"] += 1
                conn.close()
                continue
            # A client that sent its request along with its connect is answered at once.
            if self._serve(conn, allowed):
                continue
            while len(pending) >= self.max_pending:
                self._make_room(selector, pending)
            try:
                selector.register(conn, selectors.EVENT_READ, "allowed" if allowed else "refused")
            except (OSError, ValueError):
                self.stats["errors"] += 1
                conn.close()
                continue
            pending[conn.fileno()] = (conn, time.monotonic() + self.handshake_timeout_s)

    def _make_room(
        self, selector: selectors.BaseSelector, pending: dict[int, tuple[socket.socket, float]]
    ) -> None:
        """Frees the oldest waiting connection: served if its request has arrived in the
        meantime, else dropped (only clients that stay silent are ever evicted)."""
        oldest = next(iter(pending.values()))[0]
        allowed = self._allowed(oldest, selector)
        self._forget(oldest, selector, pending)
        if not self._serve(oldest, allowed):
            self.stats["evicted"] += 1
            oldest.close()

    @staticmethod
    def _forget(
        conn: socket.socket,
        selector: selectors.BaseSelector,
        pending: dict[int, tuple[socket.socket, float]],
    ) -> None:
        fd = conn.fileno()
        if fd >= 0 and pending.pop(fd, None) is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(conn)

    def _expire(
        self, selector: selectors.BaseSelector, pending: dict[int, tuple[socket.socket, float]]
    ) -> None:
        now = time.monotonic()
        while pending:
            conn, deadline = next(iter(pending.values()))
            if deadline > now:
                return
            allowed = self._allowed(conn, selector)
            self._forget(conn, selector, pending)
            if not self._serve(conn, allowed):  # one last look before hanging up
                self.stats["timeouts"] += 1  # counted first: the peer sees the close
                conn.close()

    @staticmethod
    def _allowed(conn: socket.socket, selector: selectors.BaseSelector) -> bool:
        try:
            return bool(selector.get_key(conn).data == "allowed")
        except (KeyError, ValueError):
            return False

    def _serve(self, conn: socket.socket, allowed: bool) -> bool:
        """Reads the request of a connection, answers it and closes the connection; False
        (connection left open) when the client has not sent anything yet. A peer that is
        not ``allowed`` gets "not allowed" whatever it asked."""
        try:
            data, _anc, flags, _addr = conn.recvmsg(REQUEST.size + 1)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self.stats["errors"] += 1
            conn.close()
            return True
        try:
            if not data:
                self.stats["disconnects"] += 1
                return True
            if not allowed:
                self.stats["refused"] += 1
                self._reply(conn, encode_status_reply(self.server_id, STATUS_NOT_ALLOWED))
                return True
            try:
                if flags & socket.MSG_TRUNC:
                    raise HandshakeError("oversized request")
                request = decode_request(data)
            except HandshakeError:
                self.stats["bad_requests"] += 1
                self._reply(conn, encode_status_reply(self.server_id, STATUS_BAD_REQUEST))
                return True
            if request.kind == KIND_LIST:
                reply = encode_list_reply(self.server_id, list(self.streams))
                fds: tuple[int, ...] = ()
            else:
                export = self.streams.get(request.stream)
                if export is None:
                    self.stats["unknown_stream"] += 1
                    self._reply(conn, encode_status_reply(self.server_id, STATUS_UNKNOWN_STREAM))
                    return True
                reply = encode_buffers_reply(
                    self.server_id, request.stream, len(export.fds), export.geometry
                )
                fds = export.fds
            if self._reply(conn, reply, fds):
                self.stats["served"] += 1
            return True
        finally:
            conn.close()

    def _reply(self, conn: socket.socket, reply: bytes, fds: tuple[int, ...] = ()) -> bool:
        """Sends ``reply`` (with ``fds``) without blocking; False if it could not go."""
        ancdata = []
        if fds:
            ancdata = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        try:
            conn.sendmsg([reply], ancdata, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            self.stats["errors"] += 1
            return False
        except OSError:
            self.stats["disconnects"] += 1  # the peer left before its answer
            return False
        return True
