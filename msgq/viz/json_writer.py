"""The MCAP export's fast path: the JSON text of a whole batch of log messages, written
in C straight from their Cap'n Proto bytes (:mod:`msgq.viz._json_writer`), the same text
byte for byte as :class:`msgq.viz.json_schema.EventConverter` makes through pycapnp.

:func:`json_program` compiles a schema's root struct once (the field order, keys, kinds,
offsets and defaults the EventConverter's generated code reads); :func:`batch_json`
converts the chosen messages of one :class:`msgq.logs.segment.MessageBatch`. A message the
writer does not follow (see the extension's docstring: damage, far pointers, generics'
parameters, ...) comes back as None, and the caller converts it the old way.
"""

from __future__ import annotations

import base64
import threading
from typing import Any

import numpy as np

from msgq.schemas import Schema
from msgq.schemas.reader_layouts import field_layout
from msgq.viz import _json_writer as native
from msgq.viz.json_schema import WHICH, _holds_null, _orjson, encode_json, event_converter

__all__ = ["JsonProgram", "batch_json", "json_program"]

_K = native.KINDS
_POINTERS = ("text", "data", "list", "struct")


class JsonProgram:
    """A schema's root struct compiled for the JSON writer, with each service's root
    discriminant and whether the EventConverter would try orjson for it."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._memo: dict[int, Any] = {}
        root = schema.event.schema
        self.root = self._struct(root)
        converter = event_converter(schema)
        self.discriminant: dict[str, int] = {}
        self.orjson_style: dict[str, bool] = {}
        for name in root.union_fields:
            self.discriminant[name] = root.fields[name].proto.discriminantValue
            self.orjson_style[name] = _orjson is not None and \
                not _holds_null(converter.json_schema(name))
        self._batch_tables: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}

    def tables(self, services: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Per index into ``services`` (a batch's service names): the root discriminant
        its messages hold (-1: unknown to this schema) and the orjson flag."""
        tables = self._batch_tables.get(services)
        if tables is None:
            expected = np.array([self.discriminant.get(s, -1) for s in services], np.int16)
            style = np.array([self.orjson_style.get(s, False) for s in services], np.uint8)
            tables = self._batch_tables[services] = (expected, style)
        return tables

    def _struct(self, struct_schema: Any) -> Any:
        node_id = struct_schema.node.id
        compiled = self._memo.get(node_id)
        if compiled is not None:
            return compiled
        compiled = self._memo[node_id] = native.make_struct()  # before its fields: recursion
        fields = struct_schema.fields
        plain = tuple(self._field(fields[name], f'"{name}":'.encode())
                      for name in struct_schema.non_union_fields)
        union = None
        if struct_schema.union_fields:
            members = {}
            for name in struct_schema.union_fields:
                field = fields[name]
                key = f'"{WHICH}":"{name}","{name}":'.encode()
                members[field.proto.discriminantValue] = self._field(field, key)
            union = (struct_schema.node.struct.discriminantOffset, members)
        compiled.set(plain, union)
        return compiled

    def _field(self, field: Any, key: bytes) -> Any:
        proto = field.proto
        if proto.which() == "group":
            return native.make_field(key, native.make_type(
                _K["group"], struct_=self._struct(field.schema)), 0, 0, False)
        slot = proto.slot
        kind = slot.type.which()
        type_schema = field.schema if kind in ("struct", "list", "enum") else None
        value_type = self._type(kind, slot.type, type_schema)
        if kind in _POINTERS:
            explicit = bool(slot.hadExplicitDefault)
            default_text = None
            if explicit and kind == "text":
                default_text = encode_json(slot.defaultValue.text)
            elif explicit and kind == "data":
                default_text = encode_json(base64.b64encode(slot.defaultValue.data).decode())
            return native.make_field(key, value_type, slot.offset, 0, explicit, default_text)
        if kind in ("void", "anyPointer", "interface"):
            return native.make_field(key, value_type, 0, 0, False)
        default = field_layout(slot, (0, 0, 0, None))[2]  # type: ignore[index]
        return native.make_field(key, value_type, slot.offset, default, False)

    def _type(self, kind: str, type_proto: Any, type_schema: Any) -> Any:
        if kind == "enum":
            by_number: dict[int, bytes] = {
                value: f'"{name}"'.encode() for name, value in type_schema.enumerants.items()}
            names = [by_number.get(i) for i in range(max(by_number, default=-1) + 1)]
            return native.make_type(_K["enum"], enum_names=names)
        if kind == "struct":
            return native.make_type(_K["struct"], struct_=self._struct(type_schema))
        if kind == "list":
            element = type_proto.list.elementType
            element_kind = element.which()
            element_schema = type_schema.elementType \
                if element_kind in ("struct", "list", "enum") else None
            return native.make_type(_K["list"],
                                    element=self._type(element_kind, element, element_schema))
        if kind == "anyPointer":
            # a generic's parameter: its value's type is the brand's (the old path reads it)
            return native.make_type(_K["other"] if type_proto.anyPointer.which() == "parameter"
                                    else _K["null"])
        if kind == "interface":
            return native.make_type(_K["null"])
        if kind in _K:
            return native.make_type(_K[kind])
        return native.make_type(_K["other"])


_programs: dict[Any, JsonProgram] = {}
_lock = threading.Lock()


def json_program(schema: Schema) -> JsonProgram:
    """The :class:`JsonProgram` of ``schema`` (compiled once per schema)."""
    with _lock:
        program = _programs.get(schema.spec)
        if program is None or program.schema is not schema:
            program = _programs[schema.spec] = JsonProgram(schema)
        return program


def batch_json(program: JsonProgram, batch: Any, which: np.ndarray) -> list[bytes | None]:
    """The JSON texts of the messages ``which`` (indexes) of ``batch`` (a
    :class:`msgq.logs.segment.MessageBatch`), None for each the writer leaves to the old
    path."""
    expected, style = program.tables(tuple(batch.services))
    which = np.ascontiguousarray(which, np.int64)
    services = batch.service[which]
    return native.convert_batch(
        program.root, batch.data, np.ascontiguousarray(batch.offset, np.int64),
        np.ascontiguousarray(batch.length, np.uint32), which,
        np.ascontiguousarray(expected[services]), np.ascontiguousarray(style[services]))
