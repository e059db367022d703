"""Cap'n Proto → JSON: a JSON Schema per service of a schema, and the JSON-able value of an
Event reader that matches it, exactly and totally.

The mapping (the one the MCAP export and the live Foxglove server write, so that Foxglove
and PlotJuggler plot any numeric field without a plug-in):

=================  ==================================================================
capnp              JSON
=================  ==================================================================
Bool               boolean
Int8 … UInt64      integer, exact (64-bit values too: the JSON text holds every digit;
                   JavaScript viewers read integers past 2**53 rounded to a double, a
                   limit of theirs, not of the file)
Float32/Float64    number (a Float32 as the double it widens to, as pycapnp reads it);
                   the non-finite values JSON has no number for as the strings
                   ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (protobuf's JSON mapping
                   does the same); the schema says so
Text               string
Data               string, base64 (``contentEncoding: base64``)
enum               the enumerant's name; a value this schema does not name (a newer
                   writer's) as its integer
List(T)            array of T
struct, group      object with every field (what pycapnp reads, defaults included)
union              only the member that is set, and ``"_which"``: its name (capnp names
                   start with a lower-case letter, so ``_which`` never collides)
Void               null
a generic's        as the brand binds it (cereal's ``Map(Text, Data)``: key a string,
parameter          value base64), read as pycapnp reads it
AnyPointer,        null (nothing in them can be read without knowing their type)
interface
=================  ==================================================================

Values are read the way pycapnp reads them (a field's declared default when the writer
left it at its default or an older writer did not have it): the dict of an Event equals
pycapnp's ``to_dict(verbose=True)`` with Data as base64, enums as names and ``_which``
added. Converters are generated once per struct type and cached per schema
(:func:`event_converter`); the JSON Schema of each (schema, service) is derived once.
"""

from __future__ import annotations

import base64
import json
import math
import re
import threading
from typing import Any

from msgq.schemas import Schema
from msgq.schemas.services import unknown_service_error

try:  # optional: ten times faster than json for event values (see EventConverter.dumps)
    import orjson as _orjson
except ImportError:
    _orjson = None

__all__ = ["EventConverter", "NON_FINITE", "WHICH", "encode_json", "event_converter",
           "json_value"]

#: The key naming the set member of a union.
WHICH = "_which"
#: The strings standing for the floats JSON has no number for.
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1),
}
_FLOATS = ("float32", "float64")
_PLAIN = frozenset((*_INT_RANGES, *_FLOATS, "bool", "text"))
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_FLOAT_SCHEMA = {
    "type": ["number", "string"],
    "pattern": "^(NaN|-?Infinity)$",
    "description": "a float; the non-finite values as the strings NaN, Infinity, -Infinity",
}


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _enum_name(value: Any) -> Any:
    try:
        return value._as_str()
    except Exception:  # an enumerant this schema does not name: its number
        return int(value.raw)


def _void(value: Any) -> None:
    return None


def _b64_list(values: Any) -> list[str]:
    return [base64.b64encode(v).decode("ascii") for v in values]


def _enum_list(values: Any) -> list[Any]:
    return [_enum_name(v) for v in values]


