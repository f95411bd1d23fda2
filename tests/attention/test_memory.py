"""The memory-efficient backend never holds the L x S scores: its peak memory at
L = S = 8192, measured as the process's peak resident memory (VmHWM, reset
through /proc/self/clear_refs) in a fresh process, not by time."""

import json
import os
import sys

import pytest

SCRIPT = r"""
import json, sys, torch
torch.set_num_threads(1)
from softk.attention import checks, op
from softk._backends import kernels

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024

def reset():
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")

def measure(backend, name, L, causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, L, 16, generator=g).requires_grad_() for _ in range(3))
    call = checks.check_call(q, k, v, None, 0.0, causal, None, False, name, None)
    reset(); base = peak()
    out = op.attention(call, None if backend == "reference" else kernels.get("attention", "native"))
    fwd = peak() - base
    reset(); base = peak()
    out.backward(torch.ones_like(out))
    return {"forward": fwd, "backward": peak() - base, "finite": bool(torch.isfinite(q.grad).all())}

# warm up every code path (lazy imports, the first allocations) at a small size
for backend in ("reference", "blockwise"):
    measure(backend, "entmax15", 70, True)
print(json.dumps({"reference_2048": measure("reference", "entmax15", 2048, False),
                  "blockwise_8192": measure("blockwise", sys.argv[1], 8192, True)}))
"""


from .. import safety_net
from ..paths import REPO


def _peaks(name):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    res = safety_net.run([sys.executable, "-c", SCRIPT, name], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("name", ["entmax15", "softmax"])
def test_blockwise_peak_memory_is_far_below_the_scores(name):
    got = _peaks(name)
    # The measurement sees a score matrix: the reference backend at L = S = 2048
    # holds its 16 MiB of float32 scores (and the weights) in both directions.
    small = 2048 * 2048 * 4
    assert got["reference_2048"]["forward"] >= small and got["reference_2048"]["backward"] >= small
    # At L = S = 8192 the scores alone are 256 MiB; the blockwise backend holds a
    # chunk of queries against a block of keys (about 2048 x 512 entries and a
    # few temporaries per entry): well under a quarter of that.
    scores = 8192 * 8192 * 4
    peak = got["blockwise_8192"]
    assert peak["finite"]
    assert peak["forward"] < scores / 4, peak
    assert peak["backward"] < scores / 4, peak
