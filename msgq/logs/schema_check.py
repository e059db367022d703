"""Whether a log was written with the schema a reader uses: :func:`check_schema` and
:class:`SchemaMismatchError`. The one copy of this check: ``LogReader``, ``Replayer``
(``msgq replay``), ``msgq info``, ``msgq export``, ``msgq logstats`` and the Spark source
(local files, and Hadoop URIs through :func:`check_paths` with ``files``) all call it.

Cap'n Proto bytes carry no schema: read with the wrong one, an Event often still
"decodes" — another service's name, a time or a validity read from the wrong bits. So a
reader looks for evidence, cheapest first, before it hands out a single event. Each
signal has a name (:data:`SIGNALS`); the error says which one decided
(:attr:`SchemaMismatchError.signal`):

1. ``index schema members`` / ``index schema fingerprint``: the recording's
   ``index.json``: the union members the writer's schema had, by ordinal
   (``schema_members``: name and type), compared with the reader's — a schema that only
   added members at the end is the same schema, grown (a log of the newer version is
   refused only when it holds events of the members the reader lacks, by the index's
   counts); any other difference is a mismatch. An older index with only
   ``schema_fingerprint``: that must be equal.
2. otherwise (loggerd logs, a segment file alone, an index without schema), a sample of
   the first events of the folder's first segment (of a loggerd route's first segment,
   for all its ``<route>--<n>`` folders; up to :data:`SAMPLE_EVENTS`), each read from its
   bytes, then decoded:

   * ``logStart fingerprint``: a ``logStart`` event whose ``schemaFingerprint`` is
     another schema's;
   * ``union ordinals``: a union discriminant beyond the schema's members;
   * ``root struct shape``: bits of the root struct's data section that no field of the
     schema uses (a writer's schema keeps them zero; another schema puts its
     discriminant, ``valid`` or a field of its own there);
   * ``decode failures``: where the ordinals and the root's bits look right (another
     schema's discriminant can land on bits that read as a valid ordinal), the event is
     decoded with the reader's schema and every field of its union member read: a
     pointer of another kind than the schema says (a list where it has a struct, a
     struct where it has text) is a decode failure.

   A mismatch when most of the sample shows one of the last three (damage hits one
   event, not most; each event counts once, under the first signal it shows).

Layer: a service (the logs); imports the Event layer and the other log modules.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO

from msgq.logs.index import read_index_document
from msgq.logs.segment import read_messages
from msgq.logs.sources import segment_paths
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.framing import root_data_section

__all__ = ["SAMPLE_EVENTS", "SIGNALS", "LocalFiles", "SchemaMismatchError", "check_paths",
           "check_schema", "schema_members"]

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

#: The evidence that can decide a mismatch, in the order it is looked at (see the module
#: docstring).
SIGNALS = ("index schema members", "index schema fingerprint", "logStart fingerprint",
           "union ordinals", "root struct shape", "decode failures")

#: Struct fields, list elements and values read per event for ``decode failures``.
_WALK_BUDGET = 4096


class SchemaMismatchError(ValueError):
    """A log was not written with the schema used to read it; the message (one line)
    names the log, the evidence, the signal that decided (``signal``, one of
    :data:`SIGNALS`) and what to pass."""

    def __init__(self, message: str, signal: str = "") -> None:
        super().__init__(message)
        self.signal = signal

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes (Spark) whole
        return type(self), (str(self), self.signal)


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


def _walk(value: Any, budget: list[int], depth: int = 0) -> None:
    """Reads ``value`` (a struct or list reader) field by field, element by element,
    within ``budget[0]`` reads: pycapnp raises its KjException at a pointer of another
    kind than the schema says."""
    if depth > 16:
        return
    if hasattr(value, "schema") and hasattr(value, "to_dict"):  # a struct (or group) reader
        schema = value.schema
        names = list(schema.non_union_fields)
        if schema.union_fields:
            try:
                names.append(value.which())
            except Exception:  # a member this version lacks (a newer writer's): unread
                pass
        for name in names:
            budget[0] -= 1
            if budget[0] <= 0:
                return
            try:
                field = getattr(value, name)
            except UnicodeDecodeError:  # text that is not UTF-8: not a schema matter
                continue
            _walk(field, budget, depth + 1)
    elif hasattr(value, "__len__") and hasattr(value, "__getitem__") \
            and not isinstance(value, (str, bytes)):  # a list reader
        for i in range(min(len(value), 64)):
            budget[0] -= 1
            if budget[0] <= 0:
                return
            try:
                item = value[i]
            except UnicodeDecodeError:
                continue
            _walk(item, budget, depth + 1)


def _decodes(data: bytes, schema: Schema) -> bool:
    """Whether the event decodes with ``schema``, every field of its union member read
    (within :data:`_WALK_BUDGET`); False only for Cap'n Proto's own refusal (a pointer of
    another kind, out of bounds), not for text that is not UTF-8 or an unknown enum."""
    try:
        event = schema.decode(data)
        _walk(getattr(event, event.which()), [_WALK_BUDGET])
    except UnicodeDecodeError:  # text that is not UTF-8: not a schema matter
        return True
    except Exception:  # pycapnp's KjException; MessageDecodeError from decode
        return False
    return True


def _tally(data: bytes, schema: Schema, sample: _Sample) -> bool:
    """:func:`_decodes`, counted by the service ``schema`` reads in ``data``."""
    peeked = schema.layout.peek(data)
    decodes = _decodes(data, schema)
    counts = sample.by_service.setdefault(peeked[2] if peeked else "", [0, 0])
    counts[0 if decodes else 1] += 1
    return decodes


#: Events of a sample decoded for ``decode failures`` (the first that fit the schema by
#: their bytes: decoding costs about 80 us an event, the bytes' look 15).
DECODE_EVENTS = 24

#: Events of one service in a sample that must all fail to decode for ``decode
#: failures`` to decide when they are not most of the sample.
SERVICE_FAILURES = 6


@dataclass
class _Sample:
    events: int = 0
    foreign: int = 0
    odd: int = 0
    fitting: int = 0  # "ok" by their bytes
    decoded: int = 0  # of those, decoded (the first DECODE_EVENTS)
    undecodable: int = 0  # of those, the ones that do not decode with the schema
    # of the events "ok" by their bytes, by the service the schema reads: (decoded, not)
    by_service: dict[str, list[int]] = dataclasses.field(default_factory=dict)
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
            else:
                sample.fitting += 1
                decodes = True
                if sample.decoded < DECODE_EVENTS:
                    sample.decoded += 1
                    decodes = _tally(raw.data, schema, sample)
                    sample.undecodable += not decodes
                if decodes and wants_fingerprint and sample.fingerprint is None:
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


def _index_verdict(info: dict[str, Any], schema: Schema) -> tuple[bool, str | None, str]:
    """(whether the index settles it, the mismatch found or None, the signal) of an
    index document (:func:`msgq.logs.index.parse_index_document`)."""
    if info.get("schema_fingerprint") == schema.fingerprint:
        return True, None, "index schema fingerprint"
    members = info.get("schema_members")
    if isinstance(members, list) and members:
        signal = "index schema members"
        ours = schema_members(schema)
        for ordinal, (theirs, mine) in enumerate(zip(members, ours, strict=False)):
            if list(theirs) != mine:
                name = theirs[0] if isinstance(theirs, list) and theirs else theirs
                return True, (f"its index.json says union member #{ordinal} is {name!r} "
                              f"({theirs[1] if isinstance(theirs, list) else '?'}), "
                              f"this schema's is {mine[0]!r} ({mine[1]})"), signal
        # the same members, one side grown at the end: a log of a newer version is read
        # unless it holds events of members this version lacks
        newer = {m[0] for m in members[len(ours):] if isinstance(m, list) and m}
        segments = info.get("segments")
        held = sorted({name for entry in segments if isinstance(segments, list)
                       and isinstance(entry, dict) and isinstance(entry.get("counts"), dict)
                       for name, n in entry["counts"].items() if name in newer and n}
                      if isinstance(segments, list) else ())
        if held:
            return True, (f"it holds events of {', '.join(held[:5])}"
                          f"{' and more' if len(held) > 5 else ''}, union members this "
                          f"schema lacks (the log's schema is a newer version of it)"), signal
        return True, None, signal
    fingerprint = info.get("schema_fingerprint")
    if isinstance(fingerprint, str) and fingerprint:
        return True, (f"its index.json says schema fingerprint {fingerprint}, this "
                      f"schema's is {schema.fingerprint}"), "index schema fingerprint"
    return False, None, ""


def _other_fingerprint(theirs: str | None, ours: str) -> bool:
    """Whether a logStart's fingerprint is another schema's: hex of the same length that
    differs in several places (damage to the event changes a character or two, or
    leaves no fingerprint at all)."""
    if theirs is None or len(theirs) != len(ours) or not _HEX.fullmatch(theirs):
        return False
    return sum(a != b for a, b in zip(theirs, ours, strict=True)) >= 4


def _sample_verdict(sample: _Sample, schema: Schema) -> tuple[str | None, str]:
    """(the mismatch the sample shows or None, the signal that decided)."""
    if _other_fingerprint(sample.fingerprint, schema.fingerprint):
        return (f"its logStart says schema fingerprint {sample.fingerprint}, this "
                f"schema's is {schema.fingerprint}"), "logStart fingerprint"
    # the events that fit by their bytes but would not decode, as estimated from the
    # ones decoded
    undecodable = (sample.undecodable * sample.fitting // sample.decoded
                   if sample.decoded else 0)
    flagged = sample.foreign + sample.odd + undecodable
    if flagged < 2 or 2 * flagged <= sample.events:
        # not most of the sample, but every event of a service fails to decode: that
        # service's union member is another type here (damage is not that regular)
        for service, (decoded, failed) in sorted(sample.by_service.items()):
            if failed >= SERVICE_FAILURES and not decoded:
                return (f"none of the {failed} of its first events that this schema "
                        f"reads as {service!r} decode with it (their union ordinals and "
                        f"root bits fit it: a pointer of another kind than it says)"), \
                    "decode failures"
        return None, ""
    top = max(sample.foreign, sample.odd, undecodable)
    if sample.foreign == top:
        return (f"{sample.foreign} of its first {sample.events} events name union "
                f"members beyond this schema's {_root_shape(schema).members}"), \
            "union ordinals"
    if sample.odd == top:
        return (f"{sample.odd} of its first {sample.events} events set bits of the root "
                f"struct that this schema does not use"), "root struct shape"
    return (f"{sample.undecodable} of the first {sample.decoded} of its events whose "
            f"union ordinals and root bits fit this schema do not decode with it (a "
            f"pointer of another kind than it says)"), "decode failures"


def _sample_group(folder: str) -> tuple[str, str]:
    """The segments one sample speaks for: a folder's, or all of a loggerd route's
    (``<route>--<n>`` folders side by side were written by one program)."""
    parent, name = os.path.split(folder)
    match = _ROUTE_SEGMENT.match(name)
    return (parent, match.group(1)) if match else (folder, "")


class LocalFiles:
    """What :func:`check_paths` reads, from the local file system: a folder's index
    document and a segment file (its path, opened by the sampler)."""

    def index(self, folder: str) -> dict[str, Any] | None:
        """``folder``'s index document (:func:`msgq.logs.index.read_index_document`)."""
        return read_index_document(folder)

    def segments(self, paths: list[str]) -> dict[str, str | BinaryIO]:
        """The segment files ``paths`` to sample, by path (a path, or a binary file of
        at least their first :data:`SAMPLE_BYTES`)."""
        return {path: path for path in paths}


