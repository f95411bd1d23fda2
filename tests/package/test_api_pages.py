"""The API reference reads like the guides: the docstrings' formulas are
typeset (MathJax from the site's own copy, so the site works offline), no
formula's subscripts turn into italics, each Returns entry names a type
rather than a piece of its sentence, and no page points at a "module
docstring" the reader cannot open.  Checked on the built site."""

from __future__ import annotations

import html
import re

import pytest

from ..paths import REPO


def api_pages(site):
    return sorted((site / "api").glob("*/index.html"))


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_mathjax_is_served_by_the_site_itself(site):
    page = (site / "api" / "maps" / "index.html").read_text(encoding="utf-8")
    scripts = re.findall(r'<script src="([^"]+)"', page)
    assert any(s.endswith("assets/mathjax/tex-svg.js") for s in scripts), scripts
    assert not [s for s in scripts if s.startswith(("http:", "https:", "//"))], scripts
    assert (site / "assets" / "mathjax" / "tex-svg.js").stat().st_size > 1_000_000
    assert (site / "assets" / "mathjax" / "input" / "tex" / "extensions" / "ams.js").is_file()


def test_the_docstrings_formulas_are_typeset(site):
    page = (site / "api" / "maps" / "index.html").read_text(encoding="utf-8")
    # sparsemax's display formula and softmax's inline one, as arithmatex hands them to MathJax
    assert re.search(r'<div class="arithmatex">\\\[\s*p = \\arg\\min_\{p\\in\\Delta\}', page)
    assert r'<span class="arithmatex">\(p_i = e^{x_i/\tau} / \sum_j e^{x_j/\tau}\)</span>' in page
    for path in api_pages(site):
        text = path.read_text(encoding="utf-8")
        outside = re.sub(r'<(span|div) class="arithmatex">.*?</\1>', "", text, flags=re.DOTALL)
        raw = re.findall(r":math:|\.\. math::|\\(?:arg|langle|frac|sum|tau|lambda)\b", outside)
        assert not raw, f"{path.parent.name}: TeX left untypeset: {raw[:5]}"


def test_no_subscript_becomes_italics(site):
    # "(z_i − μ)_+^{…} / Σ_j (z_j − μ)_" read as _emphasis_ is the typical case
    for path in api_pages(site):
        em = [text_of(e) for e in re.findall(r"<em>(.*?)</em>", path.read_text(encoding="utf-8"), re.DOTALL)]
        bad = [e for e in em if re.search(r"[_^{}Σ]", e)]
        assert not bad, f"{path.parent.name}: {bad}"


def test_each_returns_entry_names_a_type(site):
    # a colon in a Returns section's first line makes the words before it the "type"
    for path in api_pages(site):
        page = path.read_text(encoding="utf-8")
        for section in re.findall(r'doc-section-title">Returns:</span></p>\s*<ul>(.*?)</ul>', page, re.DOTALL):
            for item in re.findall(r'<li class="doc-section-item field-body">\s*(.*?)\s*–', section, re.DOTALL):
                annotation = text_of(item).strip()
                assert not annotation or re.fullmatch(r"[\w.\[\], |]+", annotation), \
                    f"{path.parent.name}: Returns type {annotation!r}"


def test_no_page_points_at_a_module_docstring(site):
    for path in api_pages(site):
        text = text_of(path.read_text(encoding="utf-8"))
        hits = [m.group(0) for m in re.finditer(r".{0,60}module docstring.{0,20}", text)]
        assert not hits, f"{path.parent.name}: {hits}"


def test_support_lists_its_fields(site):
    page = (site / "api" / "maps" / "index.html").read_text(encoding="utf-8")
    section = page[page.index('id="softk.Support"'):page.index('id="softk.properties"')]
    text = " ".join(text_of(section).split())
    assert "Attributes:" in text and "lam (Tensor)" in text and "size (Tensor)" in text, text


def _hook():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rest_docstrings", REPO / "docs" / "hooks" / "rest_docstrings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hook_turns_sphinx_math_into_arithmatex():
    pytest.importorskip("griffe")
    md = _hook()._markdown
    assert md(r"A :math:`\lambda_i` and :math:`a +" "\n" r"   b`.") == r"A $\lambda_i$ and $a + b$."
    assert md("Text.\n\n.. math:: p = q,\n          r = s\n\nMore.").splitlines() == \
        ["Text.", "", "", "$$", "p = q,", "r = s", "$$", "", "More."]


def test_no_page_sends_the_reader_into_a_private_module(site):
    for path in api_pages(site):
        private = sorted(set(re.findall(r"\bsoftk\._\w[\w.]*", text_of(path.read_text(encoding="utf-8")))))
        assert not private, f"{path.parent.name}: {private}"
