"""softk.losses.cross_entropy on half-precision scores through the fused
softmax loss kernel (Triton, in the interpreter): the loss and its gradient
against the NumPy float64 formula (tests/oracle/losses.py) on the rounded
scores, torch's row conventions against ``F.cross_entropy`` itself, the
route (one kernel, no float32 copy of the logits), double backward, and the
index check."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import softk
from softk.losses import cross_entropy
from ...oracle import losses as oracle_losses

EPS32 = 2.0**-23
# half an ulp of the output dtype, relative: torch's rounding of the float32 loss
HALF_ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# an ulp: the kernel's store of the float32 gradient, which the interpreter
# truncates (a GPU rounds it to nearest)
ULP = {dtype: 2 * h for dtype, h in HALF_ULP.items()}
INF = float("inf")


def _scores(dtype, shape, seed=0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3 + offset
    return x.to(dtype)


def _targets(shape, n, seed=1, ignored=()):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, n, shape, generator=g)
    for i in ignored:
        t.view(-1)[i] = -100
    return t


def _ref_grad(x64, t, tau, reduction, cdim):
    """d(Σ or mean of the losses)/dx in float64: (softmax(x/τ) − e_t)/τ on kept rows."""
    xm = np.moveaxis(x64, cdim, -1) / tau
    m = xm.max(-1, keepdims=True)
    p = np.exp(xm - m)
    p /= p.sum(-1, keepdims=True)
    tm = np.asarray(t)
    keep = tm != -100
    y = np.zeros_like(p)
    np.put_along_axis(y, np.where(keep, tm, 0)[..., None], 1.0, -1)
    g = np.where(keep[..., None], p - y, 0.0) / tau
    if reduction == "mean":
        g = g / keep.sum()
    return np.moveaxis(g, -1, cdim)


def _tol(ref, x64, tau, n, rounding):
    """The output's ``rounding`` (relative) plus the float32 kernel's error, a
    few ulps of the scaled scores' magnitude and of log n."""
    fin = x64[np.isfinite(x64)]
    r = (np.abs(fin).max() if fin.size else 1.0) / tau
    return rounding * np.abs(ref) + 16 * EPS32 * (1 + r + np.log2(n))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("layout", ["rows", "classes_on_dim_1", "one_row"])
@pytest.mark.parametrize("tau", [1.0, 0.37])
def test_half_scores_match_the_float64_formula(dtype, reduction, layout, tau):
    n = 37
    if layout == "rows":
        x, t = _scores(dtype, (9, n)), _targets((9,), n, ignored=(4,))
    elif layout == "classes_on_dim_1":
        x, t = _scores(dtype, (3, n, 4), offset=100.0), _targets((3, 4), n, ignored=(5,))
    else:
        x, t = _scores(dtype, (n,)), torch.tensor(7)
    x.requires_grad_()
    with softk.use_backend("triton"):
        out = cross_entropy(x, t, reduction=reduction, tau=tau)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert out.dtype == dtype and g.dtype == dtype
    x64 = x.detach().double().numpy()
    ref = np.asarray(oracle_losses.cross_entropy(x64, t.numpy(), reduction=reduction, tau=tau))
    got = out.detach().double().numpy()
    assert got.shape == ref.shape
    assert np.all(np.abs(got - ref) <= _tol(ref, x64, tau, n, HALF_ULP[dtype])), (got, ref)
    cdim = 0 if x.dim() == 1 else 1
    gref = _ref_grad(x64, t.numpy(), tau, reduction, cdim)
    assert np.all(np.abs(g.double().numpy() - gref) <= _tol(gref, x64, tau, n, ULP[dtype]))


def _edge_rows(dtype, n=8):
    """Rows at torch's conventions (class index per row in the comment)."""
    x = _scores(torch.float32, (10, n), seed=3)
    x[1] = -INF  # no finite score, kept
    x[2] = -INF  # no finite score, ignored
    x[3, 5] = float("nan")  # NaN row, kept
    x[4, 2] = float("nan")  # NaN row, ignored
    x[5, 0] = INF  # +inf row
    x[6, ::2] = -INF  # target 2 masked: +inf
    x[7] = -INF
    x[7, 6] = 0.5  # one finite entry, the target
    x[8] = -INF
    x[8, 1] = 0.5  # one finite entry, not the target
    t = torch.tensor([0, 3, -100, 1, -100, 4, 2, 6, 3, 5])
    return x.to(dtype), t


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("n", [8, 1500])  # on chip, and looped over blocks
def test_rows_follow_torch_cross_entropy(dtype, reduction, n):
    """NaN and inf where torch's cross-entropy puts them, including the NaN
    gradient of an ignored row that holds no finite score or a NaN; the
    finite entries as torch computes them on the float32 scores."""
    x, t = _edge_rows(dtype, n)
    for rows in (slice(None), [0, 2, 4, 6, 7]):  # every row, and no kept NaN row
        a = x[rows].clone().requires_grad_()
        b = x[rows].float().requires_grad_()
        with softk.use_backend("triton"):
            out = cross_entropy(a, t[rows], reduction=reduction)
        ref = F.cross_entropy(b, t[rows], reduction=reduction)
        (ga,) = torch.autograd.grad(out.sum(), a)
        (gb,) = torch.autograd.grad(ref.sum(), b)
        for got, want in ((out.float(), ref), (ga.float(), gb)):
            assert torch.equal(got.isnan(), want.isnan()), (got, want)
            assert torch.equal(got.isinf(), want.isinf()), (got, want)
            fin = want.isfinite()
            # torch's float32 result, and softk's rounded to the half dtype
            assert torch.all((got[fin] - want[fin]).abs() <= ULP[dtype] * want[fin].abs() + 1e-6)


