"""Su's sparse-softmax cross-entropy on the CPU's compiled kernels (and the tensor code)
(kernels_topk_ce.h through softk.losses.topk_softmax_cross_entropy): values
and gradients against the NumPy float64 oracle (a full sort) over widths that
take the block lower bound and the quickselect, heavy ties, masks, rows with
fewer than k finite scores, NaN/+inf rows, far from the origin, τ from 1e-3
to 10 and every float dtype; outputs prefilled with NaN; the autograd
contract (gradcheck, double backward, forward AD, torch.func and compile
take the tensor code)."""

import numpy as np
import pytest
import torch
from torch.autograd import forward_ad

import softk
from softk.losses import topk_softmax_cross_entropy as topk_ce

from ..oracle import losses as oracle_losses
from .fused_loss_cases import native_only, nan_outputs  # noqa: F401  (fixture)

pytestmark = [native_only, pytest.mark.usefixtures("nan_outputs")]


def _oracle(xn, t, k, tau, ignore_index=-100):
    """Per-row ℓ and gradient (softmax over the k largest − e_t)/τ from a full
    sort (rows without ties at the k-th place)."""
    s = xn / tau
    keep = t != ignore_index
    with np.errstate(invalid="ignore"):  # rows without a finite score (set to NaN below)
        loss = oracle_losses.topk_softmax_ce(xn, t, k, ignore_index, "none", tau)
    grad = np.zeros_like(s)
    for i, row in enumerate(s):
        if not keep[i]:
            continue
        if np.isnan(row).any() or np.isposinf(row).any() or not np.isfinite(row).any():
            grad[i] = np.nan
            loss[i] = np.nan
            continue
        top = np.argsort(-row, kind="stable")[: min(k, np.isfinite(row).sum())]
        e = np.exp(row[top] - row[top].max())
        grad[i, top] = e / e.sum()
        grad[i, t[i]] -= 1
    return loss, grad / tau


def _run(x, t, k, tau, reduction="none", weights=None, ignore_index=-100, backend="native"):
    xt = x.clone().requires_grad_()
    with softk.use_backend(backend):
        loss = topk_ce(xt, t, k, ignore_index=ignore_index, reduction=reduction, tau=tau)
    (loss if weights is None else loss * weights).sum().backward()
    return loss.detach(), xt.grad


def _rows(rng, n, offset=0.0):
    x = rng.normal(size=(8, n)) * 2
    x[1, ::3] = -np.inf  # masked entries
    x[2] = -np.inf
    x[2, :2] = [0.5, -1.0]  # fewer finite entries than k
    x[3] = -np.inf  # no finite entry: NaN
    x[4, 1] = np.nan  # NaN row
    x[5, 0] = np.inf  # +inf row
    x[6] = offset + np.round(x[6] * 16) / 16  # far from the origin
    x[7, 3] = 40.0  # one dominant entry
    return x


