"""A Python float k: fractional for the capped threshold maps (the same budget in
every row), whole (3.0) wherever an int k is taken, and refused with a message
naming k where only a count makes sense.  Values against the NumPy float64
oracle, never against softk's own tensor-k path alone."""

import numpy as np
import pytest
import torch

import softk
import softk.nn as snn

from ..oracle import maps as oracle, losses as oracle_losses, topk as oracle_topk

THRESHOLD = ["exp", "sigmoid", "laplace", "sparse"]


@pytest.mark.parametrize("method", THRESHOLD)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_fractional_k_matches_oracle(rng, method, dim):
    x = rng.normal(size=(4, 6, 5)) * 3
    x[1, :, 2] = -np.inf  # a fully masked row along dim 1
    k = 2.5
    p = softk.soft_topk(torch.tensor(x), k, dim=dim, tau=0.7, method=method)
    ref = oracle.soft_topk(x, k, dim=dim, tau=0.7, method=method)
    np.testing.assert_allclose(p.numpy(), ref, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fractional_k_in_half_and_single(rng, dtype):
    x = torch.tensor(rng.normal(size=(3, 8)), dtype=dtype)
    p = softk.soft_topk(x, 3.25, method="laplace")
    assert p.dtype == dtype
    ref = oracle.soft_topk(x.double().numpy(), 3.25, method="laplace")
    tol = {torch.float32: 4e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    np.testing.assert_allclose(p.double().numpy(), ref, atol=tol)


def test_fractional_k_on_the_native_backend_too(rng):
    x = torch.tensor(rng.normal(size=(5, 9)))
    for backend in ("torch", "native"):
        with softk.use_backend(backend):
            p = softk.soft_topk(x, 1.75, method="exp")
        np.testing.assert_allclose(p.numpy(), oracle.soft_topk(x.numpy(), 1.75, method="exp"), atol=1e-12)


def test_fractional_k_gradcheck(rng):
    x = torch.tensor(rng.normal(size=(3, 6)), requires_grad=True)
    for method in THRESHOLD:
        assert torch.autograd.gradcheck(lambda t: softk.soft_topk(t, 2.5, method=method), (x,))


def test_fractional_k_under_vmap(rng):
    x = torch.tensor(rng.normal(size=(4, 7)))
    out = torch.func.vmap(lambda r: softk.soft_topk(r, 2.5, method="sigmoid"))(x)
    np.testing.assert_allclose(out.numpy(), oracle.soft_topk(x.numpy(), 2.5, method="sigmoid"), atol=1e-12)


@pytest.mark.parametrize("method", ["exp", "sparse"])
def test_topk_sum_takes_fractional_k(rng, method):
    x = rng.normal(size=(3, 7))
    got = softk.topk_sum(torch.tensor(x), 2.5, tau=0.5, method=method)
    np.testing.assert_allclose(got.numpy(), oracle_topk.topk_sum(x, 2.5, tau=0.5, method=method), atol=1e-12)


def test_soft_topk_loss_takes_fractional_k():
    x = np.array([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]])
    y = np.array([[0.0, 0.5, 1.0, 1.0], [1.0, 0.0, 1.0, 0.5]])  # rows in the capped simplex, Σ = 2.5
    got = softk.losses.soft_topk_loss(torch.tensor(x), torch.tensor(y), k=2.5, method="sparse", reduction="none")
    ref = [oracle_losses.fy_row("sparse", x[i], y[i], k=2.5) for i in range(2)]
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-12)


@pytest.mark.parametrize("method", softk._maps.soft_topk.METHODS)
def test_whole_float_k_is_the_int(rng, method):
    x = torch.tensor(rng.normal(size=(3, 6)))
    assert torch.equal(softk.soft_topk(x, 3.0, method=method), softk.soft_topk(x, 3, method=method))


