"""softk.support: λ and the support size against the NumPy float64 oracle
(λ from its bisection, p = f(x/τ − λ) recomputed, and the count of p > 0)."""

import numpy as np
import pytest
import torch

import softk

from ..oracle import maps as oracle

CASES = [
    ("sparsemax", 1, {}, oracle._f_relu, None),
    ("entmax15", 1, {}, oracle._f_entmax(1.5), None),
    ("entmax", 1, {"alpha": 1.3}, oracle._f_entmax(1.3), None),
    ("exp", 2, {}, oracle._f_exp, None),
    ("sigmoid", 3, {}, oracle._f_sigmoid, None),
    ("laplace", 2, {}, oracle._f_laplace, None),
    ("sparse", 2, {}, oracle._f_sparse, None),
]


@pytest.mark.parametrize("method,k,kw,f,_", CASES)
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_lambda_and_size_match_oracle(rng, method, k, kw, f, _, offset):
    x = rng.normal(size=(4, 9)) * 2
    tau = 0.5
    s = softk.support(torch.tensor(x + offset), method, k=k, tau=tau, **kw)
    for i in range(4):
        z = (x[i] + offset) / tau
        lam = oracle.solve_lambda(f, z, k)
        p_ref = f(z - lam)
        # p = f(x/τ − λ) at softk's λ is the map (λ itself is not unique for
        # "sparse" at a vertex of the capped simplex, where g is flat)
        np.testing.assert_allclose(f(z - s.lam[i].item()), p_ref, atol=1e-9 * max(1.0, abs(lam)))
        if method != "sparse":
            np.testing.assert_allclose(s.lam[i].item(), lam, rtol=0, atol=1e-9 * max(1.0, abs(lam)))
        assert s.size[i].item() == int((p_ref > 1e-12).sum())  # the oracle bisects: 1e-16 residues


@pytest.mark.parametrize("method,k,kw,f,_", [c for c in CASES if c[0] not in ("entmax", "sigmoid")])
def test_compiled_and_vmapped_match_oracle(rng, method, k, kw, f, _):
    # at τ < 1 (and for every top-k map) the rows' overflow check read a value
    # on the host: torch.compile(fullgraph=True) and vmap refused the call
    # (entmax α and sigmoid solve by Newton with a data-dependent stop)
    x = rng.normal(size=(3, 9)) * 2
    tau = 0.5
    compiled = torch.compile(lambda t: softk.support(t, method, k=k, tau=tau, **kw), fullgraph=True, backend="eager")
    mapped = torch.func.vmap(lambda r: softk.support(r, method, k=k, tau=tau, **kw).lam)
    for lam_got in (compiled(torch.tensor(x)).lam, mapped(torch.tensor(x))):
        for i in range(3):
            z = x[i] / tau
            lam = oracle.solve_lambda(f, z, k)
            np.testing.assert_allclose(f(z - lam_got[i].item()), f(z - lam), atol=1e-9 * max(1.0, abs(lam)))


def test_row_conventions():
    x = torch.tensor([[0.0, float("-inf"), float("-inf")], [1.0, float("nan"), 0.0], [0.1, 1.0, 1.5]])
    s = softk.support(x, "sparsemax")
    assert s.lam[0].item() == float("-inf") and np.isnan(s.lam[1].item())
    assert s.size.tolist() == [1, 0, 2]
    assert s.lam[2].item() == pytest.approx(0.75, abs=1e-7)


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        softk.support(torch.zeros(3), "nope")
    with pytest.raises(ValueError, match="k = 1 only"):
        softk.support(torch.zeros(3), "sparsemax", k=2)
    with pytest.raises(ValueError, match="alpha"):
        softk.support(torch.zeros(3), "entmax", alpha=0.5)


def test_alpha_is_refused_where_the_method_takes_none():
    # it was read for entmax only and ignored elsewhere, silently
    with pytest.raises(ValueError, match="alpha applies to method='entmax' only"):
        softk.support(torch.tensor([0.1, 1.0, 1.5]), "sparsemax", alpha=1.3)


@pytest.mark.parametrize("method,_k,kw,f,_", [c for c in CASES if c[0] in softk.families.THRESHOLD_METHODS])
@pytest.mark.parametrize("per_row", [False, True])
def test_a_fractional_budget_as_soft_topk_takes_it(rng, method, _k, kw, f, _, per_row):
    # a real k in (0, n], the same for every row or one per row, along dim 0
    x = rng.normal(size=(9, 4)) * 2
    ks = np.array([2.5, 0.5, 7.25, 1.0]) if per_row else np.full(4, 2.5)
    k = torch.tensor(ks)[None] if per_row else 2.5
    s = softk.support(torch.tensor(x), method, k=k, dim=0, tau=0.5)
    p = softk.soft_topk(torch.tensor(x), k, dim=0, tau=0.5, method=method)
    for i in range(4):
        z = x[:, i] / 0.5
        lam = oracle.solve_lambda(f, z, ks[i])
        np.testing.assert_allclose(f(z - s.lam[i].item()), f(z - lam), atol=1e-9 * max(1.0, abs(lam)))
        assert s.size[i].item() == int((f(z - lam) > 1e-12).sum()) == int((p[:, i] > 0).sum())
