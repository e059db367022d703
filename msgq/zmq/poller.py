"""The ZMQ Poller: waits on many subscribers of the ZMQ backend at once."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import zmq

from msgq.aio import wait_for_result
from msgq.errors import IpcError
from msgq.zmq.options import _SLICE_MS, _slice_ms
from msgq.zmq.subscriber import SubSocket, wait_readable_async


class Poller:
    """Waits on many SubSockets of the ZMQ backend at once."""

    def __init__(self) -> None:
        self._sockets: list[SubSocket] = []
        self._registered: list[zmq.Socket] = []  # the ZMQ socket each one had then
        self._poller = zmq.Poller()
        self._next_handshake_check = 0.0

    def registerSocket(self, socket: SubSocket) -> None:  # noqa: N802 (upstream name)
        """Adds ``socket``; registering a socket twice has no further effect."""
        sock = socket  # upstream's parameter name, for keyword callers
        if not isinstance(sock, SubSocket):
            raise TypeError(f"a ZMQ Poller takes ZMQ SubSockets, not {type(sock).__name__}")
        if sock._sock is None:
            raise IpcError("register a connected SubSocket")
        sock._check_connected()  # refuses a socket of the parent after fork
        if any(s is sock for s in self._sockets):
            return
        self._sockets.append(sock)
        self._registered.append(sock._sock)
        self._poller.register(sock._sock, zmq.POLLIN)

    def poll(self, timeout: int | None) -> list[SubSocket]:
        """Sockets with a message waiting, after at most ``timeout`` ms (negative or None:
        no limit). Empty list on timeout."""
        if not self._sockets:
            return []
        # Each socket is taken for the whole poll, as a receive takes it: close or
        # reconnect from another thread meanwhile raises IpcError instead of closing the
        # ZMQ socket under zmq_poll (a libzmq abort).
        taken: list[SubSocket] = []
        try:
            for s in self._sockets:
                if s._sock is None:
                    raise IpcError("a socket registered with this Poller was closed")
                # a fork()ed child polling its parent's sockets would spin on a libzmq
                # context it cannot use: it is refused as the sockets' own calls are
                s._enter()
                taken.append(s)
            return self._poll(timeout)
        finally:
            for s in taken:
                s._turn.append(True)

    def _poll(self, timeout: int | None) -> list[SubSocket]:
        for i, s in enumerate(self._sockets):
            if s._sock is not self._registered[i]:  # reconnected since it was registered
                self._poller.unregister(self._registered[i])
                self._registered[i] = s._sock
                self._poller.register(s._sock, zmq.POLLIN)
        stashed = [s for s in self._sockets if s._stash is not None]
        if stashed:
            timeout = 0
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout / 1000
        while True:
            slice_ms = _slice_ms(deadline)
            ready = {id(sk) for sk, _ in self._poller.poll(slice_ms)}
            if ready:
                # A readable socket may hold only messages receive() would drop (foreign
                # or malformed): take its next valid one into the stash, so a socket is
                # reported exactly when receive() has something to return.
                for s in self._sockets:
                    if s._stash is None and id(s._sock) in ready:
                        s._stash = s._recv_one(s._sock)
                stashed = [s for s in self._sockets if s._stash is not None]
            if stashed:
                return stashed
            now = time.monotonic()
            if now >= self._next_handshake_check:  # at most once a slice, not per poll(0)
                self._next_handshake_check = now + _SLICE_MS / 1000
                for s in self._sockets:
                    s._check_handshakes()
            if deadline is not None and now >= deadline:
                return []

    async def poll_async(self, timeout: int | None = None) -> list[SubSocket]:
        """``await poller.poll_async(timeout)``: the registered sockets with a message
        waiting, after at most ``timeout`` ms (None or negative: no limit); empty on
        timeout. The task sleeps on the sockets' descriptors meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None or timeout < 0 else loop.time() + timeout / 1000
        ready = await wait_for_result(
            loop, lambda: self.poll(0) or None,
            partial(wait_readable_async, loop, list(self._sockets)), deadline)
        return ready or []
