"""pytest collects src/softk with --doctest-modules: skip this package's
modules where triton is not installed (they import it at module level)."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("triton") else ["*.py"]
