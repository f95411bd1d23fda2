"""What a reader of the built site sees: examples without doctest machinery,
a copy button that copies the code of a ```pycon block without its prompts
and outputs (so that a paste runs as a script), code lines that fit the
column on the first pages, and no issue numbers."""

from __future__ import annotations

import html
import re

import pytest

from ..paths import REPO


def pages(site):
    return sorted(p for p in site.rglob("index.html") if "assets" not in p.parts)


def test_no_page_shows_doctest_machinery(site):
    for path in pages(site):
        text = html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))
        hits = re.findall(r"# doctest:.*|<torch\._C\.\w+ object at", text)
        assert not hits, f"{path.relative_to(site)}: {hits}"


def test_copy_leaves_out_prompts_and_outputs(site):
    page = (site / "getting-started" / "index.html").read_text(encoding="utf-8")
    # the examples mark prompts and outputs as Pygments' .gp and .go ...
    assert '<span class="gp">&gt;&gt;&gt; </span>' in page and '<span class="go">' in page
    # ... and while Material's copy button reads a block (data-md-copying), they are not displayed
    sheets = [site / href.replace("../", "") for href in re.findall(r'<link rel="stylesheet" href="([^"]+)"', page)]
    rules = "".join(s.read_text(encoding="utf-8") for s in sheets if s.is_file() and "extra" in s.name)
    rules = re.sub(r"/\*.*?\*/", "", rules, flags=re.DOTALL)
    hidden = re.search(r"([^{}]*)\{\s*display:\s*none;?\s*\}", rules)
    assert hidden, rules
    selectors = {" ".join(s.split()) for s in hidden.group(1).split(",")}
    assert {"[data-md-copying] .gp", "[data-md-copying] .go"} <= selectors, selectors


ISSUE = re.compile(r"\b[Ii]ssue \d+|\b[Ii]ssue's\b")


def test_no_page_names_an_issue(site):
    """The site (the included BENCHMARKS.md and EXPERIMENTS.md too) speaks of the
    project's code and measurements, not of the issues that led to them."""
    for path in pages(site):
        text = html.unescape(re.sub(r"<[^>]+>", " ", path.read_text(encoding="utf-8")))
        hits = [m.group(0) for m in ISSUE.finditer(text)]
        assert not hits, f"{path.relative_to(site)}: {hits}"


# About what a code block shows without scrolling in the site's content column at 1400 px.
CODE_WIDTH = 88


@pytest.mark.parametrize("page", ["getting-started.md", "guides/attention.md"])
def test_code_fits_the_column(page):
    """The first pages a new reader opens show every code line whole."""
    long, fenced = [], False
    for number, line in enumerate((REPO / "docs" / page).read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and len(line) > CODE_WIDTH:
            long.append(f"{number}: {line}")
    assert not long, f"docs/{page}: code lines wider than {CODE_WIDTH}:\n" + "\n".join(long)
