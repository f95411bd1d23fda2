"""softk.losses.fused_linear_loss / softk.nn.FusedLinearLoss against the unfused loss.

The unfused loss (the public function on the full logits) is itself checked
against the NumPy oracles in test_losses_*.py; here the fused kernel must give
the same value and the same gradients for input, weight and bias, for every
loss, reduction, chunking, ignore_index and masked row, and one case is also
checked against the oracle directly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from softk import losses as L
from softk.losses import fused_linear_loss
from softk.losses.chunking import auto_chunk_size
from softk.nn import FusedLinearLoss

from ..oracle import losses as OL
from ..distributed.dist_cases import single_loss

D = torch.float64


def _unfused(loss, logits, t, *, method="exp", **kwargs):
    """The public loss on the whole logits (the same reference the distributed tests use)."""
    return single_loss(loss, logits, t, method=method, **kwargs)


CASES = [
    ("cross_entropy", {}),
    ("softmax", {}),
    ("sparsemax", {}),
    ("entmax15", {}),
    ("entmax", {"alpha": 1.3}),
    ("entmax", {"alpha": 2.5}),
    ("topk_softmax_ce", {"k": 3}),
    ("soft_topk", {"k": 3, "method": "exp"}),
    ("soft_topk", {"k": 3, "method": "sparse"}),
    ("soft_topk", {"k": 2, "method": "sigmoid"}),
]


def _data(n, h, v, dense_k=None, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, dtype=D, generator=g, requires_grad=True)
    w = (torch.randn(v, h, dtype=D, generator=g) / h**0.5).requires_grad_()
    b = (torch.randn(v, dtype=D, generator=g) * 0.3).requires_grad_() if bias else None
    if dense_k is None:
        t = torch.randint(0, v, (n,), generator=g)
    else:
        t = torch.zeros(n, v, dtype=D)
        idx = torch.rand(n, v, generator=g).argsort(-1)[:, :dense_k]
        t.scatter_(1, idx, 1.0)
    return x, w, b, t


def _grads(out, params):
    gout = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)
    return torch.autograd.grad(out, [p for p in params if p is not None], gout)


@pytest.mark.parametrize("loss,kw", CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.slow
def test_fused_equals_unfused_value_and_grads(loss, kw, reduction):
    dense_k = kw["k"] if loss == "soft_topk" else None
    x, w, b, t = _data(13, 5, 37, dense_k)
    tau = 0.7
    fused = fused_linear_loss(x, w, t, loss, b, tau=tau, reduction=reduction, chunk_size=4, **kw)
    ref = _unfused(loss, x @ w.T + b, t, tau=tau, reduction=reduction, **kw)
    assert fused.shape == ref.shape
    torch.testing.assert_close(fused, ref, rtol=1e-12, atol=1e-12)
    for a, r in zip(_grads(fused, (x, w, b)), _grads(ref, (x, w, b))):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("loss", ["cross_entropy", "sparsemax", "entmax15", "topk_softmax_ce"])
def test_ignore_index_rows_give_nothing(loss):
    kw = {"k": 2} if loss == "topk_softmax_ce" else {}
    x, w, b, t = _data(9, 4, 20)
    t[[0, 4, 5]] = 7  # ignored
    for reduction in ("mean", "sum", "none"):
        fused = fused_linear_loss(x, w, t, loss, b, ignore_index=7, reduction=reduction, chunk_size=2, **kw)
        ref = _unfused(loss, x @ w.T + b, t, ignore_index=7, reduction=reduction, **kw)
        torch.testing.assert_close(fused, ref, rtol=1e-12, atol=1e-12)
        for a, r in zip(_grads(fused, (x, w, b)), _grads(ref, (x, w, b))):
            torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)
    # The ignored rows' inputs get exactly zero gradient.
    gx = torch.autograd.grad(fused_linear_loss(x, w, t, loss, b, ignore_index=7, **kw), x)[0]
    assert bool((gx[[0, 4, 5]] == 0).all())


def test_all_rows_ignored_mean_is_nan_with_zero_grads():
    x, w, b, t = _data(4, 3, 6)
    t[:] = -100
    out = fused_linear_loss(x, w, t, "sparsemax", b)
    assert torch.isnan(out)
    gx, gw, gb = torch.autograd.grad(out, (x, w, b))
    assert not gx.any() and not gw.any() and not gb.any()


def test_masked_bias_and_fully_masked_row():
    """-inf in the bias masks classes; a row whose target is masked gives +inf (FY) as unfused."""
    x, w, _, t = _data(6, 3, 10)
    b = torch.zeros(10, dtype=D)
    b[[2, 5]] = float("-inf")
    t[t == 2] = 0
    t[t == 5] = 1
    for loss in ("sparsemax", "entmax15", "softmax", "cross_entropy"):
        fused = fused_linear_loss(x, w, t, loss, b, reduction="none", chunk_size=4)
        ref = _unfused(loss, x @ w.T + b, t, reduction="none")
        torch.testing.assert_close(fused, ref, rtol=1e-12, atol=1e-12)
        gx, gw = torch.autograd.grad(fused.sum(), (x, w))
        rx, rw = torch.autograd.grad(ref.sum(), (x, w))
        torch.testing.assert_close(gx, rx)
        torch.testing.assert_close(gw, rw)
    t2 = t.clone()
    t2[0] = 2  # a target on a masked class
    out = fused_linear_loss(x.detach(), w.detach(), t2, "sparsemax", b, reduction="none")
    assert out[0] == float("inf") and torch.isfinite(out[1:]).all()


def test_against_numpy_oracle():
    x, w, b, t = _data(7, 4, 15)
    out = fused_linear_loss(x, w, t, "entmax15", b, tau=0.5, reduction="none", chunk_size=3)
    z = (x @ w.T + b).detach().numpy()
    want = OL.fy_loss("entmax", z, OL.one_hot(t.numpy(), 15, 1), tau=0.5, alpha=1.5)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_gradcheck_small():
    x, w, b, t = _data(5, 3, 7)
    for loss, kw in (("sparsemax", {}), ("entmax15", {}), ("cross_entropy", {})):
        for reduction in ("mean", "none"):
            fn = lambda x, w, b: fused_linear_loss(x, w, t, loss, b, reduction=reduction, chunk_size=2, **kw)  # noqa: E731
            assert torch.autograd.gradcheck(fn, (x, w, b))


@pytest.mark.parametrize("chunk", [None, 1, 3, 64])
def test_chunk_size_does_not_change_the_result(chunk):
    x, w, b, t = _data(10, 4, 12, seed=3)
    ref = fused_linear_loss(x, w, t, "sparsemax", b, chunk_size=10)
    out = fused_linear_loss(x, w, t, "sparsemax", b, chunk_size=chunk)
    torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-14)


def test_float32_matches_to_rounding_and_leading_dims():
    x, w, b, t = _data(12, 6, 50, seed=1)
    x32, w32, b32 = (a.detach().float().requires_grad_() for a in (x, w, b))
    x3 = x32.reshape(3, 4, 6)
    fused = fused_linear_loss(x3, w32, t.reshape(3, 4), "sparsemax", b32, chunk_size=5)
    ref = L.sparsemax_loss(x @ w.T + b, t)
    torch.testing.assert_close(fused, ref.float(), rtol=1e-5, atol=1e-6)
    g32 = torch.autograd.grad(fused, (x32, w32, b32))
    g64 = torch.autograd.grad(ref, (x, w, b))
    for a, r in zip(g32, g64):
        torch.testing.assert_close(a, r.float(), rtol=1e-4, atol=1e-6)
    none = fused_linear_loss(x3, w32, t.reshape(3, 4), "sparsemax", b32, reduction="none")
    assert none.shape == (3, 4)


def test_no_bias_and_frozen_weight():
    x, w, _, t = _data(6, 3, 9, bias=False)
    wf = w.detach()
    out = fused_linear_loss(x, wf, t, "entmax15", None, chunk_size=2)
    (gx,) = torch.autograd.grad(out, (x,))
    (rx,) = torch.autograd.grad(L.entmax15_loss(x @ wf.T, t), (x,))
    torch.testing.assert_close(gx, rx)


def test_auto_chunk_size_rule():
    assert auto_chunk_size(4096, 256, 65536) == 512  # the CPU's floor of 512 rows (64 by the logits' budget)
    assert auto_chunk_size(4096, 256, 65536, "cuda") == 2048  # 2^27 / 2^16: no floor in rows
    assert auto_chunk_size(2000, 64, 65536) == 128  # 64 by the budget; an eighth of 2000 rows, as a power of two
    assert auto_chunk_size(8192, 4096, 131072) == 512  # Liger's rule gives 256; the CPU's floor of rows
    assert auto_chunk_size(10, 4, 12) == 10  # never more rows than there are
    assert auto_chunk_size(1, 1, 1 << 30) == 1


def test_module_matches_linear_then_loss():
    torch.manual_seed(0)
    head = FusedLinearLoss(4, 11, loss="entmax", alpha=1.7, dtype=D, chunk_size=3)
    lin = torch.nn.Linear(4, 11, dtype=D)
    lin.load_state_dict(head.state_dict())
    x = torch.randn(8, 4, dtype=D)
    t = torch.randint(0, 11, (8,))
    out = head(x, t)
    ref = L.entmax_loss(lin(x), t, alpha=1.7)
    torch.testing.assert_close(out, ref)
    out.backward()
    ref.backward()
    torch.testing.assert_close(head.weight.grad, lin.weight.grad)
    torch.testing.assert_close(head.bias.grad, lin.bias.grad)
    assert "entmax" in repr(head)
    torch.testing.assert_close(head.logits(x), lin(x))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"loss": "hinge"}, "loss must be one of"),
        ({"loss": "entmax"}, "needs alpha"),
        ({"loss": "sparsemax", "alpha": 1.5}, "alpha applies"),
        ({"loss": "sparsemax", "k": 2}, "k applies"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"reduction": "avg"}, "reduction"),
        ({"method": "bogus", "loss": "soft_topk"}, "method"),
    ],
)
def test_bad_options(kwargs, match):
    x, w, b, t = _data(3, 2, 5)
    with pytest.raises(ValueError, match=match):
        fused_linear_loss(x, w, t, bias=b, **kwargs)


def test_bad_shapes_and_targets():
    x, w, b, t = _data(3, 2, 5)
    with pytest.raises(ValueError, match="in_features"):
        fused_linear_loss(x, w[:, :1], t)
    with pytest.raises(ValueError, match="bias"):
        fused_linear_loss(x, w, t, bias=b[:3])
    with pytest.raises(TypeError, match="dtype"):
        fused_linear_loss(x, w.float(), t)
    with pytest.raises(ValueError, match="target of class indices must have shape"):
        fused_linear_loss(x, w, t[:2])
    with pytest.raises(ValueError, match="outside"):
        fused_linear_loss(x, w, torch.tensor([0, 5, 1]))
    with pytest.raises(ValueError, match="target of probabilities"):
        fused_linear_loss(x, w, torch.ones(3, 4, dtype=D) / 4)
    with pytest.raises(ValueError, match="in_features must be"):
        FusedLinearLoss(0, 3)


def test_bfloat16_runs_and_is_close_to_float32():
    x, w, b, t = _data(16, 8, 40, seed=2)
    xb, wb, bb = (a.detach().to(torch.bfloat16).requires_grad_() for a in (x, w, b))
    out = fused_linear_loss(xb, wb, t, "entmax15", bb, chunk_size=5)
    assert out.dtype == torch.bfloat16
    ref = L.entmax15_loss(x @ w.T + b, t)
    assert abs(out.double().item() - ref.item()) < 0.03 * max(1.0, abs(ref.item()))
    gx, gw, gb = torch.autograd.grad(out, (xb, wb, bb))
    assert gx.dtype == gw.dtype == gb.dtype == torch.bfloat16
    rx, rw, rb = torch.autograd.grad(ref, (x, w, b))
    for a, r in ((gx, rx), (gw, rw), (gb, rb)):
        assert (a.double() - r).abs().max() < 0.05 * r.abs().max() + 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("loss", ["cross_entropy", "sparsemax", "entmax15"])
def test_half_precision_loss_does_not_depend_on_which_inputs_want_a_gradient(dtype, loss):
    # with a weight that wanted no gradient (evaluation under no_grad, a
    # frozen head) the logits were rounded to half precision: a bfloat16 CE
    # of 9.625 for 8.9165 (8.9375 when training), NaN in float16 past 65504
    g = torch.Generator().manual_seed(0)
    h = torch.randn(8, 16, generator=g).to(dtype)
    w = torch.randn(50, 16, generator=g).to(dtype)
    b = (torch.randn(50, generator=g) + (1000.0 if dtype == torch.bfloat16 else 0.0)).to(dtype)
    t = torch.randint(0, 50, (8,), generator=g)
    z = h.double() @ w.double().T + b.double()
    want = float(_unfused(loss, z, t))  # float64 on the same half inputs
    trained = fused_linear_loss(h, w.clone().requires_grad_(), t, bias=b, loss=loss)
    with torch.no_grad():
        evaluated = fused_linear_loss(h, w, t, bias=b, loss=loss)
    frozen = fused_linear_loss(h.clone().requires_grad_(), w, t, bias=b, loss=loss)
    for out in (trained, evaluated, frozen):
        # float32 logits and sums: the result's one rounding to ``dtype``
        assert float(out) == pytest.approx(want, rel=2.0 ** -(8 if dtype == torch.bfloat16 else 11))
    assert float(evaluated) == float(trained) == float(frozen)
    # float16 logits past its maximum: the loss is finite, 15
    h = torch.tensor([[300.0, 300.0]], dtype=torch.float16)
    w = torch.tensor([[300.0, 0.0], [0.0, 250.0], [-300.0, 100.0]], dtype=torch.float16)
    with torch.no_grad():
        assert float(fused_linear_loss(h, w, torch.tensor([1]), tau=1000.0)) == 15.0


@pytest.mark.parametrize("loss", ["cross_entropy", "softmax", "sparsemax"])
def test_float32_class_weights_keep_float64_scores_exact(loss):
    # the weights stayed float32, and Σw[y] with them: 1.6e-8 relative error
    # in a float64 loss (torch refuses the mixed dtypes; softk takes them)
    g = torch.Generator().manual_seed(3)
    h = torch.randn(7, 5, dtype=D, generator=g)
    w = torch.randn(11, 5, dtype=D, generator=g)
    t = torch.randint(0, 11, (7,), generator=g)
    cw = torch.rand(11, generator=g).to(torch.float32) + 0.1
    want = fused_linear_loss(h, w, t, loss=loss, class_weight=cw.double())
    got = fused_linear_loss(h, w, t, loss=loss, class_weight=cw)
    assert float(got) == pytest.approx(float(want), rel=1e-15)
    if loss == "cross_entropy":
        ref = torch.nn.functional.cross_entropy(h @ w.T, t, weight=cw.double())
        assert float(got) == pytest.approx(float(ref), rel=1e-14)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_no_rows_give_every_input_a_zero_gradient(reduction):
    # the bias was left out of an empty batch's graph: autograd.grad over
    # (input, weight, bias) raised that it was unused
    h = torch.randn(0, 4, dtype=D, requires_grad=True)
    w = torch.randn(5, 4, dtype=D, requires_grad=True)
    b = torch.randn(5, dtype=D, requires_grad=True)
    out = fused_linear_loss(h, w, torch.zeros(0, dtype=torch.long), bias=b, reduction=reduction)
    for g, p in zip(torch.autograd.grad(out.sum(), (h, w, b)), (h, w, b)):
        assert torch.equal(g, torch.zeros_like(p))


@pytest.mark.parametrize("loss, kw", [("cross_entropy", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3})])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_second_derivatives_and_transforms_match_the_unfused_loss(rng, loss, kw, reduction):
    # The eager gradient is formed in the forward, as numbers: create_graph
    # gave it no graph, so a Hessian-vector product lost the loss's term
    # (silently: only a regulariser's was left), and the torch.func
    # transforms raised from inside torch
    h = torch.tensor(rng.normal(size=(5, 4)))
    w = torch.tensor(rng.normal(size=(7, 4)), requires_grad=True)
    b = torch.tensor(rng.normal(size=7), requires_grad=True)
    t = torch.tensor([0, 3, -100, 6, 2])
    v = torch.tensor(rng.normal(size=(7, 4)))
    scale = torch.linspace(0.5, 1.5, 5, dtype=D) if reduction == "none" else torch.tensor(1.0, dtype=D)

    def fused(w, b, h=h, t=t):
        return fused_linear_loss(h, w, t, bias=b, loss=loss, reduction=reduction, chunk_size=2, **kw)

    def unfused(w, b, h=h, t=t):
        return _unfused(loss, torch.addmm(b, h, w.T), t, reduction=reduction, **kw)

    hvps = []
    for f in (fused, unfused):
        gw, gb = torch.autograd.grad((f(w, b) * scale).sum(), (w, b), create_graph=True)
        hvps.append(torch.autograd.grad((gw * v).sum() + gb.sum(), (w, b)))
    for got, want in zip(*hvps):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    jw, jb = torch.func.jacrev(fused, argnums=(0, 1))(w.detach(), b.detach())
    rw, rb = torch.func.jacrev(unfused, argnums=(0, 1))(w.detach(), b.detach())
    torch.testing.assert_close((jw, jb), (rw, rb), rtol=1e-10, atol=1e-12)
    if reduction != "none":  # per-row gradients: vmap over the rows
        def row(w, hr, tr):
            return torch.func.grad(lambda w: fused(w, b.detach(), hr[None], tr[None]))(w)

        def row_ref(w, hr, tr):
            return torch.func.grad(lambda w: unfused(w, b.detach(), hr[None], tr[None]))(w)

        keep = t != -100
        got = torch.func.vmap(row, in_dims=(None, 0, 0))(w.detach(), h[keep], t[keep])
        want = torch.stack([row_ref(w.detach(), h[i], t[i]) for i in range(5) if t[i] != -100])
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
