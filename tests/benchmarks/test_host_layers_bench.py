"""benchmarks/gpu/host_layers.py on the CPU: every layer timed, the backward's
own Python timed where it runs, the cProfile tables of softk's code, and a
clear refusal of a CUDA run without a GPU.  Nothing here asserts on time."""

import json
import os
import sys

import pytest
import torch

from .. import safety_net
from ..paths import REPO

SCRIPT = os.path.join(str(REPO), "benchmarks", "gpu", "host_layers.py")


def _run(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("SOFTK_BACKEND", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(str(REPO), "src"), env.get("PYTHONPATH", "")])
    return safety_net.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env)


def test_cpu_run_times_every_layer_and_profiles_the_backward(tmp_path):
    out, md = tmp_path / "layers.json", tmp_path / "layers.md"
    r = _run("--device", "cpu", "--calls", "3", "--repeats", "1", "--cprofile", "--top", "8", "--json", str(out), "--md", str(md))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    names = [row["layer"] for row in rows]
    # the CPU has no Triton launches to time alone: the layers above them, and the backward's own Python
    assert names == ["torch.empty_like", "torch.softmax, no grad", "a Python autograd.Function (a clone), forward + backward",
                     "softk.sparsemax, no grad", "softk.sparsemax, grad mode, no backward", "torch.softmax forward + backward",
                     "softk.sparsemax forward + backward", "inside softk's backward (its Python, the launch included)"]
    assert all(row["us"] > 0 for row in rows)
    text = md.read_text()
    # both profiles name softk's own functions: the forward's dispatch and the backward's rule
    assert "### cProfile, forward" in text and "threshold_map" in text
    assert "### cProfile, softk's backward" in text and "op.py" in text.split("### cProfile, softk's backward")[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_cuda_run_without_a_gpu_says_so():
    r = _run("--device", "cuda")
    assert r.returncode == 2 and "no CUDA device here" in r.stderr
