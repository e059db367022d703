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
from itertools import chain
from typing import Any

import numpy as np

from msgq.logs._scan import LogEvent, log_events
from msgq.logs.index import IndexCache
from msgq.logs.schema_check import check_paths
from msgq.logs.segment import ROOT_WHOLE, LogProblem, MessageBatch, read_batches
from msgq.logs.sources import segment_paths
from msgq.schemas import Schema, schema_in_force
from msgq.schemas.events import MessageDecodeError, decode_event
from msgq.schemas.schema import traversal_limit
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

    def _decode(self, data: bytes) -> Any:
        try:
            return decode_event(data, self.schema)
        except MessageDecodeError:
            return None

    # -- iteration ------------------------------------------------------------------

    def _wanted(self) -> np.ndarray | None:
        """Per service index of the layout, whether this reader wants it (None: all)."""
        if self.services is None:
            return None
        return np.array([name in self.services for name in self.schema.layout.services],
                        np.uint8)

    def _segment_items(self, path: Any) -> Iterator[tuple[str, MessageBatch | LogEvent]]:
        """(segment name, batch or single event) of one segment, in file order; a batch
        is unfiltered, a single event is filtered already."""
        wanted = self.services
        start = self.start_mono_ns
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else \
            str(getattr(path, "name", "<in-memory segment>"))
        for item in read_batches(path, self._on_problem, self.skip_corrupt,
                                 self.schema.layout):
            if type(item) is MessageBatch:
                yield name, item
                continue
            mono, valid, service = item.identity
            if wanted is not None and service not in wanted:
                continue
            if start is not None and mono < start:
                continue
            yield name, LogEvent(item.data, mono, valid, service, name, item.offset)

    def segment_batches(self, path: Any) -> Iterator[MessageBatch | LogEvent]:
        """One segment as the scanner hands it over, for tools that work on whole runs of
        events (numpy arrays of offset, length, service index, flags and logMonoTime over
        the decompressed bytes; see :class:`msgq.logs.segment.MessageBatch`): a batch is
        not filtered (apply ``services`` / ``start_mono_ns`` to its arrays), an event the
        scanner left to pycapnp comes as a :class:`LogEvent`, filtered. Damage handling
        and problems are this reader's, as for :meth:`segment_events`."""
        for _, item in self._segment_items(path):
            yield item

    def segment_events(self, path: Any) -> Iterator[LogEvent]:
        """The events of one segment (a path, or a seekable binary file such as an
        ``io.BytesIO`` of a segment's bytes, named by its ``name``), in file order, with
        this reader's service and time filters and damage handling; no path listing and
        no index."""
        return chain.from_iterable(self._event_lists(path))

    def _event_lists(self, path: Any) -> Iterator[list[LogEvent]]:
        """The events of one segment, a list per batch (chained, they cost no Python
        frame per event)."""
        wanted = self._wanted()
        start = self.start_mono_ns
        for name, item in self._segment_items(path):
            if type(item) is MessageBatch:
                yield log_events(item.data, item.offset, item.length, item.service,
                                 item.flags, item.mono_ns, item.services, name,
                                 item.stream_offset, wanted, start)
            else:
                yield [item]

    def paths_to_read(self) -> list[str]:
        """The segment files this reader reads, in order: :attr:`paths` less those whose
        sealed index entry says they hold nothing it wants (every event before
        ``start_mono_ns``, none of ``services``). For tools that read segment by segment
        (:meth:`segment_batches`, :meth:`segment_events`) and want the reader's choice."""
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
        return chain.from_iterable(self._raw_runs())

    def _opened(self) -> tuple[list[str], bool]:
        """The paths to read (schema-checked) and whether they must be merged by time:
        with ``sort``, unless their index entries say that no segment holds an event
        earlier than one of the segment before it (then the merge is reading them one
        after another: heapq.merge takes the earlier segment first on a tie)."""
        paths = self.paths_to_read()
        if self.check_schema:
            check_paths(paths, self.schema)
        return paths, self.sort and len(paths) > 1 and not self._in_order(paths)

    def _in_order(self, paths: list[str]) -> bool:
        indexes = self._indexes if self._indexes is not None else IndexCache()
        last = None
        for path in paths:
            entry = indexes.entry(path)  # sealed: the entry describes the file as it is
            if entry is None:
                return False
            if not entry.events:
                continue
            if last is not None and entry.first_mono_ns < last:
                return False
            last = entry.last_mono_ns
        return True

    def _raw_runs(self) -> Iterator[Iterable[LogEvent]]:
        paths, merge = self._opened()
        if merge:
            yield heapq.merge(*(self.segment_events(p) for p in paths),
                              key=lambda e: e.mono_ns)
            return
        for path in paths:
            yield self.segment_events(path)

    def __iter__(self) -> Iterator[Any]:
        return chain.from_iterable(self._decoded_runs(False))

    def decoded_events(self) -> Iterator[tuple[str, int, int, Any]]:
        """``(service, logMonoTime, size in bytes, Event reader)`` of every event: what
        iterating gives, with what the scanner peeked of each (for tools that need the
        event's service, time and size beside its reader, without a copy of its bytes)."""
        return chain.from_iterable(self._decoded_runs(True))

    def _merged_decoded(self, paths: list[str], detailed: bool) -> Iterator[Any]:
        for event in heapq.merge(*(self.segment_events(p) for p in paths),
                                 key=lambda e: e.mono_ns):
            msg = self.decode(event)
            if msg is not None:
                yield (event.service, event.mono_ns, len(event.data), msg) if detailed \
                    else msg

    def decode(self, event: LogEvent) -> Any:
        """The Event reader of ``event`` (one of this reader's: :meth:`raw`,
        :meth:`segment_events`, a :class:`LogEvent` of :meth:`segment_batches`), or None
        when its bytes do not decode; that is reported as this reader reports damage:
        listed in :attr:`corrupt` (file and offset, "an event that does not decode"),
        with a :class:`CorruptLogWarning` unless ``warn=False``, and raised as
        :class:`LogCorruptionError` without ``skip_corrupt``."""
        msg = self._decode(event.data)
        if msg is None:
            self._on_problem(LogProblem(event.path, "corrupt", event.offset, event.offset,
                                        "an event that does not decode"))
        return msg

    @staticmethod
    def traversal_limit(largest_message_size: int) -> int:
        """The traversal limit (words) that :meth:`msgq.schemas.Schema.decode` gives a
        message of ``largest_message_size`` bytes (4 words per word of it, at least
        capnp's default of 8 Mi words): what this reader passes to pycapnp's
        ``read_multiple_bytes`` for a run of messages, the largest one's for all."""
        return traversal_limit(largest_message_size)

    def _decoded_runs(self, detailed: bool) -> Iterator[Iterable[Any]]:
        """The Event readers of every segment, an iterable per run of messages: each
        batch's wanted run read by pycapnp's ``read_multiple_bytes`` over the batch's
        bytes (lazy readers of one buffer, the traversal limit of the run's largest
        message for each; chained, they cost no Python frame per event), a message whose
        root the scanner found broken decoded alone (and reported). ``detailed``: each
        reader comes as (service, logMonoTime, size, reader)."""
        paths, merge = self._opened()
        if merge:
            yield self._merged_decoded(paths, detailed)
            return
        wanted = self._wanted()
        start = self.start_mono_ns
        for path in paths:
            for name, item in self._segment_items(path):
                if type(item) is not MessageBatch:
                    msg = self.decode(item)
                    if msg is not None:
                        yield ((item.service, item.mono_ns, len(item.data), msg),) \
                            if detailed else (msg,)
                    continue
                keep = (item.flags & ROOT_WHOLE) != 0
                if wanted is not None:
                    keep &= wanted[item.service] != 0
                if start is not None:
                    keep &= item.mono_ns >= max(start, 0)
                view = memoryview(item.data)
                if keep.all():
                    yield self._run(item, view, 0, len(item), detailed)
                    continue
                # runs of kept messages (edges where keep changes), and the broken roots
                edges = np.flatnonzero(np.diff(keep.view(np.int8), prepend=0, append=0))
                broken = set(np.flatnonzero((item.flags & ROOT_WHOLE) == 0).tolist())
                first = 0
                for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
                    yield self._broken(item, name, broken, first, a, detailed)
                    yield self._run(item, view, a, b, detailed)
                    first = b
                yield self._broken(item, name, broken, first, len(item), detailed)

    def _run(self, batch: MessageBatch, view: memoryview, a: int, b: int,
             detailed: bool) -> Iterable[Any]:
        """The readers of messages ``a`` to ``b`` of ``batch`` (whole roots, back to back):
        one read_multiple_bytes over their bytes."""
        begin = int(batch.offset[a])
        end = int(batch.offset[b - 1]) + int(batch.length[b - 1])
        lengths = batch.length[a:b]
        readers = self.schema.event.read_multiple_bytes(
            view[begin:end], traversal_limit_in_words=self.traversal_limit(int(lengths.max())))
        if not detailed:
            return readers
        names = batch.services
        return zip([names[i] for i in batch.service[a:b].tolist()],
                   batch.mono_ns[a:b].tolist(), lengths.tolist(), readers, strict=True)

    def _broken(self, batch: MessageBatch, name: str, broken: set[int], first: int,
                end: int, detailed: bool) -> list[Any]:
        """Decodes (and so reports) the messages of ``batch`` from ``first`` to ``end``
        whose root the scanner found broken and that this reader wants."""
        found = []
        for i in sorted(b for b in broken if first <= b < end):
            if self.services is not None and \
                    batch.services[batch.service[i]] not in self.services:
                continue
            if self.start_mono_ns is not None and batch.mono_ns[i] < self.start_mono_ns:
                continue
            at, length = int(batch.offset[i]), int(batch.length[i])
            event = LogEvent(batch.data[at:at + length], int(batch.mono_ns[i]),
                             bool(batch.flags[i] & 1), batch.services[batch.service[i]], name,
                             batch.stream_offset + at)
            msg = self.decode(event)
            if msg is not None:
                found.append((event.service, event.mono_ns, length, msg) if detailed else msg)
        return found

