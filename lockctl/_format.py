"""How lockctl shows things to people: aligned tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["table"]


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """``rows`` as a table of ``columns`` ((key, header) pairs): a header line, then one line
    per row, each column as wide as its widest cell; numbers right-aligned. No rows: the
    header alone."""
    cells = [[header for _, header in columns]]
    cells += [
        ["" if row.get(key) is None else str(row.get(key)) for key, _ in columns] for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    numeric = [bool(rows) and all(_numeric(row.get(key)) for row in rows) for key, _ in columns]
    out = []
    for line in cells:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(line, widths, numeric, strict=True)
        ]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def _numeric(value: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
        return True
    return False
