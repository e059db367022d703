"""Whether a log was written with the schema a reader uses: :func:`check_schema` and
:class:`SchemaMismatchError`.

Cap'n Proto bytes carry no schema: read with the wrong one, an Event often still
"decodes" — another service's name, a time or a validity read from the wrong bits. So a
reader looks for evidence, cheapest first, before it hands out a single event:

1. the recording's ``index.json``: the union members the writer's schema had, by ordinal
   (``schema_members``: name and type), compared with the reader's — a schema that only
   added members at the end is the same schema, grown (a log of the newer version is
   refused only when it holds events of the members the reader lacks, by the index's
   counts); any other difference is a mismatch. An older index with only
   ``schema_fingerprint``: that must be equal.
2. otherwise (loggerd logs, a segment file alone, an index without schema), a sample of
   the first events of the folder's first segment (of a loggerd route's first segment,
   for all its ``<route>--<n>`` folders; up to :data:`SAMPLE_EVENTS`), each
   read from its bytes: a union discriminant beyond the schema's members, or bits of the
   root struct's data section that no field of the schema uses (a writer's schema keeps
   them zero; another schema puts its discriminant or ``valid`` there) — a mismatch when
   most of the sample shows it (damage hits one event, not most); and a ``logStart``
   event whose ``schemaFingerprint`` is not the reader's.

Layer: a service (the logs); imports the Event layer and the other log modules.
"""

from __future__ import annotations

import os
import re
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO

from msgq.logs.index import INDEX_NAME, read_index, read_recording
from msgq.logs.segment import read_messages
from msgq.logs.sources import segment_paths
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.framing import root_data_section

__all__ = ["SAMPLE_EVENTS", "SchemaMismatchError", "check_schema", "schema_members"]

#: Events of a segment's start read to judge its schema.
SAMPLE_EVENTS = 64
#: ... or this many bytes of them, whichever comes first.
SAMPLE_BYTES = 4 << 20

_HEX = re.compile(r"[0-9a-f]+")
_ROUTE_SEGMENT = re.compile(r"^(.+)--(\d+)$")
_U16 = struct.Struct("<H")
# Bits of each plain type in a struct's data section (pointer types take none).
_WIDTH = {"void": 0, "bool": 1, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16,
          "enum": 16, "int32": 32, "uint32": 32, "float32": 32, "int64": 64, "uint64": 64,
          "float64": 64}

HINT = "pass the schema it was written with (--schema FILE.capnp --registry FILE)"


class SchemaMismatchError(ValueError):
    """A log was not written with the schema used to read it; the message (one line)
    names the log, the evidence and what to pass."""


def _type_signature(typ: Any) -> str:
    kind = typ.which()
    if kind == "struct":
        return f"struct:{typ.struct.typeId:x}"
    if kind == "enum":
        return f"enum:{typ.enum.typeId:x}"
    if kind == "interface":
        return f"interface:{typ.interface.typeId:x}"
    if kind == "list":
        return f"list({_type_signature(typ.list.elementType)})"
    return str(kind)


def schema_members(schema: Schema) -> list[list[str]]:
    """The root struct's union members by ordinal, as ``[name, type]`` (a struct's type
    is its Cap'n Proto id: the same in every version of a schema file); what
    ``index.json`` keeps as ``schema_members``."""
    fields = schema.event.schema.fields
    return [[name, _type_signature(fields[name].proto.slot.type)]
            for name in schema.layout.services]


@dataclass(frozen=True)
class _RootShape:
    """What the root struct of a schema looks like in bytes."""

    data_words: int
    used: int  # bits of the data section some field (or the discriminant) uses
    members: int
    discriminant_byte: int


def _mark_fields(struct_schema: Any, used: list[tuple[int, int]]) -> None:
    """Appends (mask, first bit) of every data-section field of a struct (its groups
    and union discriminants included)."""
    node = struct_schema.node.struct
    if node.discriminantCount:
        used.append((0xFFFF, 16 * node.discriminantOffset))
    for field in struct_schema.fields.values():
        proto = field.proto
        if proto.which() == "group":
            _mark_fields(field.schema, used)
            continue
        width = _WIDTH.get(proto.slot.type.which())
        if width:
            used.append(((1 << width) - 1, width * proto.slot.offset))


