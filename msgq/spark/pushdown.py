"""Filter pushdown of the msgqlog source: what a query's filters let the reader skip.

Spark hands the source the conjuncts of a query's ``WHERE`` (:meth:`DataSourceReader.
pushFilters`, PySpark 4.1+); :func:`push` keeps those the reader decides exactly and
returns the others, which Spark then applies itself. The kept ones become one
:class:`EventFilter` (plain data: pickled to the executors), used twice:

* per segment file, in the planner: a file whose path or segment number fails, or whose
  *sealed* index entry (:class:`msgq.logs.index.IndexCache`) says it holds none of the
  wanted services or no event in the time window, is left out unread;
* per event, in the reader: from the fields peeked before decoding (service, logMonoTime,
  valid), so that an event that fails is never decoded, copied or shipped.

Exactness is the rule: the rows a pushed read gives are the rows Spark's own evaluation
of the same filters gives (SQL semantics: a comparison with null is not true, so a filter
on an event column leaves out problem rows, whose event columns are null). What is
pushed: ``service`` (``=``, ``IN``, ``IS NOT NULL``), ``logMonoTime`` (``<``, ``<=``,
``>``, ``>=``, ``=``, ``IN`` of a few, ``BETWEEN`` arrives as two of those, ``IS NOT
NULL``), ``valid`` (``= true/false``, ``NOT valid``), ``file`` (``=``, ``IN``),
``segment`` and ``route`` (``=``, ``IN``, comparisons of segment). Anything else (typed
columns, ``OR``, ``LIKE``, ``<>``) is returned to Spark.

Layer: part of the Spark tool; pyspark's filter classes are imported by :func:`push`
only (the executors unpickle an :class:`EventFilter` without them).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["EventFilter", "push"]

_MAX_LONG = (1 << 63) - 1
_EVENT_COLUMNS = ("service", "logMonoTime", "valid", "offset", "size")


@dataclass(frozen=True)
class EventFilter:
    """The pushed filters of one read, ANDed (None or empty: no condition).

    ``services``: an event's service is one of these. ``min_mono``/``max_mono``: its
    logMonoTime is within (both inclusive). ``valid``: its valid flag is this.
    ``events_only``: problem rows are left out (any pushed filter on an event column
    implies it). ``files``/``routes``: the segment file's path / route is one of these.
    ``segments``: (operator name, value) conditions on the segment number (a file
    without one fails them all). ``none``: nothing can match (``service IN ()``, an
    empty time window)."""

    services: frozenset[str] | None = None
    min_mono: int | None = None
    max_mono: int | None = None
    valid: bool | None = None
    events_only: bool = False
    files: frozenset[str] | None = None
    routes: frozenset[str] | None = None
    segments: tuple[tuple[str, Any], ...] = ()
    none: bool = False
    monos: frozenset[int] | None = field(default=None)

    @property
    def active(self) -> bool:
        """Whether any condition was pushed."""
        return self != EventFilter()

    # -- per file ---------------------------------------------------------------------

    def keeps_file(self, path: str, segment: int | None, route: str | None,
                   entry: Any = None) -> bool:
        """Whether the file at ``path`` may hold a row that passes; ``entry``: its sealed
        index entry (a :class:`msgq.logs.SegmentIndex`), or None when there is none to
        trust. A sealed file is whole (its seal matches its bytes), so it has no problem
        row to keep."""
        if self.none:
            return False
        if self.files is not None and path not in self.files:
            return False
        if self.routes is not None and route not in self.routes:
            return False
        for name, value in self.segments:
            if segment is None or not _COMPARE[name](segment, value):
                return False
        if entry is None:
            return True
        if self.services is not None and not self.services & set(entry.counts):
            return False
        low = self.min_mono if self.min_mono is not None else -1
        high = self.max_mono if self.max_mono is not None else _MAX_LONG
        if self.monos is not None:
            low, high = max(low, min(self.monos)), min(high, max(self.monos))
        if entry.events and (low > -1 or high < _MAX_LONG):
            if entry.last_mono_ns < low or entry.first_mono_ns > high:
                return False
        if self.events_only and entry.events == 0:
            return False
        return True

    # -- per event --------------------------------------------------------------------

    @property
    def checks_events(self) -> bool:
        """Whether events are tested one by one (:meth:`event_test`)."""
        return (self.min_mono is not None or self.max_mono is not None
                or self.valid is not None or self.monos is not None or self.none)

    def event_test(self) -> Callable[[int, bool], bool]:
        """``(logMonoTime, valid) -> passes`` for the peeked fields of an event (the
        service is tested by the reader's service set); a logMonoTime beyond a long is a
        null in the rows, which a time filter leaves out."""
        low = self.min_mono if self.min_mono is not None else -1
        high = min(self.max_mono, _MAX_LONG) if self.max_mono is not None else _MAX_LONG
        valid = self.valid
        monos = self.monos
        if self.none:
            return lambda mono, ok: False
        if monos is not None:
            return lambda mono, ok: mono in monos and low <= mono <= high and (
                valid is None or ok == valid)
        if self.min_mono is None and self.max_mono is None:
            if valid is None:
                return lambda mono, ok: True  # as event_mask: nothing to decide
            return lambda mono, ok: ok == valid
        if valid is None:
            return lambda mono, ok: low <= mono <= high
        return lambda mono, ok: low <= mono <= high and ok == valid

    def event_mask(self, mono_ns: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """:meth:`event_test` over whole arrays (a scanner batch's uint64 logMonoTimes and
        bool valid flags): a bool array, True where the event passes."""
        n = len(mono_ns)
        if self.none:
            return np.zeros(n, bool)
        keep = np.ones(n, bool)
        if self.valid is not None:
            keep &= valid == self.valid
        if self.min_mono is None and self.max_mono is None and self.monos is None:
            return keep  # as event_test: no time bound at all, not even a long's
        low = self.min_mono if self.min_mono is not None else -1
        high = min(self.max_mono, _MAX_LONG) if self.max_mono is not None else _MAX_LONG
        if high < 0 or low > high:
            return np.zeros(n, bool)
        if low > 0:
            keep &= mono_ns >= np.uint64(low)
        keep &= mono_ns <= np.uint64(high)
        if self.monos is not None:
            wanted = np.array(sorted(m for m in self.monos if 0 <= m <= _MAX_LONG), np.uint64)
            keep &= np.isin(mono_ns, wanted)
        return keep

    def services_within(self, services: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """The services to read: ``services`` (the source's option; None: all) narrowed
        to the pushed ones."""
        if self.services is None:
            return services
        if services is None:
            return tuple(sorted(self.services))
        return tuple(s for s in services if s in self.services)


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "eq": operator.eq, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "in": lambda a, b: a in b,
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _narrow(current: frozenset[Any] | None, values: Iterable[Any]) -> frozenset[Any]:
    new = frozenset(values)
    return new if current is None else current & new


def push(filters: list[Any], pushed: EventFilter | None = None
         ) -> tuple[EventFilter, list[Any]]:
    """The filters of ``filters`` (pyspark's :class:`~pyspark.sql.datasource.Filter`
    objects) the reader decides exactly, ANDed into ``pushed``, and the others (the very
    objects, in order) for Spark to apply."""
    # pyspark: the optional spark extra, imported when Spark is used
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
        Not,
    )

    result = pushed or EventFilter()
    rest = []
    bounds = {GreaterThan: "gt", GreaterThanOrEqual: "ge", LessThan: "lt",
              LessThanOrEqual: "le"}
    for f in filters:
        path = getattr(f.child if isinstance(f, Not) else f, "attribute", ())
        column = path[0] if len(path) == 1 else None
        kind = type(f)
        new: EventFilter | None = None
        if column == "service":
            if kind is EqualTo and isinstance(f.value, str):
                new = replace(result, services=_narrow(result.services, [f.value]))
            elif kind is In and all(isinstance(v, str) for v in f.value):
                new = replace(result, services=_narrow(result.services, f.value))
            elif kind is IsNotNull:
                new = result
        elif column == "logMonoTime":
            if kind in bounds and _is_int(f.value):
                value = f.value
                low, high = result.min_mono, result.max_mono
                op = bounds[kind]
                if op in ("gt", "ge"):
                    value = value + 1 if op == "gt" else value
                    low = value if low is None else max(low, value)
                else:
                    value = value - 1 if op == "lt" else value
                    high = value if high is None else min(high, value)
                new = replace(result, min_mono=low, max_mono=high)
            elif kind is EqualTo and _is_int(f.value):
                new = replace(result, monos=_narrow(result.monos, [f.value]))
            elif kind is In and all(_is_int(v) for v in f.value) and len(f.value) <= 1024:
                new = replace(result, monos=_narrow(result.monos, f.value))
            elif kind is IsNotNull:  # logMonoTime is unsigned: null only beyond a long
                new = replace(result, min_mono=max(result.min_mono or 0, 0))
        elif column == "valid":
            if kind is EqualTo and isinstance(f.value, bool):
                value = f.value
            elif kind is Not and type(f.child) is EqualTo and isinstance(f.child.value, bool):
                value = not f.child.value
            else:
                value = None
            if value is not None:
                new = replace(result, valid=value, none=result.none or (
                    result.valid is not None and result.valid != value))
            elif kind is IsNotNull:
                new = result
        elif column in ("offset", "size") and kind is IsNotNull:
            new = result
        elif column == "file":
            if kind is EqualTo and isinstance(f.value, str):
                new = replace(result, files=_narrow(result.files, [f.value]))
            elif kind is In and all(isinstance(v, str) for v in f.value):
                new = replace(result, files=_narrow(result.files, f.value))
            elif kind is IsNotNull or (kind is Not and type(f.child) is EqualTo
                                       and f.child.value == ""):
                new = result  # every row has a file, and no file is named ""
        elif column == "route":
            if kind is EqualTo and isinstance(f.value, str):
                new = replace(result, routes=_narrow(result.routes, [f.value]))
            elif kind is In and all(isinstance(v, str) for v in f.value):
                new = replace(result, routes=_narrow(result.routes, f.value))
        elif column == "segment":
            if kind in bounds and _is_int(f.value):
                new = replace(result, segments=(*result.segments, (bounds[kind], f.value)))
            elif kind is EqualTo and _is_int(f.value):
                new = replace(result, segments=(*result.segments, ("eq", f.value)))
            elif kind is In and all(_is_int(v) for v in f.value):
                new = replace(result,
                              segments=(*result.segments, ("in", frozenset(f.value))))
            elif kind is IsNotNull:
                new = replace(result, segments=(*result.segments, ("ge", -(1 << 31))))
        if new is None:
            rest.append(f)
            continue
        if column in _EVENT_COLUMNS:
            new = replace(new, events_only=True)
        result = new
    if result.services is not None and not result.services:
        result = replace(result, none=True)
    if result.monos is not None and not result.monos:
        result = replace(result, none=True)
    if result.min_mono is not None and result.max_mono is not None \
            and result.min_mono > result.max_mono:
        result = replace(result, none=True)
    return result, rest
