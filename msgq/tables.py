"""Plain-text tables for people: the one table formatter of the library and its commands,
and the short forms of a size and a count they print in them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table", "human_bytes", "plural"]


def format_table(rows: Sequence[Sequence[object]]) -> str:
    """``rows`` (the first is the header) as aligned columns: the first column left-aligned,
    the others right-aligned (they hold numbers), two spaces between columns."""
    cells = [[str(c) for c in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(row[i]) for row in cells if i < len(row))
              for i in range(max(len(row) for row in cells))]
    return "\n".join(
        "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                  for i, c in enumerate(row)).rstrip()
        for row in cells)


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB'; None -> '-'."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, plural unless ``n`` is 1: "1 segment", "3 segments"."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
