"""Cap'n Proto schema → Spark types, and Cap'n Proto readers → values of those types.

One plan per capnp type holds both halves, so the Spark schema a DataFrame declares and
the values the executors produce can never disagree. The rules (docs/spark.md):

=====================  =====================================================
capnp                  Spark
=====================  =====================================================
Bool                   BooleanType
Int8/16/32/64          ByteType / ShortType / IntegerType / LongType
UInt8/16/32            ShortType / IntegerType / LongType (widened: no loss)
UInt64                 DecimalType(20, 0) (every value exact)
Float32 / Float64      FloatType / DoubleType
Text / Data            StringType / BinaryType
enum                   StringType: the enumerant's name (the number, as text,
                       for a value this schema does not know)
List(T)                ArrayType(T)
struct, group          StructType of its fields, in declaration order
union (anonymous)      a ``which`` string field (the active member), then one
                       field per member: null unless it is the active one
named union            a struct of ``which`` + its members, as above
Void, AnyPointer,      no field (a Void union member shows in ``which``)
interface
a struct inside itself StringType: the capnp text form of that value
(recursion)
=====================  =====================================================

Unset pointer fields read as capnp defines them (empty text, list or data, a struct of
defaults), as pycapnp and the LogReader give them. If a struct has a field named
``which`` the discriminator is called ``_which``.

Everything here runs where the data is read (Spark executors); nothing in a plan is
shipped between processes: executors build plans from the schema file themselves.

A plan also carries a layout: where each value lies in the encoded message, for the typed
reader (``msgq.schemas._typed_reader``, shared with SubMaster), which reads the values
straight from a message's bytes (several times faster than pycapnp's attribute access)
and hands back to the pycapnp converter any
message it does not follow. A type it cannot read at all (recursion, a pointer field with
an explicit default) has no layout, and neither has anything containing it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from msgq.schemas import _typed_reader as reader
from msgq.schemas.reader_layouts import KINDS, Layout, field_layout

__all__ = ["TypePlan", "member_plan", "struct_plan"]

Converter = Callable[[Any], Any]

_PRIMITIVES: dict[str, DataType] = {
    "bool": BooleanType(),
    "int8": ByteType(),
    "int16": ShortType(),
    "int32": IntegerType(),
    "int64": LongType(),
    "uint8": ShortType(),
    "uint16": IntegerType(),
    "uint32": LongType(),
    "uint64": DecimalType(20, 0),
    "float32": FloatType(),
    "float64": DoubleType(),
    "text": StringType(),
    "data": BinaryType(),
}
_OMITTED = frozenset({"void", "anyPointer", "interface"})



@dataclass(frozen=True)
class TypePlan:
    """The Spark type of one capnp type and how to turn a pycapnp value of it into a
    value Arrow/Spark take for that type (None: the pycapnp value already is one).
    ``layout``: the type for the typed reader — ``(kind, 0, 0, extra)``, the shape of a
    list element; a field places it (:func:`msgq.schemas.reader_layouts.field_layout`) —
    or None."""

    spark_type: DataType
    convert: Converter | None
    layout: Layout | None = None


def _enum_plan(enum_schema: Any) -> TypePlan:
    names = {value: name for name, value in enum_schema.enumerants.items()}

    def convert(value: Any) -> str:
        raw = value.raw
        name = names.get(raw)
        return name if name is not None else str(raw)

    return TypePlan(StringType(), convert, (reader.K_ENUM, 0, 0, names))


def _list_plan(element_type: Any, list_schema: Any, stack: tuple[int, ...]) -> TypePlan | None:
    kind = element_type.which()
    if kind in _OMITTED:
        return None
    if kind in _PRIMITIVES:
        return TypePlan(ArrayType(_PRIMITIVES[kind]), list,
                        (reader.K_LIST, 0, 0, (KINDS[kind], 0, 0, None)))
    element = _type_plan(element_type, list_schema.elementType, stack)
    if element is None:
        return None
    layout = None if element.layout is None else (reader.K_LIST, 0, 0, element.layout)
    convert = element.convert
    if convert is None:
        return TypePlan(ArrayType(element.spark_type), list, layout)

    def convert_list(values: Any) -> list[Any]:
        return [convert(v) for v in values]

    return TypePlan(ArrayType(element.spark_type), convert_list, layout)


def _type_plan(type_proto: Any, schema: Any, stack: tuple[int, ...]) -> TypePlan | None:
    """Plan of a slot's type (``type_proto``: the schema's Type; ``schema``: pycapnp's
    schema object of that type when it has one: struct, enum, list)."""
    kind = type_proto.which()
    if kind in _OMITTED:
        return None
    if kind in _PRIMITIVES:
        return TypePlan(_PRIMITIVES[kind], None, (KINDS[kind], 0, 0, None))
    if kind == "enum":
        return _enum_plan(schema)
    if kind == "list":
        return _list_plan(type_proto.list.elementType, schema, stack)
    if kind == "struct":
        return struct_plan(schema, stack)
    raise ValueError(f"unsupported Cap'n Proto type {kind!r}")


def _field_plan(field: Any, stack: tuple[int, ...]) -> TypePlan | None:
    """The plan of a field, its layout placed where the field lies in its struct."""
    proto = field.proto
    if proto.which() == "group":
        plan = struct_plan(field.schema, stack)
        layout = None if plan.layout is None else (reader.K_GROUP, 0, 0, plan.layout[3])
        return TypePlan(plan.spark_type, plan.convert, layout)
    type_proto = proto.slot.type
    needs_schema = type_proto.which() in ("struct", "enum", "list")
    plan = _type_plan(type_proto, field.schema if needs_schema else None, stack)
    if plan is None or plan.layout is None:
        return plan
    return TypePlan(plan.spark_type, plan.convert, field_layout(proto.slot, plan.layout))


def _text_form(value: Any) -> str:
    return str(value)


def struct_plan(schema: Any, stack: tuple[int, ...] = ()) -> TypePlan:
    """The plan of a struct (or group) type: a StructType and a converter from a struct
    reader to a tuple in the StructType's field order."""
    node_id = schema.node.id
    if node_id in stack:  # recursion: Spark types are finite
        return TypePlan(StringType(), _text_form)  # no layout: pycapnp's text form
    stack = (*stack, node_id)

    plain: list[tuple[Any, Converter | None]] = []
    members: list[tuple[str, Any, Converter | None]] = []
    fields: list[StructField] = []
    member_fields: list[StructField] = []
    union_names = set(schema.union_fields)
    layouts: list[Layout | None] = []  # every planned field's, to see that all have one
    plain_layouts: list[Layout | None] = []
    by_discriminant: dict[int, tuple[str, int, Layout | None]] = {}
    for field in schema.fields_list:
        name = field.proto.name
        plan = _field_plan(field, stack)
        if name in union_names:
            # Void members have no column but remain a possible `which` value.
            at = -1
            if plan is not None:
                at = len(members)
                members.append((name, field, plan.convert))
                member_fields.append(StructField(name, plan.spark_type, True))
                layouts.append(plan.layout)
            by_discriminant[field.proto.discriminantValue] = \
                (name, at, None if plan is None else plan.layout)
        elif plan is not None:
            plain.append((field, plan.convert))
            fields.append(StructField(name, plan.spark_type, True))
            layouts.append(plan.layout)
            plain_layouts.append(plan.layout)
    has_union = bool(union_names)
    if has_union:
        which_name = "_which" if "which" in schema.fieldnames else "which"
        fields.append(StructField(which_name, StringType(), True))
        fields += member_fields
    layout = None
    if all(item is not None for item in layouts):
        union = (schema.node.struct.discriminantOffset, by_discriminant, len(members)) \
            if has_union else None
        layout = (reader.K_STRUCT, 0, 0, (tuple(plain_layouts), union))

    return TypePlan(StructType(fields), _struct_converter(plain, members if has_union else None),
                    layout)


