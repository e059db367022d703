"""Exceptions shared by every backend."""


class IpcError(Exception):
    """A system-level failure of a socket: the endpoint and the OS reason are in the message."""


class MultiplePublishersError(IpcError):
    """Another publisher took over the endpoint; this publisher may no longer send."""
