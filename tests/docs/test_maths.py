"""Maths on the site is typeset: no TeX left raw outside a formula.

A formula is written as ``$...$`` or ``$$...$$`` in the pages and as
``:math:`...``` or ``.. math::`` in the docstrings (docs/hooks/rest_docstrings.py
turns those into the same), and MathJax typesets it.  Written as plain text,
``e^{-u}``, ``Σ_{i∈S}`` or ``\\frac`` reach the reader as they are.  The pages'
sources are read, and then every built page as a reader gets it, the API
reference's docstrings and the included BENCHMARKS.md and EXPERIMENTS.md too.
Display formulas scroll sideways where they are wider than the column."""

from __future__ import annotations

import html
import re

import pytest

from ..paths import REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
# a superscript or subscript written as TeX or as a caret ("e^u", "p^α"), and \frac
RAW = re.compile(r"\S*(?:\S\^|_\{|\\frac)\S*")
# text that is not in this repository's docs/ (EXPERIMENTS.md is included by
# guides/experiments.md) and still writes a formula as text, each with the page it shows on
EXEMPT: set = set()


def raw_in_markdown(text: str) -> list[str]:
    """TeX outside code, comments and $...$ / $$...$$ in a Markdown page."""
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"`[^`\n]+`|<!--.*?-->|\$\$.*?\$\$|\$[^$\n]+\$", "", text, flags=re.DOTALL)
    return RAW.findall(text)


def raw_in_html(page: str) -> list[str]:
    """TeX outside code and typeset maths in a built page, as a reader sees its text."""
    page = re.sub(r"<(pre|code|script|style)\b.*?</\1>", " ", page, flags=re.DOTALL)
    page = re.sub(r'<(span|div) class="arithmatex">.*?</\1>', " ", page, flags=re.DOTALL)
    return RAW.findall(html.unescape(re.sub(r"<[^>]+>", " ", page)))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_pages_write_maths_as_maths(page):
    found = raw_in_markdown(page.read_text(encoding="utf-8"))
    assert not found, f"docs/{page.relative_to(DOCS)}: TeX outside $...$: {found}"


def test_the_built_site_shows_no_raw_tex(site):
    found, exempt = [], set()
    for path in sorted(site.rglob("index.html")):
        page = str(path.parent.relative_to(site))
        for token in raw_in_html(path.read_text(encoding="utf-8")):
            (exempt.add if (page, token) in EXEMPT else found.append)((page, token))
    assert not found, "TeX outside a formula on the built site:\n" + "\n".join(f"{p}: {t}" for p, t in found)
    assert exempt == EXEMPT, f"exemptions that no longer match: {EXEMPT - exempt}"


def test_the_raw_tex_finders():
    text = "p_i ∝ e^{x_i} and e^u, but $e^{x}$, $$\\frac{a}{b}$$, `x^{2}`, <!-- a^{b} -->\n```\nz_{1}\n```\n"
    assert raw_in_markdown(text) == ["e^{x_i}", "e^u,"]
    built = '<p>sum Σ_{i} and <span class="arithmatex">\\(e^{x}\\)</span> <code>a^b</code> x^2</p>'
    assert raw_in_html(built) == ["Σ_{i}", "x^2"]


def test_display_maths_scrolls_sideways(site):
    """A display formula wider than the content column scrolls instead of being cut off."""
    rules = re.sub(r"/\*.*?\*/", "", (site / "assets" / "extra.css").read_text(encoding="utf-8"), flags=re.DOTALL)
    blocks = re.findall(r"([^{}]*)\{([^{}]*)\}", rules)
    scrolling = [sel for sel, body in blocks if re.search(r"overflow-x:\s*auto", body)]
    assert any('mjx-container[display="true"]' in sel for sel in scrolling), scrolling
