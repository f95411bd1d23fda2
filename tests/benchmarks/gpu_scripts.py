"""The scripts of benchmarks/gpu/ loaded as modules, for the tests that call their functions."""

import importlib.util

from ..paths import REPO


def load(name):
    """benchmarks/gpu/<name>.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"_{name}_under_test", REPO / "benchmarks" / "gpu" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
