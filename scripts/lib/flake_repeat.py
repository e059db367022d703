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


def _identity(item: pytest.Item) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What names an item across collections: its function and its parameters (node ids
    cannot be compared: a second collection escapes some parameter ids twice)."""
    callspec = getattr(item, "callspec", None)
    params = () if callspec is None else tuple(
        sorted((key, repr(value)) for key, value in callspec.params.items()))
    return item.name.split("[")[0], params


def _fresh_copies(item: pytest.Item, count: int) -> list[pytest.Item]:
    parent = item.parent
    assert parent is not None
    wanted = _identity(item)
    copies: list[pytest.Item] = []
    for _ in range(count):
        same = [c for c in parent.collect()
                if isinstance(c, pytest.Item) and _identity(c) == wanted]
        if len(same) != 1:
            raise pytest.UsageError(f"flake_repeat: cannot collect {item.nodeid} again")
        copies.append(same[0])
    return copies


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
