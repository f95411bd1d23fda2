"""The mean's divisor, in the value and in the gradients, on every route of the fused linear losses.

With class weights, "mean" divides by Σ w[y] over the kept rows, a sum of
weights that may be below 1.  A divisor clamped to 1 in the backward only
(a guard meant for a row count) leaves the value right and the gradients
Σ w[y] times too small, so every case here compares gradients, not only
values, against the float64 reference of weighted_mean_cases.py: weight sums
below 1, at 1 and above 1, with ignored rows; and the cases with no kept
weight (all rows ignored, or every kept row weighted 0), whose mean is NaN
with zero gradients.  Routes: fused_linear_loss eager on each CPU backend and
compiled, nn.FusedLinearLoss, and vocab-parallel over 2 gloo ranks.
"""

from __future__ import annotations

import math

import pytest
import torch

import softk
from softk.losses import fused_linear_loss, ts2_loss
from softk.nn import FusedLinearLoss

from ..distributed.dist_harness import run
from .weighted_mean_cases import LOSSES, V, WEIGHT_SUMS, class_weight, data, reference

IDS = [name for name, _ in LOSSES]


def _grads(out, args):
    return torch.autograd.grad(out, args, allow_unused=True)


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{what}: {m}")


def _check(fused_fn, loss, opts, case, reduction):
    x, w, b, t = data()
    cw = class_weight(case, t)
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    out = fused_fn(*args, t, cw)
    refs = [a.clone().requires_grad_() for a in (x, w, b)]
    ref = reference(loss, *refs, t, cw, reduction, opts)
    _close(out, ref, f"{loss} {case} {reduction} value")
    for name, g, e in zip("xWb", _grads(out, args), _grads(ref, refs)):
        _close(g, e, f"{loss} {case} {reduction} grad {name}")


def _check_no_weight(fused_fn, what):
    """A mean with nothing to divide by: NaN, and zero gradients (not NaN, not inf)."""
    x, w, b, t = data()
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    out = fused_fn(*args, t)
    assert math.isnan(float(out.detach())), f"{what}: {out}"
    for name, g in zip("xWb", _grads(out, args)):
        assert g is not None and bool((g == 0).all()), f"{what}: grad {name} {g}"


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case", WEIGHT_SUMS)
@pytest.mark.parametrize("loss,opts", LOSSES, ids=IDS)
def test_weighted_mean_gradients_match_the_reference(loss, opts, case, reduction, backend):
    def fused(x, w, b, t, cw):
        return fused_linear_loss(x, w, t, loss, b, class_weight=cw, reduction=reduction, chunk_size=3, **opts)

    with softk.use_backend(backend):
        _check(fused, loss, opts, case, reduction)


@pytest.mark.parametrize("case", WEIGHT_SUMS)
@pytest.mark.parametrize("loss,opts", LOSSES, ids=IDS)
def test_module_weighted_mean_gradients(loss, opts, case):
    x, w, b, t = data()
    cw = class_weight(case, t)
    head = FusedLinearLoss(x.shape[1], V, loss, class_weight=cw, chunk_size=4, dtype=x.dtype, **opts)
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.copy_(b)
    out = head(x, t)
    refs = [a.clone().requires_grad_() for a in (x, w, b)]
    ref = reference(loss, *refs, t, cw, "mean", opts)
    _close(out, ref, f"module {loss} {case}")
    gw, gb = torch.autograd.grad(out, (head.weight, head.bias))
    _, ew, eb = torch.autograd.grad(ref, refs)
    _close(gw, ew, f"module {loss} {case} grad W")
    _close(gb, eb, f"module {loss} {case} grad b")


@pytest.mark.slow
@pytest.mark.parametrize("loss,opts", [LOSSES[0], LOSSES[2], LOSSES[-1]], ids=["cross_entropy", "sparsemax", "ts2"])
def test_compiled_weighted_mean_gradients(loss, opts):
    """The compiled pass (activation checkpoints) divides by the same Σ w[y] as eager."""

    def fused(x, w, b, t, cw):
        return fused_linear_loss(x, w, t, loss, b, class_weight=cw, chunk_size=3, **opts)

    torch._dynamo.reset()
    _check(torch.compile(fused, fullgraph=True), loss, opts, "below", "mean")


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("loss,opts", LOSSES, ids=IDS)
def test_no_kept_row_gives_nan_and_zero_gradients(loss, opts, weighted, backend):
    def fused(x, w, b, t):
        cw = torch.rand(V, dtype=x.dtype) if weighted else None
        return fused_linear_loss(x, w, torch.full_like(t, -100), loss, b, class_weight=cw, chunk_size=3, **opts)

    with softk.use_backend(backend):
        _check_no_weight(fused, f"{loss} all ignored")


