"""Type stubs of the cache-bound model (msgq/bench/_bound.pyx)."""

SLOTS: int
WINDOW: int

def cache_bound(size: int, seconds: float = 0.1, rounds: int = 5) -> float: ...
