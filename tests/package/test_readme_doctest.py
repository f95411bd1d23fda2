"""``python -m doctest README.md`` passes: the page is read as one doctest
file, so an expected output runs until a blank line or the next prompt, and a
closing fence right after an output would be read as part of it (the fenced
blocks alone are checked by test_docs.py)."""

import doctest

from ..paths import REPO


def test_the_readme_passes_python_m_doctest():
    result = doctest.testfile(str(REPO / "README.md"), module_relative=False, verbose=False, report=False)
    assert result.attempted > 0
    assert result.failed == 0