def _struct_converter(plain: list[tuple[Any, Converter | None]],
                      members: list[tuple[str, Any, Converter | None]] | None) -> Converter:
    """A converter from a struct reader to the tuple of its fields: ``plain`` (field,
    converter) in order, then, for a struct with a union (``members`` not None), the
    active member's name and one value per member (None unless active).

    The function is generated for the struct, one expression per field
    (``get(f3)``, ``c3(get(f3))``), so that a struct costs one Python call and a tuple,
    with no loop over a field list per value: typed columns are built from millions of
    them."""
    namespace: dict[str, Any] = {}
    values = []
    for i, (field, convert) in enumerate(plain):
        namespace[f"f{i}"] = field
        if convert is None:
            values.append(f"get(f{i})")
        else:
            namespace[f"c{i}"] = convert
            values.append(f"c{i}(get(f{i}))")
    lines = ["def convert(reader):", "    get = reader._get_by_field"]
    if members is None:
        lines.append(f"    return ({''.join(v + ', ' for v in values)})")
    else:
        # the active member's value among Nones, by its name: one dict lookup
        count = len(members)
        index = {name: i for i, (name, _, _) in enumerate(members)}
        namespace["member_of"] = {name: (index[name], field, convert)
                                  for name, field, convert in members}
        namespace["no_member"] = (None,) * count
        lines += [
            "    which = reader._which_str()",
            "    member = member_of.get(which)",
            "    if member is None:",
            f"        return ({''.join(v + ', ' for v in values)}which, *no_member)",
            "    at, field, convert = member",
            "    value = get(field) if convert is None else convert(get(field))",
            f"    return ({''.join(v + ', ' for v in values)}which, "
            "*no_member[:at], value, *no_member[at + 1:])",
        ]
    exec("\n".join(lines), namespace)  # noqa: S102 - generated from the schema's fields
    converter: Converter = namespace["convert"]
    return converter


def member_plan(root_schema: Any, member: str) -> TypePlan | None:
    """The plan of one union member of the root struct (a service of an Event schema);
    None for a member without a column (Void). Its layout is the member's for
    ``_typed_reader.read_member``: ``(discriminant offset, discriminant, field layout)``,
    so that the member is read only from a message whose root union holds it."""
    field = root_schema.fields[member]
    plan = _field_plan(field, (root_schema.node.id,))
    if plan is None or plan.layout is None:
        return plan
    return replace(plan, layout=(root_schema.node.struct.discriminantOffset,
                                 field.proto.discriminantValue, plan.layout))
