"""LogReader: events from log segments, streamed in time order.

A source is a segment file, a recording folder (its segments in order), a glob, or a list
of any of those; logs written the way openpilot's loggerd writes them too (``rlog.zst``,
``rlog.bz2``, a raw ``rlog``, ``qlog*``; a route segment folder ``<route>--<n>`` or a
folder of them, read in segment order). Reading streams: memory stays bounded whatever
the size of the logs.

Before the first event, the logs are checked against the schema
(:func:`msgq.logs.check_schema`): a log written with another schema raises
:class:`~msgq.logs.SchemaMismatchError` instead of being read under wrong names.

Damage (see :mod:`msgq.logs.segment`):

* a truncated last message: every complete event is returned, a
  :class:`TruncatedLogWarning` is issued and the problem is listed in ``reader.truncated``;
* corruption in the middle: :class:`LogCorruptionError` naming file and byte offset, after
  every event before it; with ``skip_corrupt=True`` a warning instead, the problem listed in
  ``reader.corrupt``, and reading goes on at the next readable event.
"""

from __future__ import annotations

import heapq
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from msgq.logs.index import IndexCache
from msgq.logs.schema_check import check_paths
from msgq.logs.segment import LogProblem, read_messages
from msgq.logs.sources import segment_paths
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.events import MessageDecodeError, decode_event
from msgq.schemas.services import unknown_service_error

__all__ = ["LogCorruptionError", "LogEvent", "LogReader", "TruncatedLogWarning",
           "segment_paths"]  # segment_paths: msgq.logs.sources, kept importable here

class LogCorruptionError(ValueError):
    """Damaged data in the middle of a log (``problem`` says where)."""

    def __init__(self, problem: LogProblem) -> None:
        super().__init__(f"{problem} (pass skip_corrupt=True to skip to the next readable "
                         "event)")
        self.problem = problem


class TruncatedLogWarning(UserWarning):
    """A log ends inside a message (the complete events before it were read)."""


class CorruptLogWarning(UserWarning):
    """Damaged data was skipped (``skip_corrupt=True``)."""


@dataclass(frozen=True)
class LogEvent:
    """One event's bytes with the fields every tool needs, read without decoding."""

    data: bytes
    mono_ns: int
    valid: bool
    service: str
    path: str
    offset: int  # in the segment's uncompressed stream


class LogReader:
    """Iterates the events of ``source`` (Event readers; ``raw()`` gives :class:`LogEvent`).

    ``services``: only these services (others are skipped without decoding).
    ``sort``: merge segments by logMonoTime (each segment is read in file order, which the
    recorder writes in arrival order); otherwise segments follow one another.
    ``start_mono_ns``: skip events before this time (whole segments, via the recording
    index, without reading them). ``skip_corrupt``: see the module docstring.
    ``warn=False``: damage is only listed in ``truncated`` / ``corrupt``, no warning is
    issued (for tools that report it themselves). ``indexes``: an
    :class:`~msgq.logs.index.IndexCache` to share between readers of the same recordings
    (each index is read, and each segment's seal checked, once). ``schema``: default the
    schema in force. ``check_schema=False``: the caller already called
    :func:`msgq.logs.check_schema` on these logs (otherwise iteration does it first and
    raises :class:`~msgq.logs.SchemaMismatchError` for logs of another schema).
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        services: Iterable[str] | None = None,
        sort: bool = False,
        skip_corrupt: bool = False,
        start_mono_ns: int | None = None,
        schema: Schema | None = None,
        *,
        warn: bool = True,
        indexes: IndexCache | None = None,
        check_schema: bool = True,
    ) -> None:
        self.schema = schema_in_force(schema)
        self.check_schema = check_schema
        self.warn = warn
        self._indexes = indexes
        self.paths = segment_paths(source)
        self.services = None if services is None else frozenset(services)
        for service in self.services or ():
            self._check_member(service)
        self.sort = sort
        self.skip_corrupt = skip_corrupt
        self.start_mono_ns = start_mono_ns
        self.truncated: list[LogProblem] = []
        self.corrupt: list[LogProblem] = []

    def _check_member(self, service: str) -> None:
        if service not in self.schema.union_fields:
            raise unknown_service_error(service, self.schema.union_fields)

    # -- problems -------------------------------------------------------------------

    def _on_problem(self, problem: LogProblem) -> None:
        if problem.kind == "truncated":
            self.truncated.append(problem)
            if self.warn:
                warnings.warn(str(problem), TruncatedLogWarning, stacklevel=4)
            return
        self.corrupt.append(problem)
        if not self.skip_corrupt:
            raise LogCorruptionError(problem)
        if self.warn:
            warnings.warn(f"{problem}; skipped to the next readable event", CorruptLogWarning,
                          stacklevel=4)

    def _identify(self, data: bytes) -> tuple[int, bool, str] | None:
        """(logMonoTime, valid, service) of bytes read_messages split off a stream (so
        their framing adds up), or None when they are not an Event."""
        return self.schema.layout.identify(data, True)

    def _decode(self, data: bytes) -> Any:
        try:
            return decode_event(data, self.schema)
        except MessageDecodeError:
            return None

    # -- iteration ------------------------------------------------------------------

    def segment_events(self, path: Any) -> Iterator[LogEvent]:
        """The events of one segment (a path, or a seekable binary file such as an
        ``io.BytesIO`` of a segment's bytes, named by its ``name``), in file order, with
        this reader's service and time filters and damage handling; no path listing and
        no index."""
        wanted = self.services
        start = self.start_mono_ns
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else \
            str(getattr(path, "name", "<in-memory segment>"))
        for raw in read_messages(path, self._on_problem, self.skip_corrupt, self._identify):
            mono, valid, service = raw.identity
            if wanted is not None and service not in wanted:
                continue
            if start is not None and mono < start:
                continue
            yield LogEvent(raw.data, mono, valid, service, name, raw.offset)

    def _paths_to_read(self) -> list[str]:
        if self.start_mono_ns is None and self.services is None:
            return self.paths
        keep = []
        indexes = self._indexes if self._indexes is not None else IndexCache()
        for path in self.paths:
            entry = indexes.entry(path)
            if entry is not None:
                if self.start_mono_ns is not None and entry.last_mono_ns < self.start_mono_ns:
                    continue
                if self.services is not None and not self.services & set(entry.counts):
                    continue
            keep.append(path)
        return keep

    def raw(self) -> Iterator[LogEvent]:
        """The events as :class:`LogEvent` (bytes plus time, validity, service)."""
        paths = self._paths_to_read()
        if self.check_schema:
            check_paths(paths, self.schema)
        if self.sort and len(paths) > 1:
            yield from heapq.merge(*(self.segment_events(p) for p in paths),
                                   key=lambda e: e.mono_ns)
        else:
            for path in paths:
                yield from self.segment_events(path)

    def __iter__(self) -> Iterator[Any]:
        for event in self.raw():
            msg = self._decode(event.data)
            if msg is None:
                self._on_problem(LogProblem(event.path, "corrupt", event.offset, event.offset,
                                            "an event that does not decode"))
                continue
            yield msg
