"""The Mulan multi-label experiment: reader, metrics, losses, trainer and CLI.

Metrics are checked against counts worked out by hand; losses and gradients
against NumPy float64 formulas written from the paper (maps from tests/oracle);
the end-to-end run reads a slice of the real emotions ARFF from ../shared when
present and a generated file otherwise.
"""

import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("scipy")

from softk._cli import main  # noqa: E402
from softk._experiments import arff, data, metrics, multilabel, objectives  # noqa: E402

from ..oracle import maps as oracle  # noqa: E402

# ../shared next to the checkout; SOFTK_MULAN_DIR overrides (e.g. from a git worktree elsewhere).
from ..paths import REPO

MULAN = os.environ.get("SOFTK_MULAN_DIR") or str(REPO.parent / "shared" / "data" / "mulan")
EMOTIONS = os.path.join(MULAN, "emotions")


# ------------------------------------------------------------------ metrics
# Toy example, 3 samples × 3 labels:
#   true  [1 0 1]  [0 1 0]  [1 1 0]
#   pred  [1 1 0]  [0 1 0]  [0 0 0]
# label 0: TP 1 FP 0 FN 1 -> P 1,   R 1/2, F1 2/3
# label 1: TP 1 FP 1 FN 1 -> P 1/2, R 1/2, F1 1/2
# label 2: TP 0 FP 0 FN 1 -> P 0/0 = 0, R 0, F1 0
# pooled: TP 2 FP 1 FN 3 -> micro-F1 2·2/(2·2+1+3) = 1/2
# macro P = 1/2, macro R = 1/3 -> paper macro-F1 = 2·(1/6)/(5/6) = 2/5
# per-label mean F1 = (2/3 + 1/2 + 0)/3 = 7/18
TOY_TRUE = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]], bool)
TOY_PRED = np.array([[1, 1, 0], [0, 1, 0], [0, 0, 0]], bool)


def test_metrics_hand_computed():
    assert metrics.micro_f1(TOY_TRUE, TOY_PRED) == pytest.approx(1 / 2, abs=1e-15)
    assert metrics.macro_precision_recall(TOY_TRUE, TOY_PRED) == pytest.approx((1 / 2, 1 / 3), abs=1e-15)
    assert metrics.macro_f1(TOY_TRUE, TOY_PRED) == pytest.approx(2 / 5, abs=1e-15)
    assert metrics.macro_f1_per_label_mean(TOY_TRUE, TOY_PRED) == pytest.approx(7 / 18, abs=1e-15)


def test_metrics_degenerate():
    empty = np.zeros((2, 3), bool)
    assert metrics.micro_f1(empty, empty) == 0.0  # 0/0 -> 0
    assert metrics.macro_f1(empty, empty) == 0.0
    assert metrics.macro_f1_per_label_mean(TOY_TRUE, TOY_TRUE) == 1.0
    assert metrics.micro_f1(TOY_TRUE, ~TOY_TRUE) == 0.0
    with pytest.raises(ValueError, match="same shape"):
        metrics.micro_f1(TOY_TRUE, TOY_PRED[:2])


def test_paper_macro_differs_from_per_label_mean():
    # label 0: P 1, R 1/4 (F1 2/5); label 1: P 1/4, R 1 (F1 2/5): per-label mean 2/5,
    # while macro P = macro R = 5/8 gives the paper's macro-F1 5/8.
    t = np.array([[1, 1], [1, 0], [1, 0], [1, 0]], bool)
    p = np.array([[1, 1], [0, 1], [0, 1], [0, 1]], bool)
    assert metrics.macro_f1_per_label_mean(t, p) == pytest.approx(2 / 5, abs=1e-15)
    assert metrics.macro_f1(t, p) == pytest.approx(5 / 8, abs=1e-15)


# --------------------------------------------------------------- ARFF / data
ARFF_TEXT = """% a comment
@relation toy
@attribute f1 numeric
@attribute 'odd \\'name\\'' numeric
@attribute location {2,10,1}
@attribute 'lab A' {0,1}
@attribute labB {0,1}

@data
0.5,-1,10,1,0
1.5,2e-1,1,0,0
-2,3,2,1,1
"""
XML_TEXT = """<?xml version="1.0" encoding="utf-8"?>
<labels xmlns="http://mulan.sourceforge.net/labels">
<label name="lab A"></label>
<label name="labB"></label>
</labels>
"""


