"""Naming helpers shared by the backends: the namespace prefix and the name hash."""

from __future__ import annotations

__all__ = ["fnv1a_64", "namespace_prefix"]

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def fnv1a_64(data: bytes) -> int:
    """The 64-bit FNV-1a hash of ``data`` (stable across runs, machines and languages)."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def namespace_prefix() -> str:
    """The namespace prefix of this process as the shared-memory core reads it
    (``MSGQ_PREFIX``, else ``OPENPILOT_PREFIX``, else ``""``). ValueError when it is not a
    valid name."""
    from msgq.shm_backend import namespace_prefix as core_prefix
    from msgq.shm_backend import validate_endpoint

    prefix = core_prefix()
    if prefix:
        try:
            validate_endpoint(prefix)
        except ValueError:
            raise ValueError(
                f"prefix {prefix!r} (MSGQ_PREFIX/OPENPILOT_PREFIX) is not a valid name: use "
                "1-100 characters from A-Z a-z 0-9 _ - .") from None
    return prefix
