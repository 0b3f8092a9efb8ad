"""The CLI's tables: a header row and rows of cells, each column padded to its widest
cell (kafka-consumer-groups.sh and kafka-transactions.sh print theirs so), so a reader
lines them up by eye and a script splits them on whitespace."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def print_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Print ``header`` and ``rows``; a None cell prints as ``-``."""
    table = [tuple(header)] + [tuple("-" if c is None else str(c) for c in r) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