def test_read_arff_nominal_codes_and_escaped_names(tmp_path):
    path = tmp_path / "toy.arff"
    path.write_text(ARFF_TEXT)
    names, X = arff.read_arff(path)
    assert names == ["f1", "odd 'name'", "location", "lab A", "labB"]
    expected = np.array([[0.5, -1, 10, 1, 0], [1.5, 0.2, 1, 0, 0], [-2, 3, 2, 1, 1]])
    np.testing.assert_array_equal(X, expected)


def _mulan_dir(tmp_path, train=ARFF_TEXT, test=ARFF_TEXT, name="toy"):
    d = tmp_path / name
    d.mkdir()
    (d / f"{name}.xml").write_text(XML_TEXT)
    (d / f"{name}-train.arff").write_text(train)
    (d / f"{name}-test.arff").write_text(test)
    return d


def test_load_mulan_drops_unlabelled_rows(tmp_path):
    ds = data.load_mulan(_mulan_dir(tmp_path))
    assert ds.name == "toy" and ds.labels == ["lab A", "labB"]
    assert ds.features == ["f1", "odd 'name'", "location"]
    assert ds.dropped_train == 1 and ds.dropped_test == 1  # the row 1.5,0.2,1,0,0
    np.testing.assert_array_equal(ds.X_train, [[0.5, -1, 10], [-2, 3, 2]])
    np.testing.assert_array_equal(ds.Y_test, [[True, False], [True, True]])


def test_load_mulan_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        data.load_mulan(tmp_path / "nope")
    d = _mulan_dir(tmp_path)
    os.remove(d / "toy-test.arff")
    with pytest.raises(ValueError, match="no train/test split"):
        data.load_mulan(d)
    d2 = _mulan_dir(tmp_path, name="bad", train=ARFF_TEXT.replace("'lab A'", "labC"))
    with pytest.raises(ValueError, match="not attributes"):
        data.load_mulan(d2)


@pytest.mark.skipif(not os.path.isdir(MULAN), reason="../shared/data/mulan not present")
def test_real_birds_nominal_location_and_dropped_rows():
    ds = data.load_mulan(os.path.join(MULAN, "birds"))
    assert ds.features[-1] == "location" and len(ds.labels) == 19
    assert set(np.unique(ds.X_train[:, -1])) <= {2, 10, 1, 7, 5, 4, 17, 15, 16, 8, 13, 11}
    assert "Swainson's Thrush" in ds.labels
    # every kept row has a label, and the dropped ones are counted
    assert ds.Y_train.any(1).all() and ds.Y_test.any(1).all()
    assert ds.dropped_train + len(ds.X_train) == 322 and ds.dropped_test + len(ds.X_test) == 323


# ------------------------------------------------------------- losses (oracle)
def _np_losses(loss, z, y):
    """Per-row loss and dL/dz in NumPy float64, from the definitions."""
    yt = y / y.sum(1, keepdims=True)
    if loss == "sigmoid":
        return (np.logaddexp(0, z) - y * z).sum(1), 1 / (1 + np.exp(-z)) - y
    if loss == "softmax":  # cross-entropy minus the (constant) entropy of ỹ
        p = oracle.softmax(z)
        lse = np.log(np.exp(z).sum(1))
        ent = np.where(yt > 0, yt * np.log(np.where(yt > 0, yt, 1)), 0).sum(1)
        return lse - (z * yt).sum(1) + ent, p - yt
    if loss == "sparsemax":  # Martins & Astudillo 2016, eq. (15)
        p = oracle.sparsemax(z)
        rows = []
        for zi, pi, yi in zip(z, p, yt):
            s = pi > 0
            tau = (zi[s] - pi[s])[0]
            rows.append(-yi @ zi + 0.5 * (zi[s] ** 2 - tau**2).sum() + 0.5 * yi @ yi)
        return np.array(rows), p - yt
    if loss == "entmax15":  # Ω(p) = (4/3) Σ p^{3/2} up to a constant
        p = oracle.entmax(z, 1.5)
        om = lambda q: (4 / 3) * (q**1.5).sum(1)  # noqa: E731
        return (z * p).sum(1) - om(p) + om(yt) - (z * yt).sum(1), p - yt
    if loss == "soft_topk":  # capped simplex, k = |y| per row, Ω = ½‖p‖²
        k = y.sum(1).astype(int)
        p = np.stack([oracle.soft_topk(zi, ki, method="sparse") for zi, ki in zip(z, k)])
        return (z * p).sum(1) - 0.5 * (p * p).sum(1) + 0.5 * (y * y).sum(1) - (z * y).sum(1), p - y
    raise AssertionError(loss)


