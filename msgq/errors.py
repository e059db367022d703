"""The exceptions every layer shares: socket failures and undecodable messages.

Layer: the bottom; imports nothing.
"""


class IpcError(Exception):
    """A system-level failure of a socket: the endpoint and the OS reason are in the message."""


class MessageOverwritten(IpcError):  # noqa: N818 (reads as what happened, like StopIteration)
    """The publisher may have overwritten a message while a reader used it in place
    (``SubSocket.receive_view``): what was read from it may be torn and must be
    discarded."""


class MultiplePublishersError(IpcError):
    """Another publisher took over the endpoint; this publisher may no longer send."""


def readers_timeout(endpoint: object, timeout: float, readers: int) -> TimeoutError:
    """The TimeoutError of ``PubSocket.wait_for_readers`` after ``timeout`` seconds (every
    backend words it so)."""
    if readers == 0:
        return TimeoutError(f"endpoint {endpoint!r}: subscriber did not connect within "
                            f"{timeout:g} s")
    return TimeoutError(f"endpoint {endpoint!r}: {readers} subscriber(s) connected but not "
                        f"every one read everything within {timeout:g} s")


class MessageDecodeError(ValueError):
    """Bytes that are not a valid Event (what pycapnp reported is in the message)."""
