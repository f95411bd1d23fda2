"""benchmarks/gpu/fused_linear.py on the CPU: the order of its rows, a peer that is missing,
and the soft cap reaching every provider that takes one.  Nothing here measures time."""

import json
import os
import sys

import pytest

from ..paths import REPO
from .gpu_scripts import load

sys.path.insert(0, os.path.join(str(REPO), "benchmarks", "gpu"))  # the script imports gpu.meta_info from its folder
fused_linear = load("fused_linear")


def test_every_shapes_main_rows_come_before_the_chunk_sweep():
    # a run cut short by its budget must lose the sweep, not a shape's comparison with the peers
    plan = [(shape, name) for shape, name, _ in fused_linear.plan(fused_linear.QUICK, ["cross_entropy", "sparsemax"], (8,), "cpu")]
    first = next(i for i, (_, name) in enumerate(plan) if name.endswith("-c8"))
    assert all(name.endswith("-c8") for _, name in plan[first:])
    assert [name for shape, name in plan[:first] if shape == "tiny"] == [
        "torch", "torch-linear-ce", "liger", "cce", "softk-cross_entropy", "softk-sparsemax"]
    assert {shape for shape, _ in plan[:first]} == {shape for shape, _ in plan[first:]} == set(fused_linear.QUICK)


def test_the_gemma_heads_carry_the_soft_cap_and_the_others_none():
    assert {name: head.softcap for name, head in fused_linear.SHAPES.items()} == {
        "gpt2": None, "llama3": None, "gemma2-2b": 30.0, "gemma2-9b": 30.0}
    assert fused_linear.SHAPES["llama3"][:3] == (4096, 4096, 128256)


def test_a_missing_peer_is_a_row_that_says_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # None in sys.modules: the import raises ImportError
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", None)
    out = tmp_path / "fused_linear.json"
    assert fused_linear.main(["--device", "cpu", "--quick", "--losses", "cross_entropy", "--no-chunks", "--json", str(out)]) == 0
    rows = {(r["shape"], r["impl"]): r for r in json.loads(out.read_text())["rows"]}
    impls = ("torch", "torch-linear-ce", "liger", "cce", "softk-cross_entropy")
    assert set(rows) == {(s, i) for s in ("tiny", "tiny-softcap") for i in impls}
    for shape in ("tiny", "tiny-softcap"):
        for peer in ("liger", "cce"):
            assert rows[shape, peer]["status"].startswith("skipped: not installed") and "ms" not in rows[shape, peer]
        assert rows[shape, "softk-cross_entropy"]["loss"] == pytest.approx(rows[shape, "torch"]["loss"], rel=1e-6)
        assert rows[shape, "torch"]["x_torch"] == 1.0 and rows[shape, "torch"]["dw_bf16_mib"] == 100 * 16 * 2 / 2**20
    # torch's own fused loss takes no cap: skipped where the head has one, never timed without it
    assert rows["tiny-softcap", "torch-linear-ce"]["status"].startswith("skipped: ")
    # the cap changes the loss, and softk's (above) follows torch's on the capped head: the cap reached it
    assert rows["tiny-softcap", "torch"]["loss"] != pytest.approx(rows["tiny", "torch"]["loss"], rel=1e-6)