@pytest.mark.parametrize("loss", objectives.LOSSES)
def test_losses_match_numpy_definitions(rng, loss):
    z = rng.normal(size=(12, 5)) * 2
    y = (rng.random((12, 5)) < 0.4).astype(float)
    y[0] = 0
    y[0, 2] = 1  # |y| = 1
    y[1] = 1  # |y| = K: soft_topk's row with p = y
    y[~y.any(1), 0] = 1
    ref_loss, ref_grad = _np_losses(loss, z, y)
    total, grad = objectives.LOSS_FUNCTIONS[loss](torch.tensor(z), torch.tensor(y))
    assert float(total) == pytest.approx(ref_loss.sum(), rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(grad.numpy(), ref_grad, rtol=0, atol=1e-12)
    assert (ref_loss >= -1e-12).all()  # Fenchel–Young / BCE losses are non-negative


def test_fy_loss_zero_at_matching_target():
    # sparsemax([3, 0, -1]) = e_0: the loss is 0 against that one-hot target.
    z = torch.tensor([[3.0, 0.0, -1.0]], dtype=torch.float64)
    y = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    assert float(objectives.sparsemax_loss(z, y)[0]) == 0.0
    # soft_topk, k = 2: projection of [3, 2, -1] onto the capped simplex is [1, 1, 0]
    y2 = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    assert float(objectives.soft_topk_loss(torch.tensor([[3.0, 2.0, -1.0]], dtype=torch.float64), y2)[0]) == 0.0


# ------------------------------------------------------------ prediction rules
# The oracle's bisection can leave ~1e-16 where the exact map has a zero (its λ
# lands anywhere in a flat stretch of g), so its support is read with this cut.
SUPPORT = 1e-12


def test_prediction_rules(rng):
    z = rng.normal(size=(6, 4)) * 2
    sig = 1 / (1 + np.exp(-z))
    np.testing.assert_array_equal(objectives.predict("sigmoid", z, 0.3), sig > 0.3)
    np.testing.assert_array_equal(objectives.predict("softmax", z, 0.25), oracle.softmax(z) > 0.25)
    for t in (1.0, 2.5):
        np.testing.assert_array_equal(objectives.predict("sparsemax", z, t), oracle.sparsemax(z * t) > SUPPORT)
        np.testing.assert_array_equal(objectives.predict("entmax15", z, t), oracle.entmax(z * t, 1.5) > SUPPORT)
        np.testing.assert_array_equal(
            objectives.predict("soft_topk", z, (2, t)), oracle.soft_topk(z * t, 2, method="sparse") > SUPPORT
        )
    # hand-made: sparsemax([2, 1.5, -1]) = [0.75, 0.25, 0]; at t=3, [6, 4.5, -3] -> [1, 0, 0]
    zz = np.array([[2.0, 1.5, -1.0]])
    np.testing.assert_array_equal(objectives.predict("sparsemax", zz, 1.0), [[True, True, False]])
    np.testing.assert_array_equal(objectives.predict("sparsemax", zz, 3.0), [[True, False, False]])


def test_threshold_grids():
    assert objectives.threshold_grid("sigmoid", 6, 3) == pytest.approx([0.05 * i for i in range(1, 11)])
    assert objectives.threshold_grid("softmax", 4, 3) == pytest.approx([i / 4 for i in range(1, 11)])
    assert objectives.threshold_grid("sparsemax", 6, 3) == pytest.approx([1 + 0.5 * i for i in range(9)])
    g = objectives.threshold_grid("soft_topk", 4, 9)  # k̂ capped at K - 1 = 3
    assert len(g) == 27 and g[0] == (1, 1.0) and g[-1] == (3, 5.0)
    assert multilabel.LAMBDAS == pytest.approx([10.0**-i for i in range(10)])


# ----------------------------------------------------------------- training
def test_folds():
    # default sizes: ceil(14/5) = 3 rows per fold, the last what is left
    f = multilabel.folds(14, "contiguous", 0)
    assert [list(x) for x in f] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13]]
    e = multilabel.folds(12, "contiguous", 0, "even")
    assert [list(x) for x in e] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9], [10, 11]]
    s = multilabel.folds(14, "shuffled", 3)
    assert sorted(np.concatenate(s).tolist()) == list(range(14))
    assert [x.tolist() for x in s] == [x.tolist() for x in multilabel.folds(14, "shuffled", 3)]
    assert np.concatenate(s).tolist() != list(range(14))
    assert [len(x) for x in s] == [3, 3, 3, 3, 2]
    with pytest.raises(ValueError, match="folds must be one of"):
        multilabel.folds(14, "random", 0)
    with pytest.raises(ValueError, match="fold_sizes must be one of"):
        multilabel.folds(14, "contiguous", 0, "odd")