def _mismatch(where: str, schema: Schema, problem: str, signal: str) -> SchemaMismatchError:
    return SchemaMismatchError(f"{where}: not a log of {_describe(schema)}: {problem} "
                               f"(decided by {signal}); {HINT}", signal)


def check_paths(paths: Iterable[str], schema: Schema, files: Any = None) -> None:
    """:func:`check_schema` over segment files already listed: each folder's index, and
    where no index settles it, the first segment of the folder (of a loggerd route: of
    the route) is sampled. ``files``: what reads the indexes and segments
    (:class:`LocalFiles` by default; the Spark source's Hadoop path passes its own, with
    the same two methods, for URIs)."""
    files = LocalFiles() if files is None else files
    firsts: dict[str, str] = {}
    for path in paths:
        firsts.setdefault(os.path.dirname(path), path)
    sampled: set[tuple[str, str]] = set()
    to_sample: list[str] = []
    for folder, path in firsts.items():
        settled = False
        info = files.index(folder)
        if info is not None:
            settled, problem, signal = _index_verdict(info, schema)
            if problem is not None:
                raise _mismatch(folder, schema, problem, signal)
        group = _sample_group(folder)
        if settled or group in sampled:
            continue
        sampled.add(group)
        to_sample.append(path)
    if not to_sample:
        return
    for path, segment in files.segments(to_sample).items():
        problem, signal = _sample_verdict(_sample(segment, schema), schema)
        if problem is not None:
            raise _mismatch(path, schema, problem, signal)


def check_schema(source: Any, schema: Schema | None = None) -> None:
    """Raises :class:`SchemaMismatchError` (one line naming ``--schema``) when the logs
    of ``source`` (what :class:`~msgq.logs.LogReader` takes) were not written with
    ``schema`` (default: the schema in force), before any work: each folder's index,
    else a sample of the first events of its first segment (see the module docstring).
    Cheap: one small file, or the first events of one segment, per folder."""
    check_paths(segment_paths(source), schema_in_force(schema))
