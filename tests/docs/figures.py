"""benchmarks/figures/, the registry of the figures the documentation quotes,
loaded from its path for the tests (benchmarks/ is not an installed package)."""

from __future__ import annotations

import importlib.util
import sys

from ..paths import REPO

NAME = "softk_figures_under_test"


def load():
    if NAME not in sys.modules:
        init = REPO / "benchmarks" / "figures" / "__init__.py"
        spec = importlib.util.spec_from_file_location(NAME, init, submodule_search_locations=[str(init.parent)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[NAME]
