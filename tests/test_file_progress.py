"""The test run's progress: one line per finished file, with its counts, on
one process or over xdist's workers (tests/file_progress.py)."""

from __future__ import annotations

import re
import sys

import pytest

from . import safety_net
from .paths import REPO

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from tests import file_progress

def pytest_configure(config):
    file_progress.register(config)
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a.py").write_text("def test_one(): pass\ndef test_two(): pass\n")
    (tmp_path / "test_b.py").write_text(
        "import pytest\ndef test_three(): pass\n@pytest.mark.skip('no')\ndef test_four(): pass\n"
        "def test_five(): assert 1 == 2\n")
    return tmp_path


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"]], ids=["one process", "two workers"])
def test_a_line_per_finished_file_and_no_dots(project, workers):
    r = safety_net.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *workers,
                        str(project)], cwd=project, capture_output=True, text=True)
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    a = re.search(r"^\[ *(\d+)%\] test_a\.py  2 passed  \d+\.\d s$", out, re.MULTILINE)
    b = re.search(r"^\[ *(\d+)%\] test_b\.py  1 failed, 1 passed, 1 skipped  \d+\.\d s$", out, re.MULTILINE)
    assert a and b, out
    assert {int(a.group(1)), int(b.group(1))} & {100}, out   # the last file done is at 100 %
    assert "." not in "".join(line for line in out.splitlines() if set(line.strip()) <= set(".sF[]%0123456789 "))
    assert "F" in out                                        # a failure still shows where it happens


def test_verbose_gives_pytests_own_lines(project):
    r = safety_net.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(project / "test_a.py")],
                       cwd=project, capture_output=True, text=True)
    assert "test_a.py::test_one PASSED" in r.stdout and "2 passed" in r.stdout
    assert not re.search(r"^\[ *\d+%\] test_a\.py  2 passed", r.stdout, re.MULTILINE)
