"""Run the Triton kernels on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported; softk imports
triton lazily (only when the "triton" backend runs), so setting it here, at
collection of this directory, is early enough.
"""

import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="triton is not installed: pip install 'softk[triton]'")
