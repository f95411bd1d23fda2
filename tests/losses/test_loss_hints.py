"""Every hint a loss gives for a refused target suggests something the same loss
then accepts: each case takes the suggested expression from the message, runs
it, and checks the loss against the NumPy reference (a bool
multi-hot target used to be told to normalise to 1, which soft_topk_loss with
k = 2 and topk_softmax_cross_entropy refuse)."""

import math

import numpy as np
import pytest
import torch

import softk
from softk import losses

from ..oracle import maps as oracle

X = torch.tensor([[3.0, 0.0, 2.0, -1.0], [0.5, 1.0, -2.0, 0.0], [1.0, 2.0, 0.0, 4.0]], dtype=torch.float64)
TWO_PER_ROW = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]).bool()
ONE_PER_ROW = torch.tensor([[1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]).bool()
MIXED = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 0]]).bool()
WITH_EMPTY_ROW = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 0]]).bool()


def refusal(fn, *args, **kwargs) -> str:
    with pytest.raises((TypeError, ValueError)) as err:
        fn(*args, **kwargs)
    return str(err.value)


def run(expr: str, message: str, target, input=X):
    """Evaluate ``expr`` after checking the message suggests it verbatim."""
    assert expr in message, message
    return eval(expr, {"torch": torch, "softk": softk, "target": target, "input": input})


