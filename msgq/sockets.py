"""The socket factory: the protocol every backend implements, the choice of backend, and
the fake-event wrapping, in one place.

``msgq.PubSocket()`` (and ``Context``, ``SubSocket``, ``Poller``) construct the class of
the backend the environment selects at that moment, so a process can change the
environment between sockets; nothing above this module knows which backend was chosen.
The backend classes are registered here as virtual subclasses of the protocol's abstract
classes when a backend is first selected (nothing registers itself by being imported), so
``isinstance(sock, msgq.SubSocket)`` holds for every backend while calls go straight to
the backend's own (Cython or Python) methods with no wrapper. A backend module also sets
``QUEUED_ON_SEND``: whether a message is in its subscribers' queues when ``send``
returns (shared memory), or may still be on its way (ZMQ); :func:`queued_on_send` reads it.

Environment (first match wins):

* ``MSGQ_BACKEND`` — a backend name from :data:`BACKENDS`.
* ``ZMQ`` — set to a non-empty value other than ``0``: the ``zmq`` backend (upstream name).
* otherwise ``msgq`` (shared memory).

``CEREAL_FAKE`` (non-empty, not ``0``, read when a socket is created) wraps every new
SubSocket and Poller in fake events: :class:`FakeSubSocket` and :class:`FakePoller`.

* :class:`FakeSubSocket` forwards everything to the backend's socket; before each
  ``receive``/``receive_into`` it passes its endpoint's gate: when the endpoint's handle
  (same namespace prefix, identifier ``CEREAL_FAKE_PREFIX`` as read at ``connect``) is
  enabled, it sets ``recv_called``, waits for ``recv_ready`` and clears it
  (:mod:`msgq.fake_events`).
* :class:`FakePoller` returns every registered socket whose handle is enabled at once, as
  upstream's fake poller does (their ``receive`` is gated, so the harness decides when
  each one goes on), together with the other sockets that have data. When no registered
  socket is enabled it is the backend's poller, unchanged.

Layer: over the backends (imported by name when first selected: the ZMQ backend loads
pyzmq only for processes that use it), :mod:`msgq.fake_events` and :mod:`msgq.errors`;
``msgq/__init__.py`` re-exports it and everything above builds on it.
"""

from __future__ import annotations

import importlib
import os
from abc import ABCMeta, abstractmethod
from types import ModuleType
from typing import Any

from msgq.aio import next_message
from msgq.fake_events import SocketEventGate, get_fake_prefix

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "Context",
    "FakePoller",
    "FakeSubSocket",
    "Poller",
    "ProcessContext",
    "PubSocket",
    "SubSocket",
    "backend_name",
    "fake_events_enabled",
    "loaded_backends",
    "queued_on_send",
    "select_backend",
]

#: Backend name -> module implementing the socket protocol.
BACKENDS: dict[str, str] = {
    "msgq": "msgq.shm_backend",
    "zmq": "msgq.zmq",
}

DEFAULT_BACKEND = "msgq"

_loaded: dict[str, ModuleType] = {}


def _flag(name: str) -> bool:
    value = os.environ.get(name, "")
    return value not in ("", "0")


# --- choosing a backend --------------------------------------------------------------


def backend_name() -> str:
    """The backend the environment asks for; ValueError names the choices if unknown."""
    name = os.environ.get("MSGQ_BACKEND", "").strip().lower()
    if not name:
        name = "zmq" if _flag("ZMQ") else DEFAULT_BACKEND
    if name not in BACKENDS:
        choices = ", ".join(sorted(BACKENDS))
        raise ValueError(
            f"unknown msgq backend {name!r} (from the environment); choose one of: {choices}"
        )
    return name


def queued_on_send(name: str | None = None) -> bool:
    """Whether backend ``name`` (default: the one the environment asks for) has a message
    in its subscribers' queues when ``send`` returns (its module's ``QUEUED_ON_SEND``)."""
    return bool(select_backend(name).QUEUED_ON_SEND)


