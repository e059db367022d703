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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
    value Arrow/Spark take for that type (None: the pycapnp value already is one)."""

    spark_type: DataType
    convert: Converter | None


def _enum_plan(enum_schema: Any) -> TypePlan:
    names = {value: name for name, value in enum_schema.enumerants.items()}

    def convert(value: Any) -> str:
        raw = value.raw
        name = names.get(raw)
        return name if name is not None else str(raw)

    return TypePlan(StringType(), convert)


def _list_plan(element_type: Any, list_schema: Any, stack: tuple[int, ...]) -> TypePlan | None:
    kind = element_type.which()
    if kind in _OMITTED:
        return None
    if kind in _PRIMITIVES:
        return TypePlan(ArrayType(_PRIMITIVES[kind]), list)
    element = _type_plan(element_type, list_schema.elementType, stack)
    if element is None:
        return None
    convert = element.convert
    if convert is None:
        return TypePlan(ArrayType(element.spark_type), list)

    def convert_list(values: Any) -> list[Any]:
        return [convert(v) for v in values]

    return TypePlan(ArrayType(element.spark_type), convert_list)


def _type_plan(type_proto: Any, schema: Any, stack: tuple[int, ...]) -> TypePlan | None:
    """Plan of a slot's type (``type_proto``: the schema's Type; ``schema``: pycapnp's
    schema object of that type when it has one: struct, enum, list)."""
    kind = type_proto.which()
    if kind in _OMITTED:
        return None
    if kind in _PRIMITIVES:
        return TypePlan(_PRIMITIVES[kind], None)
    if kind == "enum":
        return _enum_plan(schema)
    if kind == "list":
        return _list_plan(type_proto.list.elementType, schema, stack)
    if kind == "struct":
        return struct_plan(schema, stack)
    raise ValueError(f"unsupported Cap'n Proto type {kind!r}")


def _field_plan(field: Any, stack: tuple[int, ...]) -> TypePlan | None:
    proto = field.proto
    if proto.which() == "group":
        return struct_plan(field.schema, stack)
    type_proto = proto.slot.type
    needs_schema = type_proto.which() in ("struct", "enum", "list")
    return _type_plan(type_proto, field.schema if needs_schema else None, stack)


def _text_form(value: Any) -> str:
    return str(value)


def struct_plan(schema: Any, stack: tuple[int, ...] = ()) -> TypePlan:
    """The plan of a struct (or group) type: a StructType and a converter from a struct
    reader to a tuple in the StructType's field order."""
    node_id = schema.node.id
    if node_id in stack:  # recursion: Spark types are finite
        return TypePlan(StringType(), _text_form)
    stack = (*stack, node_id)

    plain: list[tuple[Any, Converter | None]] = []
    members: list[tuple[str, Any, Converter | None]] = []
    fields: list[StructField] = []
    member_fields: list[StructField] = []
    union_names = set(schema.union_fields)
    for field in schema.fields_list:
        name = field.proto.name
        plan = _field_plan(field, stack)
        if name in union_names:
            # Void members have no column but remain a possible `which` value.
            if plan is not None:
                members.append((name, field, plan.convert))
                member_fields.append(StructField(name, plan.spark_type, True))
        elif plan is not None:
            plain.append((field, plan.convert))
            fields.append(StructField(name, plan.spark_type, True))
    has_union = bool(union_names)
    if has_union:
        which_name = "_which" if "which" in schema.fieldnames else "which"
        fields.append(StructField(which_name, StringType(), True))
        fields += member_fields

    return TypePlan(StructType(fields), _struct_converter(plain, members if has_union else None))


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
    None for a member without a column (Void)."""
    return _field_plan(root_schema.fields[member], (root_schema.node.id,))
