"""The server's side of the handshake: one thread, one poll loop, no blocking calls.

The loop is C (``src/vipc_listener.c``, bound as ``_listener.Listener``), the same code a
C server (``visionipc.h``) runs.

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

from dataclasses import dataclass

from ._listener import Listener
from .buffer import BufferGeometry

__all__ = ["Listener", "StreamExport"]


@dataclass(frozen=True)
class StreamExport:
    """What the listener hands out for a stream: its geometry and its buffers' fds (the
    server's: they stay open until the listener is closed)."""

    geometry: BufferGeometry
    fds: tuple[int, ...]