def test_standardise_uses_training_statistics():
    Xtr = np.array([[1.0, 5.0], [3.0, 5.0]])
    Xte = np.array([[5.0, 7.0]])
    a, b = multilabel.standardise(Xtr, Xte)
    np.testing.assert_array_equal(a, [[-1.0, 0.0], [1.0, 0.0]])  # constant column -> 0
    np.testing.assert_array_equal(b, [[3.0, 2.0]])


@pytest.mark.parametrize("loss", objectives.LOSSES)
def test_fit_reaches_stationary_point(rng, loss):
    # At the L-BFGS solution the gradient of  mean loss + λ/2 ‖W‖²  (computed
    # here in NumPy from the definitions) vanishes; b is unregularised.
    X = rng.normal(size=(30, 4))
    Y = rng.random((30, 3)) < 0.4
    Y[~Y.any(1), 1] = True
    lam = 0.1
    W, b = multilabel.fit(X, Y, loss, lam)
    _, G = _np_losses(loss, X @ W + b, Y.astype(float))
    gW = X.T @ G / len(X) + lam * W
    gb = G.mean(0)
    assert np.abs(gW).max() < 1e-6 and np.abs(gb).max() < 1e-6


# --------------------------------------------------------------- end to end
def _slice(path, n_rows):
    lines = open(path).read().splitlines()
    at = next(i for i, l in enumerate(lines) if l.strip().lower() == "@data")
    rows = [l for l in lines[at + 1:] if l.strip() and not l.startswith("%")]
    return "\n".join(lines[: at + 1] + rows[:n_rows]) + "\n"


def _generated(rng, n_rows):
    # 5 numeric features and a nominal one; 3 labels driven by the features.
    head = ["@relation gen"] + [f"@attribute x{i} numeric" for i in range(5)]
    head += ["@attribute site {3,1,2}", "@attribute A {0,1}", "@attribute B {0,1}", "@attribute C {0,1}", "@data"]
    X = rng.normal(size=(n_rows, 5))
    Y = (X[:, :3] + 0.5 * rng.normal(size=(n_rows, 3))) > 0.3
    Y[~Y.any(1), 0] = True
    site = rng.choice([1, 2, 3], size=n_rows)
    rows = [",".join([f"{v:.6f}" for v in x] + [str(s)] + [str(int(v)) for v in yv]) for x, s, yv in zip(X, site, Y)]
    return "\n".join(head + rows) + "\n"


