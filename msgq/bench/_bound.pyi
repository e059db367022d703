"""Type stubs of the cache-bound models (msgq/bench/_bound.pyx)."""

SLOTS: int
WINDOW: int
VIEW_SLOTS: int
VIEW_WINDOW: int

def cache_bound(size: int, seconds: float = 0.1, rounds: int = 5) -> float: ...
def fanout_bound(
    size: int, subscribers: int, seconds: float = 0.1, rounds: int = 5
) -> float: ...
def view_bound(size: int, seconds: float = 0.1, rounds: int = 5) -> float: ...
