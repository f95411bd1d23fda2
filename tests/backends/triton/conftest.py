"""Run the Triton kernels on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported; softk imports
triton lazily (only when the "triton" backend runs), so setting it here, at
collection of this directory, is early enough.
"""

import os
import pathlib

import pytest

os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="triton is not installed: pip install 'softk[triton]'")

_HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(items):
    # The interpreter evaluates both sides of every tl.where with NumPy, so a
    # step that is NaN/inf by design (a Newton proposal the kernel then
    # rejects) warns there, and its tl.max over a row the tests make NaN on
    # purpose warns from NumPy's reduce; on a GPU nothing is raised.
    for item in items:
        if _HERE in pathlib.Path(item.path).parents:
            item.add_marker(pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter"))
            item.add_marker(pytest.mark.filterwarnings(
                "ignore:invalid value encountered in reduce:RuntimeWarning:numpy._core.fromnumeric"))