_shapes: dict[Any, _RootShape] = {}
_shapes_lock = threading.Lock()


def _root_shape(schema: Schema) -> _RootShape:
    key = schema.spec
    shape = _shapes.get(key)
    if shape is None:
        marks: list[tuple[int, int]] = []
        _mark_fields(schema.event.schema, marks)
        used = 0
        for mask, bit in marks:
            used |= mask << bit
        node = schema.event.schema.node.struct
        shape = _RootShape(int(node.dataWordCount), used, len(schema.layout.services),
                           schema.layout.discriminant_byte)
        with _shapes_lock:
            _shapes[key] = shape
    return shape


def _classify(message: bytes, shape: _RootShape) -> str | None:
    """``"ok"``, ``"foreign"`` (a discriminant beyond the members), ``"odd"`` (bits set
    that no field uses), or None (no root struct to read: a far pointer, garbage)."""
    section = root_data_section(message)
    if section is None:
        return None
    start, data_words = section
    words = min(data_words, shape.data_words)
    which = _U16.unpack_from(message, start + shape.discriminant_byte)[0] \
        if shape.discriminant_byte + 2 <= 8 * data_words else 0
    if which >= shape.members:
        return "foreign"
    section = int.from_bytes(message[start:start + 8 * words], "little")
    return "odd" if section & ~shape.used else "ok"


@dataclass
class _Sample:
    events: int = 0
    foreign: int = 0
    odd: int = 0
    fingerprint: str | None = None  # a logStart's schemaFingerprint, when one was read


def _log_start_fingerprint(data: bytes, schema: Schema) -> str | None:
    peeked = schema.layout.peek(data)
    if peeked is None or peeked[2] != "logStart":
        return None
    try:
        start = schema.decode(data).logStart
        return str(start.schemaFingerprint) if start.schemaFingerprint else None
    except Exception:  # not msgq's logStart: no fingerprint to compare
        return None


def log_start_fields(schema: Schema) -> tuple[str, ...]:
    """The fields of the schema's ``logStart`` member when it is a struct; () when the
    schema has none (openpilot's, for one: its metadata event is initData)."""
    if "logStart" not in schema.union_fields:
        return ()
    field = schema.event.schema.fields["logStart"]
    if field.proto.slot.type.which() != "struct":
        return ()
    return tuple(field.schema.fieldnames)


def _sample(path: str | BinaryIO, schema: Schema) -> _Sample:
    shape = _root_shape(schema)
    sample = _Sample()
    wants_fingerprint = "schemaFingerprint" in log_start_fields(schema)
    seen_bytes = 0
    messages = read_messages(path, lambda problem: None, True,
                             lambda data: _classify(data, shape))
    try:
        for raw in messages:
            sample.events += 1
            seen_bytes += len(raw.data)
            if raw.identity == "foreign":
                sample.foreign += 1
            elif raw.identity == "odd":
                sample.odd += 1
            elif wants_fingerprint and sample.fingerprint is None:
                sample.fingerprint = _log_start_fingerprint(raw.data, schema)
            if sample.events >= SAMPLE_EVENTS or seen_bytes >= SAMPLE_BYTES:
                break
    except OSError:  # unreadable (a folder, no permission): the reader says so there
        pass
    finally:
        messages.close()
    return sample


def _describe(schema: Schema) -> str:
    root = "" if schema.root_name == "Event" else f" (root {schema.root_name})"
    return f"{schema.path}{root}"


