"""Type stubs of the log scanner extension (msgq/logs/_scan.pyx)."""

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

END: int
INCOMPLETE: int
BAD_FRAMING: int
NOT_PEEKED: int
FULL: int
VALID: int
ROOT_WHOLE: int

class ScanLayout:
    services: tuple[str, ...]
    def __init__(self, layout: Any) -> None: ...

def scan(
    buf: Any, pos: int, layout: ScanLayout, end: int = -1
) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...

class LogEvent:
    @property
    def data(self) -> bytes: ...
    @property
    def mono_ns(self) -> int: ...
    @property
    def valid(self) -> bool: ...
    @property
    def service(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def offset(self) -> int: ...
    def __init__(
        self, data: bytes, mono_ns: int, valid: bool, service: str, path: str, offset: int
    ) -> None: ...
    def __hash__(self) -> int: ...

def log_events(
    data: bytes, offset: np.ndarray, length: np.ndarray, service: np.ndarray,
    flags: np.ndarray, mono_ns: np.ndarray, names: tuple[str, ...], path: str,
    stream_offset: int, wanted: np.ndarray | None = None, start_mono_ns: int | None = None,
) -> list[LogEvent]: ...

def message_extent(message: Any) -> int | None: ...

class Splitter:
    def __init__(
        self, identify: Callable[[bytes], Any], layout: ScanLayout | None = None,
        raw: bool = False,
    ) -> None: ...
    def split(
        self, chunks: Iterable[Any], path: str, on_problem: Callable[[Any], None],
        skip_corrupt: bool, batch: Callable[..., Any], message: Callable[..., Any],
        problem: Callable[..., Any],
    ) -> Iterator[Any]: ...
