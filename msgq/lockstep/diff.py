"""Comparing two output streams of lockstep runs.

A stream is a :class:`~msgq.lockstep.harness.LockstepResult`, a list of steps (each a
:class:`~msgq.lockstep.harness.StepOutput` or a list of events), or a flat list of events;
an event is an :class:`~msgq.lockstep.harness.OutputEvent`, the bytes of an Event, or an
Event reader/builder. Steps are matched by index, events within a step by position.

Field paths name a field from the Event root: ``logMonoTime``, ``valid``,
``controllerState.lateral.output``. A path covers the field and everything under it, and
list elements are covered by their list's path (``modelOutput.laneLines.x`` is the ``x`` of
every lane line). ``*`` matches any characters (``*.cumLagMs``). Reports show list indices:
``modelOutput.laneLines[1].x[3]``.

* ``mode="fields"`` (default): decodes both events and compares field by field; numbers
  within the path's tolerance (absolute, ``|a - b| <= tolerance``) are equal, NaN equals
  NaN, ignored paths are skipped.
* ``mode="bytes"``: the events must be byte-identical after the ignored fields are reset
  to their defaults (with ``ignore=()``: the bytes as published). Differences are then
  explained field by field. Tolerances do not apply; ignore paths must be exact (no
  ``*``).

``logMonoTime`` is ignored by default, for targets that stamp it from a clock of their own
(``msgq.messaging.new_message`` takes the replayed time of :mod:`msgq.lockstep.clock`, so
outputs made with it match there too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Generic, TypeVar

from msgq.lockstep.harness import LockstepResult, StepOutput
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.events import log_from_bytes

__all__ = [
    "DEFAULT_IGNORE",
    "Difference",
    "OutputDiff",
    "assert_outputs_equal",
    "canonical_bytes",
    "diff_outputs",
]

#: Fields ignored unless told otherwise.
DEFAULT_IGNORE: tuple[str, ...] = ("logMonoTime",)

MODES = ("fields", "bytes")


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Any = _Absent()

V = TypeVar("V")


def _is_pattern(path: str) -> bool:
    return any(c in path for c in "*?[")


class _Rules(Generic[V]):
    """Field path → value, matched on a path or its nearest listed ancestor."""

    def __init__(self, rules: Mapping[str, V]) -> None:
        self.exact = {k: v for k, v in rules.items() if not _is_pattern(k)}
        self.patterns = [(k, v) for k, v in rules.items() if _is_pattern(k)]

    def __bool__(self) -> bool:
        return bool(self.exact or self.patterns)

    def find(self, names: tuple[str, ...]) -> V | None:
        for n in range(len(names), 0, -1):
            path = ".".join(names[:n])
            if path in self.exact:
                return self.exact[path]
            for pattern, value in self.patterns:
                if fnmatchcase(path, pattern):
                    return value
        return None


@dataclass(frozen=True)
class Difference:
    """One difference: where (``step``: step index, ``"startup"`` or None in a flat
    stream; ``index``: position of the event in its step; ``service``) and what
    (``path``: a field path, or ``<steps>``, ``<events>``, ``<service>``, ``<bytes>``;
    ``a`` and ``b``: the two values)."""

    step: int | str | None
    index: int | None
    service: str | None
    path: str
    a: Any
    b: Any
    note: str = ""

    def where(self) -> str:
        """Step, event and service, as the report prints them."""
        parts = []
        if self.step == "startup":
            parts.append("startup")
        elif self.step is not None:
            parts.append(f"step {self.step}")
        if self.index is not None:
            parts.append(f"event {self.index}")
        text = ", ".join(parts) or "stream"
        return f"{text} ({self.service})" if self.service else text

    def __str__(self) -> str:
        note = f"  [{self.note}]" if self.note else ""
        return f"{self.where()}: {self.path}: a={self.a!r} b={self.b!r}{note}"


@dataclass
class OutputDiff:
    """The result of :func:`diff_outputs`: ``differences`` (the first
    ``max_differences``), ``more`` (how many more were found), ``events_compared``."""

    differences: list[Difference]
    events_compared: int
    more: int = 0
    mode: str = "fields"

    @property
    def equal(self) -> bool:
        """True when the streams match."""
        return not self.differences

    def report(self) -> str:
        """A readable summary: one line per difference."""
        if self.equal:
            return f"output streams match ({self.events_compared} events compared, " \
                   f"mode {self.mode})"
        total = len(self.differences) + self.more
        shown = "" if not self.more else f", the first {len(self.differences)} shown"
        lines = [f"output streams differ: {total} difference{'s' if total != 1 else ''}"
                 f"{shown} ({self.events_compared} events compared, mode {self.mode})"]
        lines += [f"  {d}" for d in self.differences]
        return "\n".join(lines)

    __str__ = report


# --- normalising streams -----------------------------------------------------------------

def _event_bytes(event: Any, schema: Schema) -> tuple[str, bytes]:
    data = getattr(event, "data", None)
    service = getattr(event, "service", None)
    if isinstance(data, bytes) and isinstance(service, str):  # OutputEvent, LogEvent
        return service, data
    if isinstance(event, (bytes, bytearray, memoryview)):
        data = bytes(event)
        identity = schema.layout.identify(data)
        return ("?" if identity is None else identity[2]), data
    if hasattr(event, "which") and hasattr(event, "to_bytes"):
        return str(event.which()), event.to_bytes()
    if hasattr(event, "which") and hasattr(event, "as_builder"):
        return str(event.which()), event.as_builder().to_bytes()
    raise TypeError(f"not an output event: {type(event).__name__} (give OutputEvents, "
                    "Event bytes, readers or builders)")


_Group = tuple[Any, list[tuple[str, bytes]]]


def _groups(stream: Any, schema: Schema) -> list[_Group]:
    """(label, [(service, bytes)]) per step; one group labelled None for a flat list."""
    def events(items: Iterable[Any]) -> list[tuple[str, bytes]]:
        return [_event_bytes(e, schema) for e in items]

    if isinstance(stream, LockstepResult):
        groups: list[_Group] = [("startup", events(stream.startup))] if stream.startup else []
        return groups + [(s.index, events(s.events)) for s in stream.steps]
    items = list(stream)
    if items and all(isinstance(i, StepOutput) for i in items):
        return [(s.index, events(s.events)) for s in items]
    if items and all(isinstance(i, (list, tuple)) for i in items):
        return [(n, events(group)) for n, group in enumerate(items)]
    return [(None, events(items))]


# --- comparing ---------------------------------------------------------------------------

class _Collector:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.found: list[Difference] = []
        self.more = 0

    def add(self, difference: Difference) -> None:
        if len(self.found) < self.limit:
            self.found.append(difference)
        else:
            self.more += 1


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _compare_values(a: Any, b: Any, names: tuple[str, ...], shown: str,
                    ignore: _Rules[bool], tolerances: _Rules[float],
                    report: Any) -> None:
    if names and ignore.find(names):
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            _compare_values(a.get(key, ABSENT), b.get(key, ABSENT), (*names, key),
                            f"{shown}.{key}" if shown else key, ignore, tolerances, report)
        return
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            report(f"{shown} (length)", len(a), len(b), "")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _compare_values(x, y, names, f"{shown}[{i}]", ignore, tolerances, report)
        return
    if _is_number(a) and _is_number(b):
        if a == b or (isinstance(a, float) and isinstance(b, float)
                      and math.isnan(a) and math.isnan(b)):
            return
        tolerance = tolerances.find(names) if tolerances else None
        delta = abs(a - b)
        if tolerance is not None and delta <= tolerance:
            return
        note = f"|a-b|={delta:.3g}" + (f" > tolerance {tolerance:g}" if tolerance is not None
                                       else "")
        report(shown, a, b, note)
        return
    if a != b:
        report(shown, a, b, "")


def _decoded(data: bytes, schema: Schema) -> dict[str, Any] | None:
    try:
        return dict(log_from_bytes(data, schema.event).to_dict())
    except Exception:
        return None


def _field_differences(a: bytes, b: bytes, ignore: _Rules[bool],
                       tolerances: _Rules[float], schema: Schema) -> list[tuple[str, Any, Any,
                                                                                str]]:
    found: list[tuple[str, Any, Any, str]] = []

    def report(path: str, x: Any, y: Any, note: str) -> None:
        found.append((path, x, y, note))

    da, db = _decoded(a, schema), _decoded(b, schema)
    if da is None or db is None:
        if a != b:
            report("<bytes>", f"{len(a)} bytes" + (" (not an Event)" if da is None else ""),
                   f"{len(b)} bytes" + (" (not an Event)" if db is None else ""), "")
        return found
    _compare_values(da, db, (), "", ignore, tolerances, report)
    return found


def _first_difference(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def canonical_bytes(data: bytes, ignore: Iterable[str] = DEFAULT_IGNORE,
                    schema: Schema | None = None) -> bytes:
    """The bytes of an Event with the ``ignore`` fields reset to their defaults (the
    message is decoded and serialised again); with nothing to ignore, ``data`` itself."""
    paths = [p for p in ignore]
    if not paths:
        return bytes(data)
    for path in paths:
        if _is_pattern(path):
            raise ValueError(f"ignore path {path!r}: patterns are not supported in bytes "
                             "mode; name the fields")

    schema = schema_in_force(schema)
    builder = log_from_bytes(data, schema.event).as_builder()
    for path in paths:
        _reset(builder, path.split("."))
    return bytes(builder.to_bytes())


def _reset(obj: Any, parts: list[str]) -> None:
    """Resets the field at ``parts`` under the struct builder ``obj`` to its default
    (every element of a list on the way; nothing when the path is not set)."""
    if hasattr(obj, "__len__") and not hasattr(obj, "schema"):  # a list builder
        for element in obj:
            _reset(element, parts)
        return
    head, rest = parts[0], parts[1:]
    fields = obj.schema.fields
    if head not in fields:
        return
    if head in obj.schema.union_fields and obj.which() != head:
        return  # another member of the union is set
    if rest:
        _reset(getattr(obj, head), rest)
        return
    slot = fields[head].proto.slot
    kind = slot.type.which()
    if kind in ("struct", "list", "text", "data", "anyPointer"):
        if obj._has(head):
            obj.disown(head)
    elif kind != "void":
        default = slot.defaultValue
        setattr(obj, head, getattr(default, default.which()))


def diff_outputs(
    a: Any,
    b: Any,
    *,
    tolerances: Mapping[str, float] | None = None,
    ignore: Iterable[str] = DEFAULT_IGNORE,
    mode: str = "fields",
    max_differences: int = 20,
    schema: Schema | None = None,
) -> OutputDiff:
    """Compares output streams ``a`` and ``b`` (see the module docstring) and returns the
    differences: steps only in one stream, steps with another number of events, events of
    another service, and field (or byte) differences."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if max_differences < 1:
        raise ValueError("max_differences must be at least 1")
    schema = schema_in_force(schema)
    ignore = tuple(ignore)
    ignore_rules: _Rules[bool] = _Rules({p: True for p in ignore})
    tolerance_rules: _Rules[float] = _Rules(dict(tolerances or {}))
    if mode == "bytes":
        if tolerances:
            raise ValueError("tolerances do not apply in bytes mode; use mode='fields'")
        for path in ignore:
            if _is_pattern(path):
                raise ValueError(f"ignore path {path!r}: patterns are not supported in "
                                 "bytes mode; name the fields")
    out = _Collector(max_differences)
    compared = 0

    groups_a, groups_b = _groups(a, schema), _groups(b, schema)
    labels_b = {label: events for label, events in groups_b}
    labels_a = {label for label, _ in groups_a}
    only_a = [label for label, _ in groups_a if label not in labels_b]
    only_b = [label for label, _ in groups_b if label not in labels_a]
    if only_a or only_b:
        out.add(Difference(None, None, None, "<steps>", f"{len(groups_a)} steps",
                           f"{len(groups_b)} steps",
                           "only in a: " + _labels(only_a) + "; only in b: " + _labels(only_b)))

    for label, events_a in groups_a:
        events_b = labels_b.get(label)
        if events_b is None:
            continue
        if len(events_a) != len(events_b):
            out.add(Difference(label, None, None, "<events>",
                               [s for s, _ in events_a], [s for s, _ in events_b],
                               f"{len(events_a)} vs {len(events_b)} events"))
        for index, ((service_a, data_a), (service_b, data_b)) in enumerate(
                zip(events_a, events_b, strict=False)):
            compared += 1
            if service_a != service_b:
                out.add(Difference(label, index, None, "<service>", service_a, service_b))
                continue
            if mode == "bytes":
                if canonical_bytes(data_a, ignore, schema) == canonical_bytes(data_b, ignore,
                                                                              schema):
                    continue
                found = _field_differences(data_a, data_b, ignore_rules, _Rules({}), schema)
                if not found:
                    offset = _first_difference(data_a, data_b)
                    found = [("<bytes>", f"{len(data_a)} bytes", f"{len(data_b)} bytes",
                              f"same fields, first differing byte at offset {offset}")]
            else:
                found = _field_differences(data_a, data_b, ignore_rules, tolerance_rules,
                                           schema)
            for path, x, y, note in found:
                out.add(Difference(label, index, service_a, path, x, y, note))
    return OutputDiff(out.found, compared, out.more, mode)


def _labels(labels: list[Any]) -> str:
    if not labels:
        return "none"
    if len(labels) > 6:
        return ", ".join(map(str, labels[:3])) + f", ... ({len(labels)} in all)"
    return ", ".join(map(str, labels))


def assert_outputs_equal(a: Any, b: Any, **kwargs: Any) -> None:
    """Raises AssertionError with the report of :func:`diff_outputs` when ``a`` and ``b``
    differ (same keyword arguments)."""
    result = diff_outputs(a, b, **kwargs)
    if not result.equal:
        raise AssertionError(result.report())
