"""A griffe extension: softk's docstrings are written for Sphinx-style readers
(``code``, :func:`roles`, ``.. math::``, :math:`roles`, bare ``>>>`` examples);
this turns each into Markdown before mkdocstrings renders it, so the API
reference reads like the source and the doctests show as code.  Formulas
become pymdownx.arithmatex's ``$...$`` and ``$$ ... $$``, which the site
typesets with MathJax (docs/hooks/mathjax.py).  The docstrings themselves stay
as they are (pytest runs their examples with --doctest-modules)."""

from __future__ import annotations

import re

from griffe import Extension

_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_ROLE = re.compile(r":(?:py:)?[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def _inline_math(match: re.Match) -> str:
    return "$" + " ".join(match.group(1).split()) + "$"  # one line: a role may wrap


def _markdown(text: str) -> str:
    text = _MATH_ROLE.sub(_inline_math, text)
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith(">>>"):  # a doctest: fence it until the next blank line
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].strip())
                i += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        if stripped.startswith(".. math::"):  # a display formula
            block = [stripped[len(".. math::"):].strip()]
            i += 1
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
                block.append(lines[i].strip())
                i += 1
            while block and not block[-1]:
                block.pop()
            out += ["", f"{indent}$$", *(indent + b for b in block if b), f"{indent}$$", ""]
            continue
        out.append(_LITERAL.sub(r"`\1`", _ROLE.sub(r"`\1`", line)))
        i += 1
    return "\n".join(out)


class RestToMarkdown(Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _markdown(obj.docstring.value)
