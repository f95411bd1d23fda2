"""apply_softk's memory: the logits of a 32k-token vocabulary are never held; and
benchmarks/gpu/e2e_step.py runs (tiny models built from configs, nothing downloaded)."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from softk.integrations.transformers import apply_softk  # noqa: E402


class LargestStorage(TorchDispatchMode):
    """The largest tensor storage any op produces while active (bytes)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


_LLAMA_32K = dict(
    vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=0,
)


def _llama_32k():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**_LLAMA_32K))


def test_no_tensor_as_large_as_the_logits_is_created():
    model = _llama_32k()
    ids = torch.randint(0, 32000, (4, 256))
    logits_bytes = ids.numel() * 32000 * 4
    sizes = {}
    for name in ("own", "softk"):
        if name == "softk":
            apply_softk(model, "cross_entropy")
        with LargestStorage() as seen:
            model(input_ids=ids, labels=ids).loss.backward()
        sizes[name] = seen.largest / logits_bytes
    assert sizes["own"] >= 1, sizes  # the measurement sees the logits when they exist
    assert sizes["softk"] <= 0.125, sizes  # one chunk: 128 of 1024 rows


_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, transformers
    from softk.integrations.transformers import apply_softk, remove_softk

    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**json.loads(sys.argv[1])))
    ids = torch.randint(0, 32000, (4, 256))
    peaks = {}
    for name in ("own", "softk", "own", "softk"):
        apply_softk(model, "cross_entropy") if name == "softk" else remove_softk(model)
        model.zero_grad(set_to_none=True)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
        base = rss("VmRSS")
        model(input_ids=ids, labels=ids).loss.backward()
        peaks[name] = max(peaks.get(name, 0), rss("VmHWM") - base)
    print(json.dumps(peaks))
    """
)


from .. import safety_net
from ..paths import REPO


@pytest.mark.slow
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
def test_peak_memory_of_a_step_stays_below_the_logits():
    """Peak RSS of one step, in a fresh process; every allocation ≥ 64 KiB is mmap'd, so RSS follows live memory."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    src = str(REPO / "src")
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-c", _PEAK_SCRIPT, json.dumps(_LLAMA_32K)]
    run = safety_net.run(cmd, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    peaks = json.loads(run.stdout.strip().splitlines()[-1])
    logits_bytes = 4 * 256 * 32000 * 4
    assert peaks["own"] >= 2 * logits_bytes, peaks  # logits, their log-softmax and gradients
    assert peaks["softk"] < 0.8 * logits_bytes, peaks


# --- benchmarks/gpu/e2e_step.py runs ---------------------------------------------------------------------


def test_e2e_benchmark_runs_at_the_tiny_size(tmp_path):
    import importlib.util

    path = str(REPO / "benchmarks" / "gpu" / "e2e_step.py")
    spec = importlib.util.spec_from_file_location("e2e_step", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "e2e.json"
    res = bench.main(["--size", "tiny", "--steps", "2", "--warmup", "0", "--memory", "none", "--json", str(out)])
    assert json.loads(out.read_text())["variants"].keys() == {"own", "softk_ce", "sparsemax", "entmax15"}
    check = res["initial_loss_check"]
    assert abs(check["own"] - check["softk_ce"]) < 1e-5 * check["own"]
    assert all(len(r["step_s"]) == 2 and np.isfinite(r["last_loss"]) for r in res["variants"].values())
