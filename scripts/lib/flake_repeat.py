"""A pytest plugin for scripts/flake-check.sh: runs every collected test FLAKE_REPEAT
times in a row in one pytest process (``-p flake_repeat`` with scripts/lib on
PYTHONPATH), so a test can be run hundreds of times without paying pytest's start-up
each time.

Each repetition is a freshly collected item (plain functions, parametrized cases and
unittest methods alike), so function-scoped fixtures and TestCase instances are made
anew every time; the reports keep the test's own node id.
"""

from __future__ import annotations

import os

import pytest


def _repeat() -> int:
    raw = os.environ.get("FLAKE_REPEAT", "1").strip() or "1"
    try:
        count = int(raw)
    except ValueError:
        raise pytest.UsageError(f"FLAKE_REPEAT={raw!r} is not a whole number") from None
    if count < 1:
        raise pytest.UsageError(f"FLAKE_REPEAT={count}: give 1 or more")
    return count


# Where each collected item lies among its parent's items, taken before -k/-m deselect
# any (a fresh collection of the parent lists the same items in the same order; node ids
# cannot be compared, the second collection escapes some parameter ids twice).
_positions: dict[int, int] = {}


def _fresh_copies(item: pytest.Item, count: int) -> list[pytest.Item]:
    parent = item.parent
    assert parent is not None
    position = _positions.get(id(item))
    copies: list[pytest.Item] = []
    for _ in range(count):
        siblings = [c for c in parent.collect() if isinstance(c, pytest.Item)]
        if position is None or position >= len(siblings) or siblings[position].name.split(
                "[")[0] != item.name.split("[")[0]:
            raise pytest.UsageError(f"flake_repeat: cannot collect {item.nodeid} again")
        copies.append(siblings[position])
    return copies


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Notes each item's place among its parent's items (before any deselection)."""
    seen: dict[int, int] = {}
    for item in items:
        key = id(item.parent)
        _positions[id(item)] = seen.get(key, 0)
        seen[key] = seen.get(key, 0) + 1


class _Repeater:
    @pytest.hookimpl(trylast=True)  # after -k/-m deselected what is not wanted
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        """Replaces each item by itself and FLAKE_REPEAT - 1 fresh copies, in a row."""
        count = _repeat()
        if count == 1:
            return
        items[:] = [run for item in items
                    for run in [item, *_fresh_copies(item, count - 1)]]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Repeater(), "flake_repeat_runner")
