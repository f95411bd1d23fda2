"""Build Triton kernels for sm_90 without a GPU (ptxas included), in a
process where TRITON_INTERPRET is unset: the interpreter accepts code that
the compiler rejects (a non-constexpr global, a type that changes across a
loop, a helper's tuple).  One harness for every kernel family's compile test.

A build takes seconds with a warm Triton cache and minutes on a loaded machine
with a cold one, so it has no time limit of its own, only the suite's safety
net (tests/safety_net.py), past which the test skips.  The tests that call it
are marked gpu_build: they are out of the README's test command, which stays
within its stated time on a busy machine, and run with the slow tier after it
(``python -m pytest -n auto -m "slow or gpu_build"``, as .ci/run does).
"""

import os
import sys

import pytest

from ... import safety_net

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


def compile_for_gpu(script: str) -> None:
    """Run PRELUDE + ``script`` (which must end by printing OK) in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = safety_net.run([sys.executable, "-c", PRELUDE + script], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    if r.stdout.startswith("SKIP"):
        pytest.skip("no Triton GPU toolchain here: " + r.stdout.strip())
    assert r.stdout.strip().endswith("OK")
