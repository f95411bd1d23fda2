"""Build Triton kernels for sm_90 without a GPU (ptxas included), in a
process where TRITON_INTERPRET is unset: the interpreter accepts code that
the compiler rejects (a non-constexpr global, a type that changes across a
loop, a helper's tuple).  One harness for every kernel family's compile test.
"""

import os
import subprocess
import sys

import pytest

# ``build(fn, signature, constexprs, warps)`` for the scripts, after a trivial
# kernel has shown that a toolchain (ptxas) exists here; where it does not,
# the script prints SKIP and the test is skipped.
PRELUDE = r'''
import sys, warnings
warnings.simplefilter("ignore")
import importlib, pathlib, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

def build(fn, sig, cs, warps):
    sig = dict(sig, **{c: "constexpr" for c in cs})
    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})

# (@triton.jit needs its source in a file)
tmp = tempfile.mkdtemp()
pathlib.Path(tmp, "probe_copy.py").write_text(
    "import triton\nimport triton.language as tl\n\n@triton.jit\ndef copy(X, Y):\n    tl.store(Y, tl.load(X))\n")
sys.path.insert(0, tmp)
try:
    build(importlib.import_module("probe_copy").copy, {"X": "*fp32", "Y": "*fp32"}, {}, 1)
except Exception as e:
    print("SKIP", type(e).__name__, e)
    sys.exit(0)
'''


def compile_for_gpu(script: str, timeout: int = 300) -> None:
    """Run PRELUDE + ``script`` (which must end by printing OK) in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", PRELUDE + script], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    if r.stdout.startswith("SKIP"):
        pytest.skip("no Triton GPU toolchain here: " + r.stdout.strip())
    assert r.stdout.strip().endswith("OK")
