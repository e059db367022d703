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

__all__ = ["BITS", "KINDS", "Layout", "field_layout"]

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
