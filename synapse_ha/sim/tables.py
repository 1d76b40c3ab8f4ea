"""The simulator's fixed-width tables: one row per result, columns declared as a header
and the cell it shows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from synapse_ha.sim.engine import Result

Row = TypeVar("Row")
Column = tuple[str, Callable[[Result], str]]


def results_table(
    columns: Sequence[tuple[str, Callable[[Row], str]]], results: Sequence[Row]
) -> list[str]:
    """The lines of a table of ``results`` (a :class:`Result`, or whatever the columns'
    cells read): the headers, then a row per result, each column as wide as its widest
    cell, two spaces apart."""
    rows = [tuple(header for header, _ in columns)]
    rows += [tuple(cell(r) for _, cell in columns) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
