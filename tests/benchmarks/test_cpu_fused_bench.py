"""benchmarks/cpu/fused_memory.py and benchmarks/cpu/fused_vs_cce.py at tiny shapes: the fields
they write and the losses they compare.  Nothing here asserts on time."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .. import safety_net
from ..paths import REPO

CPU = REPO / "benchmarks" / "cpu"
TINY = ["--n", "256", "--h", "32", "--v", "4096"]


def _run(script, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    r = safety_net.run([sys.executable, str(CPU / script), *args], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_{name}_under_test", CPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="peak RSS needs Linux's clear_refs")
def test_fused_memory_in_bfloat16_with_the_torch_row(tmp_path):
    out = tmp_path / "memory.json"
    # two variants: each is a fresh process importing torch, which is most of this test's time
    r = _run("fused_memory.py", *TINY, "--loss", "cross_entropy", "--dtype", "bfloat16", "--variants", "torch", "fused",
             "--json", str(out))
    rep = json.loads(out.read_text())
    assert rep["dtype"] == "bfloat16" and rep["dw_bytes"] == rep["dw_bf16_bytes"] == 4096 * 32 * 2
    rows = {row["variant"]: row for row in rep["rows"]}
    assert list(rows) == ["torch", "fused"] and rows["torch"]["loss_fn"] == rows["fused"]["loss_fn"] == "cross_entropy"
    for row in rows.values():
        # every variant holds its dW (bf16, 256 KiB) at the end: a peak below it missed the step
        assert row["peak_extra_bytes"] >= rep["dw_bytes"] and row["x_dw"] == row["peak_extra_bytes"] / rep["dw_bytes"]
    # the same cross-entropy, so the fused one is checked against torch's
    checks = {c["tensor"]: c for c in rep["checks"] if (c["ref"], c["variant"]) == ("torch", "fused")}
    assert set(checks) == {"loss", "gx", "gw", "gb"}
    # torch's bf16 loss is rounded to bf16 (8 bits): a few ulps; the gradients to bf16 rounding
    assert checks["loss"]["max_abs_diff"] <= 0.05 * checks["loss"]["max_abs"]
    assert all(c["max_abs_diff"] <= 1e-2 * c["max_abs"] for k, c in checks.items() if k != "loss")
    assert "bf16 dW (V×H×2 bytes): 0.2 MiB" in r.stdout


def test_fused_vs_cce_goes_round_the_providers_and_keeps_the_minimum(monkeypatch):
    bench = _load("fused_vs_cce")
    calls, times = [], {"softk": iter([3.0, 2.0, 4.0]), "matmuls": iter([1.0, 1.5, 0.5])}

    def fake_run(cmd, **kwargs):
        p = cmd[cmd.index("--provider") + 1]
        calls.append(p)
        if p == "cce":
            return subprocess.CompletedProcess(cmd, 1, "", "Traceback ...\nRuntimeError: no compiler")
        loss = None if p == "matmuls" else 1.25
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"provider": p, "seconds": next(times[p]), "loss": loss}) + "\n", "")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    rep = bench.main(["--reps", "3", "--providers", "softk", "cce", "matmuls"])
    # the order rotates each rep; a provider that failed is not started again
    assert calls == ["softk", "cce", "matmuls", "matmuls", "softk", "matmuls", "softk"]
    rows = {row["provider"]: row for row in rep["rows"]}
    assert rows["softk"]["seconds"] == 2.0 and rows["softk"]["reps_s"] == [3.0, 2.0, 4.0] and rows["softk"]["x_softk"] == 1.0
    assert rows["matmuls"]["seconds"] == 0.5 and rows["matmuls"]["x_softk"] == 0.25
    assert rows["cce"]["error"] == "exit 1: RuntimeError: no compiler"


def test_fused_vs_cce_at_a_tiny_shape(tmp_path):
    out = tmp_path / "speed.json"
    _run("fused_vs_cce.py", *TINY, "--reps", "1", "--providers", "softk", "torch", "--json", str(out))
    rep = json.loads(out.read_text())
    assert (rep["N"], rep["H"], rep["V"], rep["ignored"], rep["threads"]) == (256, 32, 4096, 0.1, 1)
    rows = {row["provider"]: row for row in rep["rows"]}
    assert all(row["seconds"] > 0 and len(row["reps_s"]) == 1 for row in rows.values())
    assert rows["softk"]["loss"] == pytest.approx(rows["torch"]["loss"], rel=1e-5)


@pytest.mark.slow
def test_cut_cross_entropy_rows_on_the_cpu(tmp_path):
    """CCE's torch.compile route (a C++ compilation on a cold cache), and the bare matmuls:
    the same cross-entropy as torch and softk."""
    pytest.importorskip("cut_cross_entropy")
    out = tmp_path / "speed.json"
    _run("fused_vs_cce.py", *TINY, "--reps", "1", "--providers", "softk", "cce", "matmuls", "--json", str(out))
    rows = {row["provider"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["cce"]["loss"] == pytest.approx(rows["softk"]["loss"], rel=1e-5)
    assert rows["matmuls"]["seconds"] > 0 and rows["matmuls"]["loss"] is None
    if os.access("/proc/self/clear_refs", os.W_OK):
        out = tmp_path / "memory.json"
        _run("fused_memory.py", *TINY, "--loss", "cross_entropy", "--variants", "torch", "cce", "--json", str(out))
        rep = json.loads(out.read_text())
        checks = {c["tensor"]: c for c in rep["checks"]}
        assert set(checks) == {"loss", "gx", "gw"}  # CCE takes no bias
        assert all(c["max_abs_diff"] <= 1e-4 * c["max_abs"] for c in checks.values())
        # compiled before the measurement: the measured call is one forward + backward, not a compilation
        assert {row["variant"] for row in rep["rows"]} == {"torch", "cce"}
        assert rep["rows"][1]["seconds"] < 10 * rep["rows"][0]["seconds"] + 1.0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fused_half_paths_times_its_three_calls(dtype):
    r = _run("fused_half_paths.py", "tiny", *TINY, "--dtype", dtype, "--rounds", "1")
    words = r.stdout.split()
    assert words[0] == "tiny"
    assert [words[i] for i in (1, 4, 7)] == ["eval", "frozen", "train"]
    assert all(float(words[i]) > 0 and words[i + 1] == "ms" for i in (2, 5, 8))
