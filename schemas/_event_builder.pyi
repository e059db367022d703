"""Typing stub of the extension ``msgq.schemas._event_builder``
(schemas/_event_builder.pyx): the Event builder that new_message returns, writing the
common calls straight into the message's bytes and handing over to pycapnp for the
rest."""

from collections.abc import Callable
from typing import Any

BUILD_NO_DISCRIMINANT: int
K_STRUCT: int
K_GROUP: int
K_ENUM: int
K_VOID: int

class StaleBuilderError(RuntimeError):
    """A struct builder used after its message handed over to pycapnp, when its struct
    was no longer in the message at that moment."""

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
    def as_pycapnp(self) -> Any:
        """pycapnp's builder of this struct (the message hands over)."""
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
