"""pytest collects src/softk with --doctest-modules (pyproject.toml): the
Triton kernels' modules import triton at module level, so where triton is
not installed they are left out of the collection.  The test run prints a line
per finished file (tests/file_progress.py).  (At the repository root, not in the
package: nothing of the test run ships in the wheel.)"""

import importlib.util

from tests import file_progress

collect_ignore_glob = [] if importlib.util.find_spec("triton") else ["src/softk/_backends/triton/*.py"]


def pytest_configure(config):
    file_progress.register(config)