class EventConverter:
    """The JSON Schemas and JSON values of one schema's root struct (see the module
    docstring); get it with :func:`event_converter` (one per schema)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._converters: dict[int, Any] = {}
        self._json_schemas: dict[str, dict[str, Any]] = {}
        self._nullable: dict[str, bool] = {}
        self._env: dict[tuple[int, int], Any] = {}  # generic parameters bound in scope
        self._lock = threading.Lock()
        root = schema.event.schema
        self._root = self._struct_converter(root)

    # -- values ---------------------------------------------------------------------

    def to_json(self, event: Any) -> dict[str, Any]:
        """The JSON-able dict of an Event reader: every non-union field of the root,
        the set union member under its name, and ``_which``."""
        return self._root(event)

    def encode(self, event: Any) -> bytes:
        """The Event reader as compact UTF-8 JSON (see :meth:`dumps`)."""
        return self.dumps(event.which(), self._root(event))

    def dumps(self, service: str, value: dict[str, Any]) -> bytes:
        """``value`` (an event of ``service`` from :meth:`to_json`) as compact UTF-8
        JSON, the same text :func:`encode_json` makes. With orjson installed (about ten
        times faster than the standard library's encoder) it encodes events whose type
        holds no Void or AnyPointer field; orjson writes NaN and infinities as null, so
        output holding a null is made again the exact way."""
        if _orjson is not None:
            nullable = self._nullable.get(service)
            if nullable is None:
                nullable = self._nullable[service] = _holds_null(
                    self.json_schema(service))
            if not nullable:
                try:
                    text = _orjson.dumps(value)
                except (TypeError, ValueError):  # e.g. a lone surrogate in a Text
                    return encode_json(value)
                if b"null" not in text:
                    return text
        return encode_json(value)

    def _value_converter(self, kind: str, type_proto: Any, type_schema: Any) -> Any:
        """The function turning pycapnp's value of this type into its JSON value (None:
        the value is already one)."""
        if kind in _PLAIN:
            return None
        if kind == "data":
            return _b64
        if kind == "enum":
            return _enum_name
        if kind == "anyPointer" and type_proto.anyPointer.which() == "parameter":
            return self._dynamic  # a generic's parameter: pycapnp reads it as bound
        if kind in ("void", "anyPointer", "interface"):
            return _void
        if kind == "struct":
            return self._struct_converter(type_schema)
        if kind == "list":
            element = type_proto.list.elementType
            element_kind = element.which()
            if element_kind in _PLAIN:
                return list
            if element_kind == "data":
                return _b64_list
            if element_kind == "enum":
                return _enum_list
            element_schema = type_schema.elementType \
                if element_kind in ("struct", "list") else None
            convert = self._value_converter(element_kind, element, element_schema)
            return lambda values: [convert(v) for v in values]
        raise TypeError(f"a field of Cap'n Proto type {kind} cannot be converted to JSON")

    def _dynamic(self, value: Any) -> Any:
        """A value whose type only its reader knows (a field of a generic's parameter
        type, e.g. cereal's ``Map(Text, Data)``): converted by what pycapnp returns."""
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, bytes):
            return _b64(value)
        kind = type(value).__name__
        if kind == "_DynamicStructReader":
            return self._struct_converter(value.schema)(value)
        if kind == "_DynamicListReader":
            return [self._dynamic(v) for v in value]
        if kind == "_DynamicEnum":
            return _enum_name(value)
        return None  # an AnyPointer bound to nothing

    def _struct_converter(self, struct_schema: Any) -> Any:
        """The converter of a struct (or group) type, generated once: straight-line code
        reading each field with pycapnp's ``_get``. Recursive types resolve through the
        cache at call time."""
        node_id = struct_schema.node.id
        existing = self._converters.get(node_id)
        if existing is not None:
            return existing
        # A placeholder first, so that a recursive type finds itself.
        namespace: dict[str, Any] = {}

        def recursive(reader: Any) -> Any:
            return namespace["convert"](reader)

        self._converters[node_id] = recursive
        fields = struct_schema.fields
        lines = ["def convert(r):", "    d = {"]
        union = []
        for name in struct_schema.fieldnames:
            if not _NAME.match(name):
                raise ValueError(f"field name {name!r} is not a Cap'n Proto identifier")
        union_names = set(struct_schema.union_fields)
        for name in struct_schema.non_union_fields:
            convert = self._field_converter(fields[name])
            if convert is None:
                lines.append(f"        {name!r}: r._get({name!r}),")
            else:
                namespace[f"c_{name}"] = convert
                lines.append(f"        {name!r}: c_{name}(r._get({name!r})),")
        lines.append("    }")
        for name in struct_schema.union_fields:
            union.append(name)
            namespace[f"u_{name}"] = self._field_converter(fields[name]) or _identity
        if union_names:
            namespace["members"] = {n: namespace[f"u_{n}"] for n in union}
            lines += [
                "    try:",
                "        w = r.which()",
                "    except Exception:",  # a member this schema does not know (newer writer)
                f"        d[{WHICH!r}] = None",
                "        return d",
                f"    d[{WHICH!r}] = w",
                "    d[w] = members[w](r._get(w))",
            ]
        lines.append("    return d")
        exec("\n".join(lines), namespace)  # noqa: S102 - field names checked above
        self._converters[node_id] = namespace["convert"]
        return namespace["convert"]

    def _field_converter(self, field: Any) -> Any:
        proto = field.proto
        if proto.which() == "group":
            return self._struct_converter(field.schema)
        type_proto = proto.slot.type
        kind = type_proto.which()
        type_schema = field.schema if kind in ("struct", "list", "enum") else None
        return self._value_converter(kind, type_proto, type_schema)

    # -- JSON Schemas ---------------------------------------------------------------

    def schema_name(self, service: str) -> str:
        """The name of ``service``'s JSON Schema: ``<root struct>.<service>``."""
        return f"{self.schema.root_name}.{service}"

    def json_schema(self, service: str) -> dict[str, Any]:
        """The JSON Schema of ``service``'s events (the root struct with only that union
        member), derived once."""
        with self._lock:
            cached = self._json_schemas.get(service)
            if cached is not None:
                return cached
            if service not in self.schema.union_fields:
                raise unknown_service_error(service, self.schema.union_fields)
            root = self.schema.event.schema
            defs: dict[str, Any] = {}
            self._env = {}
            doc = self._struct_json(root, [], defs, only_member=service)
            doc = {"$schema": "https://json-schema.org/draft/2020-12/schema", **doc,
                   "title": self.schema_name(service)}
            if defs:
                doc["$defs"] = defs
            self._json_schemas[service] = doc
            return doc

    def _struct_json(self, struct_schema: Any, stack: list[int], defs: dict[str, Any],
                     only_member: str | None = None) -> dict[str, Any]:
        node = struct_schema.node
        if node.id in stack:  # a recursive type: one definition, referenced
            name = _def_name(node.displayName)
            if name not in defs:
                defs[name] = {}  # reserved; filled when the outer walk returns
            return {"$ref": f"#/$defs/{name}"}
        stack.append(node.id)
        fields = struct_schema.fields
        properties: dict[str, Any] = {}
        required = list(struct_schema.non_union_fields)
        for name in struct_schema.non_union_fields:
            properties[name] = self._field_json(fields[name], stack, defs)
        members = list(struct_schema.union_fields)
        if only_member is not None:
            members = [only_member]
        if members:
            for name in members:
                properties[name] = self._field_json(fields[name], stack, defs)
            properties[WHICH] = {"type": "string", "enum": members,
                                 "description": "the union member that is set"}
            required.append(WHICH)
            if only_member is not None:
                required.append(only_member)
        stack.pop()
        doc = {"type": "object", "title": node.displayName.split(":", 1)[-1],
               "properties": properties, "required": required,
               "additionalProperties": False}
        name = _def_name(node.displayName)
        if name in defs and not defs[name]:
            defs[name] = doc
            return {"$ref": f"#/$defs/{name}"}
        return doc

    @staticmethod
    def _bind(brand: Any, env: dict[tuple[int, int], Any]) -> dict[tuple[int, int], Any]:
        """``env`` with the parameters a struct type's brand binds (generics:
        ``Map(Text, Data)`` binds Map's Key to Text and Value to Data)."""
        scopes = list(brand.scopes)
        if not scopes:
            return env
        bound = dict(env)
        for scope in scopes:
            if scope.which() == "bind":
                for index, binding in enumerate(scope.bind):
                    bound[(scope.scopeId, index)] = _bound_type(binding, env)
        return bound

    def _field_json(self, field: Any, stack: list[int], defs: dict[str, Any]) -> dict[str, Any]:
        proto = field.proto
        if proto.which() == "group":
            return self._struct_json(field.schema, stack, defs)
        type_proto = proto.slot.type
        kind = type_proto.which()
        type_schema = field.schema if kind in ("struct", "list", "enum") else None
        return self._type_json(kind, type_proto, type_schema, stack, defs)

    def _type_json(self, kind: str, type_proto: Any, type_schema: Any, stack: list[int],
                   defs: dict[str, Any]) -> dict[str, Any]:
        if kind == "bool":
            return {"type": "boolean"}
        if kind in _INT_RANGES:
            low, high = _INT_RANGES[kind]
            doc: dict[str, Any] = {"type": "integer", "minimum": low, "maximum": high}
            if kind in ("int64", "uint64"):
                doc["description"] = ("64-bit, exact in the JSON text (JavaScript viewers "
                                      "round past 2**53)")
            return doc
        if kind in _FLOATS:
            return dict(_FLOAT_SCHEMA)
        if kind == "text":
            return {"type": "string"}
        if kind == "data":
            return {"type": "string", "contentEncoding": "base64"}
        if kind == "enum":
            names = list(type_schema.enumerants)
            return {"anyOf": [{"type": "string", "enum": names},
                              {"type": "integer",
                               "description": "an enumerant this schema does not name"}]}
        if kind == "void":
            return {"type": "null"}
        if kind == "anyPointer" and type_proto.anyPointer.which() == "parameter":
            parameter = type_proto.anyPointer.parameter
            bound = self._env.get((parameter.scopeId, parameter.parameterIndex))
            if bound is not None and bound.which() not in ("struct", "list", "enum",
                                                            "anyPointer", "interface"):
                return self._type_json(bound.which(), bound, None, stack, defs)
            return {"description": "a generic's parameter: the value as its type maps"}
        if kind in ("anyPointer", "interface"):
            return {"type": "null", "description": f"a Cap'n Proto {kind}: not converted"}
        if kind == "struct":
            outer = self._env
            self._env = self._bind(type_proto.struct.brand, outer)
            try:
                return self._struct_json(type_schema, stack, defs)
            finally:
                self._env = outer
        if kind == "list":
            element = type_proto.list.elementType
            element_kind = element.which()
            element_schema = type_schema.elementType \
                if element_kind in ("struct", "list", "enum") else None
            return {"type": "array",
                    "items": self._type_json(element_kind, element, element_schema, stack,
                                             defs)}
        raise TypeError(f"a field of Cap'n Proto type {kind} cannot be converted to JSON")