@pytest.mark.parametrize("loss,opts", LOSSES, ids=IDS)
def test_zero_kept_weight_gives_nan_and_zero_gradients(loss, opts):
    """Kept rows whose classes all weigh 0: Σ w[y] = 0 takes the no-kept-row path."""

    def fused(x, w, b, t):
        cw = torch.ones(V, dtype=x.dtype)
        cw[t[t != -100]] = 0.0
        return fused_linear_loss(x, w, t, loss, b, class_weight=cw, chunk_size=3, z_loss=0.01, **opts)

    _check_no_weight(fused, f"{loss} weights 0")


@pytest.mark.slow
def test_compiled_no_kept_row_gives_zero_gradients():
    def fused(x, w, b, t):
        return fused_linear_loss(x, w, torch.full_like(t, -100), "sparsemax", b, chunk_size=3)

    torch._dynamo.reset()
    _check_no_weight(torch.compile(fused, fullgraph=True), "compiled, all ignored")


@pytest.mark.parametrize("loss,opts", LOSSES, ids=IDS)
def test_empty_batch_is_differentiable_for_every_reduction(loss, opts):
    x = torch.zeros(0, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, 4, dtype=torch.float64, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long)
    for reduction in ("none", "sum", "mean"):
        out = fused_linear_loss(x, w, t, loss, reduction=reduction, **opts)
        assert out.shape == ((0,) if reduction == "none" else ()), (reduction, out.shape)
        assert out.dtype == x.dtype
        out.sum().backward()  # raises on a result with no grad_fn
        assert x.grad.shape == x.shape and bool((w.grad == 0).all()), reduction
        x.grad = w.grad = None


def test_ts2_loss_with_every_row_ignored_has_zero_gradients():
    z = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    y = torch.full((3,), -100)
    for reduction in ("mean", "sum"):
        out = ts2_loss(z, y, reduction=reduction)
        (g,) = torch.autograd.grad(out, z)
        assert bool((g == 0).all()), (reduction, g)
    assert math.isnan(float(ts2_loss(z, y).detach()))


@pytest.mark.parametrize("name", ["softmax_loss", "sparsemax_loss", "entmax15_loss", "ts2_loss"])
def test_double_backward_with_every_row_ignored_is_zero(name):
    """The gradient written as tensor code (create_graph) divides as the forward does."""
    z = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    y = torch.full((3,), -100)
    (g,) = torch.autograd.grad(getattr(softk.losses, name)(z, y), z, create_graph=True)
    assert bool((g == 0).all()), g
    (h,) = torch.autograd.grad((g * torch.randn_like(g)).sum(), z, allow_unused=True)
    assert h is None or bool((h == 0).all()), h


# ------------------------------------------------------- vocab-parallel, 2 gloo ranks
def _vocab_parallel(rank, world):
    from softk.distributed import vocab_parallel_fused_linear_loss

    lo, hi = (0, 5) if rank == 0 else (5, V)
    x, w, b, t = data()
    for loss, opts in LOSSES:
        for case in WEIGHT_SUMS:
            cw = class_weight(case, t)
            refs = [a.clone().requires_grad_() for a in (x, w, b)]
            ref = reference(loss, *refs, t, cw, "mean", opts)
            gx, gw, gb = torch.autograd.grad(ref, refs)
            args = [x.clone().requires_grad_(), w[lo:hi].clone().requires_grad_(), b[lo:hi].clone().requires_grad_()]
            out = vocab_parallel_fused_linear_loss(args[0], args[1], t, loss, args[2], class_weight=cw, chunk_size=3,
                                                   **opts)
            what = f"vocab-parallel {loss} {case} rank {rank}"
            _close(out, ref, what)
            hx, hw, hb = torch.autograd.grad(out, args)
            _close(hx, gx, what + " grad x")
            _close(hw, gw[lo:hi], what + " grad W")
            _close(hb, gb[lo:hi], what + " grad b")
        # no kept row: NaN, zero gradients
        args = [x.clone().requires_grad_(), w[lo:hi].clone().requires_grad_(), b[lo:hi].clone().requires_grad_()]
        out = vocab_parallel_fused_linear_loss(args[0], args[1], torch.full_like(t, -100), loss, args[2],
                                               class_weight=torch.ones(V, dtype=x.dtype), chunk_size=3, **opts)
        assert math.isnan(float(out.detach())), (loss, out)
        for g in torch.autograd.grad(out, args):
            assert bool((g == 0).all()), (loss, g)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_vocab_parallel_weighted_mean_gradients(tmp_path):
    run(2, _vocab_parallel, tmp_path)
