"""Typing stub of the extension ``msgq.schemas._typed_reader`` (schemas/_typed_reader.pyx):
fields read straight from Cap'n Proto bytes, pycapnp the fallback: Spark's typed columns
(read_member) and SubMaster's payload views (view_member)."""

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

class EnumValue:
    """An enum value as a view reads it, behaving as pycapnp's ``_DynamicEnum``."""

    @property
    def raw(self) -> int:
        """The enumerant's number."""

    def _as_str(self) -> str: ...

class StructView:
    """A struct of a message, read field by field from its bytes; anything else is asked
    of a pycapnp reader of the same struct."""

    def __getattr__(self, name: str) -> Any: ...

class StructListView:
    """A list of structs of a message, as pycapnp's list reader behaves (len, [i],
    iteration; elements are StructViews); anything else is asked of pycapnp's."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> StructView: ...
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

# -- the Event builder (_event_builder.pxi) ---------------------------------------------

BUILD_NO_DISCRIMINANT: int

class BuildLayout:
    """Where a struct's fields lie, for the builder (builder_layouts.py makes them)."""

    data_words: int
    ptr_count: int
    disc_offset: int
    fields: dict[str, BuildField]
    members: dict[int, str]

    def __init__(self, data_words: int, ptr_count: int, disc_offset: int) -> None: ...

class BuildField:
    """One field of a BuildLayout: kind, offset, default bits, discriminant, and the
    struct's layout (made on first use from ``schema``) or the enum's names."""

    kind: int
    where: int
    default: int
    disc: int
    sub: Any
    schema: Any

    def __init__(self, kind: int, where: int, default: int, disc: int, sub: Any = None,
                 schema: Any = None) -> None: ...

def set_layout_maker(maker: Callable[[Any], BuildLayout]) -> None:
    """The function that makes a struct's BuildLayout from its pycapnp schema."""

class StructBuilder:
    """A struct of a message being built: pycapnp's builder API; what it does not write
    itself it hands over to a pycapnp builder of the same bytes."""

    @property
    def handed_over(self) -> bool: ...
    def init(self, name: str, *args: Any) -> Any: ...
    def which(self) -> str: ...
    def to_bytes(self) -> bytes: ...
    def __getattr__(self, name: str) -> Any: ...
    def __setattr__(self, name: str, value: Any) -> None: ...

class EventFactory:
    """new_message's builder for one schema's Event."""

    members: frozenset[str]

    def __init__(self, layout: BuildLayout, handover: Callable[[bytes], Any]) -> None: ...
    def new(self, service: str | None, mono_ns: int) -> StructBuilder: ...

def new_root(layout: BuildLayout, handover: Callable[[bytes], Any]) -> StructBuilder:
    """An empty root struct of ``layout`` in a new message."""

def built_bytes(msg: StructBuilder, service: str) -> bytes | None:
    """The bytes of a root builder carrying ``service``; None otherwise."""
