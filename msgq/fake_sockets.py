"""Subscribers and pollers of any backend, gated by fake events (``CEREAL_FAKE=1``).

:func:`wrap` is called by :func:`msgq.backend.with_fake_events` when a SubSocket or
Poller is created while fake events are on (``CEREAL_FAKE``); nothing else knows about
them.

* :class:`FakeSubSocket` forwards everything to the backend's socket; before each
  ``receive``/``receive_into`` it passes its endpoint's gate: when the endpoint's handle
  (same namespace prefix, identifier ``CEREAL_FAKE_PREFIX`` as read at ``connect``) is
  enabled, it sets ``recv_called``, waits for ``recv_ready`` and clears it.
* :class:`FakePoller` returns every registered socket whose handle is enabled at once, as
  upstream's fake poller does (their ``receive`` is gated, so the harness decides when
  each one goes on), together with the other sockets that have data. When no registered
  socket is enabled it is the backend's poller, unchanged.
"""

from __future__ import annotations

from typing import Any

from msgq import protocol
from msgq.fake_events import SocketEventGate, get_fake_prefix

__all__ = ["FakePoller", "FakeSubSocket", "wrap"]


class FakeSubSocket:
    """A backend SubSocket whose receives are gated by its endpoint's fake events."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self._gate: SocketEventGate | None = None

    def connect(
        self,
        context: Any,
        endpoint: str,
        address: bytes | str = b"127.0.0.1",
        conflate: bool = False,
        segment_size: int = 0,
    ) -> None:
        """Connects the backend socket, then finds the endpoint's fake events."""
        self.sock.connect(context, endpoint, address, conflate, segment_size)
        if self._gate is not None:
            self._gate.close()
        self._gate = SocketEventGate(endpoint, get_fake_prefix())

    @property
    def gate_enabled(self) -> bool:
        """True when receives on this socket are currently gated."""
        return self._gate is not None and self._gate.enabled()

    def receive(self, non_blocking: bool = False) -> bytes | None:
        """Passes the gate, then receives as the backend does."""
        if self._gate is not None:
            self._gate.pass_gate()
        return self.sock.receive(non_blocking)

    def receive_into(self, buffer: Any, non_blocking: bool = False) -> int | None:
        """Passes the gate, then receives into ``buffer`` as the backend does."""
        if self._gate is not None:
            self._gate.pass_gate()
        return self.sock.receive_into(buffer, non_blocking)

    def setTimeout(self, timeout: int | None) -> None:  # noqa: N802 (upstream name)
        """Timeout of a blocking receive in milliseconds (after the gate)."""
        self.sock.setTimeout(timeout)

    @property
    def endpoint(self) -> Any:
        """The endpoint this socket is connected to."""
        return self.sock.endpoint

    @property
    def conflate(self) -> bool:
        """True when only the newest message is kept."""
        return bool(self.sock.conflate)

    def close(self) -> None:
        """Closes the backend socket and lets go of the fake events."""
        if self._gate is not None:
            self._gate.close()
            self._gate = None
        self.sock.close()

    def __getattr__(self, name: str) -> Any:
        # Backend extras (has_data, segment_size, ...) pass through unchanged.
        if name == "sock":
            raise AttributeError(name)
        return getattr(self.sock, name)

    def __repr__(self) -> str:
        return f"FakeSubSocket({self.sock!r})"


class FakePoller:
    """A backend Poller that returns gated sockets at once (see the module doc)."""

    def __init__(self, poller: Any) -> None:
        self.poller = poller
        self._sockets: list[Any] = []

    def registerSocket(self, socket: Any) -> None:  # noqa: N802 (upstream name)
        """Adds ``socket`` (wrapped or not); registering twice has no further effect."""
        sock = socket  # upstream's parameter name, for keyword callers
        if any(s is sock for s in self._sockets):
            return
        inner = sock.sock if isinstance(sock, FakeSubSocket) else sock
        self.poller.registerSocket(inner)
        self._sockets.append(sock)

    def poll(self, timeout: int | None) -> list[Any]:
        """Enabled sockets at once plus the others with data; the backend's poll when no
        socket is enabled."""
        enabled = {id(s) for s in self._sockets
                   if isinstance(s, FakeSubSocket) and s.gate_enabled}
        ready = self.poller.poll(0 if enabled else timeout)
        ready_ids = {id(s) for s in ready}
        return [s for s in self._sockets
                if id(s) in enabled
                or id(s.sock if isinstance(s, FakeSubSocket) else s) in ready_ids]


protocol.SubSocket.register(FakeSubSocket)
protocol.Poller.register(FakePoller)


def wrap(obj: Any) -> Any:
    """A new backend SubSocket or Poller under the fake layer."""
    if isinstance(obj, (FakeSubSocket, FakePoller)):
        return obj
    if hasattr(obj, "registerSocket"):
        return FakePoller(obj)
    return FakeSubSocket(obj)