@pytest.mark.parametrize("n,k", [(13, 3), (200, 1), (1000, 40), (64, 64)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("backend", ["native", "torch"])
def test_rows_match_oracle(rng, n, k, dtype, backend):
    # the tensor code (backend "torch", and every call the kernel does not
    # take) gave a +inf row an infinite loss, and its gradient off the top k 0
    xn = torch.tensor(_rows(rng, n, offset=1e4)).to(dtype).double().numpy()
    t = rng.integers(0, n, size=8)
    t[1] = 0  # a masked class: +inf
    t[7] = 3
    w = torch.tensor(rng.uniform(0.5, 2.0, size=8)).to(dtype)
    for tau in (1e-3, 0.5, 10.0):
        loss, grad = _run(torch.tensor(xn).to(dtype), torch.tensor(t), k, tau, weights=w, backend=backend)
        ref_loss, ref_grad = _oracle(xn, t, k, tau)
        rtol = 1e-12 if dtype == torch.float64 else 4e-6
        np.testing.assert_array_equal(np.isnan(loss.numpy()), np.isnan(ref_loss))
        np.testing.assert_allclose(loss.double().numpy(), ref_loss, rtol=rtol, atol=rtol / tau)
        # (torch's topk gives ties at the k-th place, row 6's, to any of them)
        rows = slice(None) if backend == "native" else [0, 1, 2, 3, 4, 5, 7]
        np.testing.assert_allclose(grad.double().numpy()[rows], (ref_grad * w.double().numpy()[:, None])[rows],
                                   rtol=rtol, atol=rtol / tau)
        assert np.isposinf(loss[1].item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_are_computed_in_float32(rng, dtype):
    xn = torch.tensor(rng.normal(size=(6, 50)) * 2).to(dtype).double().numpy()
    t = rng.integers(0, 50, size=6)
    loss, grad = _run(torch.tensor(xn).to(dtype), torch.tensor(t), 5, 0.5, "mean")
    assert loss.dtype == grad.dtype == dtype
    ref_loss, ref_grad = _oracle(xn, t, 5, 0.5)
    eps = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    np.testing.assert_allclose(loss.double().item(), ref_loss.mean(), rtol=eps)
    np.testing.assert_allclose(grad.double().numpy(), ref_grad / 6, rtol=eps, atol=eps / 50)
    # and without a gradient to form (inference, or an input that needs none)
    for reduction in ("none", "mean"):
        loss = topk_ce(torch.tensor(xn).to(dtype), torch.tensor(t), k=5, tau=0.5, reduction=reduction)
        want = ref_loss if reduction == "none" else ref_loss.mean()
        np.testing.assert_allclose(loss.double().numpy(), want, rtol=eps)


def test_ties_value_is_tie_free_and_gradient_goes_to_the_lowest_indices(rng):
    """Scores with many equal values (integers): every order statistic
    ties.  ℓ does not depend on which tied entries are kept; the kernel
    keeps the lowest-indexed ones."""
    xn = rng.integers(-3, 4, size=(20, 300)).astype(np.float64)
    t = rng.integers(0, 300, size=20)
    for k in (1, 7, 150):
        loss, grad = _run(torch.tensor(xn), torch.tensor(t), k, 1.0)
        ref_loss, ref_grad = _oracle(xn, t, k, 1.0)  # a stable sort: the lowest indices among ties
        np.testing.assert_allclose(loss.numpy(), ref_loss, rtol=1e-13)
        np.testing.assert_allclose(grad.numpy(), ref_grad, rtol=1e-13, atol=1e-15)


def test_reductions_ignore_index_and_k_equal_c(rng):
    xn = rng.normal(size=(7, 9))
    t = rng.integers(0, 9, size=7)
    t[[2, 5]] = 4
    x = torch.tensor(xn)
    ref_loss, ref_grad = _oracle(xn, t, 3, 0.7, ignore_index=4)
    keep = t != 4
    for reduction, scale in (("mean", 1 / keep.sum()), ("sum", 1.0)):
        loss, grad = _run(x, torch.tensor(t), 3, 0.7, reduction, ignore_index=4)
        np.testing.assert_allclose(loss.item(), np.where(keep, ref_loss, 0).sum() * scale, rtol=1e-13)
        np.testing.assert_allclose(grad.numpy(), np.where(keep[:, None], ref_grad, 0) * scale, rtol=1e-13,
                                   atol=1e-15)
    loss, grad = _run(x, torch.tensor(t), 9, 0.7, "sum")
    xr = x.clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xr / 0.7, torch.tensor(t), reduction="sum")
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-13, atol=0)
    torch.testing.assert_close(grad, xr.grad, rtol=1e-13, atol=1e-15)
    with softk.use_backend("native"), pytest.raises(ValueError, match="outside \\[0, 9\\)"):
        topk_ce(x, torch.tensor([0, 1, 2, 3, 9, 5, 6]), 3)


def test_autograd_ops(rng):
    x = torch.tensor(rng.normal(size=(3, 8)) * 2, requires_grad=True)
    t = torch.tensor([1, 7, -100])
    v = torch.tensor(rng.normal(size=(3, 8)))
    with softk.use_backend("native"):
        for reduction in ("mean", "none"):
            f = lambda a: topk_ce(a, t, 3, reduction=reduction, tau=0.7)  # noqa: E731
            assert torch.autograd.gradcheck(f, (x,))
            assert torch.autograd.gradgradcheck(f, (x,))
        with forward_ad.dual_level():
            tangent = forward_ad.unpack_dual(topk_ce(forward_ad.make_dual(x.detach(), v), t, 3, reduction="none",
                                                     tau=0.7)).tangent
        per_row = torch.func.vmap(lambda r, c: topk_ce(r, c, 3, tau=0.7))(x.detach()[:2], t[:2])
        compiled = torch.compile(lambda a: topk_ce(a, t, 3, tau=0.7), fullgraph=True, backend="aot_eager")(x.detach())
    ref_loss, ref_grad = _oracle(x.detach().numpy(), t.numpy(), 3, 0.7)
    np.testing.assert_allclose(tangent.numpy(), (ref_grad * v.numpy()).sum(1), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(per_row.numpy(), ref_loss[:2], rtol=1e-12)
    np.testing.assert_allclose(compiled.item(), ref_loss[:2].mean(), rtol=1e-12)
