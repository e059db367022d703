"""Who may talk to whom: peer credentials of a Unix socket and the uid policies.

A server serves a connecting process only when the process's uid (from ``SO_PEERCRED``,
which the kernel fills in; a peer cannot forge it) is in the server's allowed set:

* ``VisionIpcServer(name, allowed_uids=...)``: an iterable of uids, or ``"any"``;
* else the environment variable ``MSGQ_VISIONIPC_ALLOW_UIDS``: a comma-separated list of
  uids (``"1000,1001"``) or ``*`` / ``any``;
* else only the server's own effective uid.

A client, in turn, trusts a server that runs as its own uid, as root, or as a uid listed
in ``MSGQ_VISIONIPC_ALLOW_UIDS`` (``*`` / ``any``: every uid); both checks are the C
library's (``src/vipc_listener.c``, ``src/vipc_client.c``), this module gives the server's
policy to it.

The socket file itself is created with the mode of msgq's queue files (``MSGQ_SHM_MODE``,
default 0600) inside the namespace folder, so a process of another uid also needs that
mode (and the folder's) to reach the socket at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ALLOW_UIDS_ENV",
    "PeerCredentials",
    "PeerPolicy",
]

ALLOW_UIDS_ENV = "MSGQ_VISIONIPC_ALLOW_UIDS"
_ANY = ("*", "any")


@dataclass(frozen=True)
class PeerCredentials:
    """The process at the other end of a Unix socket, as the kernel reports it."""

    pid: int
    uid: int
    gid: int


def _parse_uid(text: str) -> int:
    try:
        uid = int(text, 10)
    except ValueError:
        uid = -1
    if not 0 <= uid < 2**32:
        raise ValueError(
            f"{ALLOW_UIDS_ENV}: {text!r} is not a uid; write uids separated by commas "
            "(e.g. 1000,1001), or * for any uid"
        )
    return uid


class PeerPolicy:
    """The set of uids a server serves (or every uid)."""

    def __init__(self, uids: Iterable[int] = (), any_uid: bool = False) -> None:
        checked = set()
        for uid in uids:
            if isinstance(uid, bool) or not isinstance(uid, int) or not 0 <= uid < 2**32:
                raise ValueError(f"allowed uid {uid!r} is not a uid (an int 0 .. 2**32-1)")
            checked.add(uid)
        self.uids = frozenset(checked)
        self.any_uid = any_uid

    @classmethod
    def parse(cls, text: str) -> PeerPolicy:
        """The policy written as in ``MSGQ_VISIONIPC_ALLOW_UIDS``; ValueError if malformed."""
        text = text.strip()
        if text.lower() in _ANY:
            return cls(any_uid=True)
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise ValueError(f"{ALLOW_UIDS_ENV} is empty; unset it or list uids")
        return cls(_parse_uid(p) for p in parts)

    @classmethod
    def for_server(cls, allowed_uids: Iterable[int] | str | None = None) -> PeerPolicy:
        """The policy of a server: ``allowed_uids`` when given (``"any"``/``"*"`` for
        every uid), else the environment's, else the server's own effective uid."""
        if isinstance(allowed_uids, str):
            return cls.parse(allowed_uids)
        if allowed_uids is not None:
            return cls(allowed_uids)
        text = os.environ.get(ALLOW_UIDS_ENV, "")
        if text.strip():
            return cls.parse(text)
        return cls((os.geteuid(),))

    def allows(self, peer: PeerCredentials) -> bool:
        """True when ``peer`` may be served."""
        return self.any_uid or peer.uid in self.uids

    def describe(self) -> str:
        """The policy in words, for messages."""
        if self.any_uid:
            return "any uid"
        return "uid " + ", ".join(str(u) for u in sorted(self.uids))

    def __repr__(self) -> str:
        return f"PeerPolicy({self.describe()})"
