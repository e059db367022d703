"""Layouts for the Event builder (:class:`msgq.schemas._event_builder.StructBuilder`, what
:func:`msgq.schemas.new_message` returns): where each field of a struct lies and what
its declared default is, from the schema (pycapnp's schema objects), made for a struct
when the builder first reaches it.

The builder writes itself only what has a layout here: numbers, bools, enums, void,
structs (without an explicit default) and groups; anything else goes to pycapnp.

Layer: the Event layer.
"""

from __future__ import annotations

from typing import Any

from msgq.schemas import _event_builder as native
from msgq.schemas.reader_layouts import KINDS, NO_DISCRIMINANT, field_layout

__all__ = ["build_layout"]

#: The pycapnp types the builder stores itself (text and data: pycapnp).
_PRIMITIVES = frozenset(KINDS) - {"text", "data"}


def build_layout(schema: Any) -> native.BuildLayout:
    """The builder's layout of the struct (or group) ``schema``."""
    node = schema.node.struct
    disc_offset = node.discriminantOffset if node.discriminantCount else -1
    layout = native.BuildLayout(node.dataWordCount, node.pointerCount, disc_offset)
    for field in schema.fields_list:
        proto = field.proto
        name = proto.name
        disc = proto.discriminantValue
        disc = native.BUILD_NO_DISCRIMINANT if disc == NO_DISCRIMINANT else disc
        if disc != native.BUILD_NO_DISCRIMINANT:
            layout.members[disc] = name
        built = _field(field, disc)
        if built is not None:
            layout.fields[name] = built
    return layout


def _field(field: Any, disc: int) -> native.BuildField | None:
    proto = field.proto
    if proto.which() == "group":
        return native.BuildField(native.K_GROUP, 0, 0, disc, None, field.schema)
    slot = proto.slot
    kind = slot.type.which()
    if kind == "void":
        return native.BuildField(native.K_VOID, 0, 0, disc)
    if kind == "struct":
        if slot.hadExplicitDefault:
            return None
        return native.BuildField(native.K_STRUCT, slot.offset, 0, disc, None, field.schema)
    if kind == "enum":
        _, where, default, _ = field_layout(slot, (native.K_ENUM, 0, 0, None))
        return native.BuildField(native.K_ENUM, where, default, disc,
                                 dict(field.schema.enumerants))
    if kind in _PRIMITIVES:
        _, where, default, _ = field_layout(slot, (KINDS[kind], 0, 0, None))
        return native.BuildField(KINDS[kind], where, default, disc)
    return None  # text, data, lists, AnyPointer, interfaces: pycapnp


native.set_layout_maker(build_layout)