def test_whole_float_k_where_only_an_int_makes_sense(rng):
    x = torch.tensor(rng.normal(size=(3, 6)))
    y = torch.tensor([0, 4, 5])
    assert torch.equal(softk.hard_topk(x, 2.0), torch.tensor(oracle_topk.hard_topk(x.numpy(), 2)))
    np.testing.assert_allclose(softk.topk_softmax(x, 3.0).numpy(), oracle_topk.topk_softmax(x.numpy(), 3), atol=1e-12)
    assert torch.equal(softk.route(x, 2.0).indices, softk.route(x, 2).indices)
    assert softk.support(x, "sparse", k=2.0).size.tolist() == softk.support(x, "sparse", k=2).size.tolist()
    assert torch.equal(softk.losses.topk_softmax_cross_entropy(x, y, k=3.0),
                       softk.losses.topk_softmax_cross_entropy(x, y, k=3))
    assert snn.SoftTopK(k=2.0).k == 2 and isinstance(snn.SoftTopK(k=2.0).k, int)


def test_modules_take_fractional_k_with_a_threshold_method(rng):
    x = rng.normal(size=(3, 7))
    got = snn.SoftTopK(k=2.5, tau=0.7, method="sigmoid")(torch.tensor(x))
    np.testing.assert_allclose(got.numpy(), oracle.soft_topk(x, 2.5, dim=-1, tau=0.7, method="sigmoid"), atol=1e-12)
    got = snn.TopKSum(k=2.5, tau=0.5, method="laplace")(torch.tensor(x))
    np.testing.assert_allclose(got.numpy(), oracle_topk.topk_sum(x, 2.5, tau=0.5, method="laplace"), atol=1e-12)
    y = np.array([[0.0, 0.5, 1.0, 1.0, 0, 0, 0]] * 3)
    got = snn.SoftTopKLoss(k=2.5, method="sparse", reduction="none")(torch.tensor(x), torch.tensor(y))
    ref = [oracle_losses.fy_row("sparse", x[i], y[i], k=2.5) for i in range(3)]
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-12)


FRACTIONAL_REFUSED = [
    (lambda x: softk.hard_topk(x, 2.5), "k must be a whole number"),
    (lambda x: softk.topk_softmax(x, 1.5), "k must be a whole number"),
    (lambda x: softk.route(x, 2.5), "k must be a whole number"),
    (lambda x: softk.support(x, "sparsemax", k=2.5), "k must be a whole number"),
    (lambda x: softk.losses.topk_softmax_cross_entropy(x, torch.tensor([0, 1]), k=2.5), "k must be a whole number"),
    (lambda x: softk.soft_topk(x, 2.5, method="grad"), r"fractional k \(2.5\) needs a threshold method.*'grad'"),
    (lambda x: softk.soft_topk(x, 2.5, method="iterative"), r"fractional k \(2.5\) needs a threshold method"),
    (lambda x: softk.soft_topk(x, 2.5, method="weighted"), r"fractional k \(2.5\) needs a threshold method"),
    (lambda x: softk.topk_sum(x, 2.5, method="grad"), r"fractional k \(2.5\) needs a threshold method"),
    (lambda x: snn.SoftTopK(k=2.5, method="iterative"), r"fractional k \(2.5\) needs a threshold method"),
    (lambda x: snn.TopKSum(k=2.5, method="grad"), r"fractional k \(2.5\) needs a threshold method"),
    (lambda x: snn.SoftTopK(k=-0.5), "k must be > 0"),
    (lambda x: softk.soft_topk(x, 6.5), r"k must lie in \(0, n\] = \(0, 6\].*6.5"),
    (lambda x: softk.soft_topk(x, -0.5), r"k must lie in \(0, n\]"),
    (lambda x: softk.soft_topk(x, float("nan")), "k must be a finite number"),
    (lambda x: softk.soft_topk(x, float("inf")), "k must be a finite number"),
    (lambda x: softk.hard_topk(x, float("inf")), "k must be a finite whole number"),
    (lambda x: softk.soft_topk(x, 7.0), r"k must be in \[1, n\] = \[1, 6\]"),
]


@pytest.mark.parametrize("call,match", FRACTIONAL_REFUSED)
def test_fractional_k_refused_where_a_count_is_needed(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.zeros(2, 6))


def test_a_string_k_is_still_a_type_error():
    with pytest.raises(TypeError, match="k must be an int, got str"):
        softk.soft_topk(torch.zeros(4), "2")
