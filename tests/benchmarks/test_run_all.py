"""benchmarks/gpu/run_all.py without a GPU: the whole flow as a dry run.

The device run is one short, prepared call; a typo in any stage would waste
it.  ``--dry-run`` runs every stage's script on the CPU at tiny sizes (the
Triton kernels in Triton's interpreter), each kernel, variant and branch
that the stage runs on the GPU at least once, and this checks that each
stage ran, wrote the JSON its section of the report reads, that those cases
made rows without errors, and that what the stages compare agrees (the
correctness stages pass, the fused losses equal torch's).  Nothing here
measures or asserts on time.
"""

import json
import math
import os
import sys

import pytest

from .. import safety_net
from ..paths import REPO

BENCH = os.path.join(str(REPO), "benchmarks", "gpu")
sys.path.insert(0, BENCH)

import host_overhead  # noqa: E402
import run_all  # noqa: E402
import tune  # noqa: E402

MODES = ("fwd", "fwdbwd")


def test_without_cuda_it_refuses_with_exit_2(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the refusal is for machines without one")
    r = safety_net.run([sys.executable, os.path.join(BENCH, "run_all.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no CUDA device" in r.stderr


def test_every_stage_has_a_script_and_a_share():
    names = [s[0] for s in run_all.STAGES]
    assert len(names) == len(set(names))
    for name, script, share, gpu_argv, dry_argv in run_all.STAGES:
        assert os.path.exists(os.path.join(BENCH, script)), script
        assert 0 < share < 1 and "{json}" in gpu_argv and "{json}" in dry_argv, name


def test_a_stage_budget_is_kept_and_the_rest_shared():
    chosen = [s for s in run_all.STAGES if s[0] in ("correctness", "speed", "host")]
    shares = {s[0]: s[2] for s in chosen}
    fixed = {"speed": 100.0}
    # correctness shares with host what speed's own 100 s leave of 400
    expect = 300.0 * shares["correctness"] / (shares["correctness"] + shares["host"])
    assert run_all.stage_budget(chosen, 0, 400.0, fixed) == pytest.approx(expect)
    assert run_all.stage_budget(chosen, 1, 5.0, fixed) == 100.0  # its own time, whatever is left
    assert run_all.stage_budget(chosen, 2, 50.0, fixed) == 50.0  # the last shared stage takes the rest
    assert run_all.stage_budget(chosen, 2, 1.0, {}) == 20.0  # never under 20 s


def test_summary_renders_each_section_from_its_json():
    meta = {k: "x" for k in ("device", "torch", "triton", "python", "softk_commit", "date", "entmax", "adasplash", "liger_kernel")}
    stages = {
        "correctness": {"exit": 1, "seconds": 3.0, "output_tail": "", "result": {
            "summary": {"total": 2, "pass": 1}, "cases": [{"verdict": "pass"}, {"verdict": "fail", "family": "sparsemax"}]}},
        "tune": {"exit": 0, "seconds": 1.0, "output_tail": "", "result": {"best": [
            {"shape": "w64", "kernel": "fwd-sparsemax", "default_config": [True, 64, 2, 8], "default_ms": 0.2, "default_x_torch": 3.0,
             "best_config": [True, 64, 1, 8], "best_ms": 0.1, "best_x_torch": 1.5}]}},
        "fused_linear": {"exit": 0, "seconds": 1.0, "output_tail": "", "result": {"rows": [
            {"shape": "s", "impl": "torch", "ms": 2.0, "x_torch": 1.0, "peak_extra_mib": 5.0, "x_dw": 2.5, "dw_bf16_mib": 2.0, "loss": 1.0},
            {"shape": "s", "impl": "liger", "dw_bf16_mib": 2.0, "status": "skipped: time budget"}]}},
        "e2e": {"exit": "killed: time budget", "seconds": 9.0, "output_tail": "the last words", "result": None},
    }
    text = run_all.summary(meta, stages)
    assert '"family": "sparsemax"' in text  # a failed case is listed
    assert "| w64 | fwd-sparsemax | [True, 64, 2, 8] | 0.2000 | 3.00 | [True, 64, 1, 8] | 0.1000 | 1.50 |" in text
    assert "| s | torch | 2.00 | 1.00 | 5 | 2.50 | 1.0000 |" in text and "skipped: time budget" in text
    assert "bf16 dW (V × H × 2 bytes): s 2 MiB" in text
    assert "## e2e (exit killed: time budget, 9 s)" in text and "the last words" in text


# rows that may be missing here, and how they must say so (Liger's capped kernel does not run in the interpreter)
_MAY_SKIP = {"liger": ("skipped: not installed", "skipped: Liger's soft cap"), "cce": ("skipped: not installed",),
             "torch-linear-ce": ("skipped: ",)}


def _fused_linear(r):
    by_shape = {}
    for row in r["rows"]:
        by_shape.setdefault(row["shape"], {})[row["impl"]] = row
    for shape, rows in by_shape.items():
        capped = rows["torch"]["softcap"] is not None
        for name, row in rows.items():
            if row["dw_bf16_mib"] != row["V"] * row["H"] * 2 / 2**20:
                return False
            if "ms" not in row and not row.get("status", "").startswith(_MAY_SKIP.get(name, ("never",))):
                return False
            # the peers that ran compute the same cross-entropy, soft cap included
            if name in ("liger", "cce", "torch-linear-ce", "softk-cross_entropy") and "ms" in row:
                if row["loss"] != pytest.approx(rows["torch"]["loss"], rel=1e-5):
                    return False
        if capped and "ms" in rows.get("torch-linear-ce", {}):  # it takes no soft cap: never timed on a capped shape
            return False
        losses = {name.split("-")[1] for name in rows if name.startswith("softk-")}
        if losses != {"cross_entropy", "sparsemax", "entmax15"} or not any(name.endswith("-c8") for name in rows):
            return False  # a fixed chunk size as well as the automatic one, for every loss
    return set(by_shape) == {"tiny", "tiny-softcap"}


def _e2e(r):
    v, check = r["variants"], r["initial_loss_check"]
    return (set(v) == {"own", "softk_ce", "sparsemax", "entmax15"} and r["precision"] == "amp-bf16"
            and all(math.isfinite(x["median_s"]) and math.isfinite(x["last_loss"]) for x in v.values())
            and check["softk_ce"] == pytest.approx(check["own"], rel=1e-2)  # the same loss, to bf16 rounding
            # the loss's own forward and backward, measured inside the step, are a part of it
            and all(0 < x["loss_fwd_s"] and 0 < x["loss_bwd_s"] and x["loss_s"] <= x["median_s"]
                    and 0 < x["loss_share"] <= 1 and 0 < x["issue_s"] <= x["median_s"] for x in v.values()))


def _attention(r):  # every row timed, in both modes, with and without the causal mask
    rows = r["rows"]
    softk = [row for row in rows if row["impl"].startswith("softk-")]
    return (all("p50" in row for row in rows) and all("block_sparsity" in row for row in softk)
            and {(row["causal"], row["mode"]) for row in softk} == {(c, m) for c in (False, True) for m in MODES}
            and {row["impl"].split()[0] for row in softk} == {"softk-softmax", "softk-sparsemax"})


# what each stage's JSON must say beyond existing, by stage
STAGE_CHECKS = {
    "attention_check": lambda r: all(c["backend"] == "triton" for c in r["cases"])  # the device's kernels, interpreted
    and {c["map"] for c in r["cases"]} == {"softmax", "sparsemax", "entmax15", "entmax"}
    and {c["kind"] for c in r["cases"]} == {"normal", "masked_row", "offset"},
    "tune": lambda r: all("ms" in row for row in r["rows"]) and len(r["best"]) == sum(len(tune.kernels_for(n)) for _, n, _ in tune.QUICK.values())
    and {b["kernel"] for b in r["best"]} == {f"{kind}-{fam}" for kind, fam in tune.KERNELS},
    "fused_linear": _fused_linear,
    "e2e": _e2e,
    "attention": _attention,
    "attention_sparse": _attention,
    "host": lambda r: {(row["impl"], row["op"]) for row in r["rows"]} == set(host_overhead.OPS)
    and all(row["us"] > 0 for row in r["rows"]) and len(r["rows"]) == 2 * len(host_overhead.OPS),
    "moe": lambda r: [row["variant"] for row in r["rows"]][:2] == ["own", "control"]
    and all(0 < row["live_per_token"] <= r["meta"]["shape"]["top_k"] for row in r["rows"]),
}


def test_the_dry_runs_cover_every_stage():
    assert set(STAGE_CHECKS) <= {s[0] for s in run_all.STAGES}


# one stage per test (``--only``), so that the stages spread over the test
# run's workers instead of running one after another in one of them
@pytest.mark.slow
@pytest.mark.parametrize("stage", [s[0] for s in run_all.STAGES])
def test_dry_run_runs_the_stage(tmp_path, stage):
    pytest.importorskip("triton", reason="the dry run runs the Triton kernels in the interpreter")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("SOFTK_BACKEND", "TRITON_INTERPRET")}
    r = safety_net.run([sys.executable, os.path.join(BENCH, "run_all.py"), "--dry-run", "--only", stage, "--out", str(out)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["log.txt", "run_all.json", "summary.md"]
    report = json.loads((out / "run_all.json").read_text())
    assert report["meta"]["device"] == "cpu (no GPU)"
    assert list(report["stages"]) == [stage]
    st = report["stages"][stage]
    assert st["exit"] == 0, (stage, st["output_tail"])
    assert st["result"], stage  # the stage wrote the JSON its section reads
    if stage in run_all.CORRECTNESS:
        summary = st["result"]["summary"]
        assert summary["pass"] > 0 and summary.get("fail", 0) == 0 and summary.get("skipped", 0) == 0, (stage, summary)
    assert STAGE_CHECKS.get(stage, lambda r: True)(st["result"]), (stage, st["result"])
    assert f"## {stage} (exit 0," in (out / "summary.md").read_text()
