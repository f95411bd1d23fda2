"""A MkDocs hook: the performance figures on any page are computed from the
recorded results (benchmarks/figures/, over benchmarks/results/*.json), never
typed by hand.

* ``<!-- figure: KEY -->`` becomes the figure inline ("0.43–0.69×"), its
  command, machine and date in the tooltip;
* ``<!-- figures: TABLE -->`` on a line of its own becomes the table, under a
  line that names its command, machine, date and results file.

Each figure is wrapped in ``<span class="figure" data-figure="KEY">``, the key
by which tests/docs/test_figures.py finds it on the built page and checks it
against the file.  An unknown key fails the build."""

from __future__ import annotations

import html
import importlib.util
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

_INLINE = re.compile(r"<!-- figure: (\S+) -->")
_TABLE = re.compile(r"^<!-- figures: (\S+) -->$", re.MULTILINE)
_PACKAGE = "softk_docs_figures"  # a private name: the registry is not an importable package of the project


def registry(root: Path, fresh: bool = False):
    """benchmarks/figures/ of the repository at ``root``, loaded from its path
    (again with ``fresh``: ``mkdocs serve`` rebuilds in one process)."""
    if fresh:
        for name in [n for n in sys.modules if n == _PACKAGE or n.startswith(_PACKAGE + ".")]:
            del sys.modules[name]
    if _PACKAGE not in sys.modules:
        init = root / "benchmarks" / "figures" / "__init__.py"
        spec = importlib.util.spec_from_file_location(_PACKAGE, init, submodule_search_locations=[str(init.parent)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[_PACKAGE] = module
        spec.loader.exec_module(module)
    return sys.modules[_PACKAGE]


def _provenance(source) -> str:
    recorded = source.recorded()
    return f"{source.command}; {recorded.setup}; {recorded.date}"


def _span(key: str, figure) -> str:
    return (f'<span class="figure" data-figure="{key}" title="{html.escape(_provenance(figure.source))}">'
            f"{figure.text()}</span>")


def _cell(name: str, r: int, c: int, cell) -> str:
    if cell is None:
        return "—"
    if isinstance(cell, str):
        return cell
    if isinstance(cell, tuple):
        return " / ".join(_span(f"{name}:{r}.{c}.{i}", f) for i, f in enumerate(cell))
    return _span(f"{name}:{r}.{c}", cell)


def table_markdown(name: str, table) -> str:
    recorded = table.source.recorded()
    lines = [f"`{table.source.command}`  ",
             f"{recorded.setup}, {recorded.date}; the rows: `benchmarks/results/{table.source.file}`", "",
             "| " + " | ".join(table.header) + " |",
             "|" + "|".join("---" if c == 0 else "---:" for c in range(len(table.header))) + "|"]
    for r, row in enumerate(table.rows):
        lines.append("| " + " | ".join(_cell(name, r, c, cell) for c, cell in enumerate(row)) + " |")
    return "\n".join(lines) + "\n"


def on_config(config):
    registry(Path(config.config_file_path).parent, fresh=True)


def on_page_markdown(markdown, page, config, files):
    figures = registry(Path(config.config_file_path).parent)

    def table(match):
        if match.group(1) not in figures.TABLES:
            raise PluginError(f"{page.file.src_uri}: no table {match.group(1)!r} in benchmarks/figures/tables.py")
        return table_markdown(match.group(1), figures.TABLES[match.group(1)])

    def inline(match):
        if match.group(1) not in figures.FIGURES:
            raise PluginError(f"{page.file.src_uri}: no figure {match.group(1)!r} in benchmarks/figures/prose.py")
        return _span(match.group(1), figures.FIGURES[match.group(1)])

    return _INLINE.sub(inline, _TABLE.sub(table, markdown))
