"""PubMaster: one publisher per service, sending Event builders or their bytes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgq
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.events import sendable_bytes

__all__ = ["PubMaster"]


class PubMaster:
    """Publishes the services named in ``services`` (of ``schema``, default: the schema in
    force).

    Each service gets a publisher socket sized from the registry. Unknown service names
    raise KeyError with close matches.
    """

    def __init__(self, services: Iterable[str], schema: Schema | None = None) -> None:
        self.schema = schema_in_force(schema)
        self.sock: dict[str, Any] = {}
        # a pycapnp builder of this Event has its service read from its bytes (see send)
        self._event = self.schema.event.schema
        try:
            self._identify: Any = self.schema.views.identify
        except ValueError:  # a root struct whose fields the layout does not read
            self._identify = None
        for service in services:
            self.schema.services[service]  # KeyError naming close matches
            if service not in self.sock:
                self.sock[service] = msgq.pub_sock(
                    service, segment_size=self.schema.services[service].queue_size)

    def _socket(self, service: str) -> Any:
        try:
            return self.sock[service]
        except KeyError:
            self.schema.services[service]  # unknown everywhere: KeyError with suggestions
            raise KeyError(f"service {service!r} is not published by this PubMaster "
                           f"(it has {sorted(self.sock)})") from None

    def send(self, service: str, dat: Any) -> None:
        """Sends ``dat`` on ``service``: an Event builder (its union must be ``service``,
        else ValueError) or the bytes of one (sent as they are)."""
        sock = self.sock.get(service)
        if sock is None:
            sock = self._socket(service)
        if isinstance(dat, (bytes, bytearray, memoryview)):
            sock.send(dat)
            return
        # what it sends comes from the builder alone: msgq's answers which() and
        # to_bytes() in one call, pycapnp's of this Event from its bytes, any other
        # through which() (see sendable_bytes)
        sock.send(sendable_bytes(dat, service, self._event, self._identify))

    def all_readers_updated(self, service: str) -> bool:
        """Whether every subscriber of ``service`` has read everything sent on it."""
        return bool(self._socket(service).all_readers_updated())

    def wait_for_readers_to_update(self, service: str, timeout: float,
                                   dt: float = 0.05) -> bool:
        """Waits up to ``timeout`` seconds (checking every ``dt``) until every subscriber
        of ``service`` is up to date; returns whether they are."""
        return bool(self._socket(service).wait_until_read(timeout, poll_interval=dt))

    def close(self) -> None:
        """Closes every publisher socket."""
        for sock in self.sock.values():
            sock.close()
        self.sock.clear()