@pytest.fixture
def tiny_mulan(tmp_path, rng):
    d = tmp_path / "tiny"
    d.mkdir()
    if os.path.isdir(EMOTIONS):  # a slice of the real files
        (d / "tiny.xml").write_text(open(os.path.join(EMOTIONS, "emotions.xml")).read())
        (d / "tiny-train.arff").write_text(_slice(os.path.join(EMOTIONS, "emotions-train.arff"), 40))
        (d / "tiny-test.arff").write_text(_slice(os.path.join(EMOTIONS, "emotions-test.arff"), 30))
    else:
        (d / "tiny.xml").write_text(
            '<labels xmlns="http://mulan.sourceforge.net/labels"><label name="A"/><label name="B"/>'
            '<label name="C"/></labels>'
        )
        (d / "tiny-train.arff").write_text(_generated(rng, 40))
        (d / "tiny-test.arff").write_text(_generated(rng, 30))
    return d


@pytest.mark.slow
def test_cli_end_to_end(tiny_mulan, tmp_path, capsys):
    out = tmp_path / "out"
    # Two λ values instead of the paper's ten keep this fast; the grid itself is
    # checked in test_threshold_grids.
    rc = main(["experiment", "multilabel", "--data", str(tiny_mulan), "--json", "--quiet",
               "--folds", "contiguous", "shuffled", "--lambdas", "1e-1", "1e-3", "--out", str(out)])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dataset"] == "tiny" and report["folds"] == "contiguous" and report["cv_score"] == "per-fold"
    assert [(r["folds"], r["cv_score"]) for r in report["runs"]] == [
        ("contiguous", "per-fold"), ("contiguous", "pooled"), ("shuffled", "per-fold"), ("shuffled", "pooled")]
    assert report["results"] == report["runs"][0]["results"]
    assert report["data"]["fold_rows"] == [8, 8, 8, 8, 8]
    for run in report["runs"]:
        assert set(run["results"]) == set(objectives.LOSSES)
    keys = {"micro_f1", "macro_f1", "macro_f1_per_label_mean", "lambda_micro", "threshold_micro",
            "lambda_macro", "threshold_macro", "train_seconds"}
    for res in report["results"].values():
        assert keys <= set(res)
        for k in ("micro_f1", "macro_f1", "macro_f1_per_label_mean"):
            assert 0.0 <= res[k] <= 1.0
        assert res["lambda_micro"] in (1e-1, 1e-3) and res["lambda_macro"] in (1e-1, 1e-3)
    assert json.loads((out / "tiny.json").read_text()) == report
    assert "| sparsemax |" in (out / "tiny.md").read_text()

    # The reported test micro-F1 is what the chosen (λ, threshold) gives: refit,
    # predict, and count TP/FP/FN here.
    ds = data.load_mulan(tiny_mulan)
    Xtr, Xte = multilabel.standardise(ds.X_train, ds.X_test)
    r = report["results"]["sparsemax"]
    W, b = multilabel.fit(Xtr, ds.Y_train, "sparsemax", r["lambda_micro"])
    pred = oracle.sparsemax((Xte @ W + b) * r["threshold_micro"]) > SUPPORT
    tp = (pred & ds.Y_test).sum()
    fp = (pred & ~ds.Y_test).sum()
    fn = (~pred & ds.Y_test).sum()
    assert r["micro_f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-12)


def test_cli_markdown_and_usage_errors(tiny_mulan, capsys):
    assert main(["experiment", "multilabel", "--data", str(tiny_mulan), "--loss", "sigmoid",
                 "--folds", "contiguous", "--quiet"]) == 0  # the full λ grid, one cheap loss
    text = capsys.readouterr().out
    assert "| sigmoid |" in text and "contiguous" in text and "shuffled" not in text
    assert "CV score: **per-fold** (headline)" in text and "CV score: **pooled**." in text
    assert main(["experiment", "multilabel", "--data", str(tiny_mulan), "--cv-score", "median"]) == 2
    assert "--cv-score must be among" in capsys.readouterr().err
    assert main(["experiment", "multilabel", "--data", str(tiny_mulan), "--loss", "hinge"]) == 2
    assert "--loss must be among" in capsys.readouterr().err
    assert main(["experiment", "multilabel", "--data", str(tiny_mulan), "--folds", "random"]) == 2
    assert "--folds must be among" in capsys.readouterr().err
    assert main(["experiment", "multilabel", "--data", str(tiny_mulan / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["experiment", "multilabel", "--data", str(tiny_mulan), "--lambdas", "0"]) == 2
    assert "--lambdas must be numbers > 0" in capsys.readouterr().err


def test_cli_lists_the_paths_it_wrote(tiny_mulan, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["experiment", "multilabel", "--data", str(tiny_mulan), "--loss", "sigmoid", "--folds", "contiguous",
                 "--lambdas", "1e-1", "--quiet", "--json", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    report = json.loads(cap.out)  # stdout: the JSON only
    assert cap.err.splitlines() == [f"wrote {out / 'tiny'}.json", f"wrote {out / 'tiny'}.md"]
    assert json.loads((out / "tiny.json").read_text()) == report


def test_cli_quick_runs_every_loss_on_the_quick_settings(tiny_mulan, capsys, monkeypatch):
    # --quick: the first 200 training rows (here 30 of the tiny set's 40), one λ, the contiguous folds, every loss
    assert multilabel.QUICK == {"n_train": 200, "lambdas": (1e-1,), "schemes": ("contiguous",)}
    monkeypatch.setattr(multilabel, "QUICK", {**multilabel.QUICK, "n_train": 30})
    assert main(["experiment", "multilabel", "--data", str(tiny_mulan), "--quick", "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["data"]["n_train"] == 30 and report["data"]["fold_rows"] == [6] * 5
    assert [(r["folds"], r["cv_score"]) for r in report["runs"]] == [("contiguous", "per-fold"), ("contiguous", "pooled")]
    assert set(report["results"]) == set(objectives.LOSSES)
    assert {res["lambda_micro"] for res in report["results"].values()} == {1e-1}
    # an option given still applies under --quick
    assert main(["experiment", "multilabel", "--data", str(tiny_mulan), "--quick", "--quiet", "--json",
                 "--loss", "sigmoid", "--lambdas", "1e-2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["results"]) == ["sigmoid"] and report["results"]["sigmoid"]["lambda_micro"] == 1e-2


def test_run_multilabel_rejects_bad_arguments(tiny_mulan):
    ds = data.load_mulan(tiny_mulan)
    with pytest.raises(ValueError, match="losses must be"):
        multilabel.run_multilabel(ds, losses=["hinge"])
    with pytest.raises(ValueError, match="schemes must be"):
        multilabel.run_multilabel(ds, schemes=[])
    with pytest.raises(ValueError, match="lambdas must be"):
        multilabel.run_multilabel(ds, lambdas=[-1.0])
    with pytest.raises(ValueError, match="cv_scores must be"):
        multilabel.run_multilabel(ds, cv_scores=["pooled", "pooled"])
    with pytest.raises(ValueError, match="fold_sizes must be"):
        multilabel.run_multilabel(ds, fold_sizes="odd")


@pytest.mark.parametrize("loss", ["softmax", "sparsemax", "entmax15", "soft_topk"])
def test_losses_agree_with_softk_losses(rng, loss):
    # The trainer's losses are softk.losses called with a detached copy and
    # differentiated by autograd; check the plumbing (normalised targets, |y|
    # groups for soft_topk, the returned gradient) against a direct call.
    losses = pytest.importorskip("softk.losses")
    z = torch.tensor(rng.normal(size=(10, 5)) * 2, requires_grad=True)
    y = torch.tensor((rng.random((10, 5)) < 0.4).astype(float))
    y[~y.bool().any(1), 3] = 1
    total, grad = objectives.LOSS_FUNCTIONS[loss](z.detach(), y)
    if loss == "soft_topk":
        card = y.sum(1).long()
        ref = sum(losses.soft_topk_loss(z[card == k], y[card == k], k=int(k), method="sparse", reduction="sum")
                  for k in card.unique())
    else:
        ref = getattr(losses, f"{loss}_loss")(z, y / y.sum(1, keepdim=True), reduction="sum")
    ref.backward()
    assert float(total) == pytest.approx(ref.item(), rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(grad.numpy(), z.grad.numpy(), rtol=0, atol=1e-12)
