"""The socket protocol every backend implements, as abstract classes.

``msgq.PubSocket()`` (and the other three) construct the class of the backend chosen by
:func:`msgq.backend.select_backend` at that moment; the backend classes are registered as
virtual subclasses, so ``isinstance(sock, msgq.SubSocket)`` holds for every backend while
calls go straight to the backend's own (Cython or Python) methods with no wrapper.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from types import ModuleType
from typing import Any


class Context(metaclass=ABCMeta):
    """A backend's process-wide state (a zmq.Context for ZMQ; nothing for msgq)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Context:
            from msgq.backend import select_backend

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
        from msgq.backend import loaded_backends

        for module in loaded_backends():
            default = getattr(module, "default_context", None)
            if default is not None:
                default.term()


class PubSocket(metaclass=ABCMeta):
    """The publisher of one endpoint."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is PubSocket:
            from msgq.backend import select_backend

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

    @abstractmethod
    def close(self) -> None: ...


class SubSocket(metaclass=ABCMeta):
    """One subscriber of an endpoint."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is SubSocket:
            from msgq.backend import select_backend, with_fake_events

            return with_fake_events(select_backend().SubSocket(*args, **kwargs))
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
    def close(self) -> None: ...


class Poller(metaclass=ABCMeta):
    """Waits on many SubSockets of one backend."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Poller:
            from msgq.backend import select_backend, with_fake_events

            return with_fake_events(select_backend().Poller(*args, **kwargs))
        return super().__new__(cls)

    @abstractmethod
    def registerSocket(self, socket: Any) -> None: ...  # noqa: N802 (upstream name)

    @abstractmethod
    def poll(self, timeout: int) -> list[Any]:
        """The registered sockets with a message waiting, after at most ``timeout``
        milliseconds (negative or None: no limit); empty on timeout."""


def register_backend(module: ModuleType) -> None:
    """Registers a backend module's classes as implementations of the protocol."""
    Context.register(module.Context)
    PubSocket.register(module.PubSocket)
    SubSocket.register(module.SubSocket)
    Poller.register(module.Poller)
