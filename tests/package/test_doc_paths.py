"""Every repository path the documentation names exists.

README.md, BENCHMARKS.md, EXPERIMENTS.md and docs/**/*.md point readers at
tests, sources and benchmark scripts by path (``tests/...py``,
``src/softk/...``, ``benchmarks/...``, ``docs/...``, and ``softk/...``, a
path under ``src/``); a file that moves leaves
such a pointer stale, and nothing else would notice.  ``{a,b}`` in a path
stands for each alternative, ``*`` for any name, as a shell reads them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..paths import REPO

PAGES = [REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "EXPERIMENTS.md", *sorted((REPO / "docs").rglob("*.md"))]
# a path from the repository's root: not inside another path (../shared/...)
# nor a URL, and its last character not the sentence's full stop or comma
PATH = re.compile(r"(?<![\w./~-])(?:tests|src/softk|softk|benchmarks|docs)/[\w./{},*-]*[\w/*}]")


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [e for alt in m.group(1).split(",") for e in _expand(path[: m.start()] + alt + path[m.end():])]


def named_paths(text: str) -> list[str]:
    """The repository paths named in ``text``, braces expanded."""
    return [e for m in PATH.finditer(text) for e in _expand(m.group(0))]


def exists(path: str, root: Path = REPO) -> bool:
    if path.startswith("softk/"):
        root = root / "src"
    return any(root.glob(path.rstrip("/"))) if "*" in path else (root / path).exists()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_named_exists(page):
    missing = sorted({p for p in named_paths(page.read_text(encoding="utf-8")) if not exists(p)})
    assert not missing, f"{page.relative_to(REPO)} names paths that do not exist: {missing}"


def test_the_paths_are_found_as_a_reader_writes_them():
    text = ("see `tests/maps/test_edges.py`, src/softk/_cli/ and "
            "benchmarks/results/run{1,2}.{json,md}. Not ../shared/data/tests/x.py nor https://a.b/tests/y.py")
    assert named_paths(text) == ["tests/maps/test_edges.py", "src/softk/_cli/", "benchmarks/results/run1.json",
                                 "benchmarks/results/run1.md", "benchmarks/results/run2.json",
                                 "benchmarks/results/run2.md"]
    assert exists("tests/maps/test_edges.py") and exists("src/softk/_cli/") and exists("tests/*/test_edges.py")
    assert not exists("tests/test_edges.py") and not exists("tests/*/test_no_such_file.py")
    assert named_paths("in `softk/_cli/compare.py`") == ["softk/_cli/compare.py"]
    assert exists("softk/_cli/compare.py") and not exists("softk/_cli/no_such_module.py")
