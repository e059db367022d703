"""Typing stub of the extension ``msgq.schemas._typed_reader`` (schemas/_typed_reader.pyx):
fields read straight from Cap'n Proto bytes, pycapnp the fallback: Spark's typed columns
(read_member, read_member_arrow) and SubMaster's payload views (view_member)."""

from collections.abc import Callable
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
K_VOID: int

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

def read_member_arrow(buffer: Any, starts: Any, lengths: Any, member: CompiledMember,
                      arrow_type: Any) -> tuple[Any, list[int]]:
    """The member's values in the messages at ``starts``/``lengths`` of ``buffer`` as one
    Arrow array of ``arrow_type`` (what ``pa.array`` makes of read_member's values), and
    the positions of the messages left out of it (read_member's FALLBACK ones)."""

class MemberColumn:
    """One Arrow array of a member's values read from the messages of many buffers (one
    :meth:`add` each), made once by :meth:`finish`."""

    def __init__(self, member: CompiledMember, arrow_type: Any) -> None: ...
    @property
    def count(self) -> int:
        """The messages added so far."""
    def add(self, buffer: Any, starts: Any, lengths: Any) -> list[int]:
        """Reads the messages at ``starts``/``lengths`` of ``buffer``; returns the
        positions (over every message added) of those of them left out."""
    def finish(self) -> tuple[Any, list[int]]:
        """(the array of every value read, the positions, over every message added, of
        the messages left out of it); once."""

class EnumValue:
    """An enum value as a view reads it, behaving as pycapnp's ``_DynamicEnum``."""

    @property
    def raw(self) -> int:
        """The enumerant's number."""

    def _as_str(self) -> str: ...

class StructView:
    """A struct of a message, read field by field from its bytes; anything else is asked
    of a pycapnp reader of the same struct."""

    def as_pycapnp(self) -> Any:
        """pycapnp's reader of the same struct."""
    def __getattr__(self, name: str) -> Any: ...

class StructListView:
    """A list of structs of a message, as pycapnp's list reader behaves (len, [i],
    iteration; elements are StructViews); anything else is asked of pycapnp's."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> StructView: ...
    def as_pycapnp(self) -> Any:
        """pycapnp's reader of the same list."""
    def __getattr__(self, name: str) -> Any: ...

class EventFields:
    """Where the root struct keeps logMonoTime, valid and the union discriminant."""

    def __init__(self, mono_byte: int, valid_byte: int, valid_bit: int,
                 discriminant_byte: int, services: tuple[str, ...], mono_default: int,
                 valid_default: bool) -> None: ...

def view_member(message: bytes, member: CompiledMember,
                decode: Callable[[], Any] | Callable[[bytes], Any],
                decode_takes_message: bool = False) -> StructView | StructListView | object:
    """A view of the root union's struct (or list of structs) ``member`` in ``message``,
    or FALLBACK; ``decode()`` (``decode(message)`` with ``decode_takes_message``) gives
    the member's pycapnp reader."""

def identify(message: bytes, fields: EventFields) -> tuple[int, bool, str] | object:
    """``(logMonoTime, valid, service)`` of a one-segment Event, or FALLBACK."""