def ref_softmax_loss(x, y):
    """KL(y || softmax(x)) row by row, the Fenchel–Young loss of softmax, mean over rows."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    p = oracle.softmax(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        ylogy = np.where(y > 0, y * np.log(np.where(y > 0, y, 1)), 0.0)
    return float(np.mean(ylogy.sum(-1) - (y * np.log(p)).sum(-1)))


def test_soft_topk_loss_bool_with_k_ones():
    msg = refusal(losses.soft_topk_loss, X, TWO_PER_ROW, k=2, method="sparse")
    y = run("target.float()", msg, TWO_PER_ROW)
    loss = losses.soft_topk_loss(X, y.double(), k=2, method="sparse", reduction="none")
    # sparse top-k puts 1 on the two labelled entries of row 0 (margin >= 1): loss 0
    assert loss[0] == 0 and (loss >= 0).all()


def test_soft_topk_loss_bool_with_another_count_names_that_k():
    msg = refusal(losses.soft_topk_loss, X, ONE_PER_ROW, k=2)
    assert "with k=1" in msg
    y = run("target.float()", msg, ONE_PER_ROW).double()
    got = losses.soft_topk_loss(X, y, k=1)  # exp at k = 1 is softmax_loss
    assert math.isclose(float(got), ref_softmax_loss(X, y), rel_tol=1e-12)


@pytest.mark.parametrize("target", [MIXED, WITH_EMPTY_ROW])
def test_soft_topk_loss_bool_varying_count_points_to_softmax_loss(target):
    msg = refusal(losses.soft_topk_loss, X, target, k=2)
    expr = "softk.losses.softmax_loss(input, target.float() / target.float().sum(dim=1, keepdim=True))"
    if target is WITH_EMPTY_ROW:
        assert "keep = target.any(dim=1)" in msg
        keep = target.any(dim=1)
        got = run(expr, msg, target[keep], X[keep])
        y = (target[keep].float() / target[keep].float().sum(1, keepdim=True)).double()  # rounded as the hint rounds it
        assert math.isclose(float(got), ref_softmax_loss(X[keep], y), rel_tol=1e-6)  # a float32 target
    else:
        got = run(expr, msg, target)
        y = (target.float() / target.float().sum(1, keepdim=True)).double()
        assert math.isclose(float(got), ref_softmax_loss(X, y), rel_tol=1e-6)  # a float32 target


def test_topk_softmax_ce_bool_one_label_per_row_gives_indices():
    msg = refusal(losses.topk_softmax_cross_entropy, X, ONE_PER_ROW, k=2)
    index = run("target.float().argmax(dim=1)", msg, ONE_PER_ROW)
    got = losses.topk_softmax_cross_entropy(X, index, k=2, reduction="none")
    x = X.numpy()
    want = [np.log(np.exp(np.sort(r)[-2:]).sum()) - r[t] for r, t in zip(x, [0, 2, 3])]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_topk_softmax_ce_bool_multi_hot_points_to_a_loss_that_takes_it():
    msg = refusal(losses.topk_softmax_cross_entropy, X, TWO_PER_ROW, k=2)
    got = run("softk.losses.soft_topk_loss(input, target.float(), k=2)", msg, TWO_PER_ROW)
    assert torch.isfinite(got) and got > 0
    msg = refusal(losses.topk_softmax_cross_entropy, X, MIXED, k=2)
    run("softk.losses.softmax_loss(input, target.float() / target.float().sum(dim=1, keepdim=True))", msg, MIXED)


def test_topk_softmax_ce_bool_class_labels():
    labels = torch.tensor([True, False, True])
    msg = refusal(losses.topk_softmax_cross_entropy, X, labels, k=2)
    index = run("target.long()", msg, labels)
    assert index.tolist() == [1, 0, 1]
    assert torch.isfinite(losses.topk_softmax_cross_entropy(X, index, k=2))


@pytest.mark.parametrize("loss", [losses.softmax_loss, losses.cross_entropy, losses.sparsemax_loss])
def test_k1_losses_bool_multi_hot_normalised(loss):
    msg = refusal(loss, X, MIXED)
    y = run("target.float() / target.float().sum(dim=1, keepdim=True)", msg, MIXED)
    assert torch.isfinite(loss(X, y))
    msg = refusal(loss, X, ONE_PER_ROW)
    y = run("target.float()", msg, ONE_PER_ROW).double()
    index = ONE_PER_ROW.float().argmax(dim=1)
    assert torch.allclose(loss(X, y), loss(X, index), rtol=1e-12, atol=0)


def test_k1_loss_bool_on_a_1d_input_names_dim_0():
    x, t = X[0], MIXED[0]
    msg = refusal(losses.softmax_loss, x, t)
    y = run("target.float() / target.float().sum(dim=0, keepdim=True)", msg, t)
    assert math.isclose(float(losses.softmax_loss(x, y)), ref_softmax_loss(x[None], y[None].double()), rel_tol=1e-6)


def test_soft_topk_loss_bool_class_labels_one_hot_at_k1():
    labels = torch.tensor([True, False, True])
    msg = refusal(losses.soft_topk_loss, X, labels, k=1)
    y = run("torch.nn.functional.one_hot(target.long(), 4).movedim(-1, 1).float()", msg, labels)
    assert torch.allclose(losses.soft_topk_loss(X, y.double(), k=1), losses.softmax_loss(X, labels.long()), rtol=1e-12)


def test_fenchel_young_loss_bool_with_k2_is_told_the_capped_simplex():
    from softk.threshold import SPARSE

    msg = refusal(losses.fenchel_young_loss, X, TWO_PER_ROW, SPARSE, k=2)
    assert ".long()" not in msg  # class indices are refused at k = 2
    y = run("target.float()", msg, TWO_PER_ROW).double()
    assert losses.fenchel_young_loss(X, y, SPARSE, k=2) == losses.soft_topk_loss(X, y, k=2, method="sparse")


def test_float_target_row_sums_hints():
    y = TWO_PER_ROW.double()
    msg = refusal(losses.soft_topk_loss, X, y, k=3)  # rows sum to 2
    assert "pass k=2" in msg
    assert torch.isfinite(losses.soft_topk_loss(X, y, k=2))
    msg = refusal(losses.soft_topk_loss, X, MIXED.double(), k=2)
    assert "k=target.sum(dim=1, keepdim=True)" in msg  # one k per row, which the same loss takes
    t = MIXED.double()
    per_row = losses.soft_topk_loss(X, t, k=t.sum(dim=1, keepdim=True), reduction="none")
    for i in range(X.shape[0]):  # equal to the loss of each row at its own int k
        if t[i].sum() > 0:
            one = losses.soft_topk_loss(X[i : i + 1], t[i : i + 1], k=int(t[i].sum()), reduction="none")
            assert math.isclose(float(per_row[i]), float(one[0]), rel_tol=1e-12)
    msg = refusal(losses.softmax_loss, X, MIXED.double())
    y = run("target / target.sum(dim=1, keepdim=True)", msg, MIXED.double())
    assert math.isclose(float(losses.softmax_loss(X, y)), ref_softmax_loss(X, y), rel_tol=1e-12)
    msg = refusal(losses.softmax_loss, X, WITH_EMPTY_ROW.double())
    assert "keep = target.sum(dim=1) > 0" in msg
