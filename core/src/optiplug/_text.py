"""Plain-text formatting shared by reports, ``explain()`` and the CLI (no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["format_table"]


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Format ``rows`` under ``header`` as left-aligned columns.

    Args:
        header: column titles.
        rows: one sequence of cells per row (cells are ``str()``-ed).

    Returns:
        The table as text, one line per row, without trailing spaces.
    """
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