def select_backend(name: str | None = None) -> ModuleType:
    """The module of backend ``name`` (default: the one the environment asks for),
    imported and registered with the protocol on first use."""
    if name is None:
        name = backend_name()
    elif name not in BACKENDS:
        choices = ", ".join(sorted(BACKENDS))
        raise ValueError(f"unknown msgq backend {name!r}; choose one of: {choices}")
    module = _loaded.get(name)
    if module is None:
        module = importlib.import_module(BACKENDS[name])
        Context.register(module.Context)
        PubSocket.register(module.PubSocket)
        SubSocket.register(module.SubSocket)
        Poller.register(module.Poller)
        _loaded[name] = module
    return module


def loaded_backends() -> list[ModuleType]:
    """The backend modules selected so far in this process."""
    return list(_loaded.values())


def fake_events_enabled() -> bool:
    """Whether new SubSockets and Pollers are wrapped in fake events (``CEREAL_FAKE``, read
    now, so ``toggle_fake_events`` affects sockets created after it)."""
    return _flag("CEREAL_FAKE")


def _with_fake_events(obj: Any) -> Any:
    if not fake_events_enabled() or isinstance(obj, (FakeSubSocket, FakePoller)):
        return obj
    if hasattr(obj, "registerSocket"):
        return FakePoller(obj)
    return FakeSubSocket(obj)


# --- the protocol --------------------------------------------------------------------


class Context(metaclass=ABCMeta):
    """A backend's process-wide state (a zmq.Context for ZMQ; nothing for msgq)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Context:
            return select_backend().Context(*args, **kwargs)
        return super().__new__(cls)

    @abstractmethod
    def term(self) -> None: ...


class ProcessContext(Context):
    """``msgq.context``, the context ``pub_sock``/``sub_sock`` connect with. It belongs to
    no backend, so importing msgq chooses none (a bad ``MSGQ_BACKEND`` is reported when a
    socket is created); each backend takes it to mean its own process-wide state."""

    def term(self) -> None:
        """Ends the process-wide state of every backend used so far."""
        for module in loaded_backends():
            default = getattr(module, "default_context", None)
            if default is not None:
                default.term()


class PubSocket(metaclass=ABCMeta):
    """The publisher of one endpoint."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is PubSocket:
            return select_backend().PubSocket(*args, **kwargs)
        return super().__new__(cls)

    @abstractmethod
    def connect(self, context: Any, endpoint: str, segment_size: int = 0) -> None: ...

    @abstractmethod
    def send(self, data: Any) -> int: ...

    @abstractmethod
    def reserve(self, size: int) -> Any:
        """Room for one message of ``size`` bytes, written in place and published when
        committed: ``with pub.reserve(n) as buf: buf[:n] = ...``."""

    @abstractmethod
    def all_readers_updated(self) -> bool: ...

    @abstractmethod
    def wait_until_read(self, timeout: float | None = None,
                        poll_interval: float = 0.001) -> bool:
        """Waits until ``all_readers_updated()`` (True) or ``timeout`` seconds (False)."""

    @abstractmethod
    def wait_for_readers(self, timeout: float = 1.0, interval: float = 0.001) -> None:
        """Upstream's wait (seconds): returns once ``all_readers_updated()``, raises
        TimeoutError after ``timeout``."""

    @property
    @abstractmethod
    def num_readers(self) -> int:
        """Subscribers connected now."""

    @property
    @abstractmethod
    def endpoint(self) -> Any:
        """The endpoint this socket is connected to (None before ``connect``)."""

    @abstractmethod
    def close(self) -> None: ...


