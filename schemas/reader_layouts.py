"""Layouts for the typed reader (:mod:`msgq.schemas._typed_reader`): where each field of
a Cap'n Proto struct lies in the encoded message and what its declared default is, built
once from the schema (pycapnp's schema objects).

A field layout is ``(kind, where, default, extra)``: ``kind`` one of the reader's ``K_``
constants, ``where`` the field's offset (in units of its own size in the data section) or
its pointer index, ``default`` the bits of the declared default (Cap'n Proto stores a value
XOR its default), ``extra`` the enum's ``{number: name}``, a list's element layout or a
struct's layout. Spark's type mapping (:mod:`msgq.spark.capnp_types`) builds its column
layouts with these pieces.

Layer: the Event layer.
"""

from __future__ import annotations

import struct
from typing import Any

from msgq.schemas import _typed_reader as reader

__all__ = ["BITS", "KINDS", "NO_DISCRIMINANT", "Layout", "field_layout", "view_member_layout",
           "view_struct_layout"]

Layout = tuple[Any, ...]

#: The reader's kind of each primitive capnp type (pycapnp's ``Type.which()`` names).
KINDS: dict[str, int] = {
    "bool": reader.K_BOOL,
    "int8": reader.K_INT8,
    "int16": reader.K_INT16,
    "int32": reader.K_INT32,
    "int64": reader.K_INT64,
    "uint8": reader.K_UINT8,
    "uint16": reader.K_UINT16,
    "uint32": reader.K_UINT32,
    "uint64": reader.K_UINT64,
    "float32": reader.K_FLOAT32,
    "float64": reader.K_FLOAT64,
    "text": reader.K_TEXT,
    "data": reader.K_DATA,
}
#: Width in bits of the integer types and enums (the mask of their default's bits).
BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint16": 16,
        "uint32": 32, "uint64": 64, "enum": 16}


def field_layout(slot: Any, layout: Layout) -> Layout | None:
    """``layout`` (a type's, ``(kind, 0, 0, extra)``) placed at the field ``slot``:
    ``(kind, offset or pointer index, default bits, extra)``; None for a pointer field
    with an explicit default (the reader does not follow those)."""
    kind, _, _, extra = layout
    name = slot.type.which()
    if name in ("text", "data", "list", "struct"):
        return None if slot.hadExplicitDefault else (kind, slot.offset, 0, extra)
    value = getattr(slot.defaultValue, name)
    if name == "enum" or name in BITS:
        default = int(value) & ((1 << BITS[name]) - 1)
    elif name == "float32":
        default = struct.unpack("<I", struct.pack("<f", value))[0]
    elif name == "float64":
        default = struct.unpack("<Q", struct.pack("<d", value))[0]
    else:  # bool
        default = int(bool(value))
    return (kind, slot.offset, default, extra)


def view_struct_layout(schema: Any, memo: dict[int, Layout | None] | None = None,
                       stack: tuple[int, ...] = ()) -> Layout:
    """A struct's layout for the reader's views: ``(fields, None, names)``, the non-union
    fields a view reads itself (union members, Void, AnyPointer, interfaces, pointers
    with explicit defaults and recursion are left to pycapnp; so are lists of lists of
    structs, by the reader)."""
    memo = {} if memo is None else memo
    stack = (*stack, schema.node.id)
    names: list[str] = []
    fields: list[Layout] = []
    for field in schema.fields_list:
        proto = field.proto
        if proto.discriminantValue != NO_DISCRIMINANT:
            continue
        layout = _view_field_layout(field, memo, stack)
        if layout is not None:
            names.append(proto.name)
            fields.append(layout)
    return (tuple(fields), None, tuple(names))


#: ``discriminantValue`` of a field outside any union.
NO_DISCRIMINANT = 0xFFFF


def _view_field_layout(field: Any, memo: dict[int, Layout | None],
                       stack: tuple[int, ...]) -> Layout | None:
    proto = field.proto
    if proto.which() == "group":
        return (reader.K_GROUP, 0, 0, view_struct_layout(field.schema, memo, stack))
    slot = proto.slot
    kind = slot.type.which()
    schema = field.schema if kind in ("struct", "enum", "list") else None
    layout = _view_type_layout(slot.type, schema, memo, stack)
    return None if layout is None else field_layout(slot, layout)


def _view_type_layout(type_proto: Any, schema: Any, memo: dict[int, Layout | None],
                      stack: tuple[int, ...]) -> Layout | None:
    kind = type_proto.which()
    if kind in KINDS:
        return (KINDS[kind], 0, 0, None)
    if kind == "enum":
        return (reader.K_ENUM, 0, 0,
                {value: name for name, value in schema.enumerants.items()})
    if kind == "struct":
        node_id = schema.node.id
        if node_id in stack:
            return None  # recursion: pycapnp reads it
        if node_id not in memo:
            memo[node_id] = view_struct_layout(schema, memo, stack)
        return (reader.K_STRUCT, 0, 0, memo[node_id])
    if kind == "list":
        element_type = type_proto.list.elementType
        element_schema = schema.elementType \
            if element_type.which() in ("enum", "list", "struct") else None
        element = _view_type_layout(element_type, element_schema, memo, stack)
        return None if element is None else (reader.K_LIST, 0, 0, element)
    return None  # void, anyPointer, interface


def view_member_layout(root_schema: Any, member: str,
                       memo: dict[int, Layout | None] | None = None) -> Layout | None:
    """``(discriminant offset, discriminant, field layout)`` of a struct or list-of-structs
    member of the root union for :func:`msgq.schemas._typed_reader.view_member`; None for
    other members (lists of numbers, text, data: pycapnp reads them)."""
    field = root_schema.fields[member]
    proto = field.proto
    if proto.which() != "slot":
        return None
    kind = proto.slot.type.which()
    if kind == "list" and proto.slot.type.list.elementType.which() != "struct":
        return None
    if kind not in ("struct", "list"):
        return None
    layout = _view_field_layout(field, {} if memo is None else memo, (root_schema.node.id,))
    if layout is None:
        return None
    return (root_schema.node.struct.discriminantOffset, proto.discriminantValue, layout)