def test_scores_whose_quotient_by_tau_overflows_float32():
    # the fused kernel shifts by the row maximum before it divides by τ: the
    # exact loss, log 2, where torch's x.float()/τ overflows to inf − inf = NaN
    # (the documented difference; softk's torch route follows torch)
    x = torch.tensor([[3e38, 3e38]], dtype=torch.bfloat16)
    t = torch.tensor([0])
    assert torch.isnan(F.cross_entropy(x.float() / 1e-3, t))
    with softk.use_backend("triton"):
        got = cross_entropy(x, t, tau=1e-3).double().item()
    assert abs(got - np.log(2)) <= HALF_ULP[torch.bfloat16] * np.log(2) * 2
    with softk.use_backend("torch"):
        assert torch.isnan(cross_entropy(x, t, tau=1e-3))


def test_every_row_ignored_gives_nan_for_the_mean():
    x, _ = _edge_rows(torch.bfloat16)
    x = x[[0, 2, 4]].clone().requires_grad_()
    t = torch.full((3,), -100)
    with softk.use_backend("triton"):
        out = cross_entropy(x, t)
    (g,) = torch.autograd.grad(out, x)
    b = x.detach().float().requires_grad_()
    (gb,) = torch.autograd.grad(F.cross_entropy(b, t), b)
    assert out.isnan()
    assert torch.equal(g.float().isnan(), gb.isnan()) and torch.all(g.float()[~gb.isnan()] == 0)


class _Allocations(TorchDispatchMode):
    """The float32 tensors of ``numel`` entries that any aten op returns."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.found = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and o.dtype == torch.float32 and o.numel() == self.numel:
                self.found.append(str(func))
        return out


def test_the_fused_kernel_runs_with_no_float32_copy_of_the_logits():
    x = _scores(torch.bfloat16, (6, 40)).requires_grad_()
    t = _targets((6,), 40)
    with softk.use_backend("triton"), softk.explain() as choices:
        out = cross_entropy(x, t)
    assert [(c.op, c.backend) for c in choices] == [("fenchel_young", "triton")]
    with softk.use_backend("triton"), _Allocations(x.numel()) as seen:
        out = cross_entropy(x, t)
        out.backward()
    assert seen.found == []
    # the tensor path, as a control: its float32 copy is seen
    with softk.use_backend("torch"), _Allocations(x.numel()) as seen:
        cross_entropy(x, t).backward()
    assert seen.found


@pytest.mark.parametrize("kwargs", [{"weight": torch.rand(40) + 0.5}, {"label_smoothing": 0.1}])
def test_weights_and_smoothing_keep_torch_s_kernel(kwargs):
    x, t = _scores(torch.bfloat16, (6, 40)), _targets((6,), 40)
    with softk.use_backend("triton"), softk.explain() as choices:
        out = cross_entropy(x, t, **kwargs)
    assert choices == []
    assert torch.equal(out, F.cross_entropy(x.float(), t, **kwargs).to(torch.bfloat16))


def test_double_backward_is_cross_entropy_s_hessian():
    x = _scores(torch.bfloat16, (5, 12), seed=4)
    x[1, ::3] = -INF
    x[2, 4] = float("nan")  # ignored: NaN in torch's second derivative too
    x[3] = -INF  # no finite score: NaN
    t = torch.tensor([0, 1, -100, 7, 11])
    v = torch.randn(5, 12, generator=torch.Generator().manual_seed(5))
    a = x.clone().requires_grad_()
    with softk.use_backend("triton"):
        (g,) = torch.autograd.grad(cross_entropy(a, t, tau=0.5), a, create_graph=True)
    (hv,) = torch.autograd.grad((g.float() * v).sum(), a)
    b = x.double().requires_grad_()
    (gb,) = torch.autograd.grad(F.cross_entropy(b / 0.5, t), b, create_graph=True)
    # v reaches the bf16 gradient's backward rounded to bf16
    (hvb,) = torch.autograd.grad((gb * v.bfloat16().double()).sum(), b)
    # the Hessian-vector product in float32 (its cancellation: a few float32
    # ulps of the largest term), rounded to bf16 once
    assert torch.equal(g.isnan(), gb.isnan())  # the gradient the graph is built on: torch's NaN rows
    nan = hvb.isnan()
    assert torch.equal(hv.isnan(), nan) and nan[[2, 3]].all() and not nan[[0, 1, 4]].any()
    hv, hvb = hv[~nan].double(), hvb[~nan]
    assert torch.all((hv - hvb).abs() <= HALF_ULP[torch.bfloat16] * hvb.abs() + 1e-6 * hvb.abs().max())
    assert hvb.abs().max() > 0.1  # a Hessian that is not ~0


def test_a_class_index_out_of_range_is_refused():
    x, t = _scores(torch.bfloat16, (4, 9)), torch.tensor([0, 9, 1, 2])
    with softk.use_backend("triton"), pytest.raises(ValueError, match=r"target holds class index 9, outside \[0, 9\)"):
        cross_entropy(x, t)