class SubSocket(metaclass=ABCMeta):
    """One subscriber of an endpoint."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is SubSocket:
            return _with_fake_events(select_backend().SubSocket(*args, **kwargs))
        return super().__new__(cls)

    @abstractmethod
    def connect(
        self,
        context: Any,
        endpoint: str,
        address: bytes | str = b"127.0.0.1",
        conflate: bool = False,
        segment_size: int = 0,
    ) -> None: ...

    @abstractmethod
    def setTimeout(self, timeout: int) -> None:  # noqa: N802 (upstream name)
        """Timeout of a blocking ``receive`` in milliseconds (negative or None: forever)."""

    @abstractmethod
    def receive(self, non_blocking: bool = False) -> bytes | None: ...

    @abstractmethod
    def receive_into(self, buffer: Any, non_blocking: bool = False) -> int | None:
        """Copies the next message into ``buffer`` and returns its size (None as
        ``receive``); a buffer too small raises ValueError and keeps the message."""

    @abstractmethod
    async def receive_async(self) -> bytes | None:
        """``await sub.receive_async()``: ``receive`` for a task (None after the socket's
        timeout); the task sleeps while it waits, and cancelling it loses no message.
        ``async for msg in sub`` receives every message."""

    @abstractmethod
    def __aiter__(self) -> Any: ...

    @abstractmethod
    async def __anext__(self) -> bytes: ...

    @abstractmethod
    def receive_view(self, non_blocking: bool = False) -> Any:
        """The next message without a copy, as a context manager whose block gets a
        read-only memoryview (None as ``receive``); leaving the block raises
        :class:`msgq.MessageOverwritten` when the message may have changed meanwhile."""

    @abstractmethod
    def has_data(self) -> bool:
        """Whether a ``receive(non_blocking=True)`` now would return a message."""

    @property
    @abstractmethod
    def endpoint(self) -> Any:
        """The endpoint this socket is connected to (None before ``connect``)."""

    @property
    @abstractmethod
    def conflate(self) -> bool:
        """True when only the newest message is kept."""

    @abstractmethod
    def close(self) -> None: ...


class Poller(metaclass=ABCMeta):
    """Waits on many SubSockets of one backend."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Poller:
            return _with_fake_events(select_backend().Poller(*args, **kwargs))
        return super().__new__(cls)

    @abstractmethod
    def registerSocket(self, socket: Any) -> None: ...  # noqa: N802 (upstream name)

    @abstractmethod
    def poll(self, timeout: int) -> list[Any]:
        """The registered sockets with a message waiting, after at most ``timeout``
        milliseconds (negative or None: no limit); empty on timeout."""

    @abstractmethod
    async def poll_async(self, timeout: int | None = None) -> list[Any]:
        """``await poller.poll_async(timeout)``: ``poll`` for a task, which sleeps
        meanwhile (``timeout`` in milliseconds; None or negative: no limit)."""


# --- fake events ---------------------------------------------------------------------


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

    async def receive_async(self) -> bytes | None:
        """Passes the gate (awaiting ``recv_ready``), then awaits the backend's receive."""
        if self._gate is not None:
            await self._gate.pass_gate_async()
        return await self.sock.receive_async()

    def __aiter__(self) -> FakeSubSocket:
        return self

    async def __anext__(self) -> bytes:
        """``async for msg in sub``: every message, each behind the gate."""
        return await next_message(self, lambda: True)

    def receive_view(self, non_blocking: bool = False) -> Any:
        """Passes the gate, then gives the backend's view of the next message."""
        if self._gate is not None:
            self._gate.pass_gate()
        return self.sock.receive_view(non_blocking)

    def has_data(self) -> bool:
        """Whether the backend socket has a message waiting (the gate is not passed)."""
        return bool(self.sock.has_data())

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
        # Backend extras (segment_size, resets, ...) pass through unchanged.
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

    async def poll_async(self, timeout: int | None = None) -> list[Any]:
        """``poll`` for a task: enabled sockets at once, else the backend's poll_async."""
        if any(isinstance(s, FakeSubSocket) and s.gate_enabled for s in self._sockets):
            return self.poll(0)
        ready = await self.poller.poll_async(timeout)
        ready_ids = {id(s) for s in ready}
        return [s for s in self._sockets
                if id(s.sock if isinstance(s, FakeSubSocket) else s) in ready_ids]


SubSocket.register(FakeSubSocket)
Poller.register(FakePoller)
