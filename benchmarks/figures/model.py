"""What a quoted figure is: rows read from a recorded results file, picked by
their fields, one column shown, rounded as the page shows it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parents[1] / "results"


@dataclass(frozen=True)
class Recorded:
    rows: list[dict]
    date: str
    setup: str  # the machine and versions, as far as the file records them


@dataclass(frozen=True)
class Source:
    """One recorded file (or one stage of a GPU run's file) read as tidy rows."""
    file: str  # in benchmarks/results/
    sha256: str  # pinned: a recorded result is not edited afterwards
    command: str
    read: Callable[[Any], Recorded]

    def recorded(self) -> Recorded:
        return _recorded(self)

    def digest(self) -> str:
        return hashlib.sha256((RESULTS / self.file).read_bytes()).hexdigest()


@cache
def _recorded(source: Source) -> Recorded:
    return source.read(json.loads((RESULTS / source.file).read_text(encoding="utf-8")))


@dataclass(frozen=True)
class Figure:
    """The rows of ``source`` whose fields have the values of ``where`` (a value,
    or a tuple of accepted ones), and their ``column``: the value of exactly one
    row, or with ``many`` the range over two or more ("0.43–0.69×"), or with
    ``show="max"`` only their largest (for "at most ...")."""
    source: Source
    where: dict = field(default_factory=dict)
    column: str = "ratio"
    unit: str = "×"
    decimals: int = 2
    scale: float = 1.0  # shown = value × scale (µs as ms, a share as %)
    many: bool = False
    show: str = "range"

    def rows(self) -> list[dict]:
        def accepts(row, name, want):
            return row.get(name) in want if isinstance(want, tuple) else row.get(name) == want

        found = [r for r in self.source.recorded().rows if all(accepts(r, k, v) for k, v in self.where.items())]
        if (len(found) < 2) if self.many else (len(found) != 1):
            raise LookupError(f"{self.source.file} {self.where}: {len(found)} rows, expected "
                              + ("two or more" if self.many else "one"))
        return found

    def values(self) -> list[float]:
        """The figure's values on the page's scale, before rounding."""
        return [float(r[self.column]) * self.scale for r in self.rows()]

    def text(self) -> str:
        values = self.values()
        lo, hi = (f"{v:.{self.decimals}f}" for v in (min(values), max(values)))
        number = hi if self.show == "max" or lo == hi else f"{lo}–{hi}"
        return number + self.unit if self.unit == "×" else f"{number} {self.unit}"


@dataclass(frozen=True)
class Table:
    """Rows of cells: a label (str), a Figure, several Figures (shown "a / b"),
    or None (not measured, shown "—").  All its figures come from ``source``."""
    source: Source
    header: tuple[str, ...]
    rows: tuple[tuple, ...]
