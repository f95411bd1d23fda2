"""The performance figures the documentation quotes, each computed from a
results file recorded in benchmarks/results/, so that no figure is typed by
hand and no two pages disagree.  docs/hooks/figures.py puts them on the pages
(``<!-- figure: KEY -->`` inline, ``<!-- figures: TABLE -->`` a whole table);
tests/docs/test_figures.py checks the built pages against the files.

* sources.py: each recorded file, read as tidy rows, with its command,
  machine and date, and its SHA-256 (a recorded result is not edited: a new
  run is a new file);
* model.py: a figure picks rows of a source by their fields and shows one
  column, the value of one row or the range over several ("0.43–0.69×");
* prose.py: the figures quoted in sentences; tables.py: the tables.

To quote a new run: record its JSON in benchmarks/results/, add it to
sources.py, and point the figures at it."""

from __future__ import annotations

from .model import Figure, Source, Table
from .prose import FIGURES
from .sources import SOURCES
from .tables import TABLES

__all__ = ["FIGURES", "SOURCES", "TABLES", "Figure", "Source", "Table", "figure", "table_cells"]


def table_cells(name: str) -> dict[str, Figure]:
    """Every figure of a table, by the key its cell carries on the page: "TABLE:row.column[.item]"."""
    out = {}
    for r, row in enumerate(TABLES[name].rows):
        for c, cell in enumerate(row):
            if isinstance(cell, Figure):
                out[f"{name}:{r}.{c}"] = cell
            elif isinstance(cell, tuple):
                out.update({f"{name}:{r}.{c}.{i}": f for i, f in enumerate(cell)})
    return out


def figure(key: str) -> Figure:
    """A figure of FIGURES, or a table's cell."""
    return table_cells(key.split(":", 1)[0])[key] if ":" in key else FIGURES[key]
