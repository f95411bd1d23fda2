"""A MkDocs hook: ``<!-- include: BENCHMARKS.md -->`` on a line of its own is
replaced by that file of the repository, so the site shows the file where it
is kept (one copy, nothing to drift).  The file's headings move down
one level (its title becomes a section of the page that includes it), and its
links to ``docs/...`` are rewritten relative to that page."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

_INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", re.MULTILINE)


def _demote(text: str) -> str:
    """One more '#' on every heading outside fenced code."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,5} ", line):
            line = "#" + line
        out.append(line)
    return "\n".join(out) + "\n"


def on_page_markdown(markdown, page, config, files):
    root = Path(config.config_file_path).parent
    up = posixpath.relpath(".", posixpath.dirname(page.file.src_uri) or ".")

    def include(match):
        path = root / match.group(1)
        if not path.is_file():
            raise FileNotFoundError(f"{page.file.src_uri}: cannot include {match.group(1)}: no such file")
        text = _demote(path.read_text(encoding="utf-8"))
        return text.replace("](docs/", f"]({up}/" if up != "." else "](")

    return _INCLUDE.sub(include, markdown)