def _index_verdict(info: dict[str, Any], schema: Schema,
                   folder: str) -> tuple[bool, str | None]:
    """(whether the index settles it, the mismatch found or None)."""
    if info.get("schema_fingerprint") == schema.fingerprint:
        return True, None
    members = info.get("schema_members")
    if isinstance(members, list) and members:
        ours = schema_members(schema)
        for ordinal, (theirs, mine) in enumerate(zip(members, ours, strict=False)):
            if list(theirs) != mine:
                name = theirs[0] if isinstance(theirs, list) and theirs else theirs
                return True, (f"its index.json says union member #{ordinal} is {name!r} "
                              f"({theirs[1] if isinstance(theirs, list) else '?'}), "
                              f"this schema's is {mine[0]!r} ({mine[1]})")
        # the same members, one side grown at the end: a log of a newer version is read
        # unless it holds events of members this version lacks
        newer = {m[0] for m in members[len(ours):] if isinstance(m, list) and m}
        held = sorted({name for entry in read_index(folder) or [] for name, n in
                       entry.counts.items() if name in newer and n})
        if held:
            return True, (f"it holds events of {', '.join(held[:5])}"
                          f"{' and more' if len(held) > 5 else ''}, union members this "
                          f"schema lacks (the log's schema is a newer version of it)")
        return True, None
    fingerprint = info.get("schema_fingerprint")
    if isinstance(fingerprint, str) and fingerprint:
        return True, (f"its index.json says schema fingerprint {fingerprint}, this "
                      f"schema's is {schema.fingerprint}")
    return False, None


def _other_fingerprint(theirs: str | None, ours: str) -> bool:
    """Whether a logStart's fingerprint is another schema's: hex of the same length that
    differs in several places (damage to the event changes a character or two, or
    leaves no fingerprint at all)."""
    if theirs is None or len(theirs) != len(ours) or not _HEX.fullmatch(theirs):
        return False
    return sum(a != b for a, b in zip(theirs, ours, strict=True)) >= 4


def _sample_verdict(sample: _Sample, schema: Schema) -> str | None:
    if _other_fingerprint(sample.fingerprint, schema.fingerprint):
        return (f"its logStart says schema fingerprint {sample.fingerprint}, this "
                f"schema's is {schema.fingerprint}")
    flagged = sample.foreign + sample.odd
    if flagged < 2 or 2 * flagged <= sample.events:
        return None
    if sample.foreign >= sample.odd:
        return (f"{sample.foreign} of its first {sample.events} events name union "
                f"members beyond this schema's {_root_shape(schema).members}")
    return (f"{sample.odd} of its first {sample.events} events set bits of the root "
            f"struct that this schema does not use")


def _sample_group(folder: str) -> tuple[str, str]:
    """The segments one sample speaks for: a folder's, or all of a loggerd route's
    (``<route>--<n>`` folders side by side were written by one program)."""
    parent, name = os.path.split(folder)
    match = _ROUTE_SEGMENT.match(name)
    return (parent, match.group(1)) if match else (folder, "")


def check_paths(paths: Iterable[str], schema: Schema) -> None:
    """:func:`check_schema` over segment files already listed: each folder's index, and
    where no index settles it, the first segment of the folder (of a loggerd route: of
    the route) is sampled."""
    firsts: dict[str, str] = {}
    for path in paths:
        firsts.setdefault(os.path.dirname(path), path)
    sampled: set[tuple[str, str]] = set()
    for folder, path in firsts.items():
        settled = False
        if os.path.exists(os.path.join(folder, INDEX_NAME)):
            info = read_recording(folder)
            if info is not None:
                settled, problem = _index_verdict(info, schema, folder)
                if problem is not None:
                    raise SchemaMismatchError(f"{folder}: not a log of {_describe(schema)}: "
                                              f"{problem}; {HINT}")
        group = _sample_group(folder)
        if settled or group in sampled:
            continue
        sampled.add(group)
        problem = _sample_verdict(_sample(path, schema), schema)
        if problem is not None:
            raise SchemaMismatchError(f"{path}: not a log of {_describe(schema)}: {problem}; "
                                      f"{HINT}")


def check_schema(source: Any, schema: Schema | None = None) -> None:
    """Raises :class:`SchemaMismatchError` (one line naming ``--schema``) when the logs
    of ``source`` (what :class:`~msgq.logs.LogReader` takes) were not written with
    ``schema`` (default: the schema in force), before any work: each folder's index,
    else a sample of the first events of its first segment (see the module docstring).
    Cheap: one small file, or the first events of one segment, per folder."""
    check_paths(segment_paths(source), schema_in_force(schema))
