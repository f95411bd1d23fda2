"""The top-k kernels' extreme rows (λ beyond ``frame.LIM`` frame units of
the first frame, as where (x − max)/τ overflows float32): searched in the
frame of their k-th largest entry, on both variants, several rows to a
program, and in the fused loss; the rows next to them in a program keep
their p and their pass count bit for bit.  Rows × methods × variants: the
default run covers each of them, the slow tier every combination
(tests/matrix.py)."""

import numpy as np
import pytest
import torch

import softk
from softk._backends.triton.function import FAMILY_IDS, forward_rows
from softk._backends.triton.loss import fenchel_young_fused_rows
from tests import matrix
from tests.oracle import maps as oracle_maps
from tests.precision import float_max_rows
from tests.precision.edge_cases import METHODS, OVERFLOW_ROWS, overflow_reference

VARIANTS = {"onchip": dict(onchip=True), "looped": dict(onchip=False, block=16)}


def _normal_rows(n, r=3, seed=0):
    return torch.tensor(np.random.default_rng(seed).normal(size=(r, n)) * 3, dtype=torch.float32)


@pytest.mark.parametrize("row, k, tau, exact, method, variant",
                         matrix.product(OVERFLOW_ROWS, METHODS, sorted(VARIANTS)))
def test_extreme_row_among_normal_rows(row, k, tau, exact, method, variant):
    n = len(row)
    normal = _normal_rows(n)
    x = torch.cat([normal[:1], torch.tensor([row]), normal[1:]])
    kw = dict(VARIANTS[variant], rows_per_program=4 if variant == "onchip" else None)
    p, its = forward_rows(x, FAMILY_IDS[method], k, tau, return_passes=True, **kw)
    np.testing.assert_allclose(p[1].double().numpy(), overflow_reference(row, k, tau, method, exact), rtol=0, atol=1e-6)
    alone, its_alone = forward_rows(normal, FAMILY_IDS[method], k, tau, return_passes=True, **kw)
    assert torch.equal(p[[0, 2, 3]], alone) and torch.equal(its[[0, 2, 3]], its_alone)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("method", METHODS)
def test_at_most_k_finite_entries_far_apart(method, variant):
    # p = 1 on every finite entry, however far below the maximum it lies
    ninf = float("-inf")
    x = torch.tensor([[1.0, 3e37, ninf, ninf], [ninf, ninf, -3e38, 3e38]])
    p = forward_rows(x, FAMILY_IDS[method], 2, 0.01, **VARIANTS[variant])
    assert p.tolist() == [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]


@pytest.mark.parametrize("method", METHODS)
def test_wide_extreme_row_passes(method):
    # a looped row of 3000 with an outlier at 3e37: the k-th largest entry
    # costs at most 16 counting passes, and the row is exact
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 3000))
    x[0, 17] = 3e37
    xt = torch.tensor(x, dtype=torch.float32)
    p, its = forward_rows(xt, FAMILY_IDS[method], 64, 0.5, return_passes=True)
    with softk.use_backend("torch"):  # float64: nothing overflows there
        ref = softk.soft_topk(xt.double(), 64, tau=0.5, method=method)
    np.testing.assert_allclose(p.double().numpy(), ref.numpy(), rtol=0, atol=1e-6)
    assert its.item() <= 40, its.item()


@pytest.mark.parametrize("row, k, tau, exact, method, variant",
                         matrix.product(OVERFLOW_ROWS, METHODS, sorted(VARIANTS)))
def test_fused_loss_on_extreme_rows(row, k, tau, exact, method, variant):
    # the gradient is (p − y)/τ with the forward's exact p; with y = p the loss is 0
    ref = overflow_reference(row, k, tau, method, exact)
    y = torch.tensor(ref[None], dtype=torch.float32)
    loss, g = fenchel_young_fused_rows(torch.tensor([row]), y, torch.ones(1), FAMILY_IDS[method], k, tau,
                                       **VARIANTS[variant])
    np.testing.assert_allclose((g * tau + y)[0].double().numpy(), ref, rtol=0, atol=1e-6)
    assert 0.0 <= loss.item() <= 1e-6


@pytest.mark.parametrize("name", sorted(float_max_rows.MAPS))
def test_a_row_at_the_float_max_over_a_large_tau_every_map(name):
    # the kernels formed (x − ref)·(1/τ), and x − ref overflowed where the
    # quotient is ordinary: softmax, log_softmax and the top-k maps gave
    # [1, 0, …] for the row of [0, −4, −0.5, −2.5] (float32: float64 rows
    # take the torch code)
    with softk.use_backend("triton"):
        float_max_rows.check_map(name, torch.float32)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("fam, k, alpha", [("softmax", 1, 1.5), ("entmax", 1, 1.05), ("exp", 2, 1.5),
                                            ("sigmoid", 2, 1.5), ("laplace", 2, 1.5)])
def test_a_row_at_the_float_max_over_a_large_tau_each_variant(fam, k, alpha, variant):
    # the general kernel, on the row and looped over blocks of 16, among normal rows
    x, tau = float_max_rows.row(torch.float32)
    x = torch.cat([_normal_rows(4, 1), x[None], x[None].flip(-1)])
    p = forward_rows(x, FAMILY_IDS[fam], k, tau, alpha, **VARIANTS[variant])
    if fam == "softmax":
        want = oracle_maps.softmax(float_max_rows.Z)
    elif fam == "entmax":
        want = oracle_maps.entmax(float_max_rows.Z, alpha)
    else:
        want = oracle_maps.soft_topk(float_max_rows.Z, k, method=fam)
    np.testing.assert_allclose(p[1:].double().numpy(), np.stack([want, want[::-1]]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", sorted(float_max_rows.LOSSES))
def test_a_row_at_the_float_max_over_a_large_tau_every_loss(name):
    with softk.use_backend("triton"):
        float_max_rows.check_loss(name, torch.float32)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("row, k, tau", [
    ([-3.9, 0.4, -1e20, 1e20], 2, 4.0),
    ([3.0, 0.0, 1.0, -3.4028234663852886e38], 1, 1.0),  # masked_fill(mask, finfo.min)
    ([3.0, 0.0, 1.0, -3.4028234663852886e38, 2.5, -1e30, 0.5], 3, 0.7),
])
def test_sparse_top_k_with_entries_far_below_the_threshold(row, k, tau, variant):
    # the clipped map's search started from [min z − 1, max z]: a far entry
    # made that bracket ~1e20 wide, which bisection did not close in its
    # passes, and λ ended below the answer: Σp = k + 1 or more
    x = torch.cat([_normal_rows(len(row), 2), torch.tensor([row])])
    p = forward_rows(x, FAMILY_IDS["sparse"], k, tau, **VARIANTS[variant])
    want = oracle_maps.soft_topk(np.array(row), k, tau=tau, method="sparse")
    np.testing.assert_allclose(p[-1].double().numpy(), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(p[:-1].double().numpy(),
                               oracle_maps.soft_topk(x[:-1].double().numpy(), k, tau=tau, method="sparse"),
                               rtol=0, atol=1e-6)