def _bound_type(binding: Any, env: dict[tuple[int, int], Any]) -> Any:
    """The Type a brand binding gives a parameter (looked up in ``env`` when it is itself
    a parameter of an outer generic); None when unbound."""
    if binding.which() != "type":
        return None
    bound = binding.type
    if bound.which() == "anyPointer" and bound.anyPointer.which() == "parameter":
        parameter = bound.anyPointer.parameter
        return env.get((parameter.scopeId, parameter.parameterIndex))
    return bound


def _holds_null(doc: Any) -> bool:
    """Whether a JSON Schema allows null anywhere (Void, AnyPointer, interface)."""
    if isinstance(doc, dict):
        kind = doc.get("type")
        if kind == "null" or (isinstance(kind, list) and "null" in kind):
            return True
        return any(_holds_null(v) for v in doc.values())
    if isinstance(doc, list):
        return any(_holds_null(v) for v in doc)
    return False


def _identity(value: Any) -> Any:
    return value


def _def_name(display_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", display_name.split(":", 1)[-1])


# One encoder: compact, UTF-8 kept as is, NaN refused (caught below), no cycle check
# (the values are trees).
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False,
                            separators=(",", ":"))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return NON_FINITE["nan" if value != value else ("inf" if value > 0 else "-inf")]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def json_value(value: Any) -> Any:
    """``value`` with non-finite floats replaced by their strings (see the module
    docstring)."""
    return _finite(value)


def encode_json(value: Any) -> bytes:
    """A converted value as compact UTF-8 JSON; non-finite floats as their strings (the
    fast path encodes directly; only a value holding one is walked)."""
    try:
        text = _ENCODER.encode(value)
    except ValueError:  # a NaN or infinity somewhere
        text = _ENCODER.encode(_finite(value))
    return text.encode("utf-8", "surrogatepass")


_cache: dict[Any, EventConverter] = {}
_cache_lock = threading.Lock()


def event_converter(schema: Schema) -> EventConverter:
    """The :class:`EventConverter` of ``schema`` (made once per schema)."""
    key = schema.spec
    with _cache_lock:
        converter = _cache.get(key)
        if converter is None or converter.schema is not schema:
            converter = _cache[key] = EventConverter(schema)
        return converter
