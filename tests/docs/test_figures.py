"""The performance figures the site shows are the recorded results.

docs/hooks/figures.py computes every figure from benchmarks/results/*.json
through the registry in benchmarks/figures/.  These tests read each figure
back from the built pages and check it against its rows (to the rounding the
page shows), check that every page shows all the figures it asks for and
that the results files are the ones recorded, and that no page of docs/
types a figure by hand."""

from __future__ import annotations

import re

import pytest

from ..paths import REPO
from . import figures

REGISTRY = figures.load()
DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
INLINE = re.compile(r"<!-- figure: (\S+) -->")
TABLE = re.compile(r"^<!-- figures: (\S+) -->$", re.MULTILINE)
SPAN = re.compile(r'<span class="figure" data-figure="([^"]+)"[^>]*>([^<]*)</span>')
SHOWN = re.compile(r"^(?P<lo>\d+(?:\.\d+)?)(?:–(?P<hi>\d+(?:\.\d+)?))?(?P<unit>×| ms| µs| MiB| %)$")


def _name(page):
    return str(page.relative_to(DOCS))


def _built(site, page):
    """The built page of docs/``page`` (the site uses directory URLs)."""
    stem = page.relative_to(DOCS).with_suffix("")
    return site / (stem.parent if stem.name == "index" else stem) / "index.html"


def _asked(page) -> set[str]:
    """The keys of the figures a page's placeholders ask for, every table cell included."""
    text = page.read_text(encoding="utf-8")
    keys = set(INLINE.findall(text))
    for table in TABLE.findall(text):
        keys |= set(REGISTRY.table_cells(table))
    return keys


def check_shown(key: str, shown: str) -> None:
    """``shown`` is the figure ``key`` of the registry, rounded as the page rounds it:
    each number within half a unit of its last digit of the value it stands for."""
    figure = REGISTRY.figure(key)
    m = SHOWN.match(shown)
    assert m, f"{key}: {shown!r} is not a figure"
    assert m["unit"].strip() == figure.unit, f"{key}: {shown!r} is not in {figure.unit}"
    numbers = [m["lo"], m["hi"]] if m["hi"] else [m["lo"]]
    for number in numbers:
        assert len(number.partition(".")[2]) == figure.decimals, f"{key}: {shown!r} has other than {figure.decimals} decimals"
    values = figure.values()
    bounds = [max(values)] if figure.show == "max" else [min(values), max(values)]
    # two numbers: the range's ends; one: every bound rounds to it
    pairs = zip(numbers, bounds) if len(numbers) == 2 else ((numbers[0], b) for b in bounds)
    half_unit = 0.5 * 10.0 ** -figure.decimals
    for number, bound in pairs:
        assert abs(float(number) - bound) <= half_unit * (1 + 1e-9), f"{key}: shows {shown!r}, the rows give {bound}"


def test_the_results_files_are_as_recorded():
    """A results file the documentation quotes is not edited afterwards: a new
    run is a new file, and the figures move to it in benchmarks/figures/."""
    for name, source in REGISTRY.SOURCES.items():
        assert source.digest() == source.sha256, f"{name}: benchmarks/results/{source.file} changed since it was recorded"


def test_every_figure_finds_its_rows():
    keys = [*REGISTRY.FIGURES, *(k for t in REGISTRY.TABLES for k in REGISTRY.table_cells(t))]
    for key in keys:
        values = REGISTRY.figure(key).values()  # raises where a figure finds no row, or too many
        assert values and all(v == v for v in values), key


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_placeholders_name_registered_figures(page):
    text = page.read_text(encoding="utf-8")
    comments = re.findall(r"<!--\s*figures?\b.*?-->", text)
    assert len(comments) == len(INLINE.findall(text)) + len(TABLE.findall(text)), \
        f"{_name(page)}: a malformed placeholder (inline: <!-- figure: KEY -->; a table on its own line): {comments}"
    unknown = [k for k in INLINE.findall(text) if k not in REGISTRY.FIGURES]
    unknown += [t for t in TABLE.findall(text) if t not in REGISTRY.TABLES]
    assert not unknown, f"{_name(page)}: not in benchmarks/figures/: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_pages_show_the_recorded_figures(site, page):
    built = _built(site, page).read_text(encoding="utf-8")
    shown = SPAN.findall(built)
    assert {key for key, _ in shown} == _asked(page), f"{_name(page)}: the figures shown are not those asked for"
    for key, text in shown:
        check_shown(key, text)


def test_a_wrong_figure_is_found():
    key = "cpu.attention.decode"
    check_shown(key, REGISTRY.FIGURES[key].text())
    lo, hi = REGISTRY.FIGURES[key].text().rstrip("×").split("–")
    for wrong in (f"{lo}–{float(hi) + 0.01:.2f}×", f"{float(lo) - 0.01:.2f}–{hi}×", f"{lo}–{hi} ms", f"{lo}×",
                  f"{lo}0–{hi}0×"):
        with pytest.raises(AssertionError):
            check_shown(key, wrong)


# ------------------------------------------------------------------ no figure typed by hand
RANGE = r"(?<![\w.])\d+(?:\.\d+)?(?:\s?[–-]\s?\d+(?:\.\d+)?)?"
# a ratio ("0.5×", "1.24–2.10×") but not a shape ("2×2", "8 × 1024"), and a time
TYPED = re.compile(RANGE + r"\s?×(?!\s?\d)|" + RANGE + r"\s?(?:ms|µs|ns)\b")
# numbers that are not measurements, each with why
EXEMPT = {("guides/numerics.md", "8×"): "an error bound, against mpmath"}


def typed_figures(text: str) -> list[str]:
    """The figures written out in Markdown, outside code and placeholders."""
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"`[^`\n]+`|<!--.*?-->", "", text, flags=re.DOTALL)
    return TYPED.findall(text)


def test_no_page_types_a_figure():
    found, used = [], set()
    for page in PAGES:
        for figure in typed_figures(page.read_text(encoding="utf-8")):
            if (_name(page), figure) in EXEMPT:
                used.add((_name(page), figure))
            else:
                found.append(f"{_name(page)}: {figure}")
    assert not found, ("figures typed by hand; write <!-- figure: KEY --> with KEY in benchmarks/figures/prose.py:\n"
                       + "\n".join(found))
    assert used == set(EXEMPT), f"exemptions that no longer match: {set(EXEMPT) - used}"


def test_the_typed_figure_pattern():
    text = ("took 1.24–2.10× SDPA's time, about 0.5× and 6.5 × the time, 15.2 µs a call, 3.42 ms, 1.5-1.8× faster;\n"
            "not a 2×2 grid, 4 × 10 rows, N × V logits, 8 × 1024 tokens, `0.5×` in code, <!-- figure: a.b -->,\n"
            "```python\nx = 0.5×\n```\n")
    assert typed_figures(text) == ["1.24–2.10×", "0.5×", "6.5 ×", "15.2 µs", "3.42 ms", "1.5-1.8×"]
