"""pytest collects src/softk with --doctest-modules (pyproject.toml): the
Triton kernels' modules import triton at module level, so where triton is
not installed they are left out of the collection.  (At the repository
root, not in the package: nothing of the test run ships in the wheel.)"""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("triton") else ["src/softk/_backends/triton/*.py"]
