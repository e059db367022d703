"""Typing stub of the extension ``msgq.schemas._typed_reader`` (schemas/_typed_reader.pyx):
typed Spark columns read straight from Cap'n Proto bytes, pycapnp the fallback."""

from typing import Any

K_BOOL: int
K_INT8: int
K_INT16: int
K_INT32: int
K_INT64: int
K_UINT8: int
K_UINT16: int
K_UINT32: int
K_UINT64: int
K_FLOAT32: int
K_FLOAT64: int
K_TEXT: int
K_DATA: int
K_ENUM: int
K_LIST: int
K_STRUCT: int
K_GROUP: int

#: What read_member returns for a message it leaves to pycapnp.
FALLBACK: object

class CompiledMember:
    """A union member of the root struct, ready for :func:`read_member`."""

def compile_member(member: tuple[int, int, tuple[Any, ...]]) -> CompiledMember:
    """``(discriminant_offset, discriminant, field layout)`` (capnp_types.member_plan)
    compiled for :func:`read_member`."""

def read_member(message: bytes | bytearray | memoryview, member: CompiledMember) -> Any:
    """The converted value of the member in ``message`` (one framed message), or
    FALLBACK when pycapnp should read it."""
