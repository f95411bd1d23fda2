"""The knobs of fused_linear_loss (softcap, label_smoothing, class_weight,
z_loss), its return_stats and loss="ts2", against unfused float64 references:
torch's own F.cross_entropy for cross-entropy, softk's dense-target loss at
the smoothed target for the Fenchel–Young losses, and a transcription of
TS²'s formula on the entmax package."""

from __future__ import annotations

import entmax
import pytest
import torch
import torch.nn.functional as F

from softk import losses as L
from softk._ops import fused_walk
from softk.losses import _ts2 as ts2_module, fused_linear_loss, ts2_loss
from softk.losses import fused_linear as fused_module
from softk.nn import FusedLinearLoss

D = torch.float64
V = 9


def _data(seed=0, n=11, h=5, v=V):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, dtype=D, generator=g) * 1.5
    w = torch.randn(v, h, dtype=D, generator=g)
    b = torch.randn(v, dtype=D, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    t[[2, 7]] = -100
    cw = torch.rand(v, dtype=D, generator=g) + 0.1
    return x, w, b, t, cw


def _reduce(rows, keep, reduction, divisor=None):
    if reduction == "none":
        return rows
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / (keep.sum() if divisor is None else divisor)


def _fy(loss, z, q, alpha=None):
    if loss == "entmax":
        return L.entmax_loss(z, q, alpha, reduction="none")
    return {"softmax": L.softmax_loss, "sparsemax": L.sparsemax_loss, "entmax15": L.entmax15_loss}[loss](
        z, q, reduction="none")


def _reference(loss, x, w, b, t, *, reduction, softcap=None, eps=0.0, cw=None, beta=0.0, alpha=None, tau=1.0):
    """The unfused loss on the whole float64 logits, written from the definitions."""
    z = x @ w.t() + b
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    keep = t != -100
    idx = torch.where(keep, t, 0)
    if loss == "cross_entropy":
        rows = F.cross_entropy(z / tau, t, weight=cw, label_smoothing=eps, reduction="none")
    else:
        q = (1 - eps) * F.one_hot(idx, z.shape[-1]).to(D) + eps / z.shape[-1]
        rows = torch.where(keep, _fy(loss, z / tau, q, alpha), 0.0)
        if cw is not None:
            rows = rows * cw[idx]
    divisor = None if cw is None else torch.where(keep, cw[idx], 0.0).sum()
    out = _reduce(rows, keep, reduction, divisor)
    zl = torch.where(keep, beta * torch.logsumexp(z, -1) ** 2, 0.0)
    return out + _reduce(zl, keep, reduction)


@pytest.fixture(params=["rows", "walk"])
def route(request, monkeypatch):
    """The fused loss's two routes in float64: the pass over chunks of rows
    (float32 and float64 inputs) and the walk over vocabulary blocks (half
    inputs, here run in float64 so that it is held to float64's rounding);
    the walk is checked to have run."""
    walks = []
    if request.param == "walk":
        monkeypatch.setattr(fused_module, "WALK_DTYPES", (D,))
        real = fused_walk.walk
        monkeypatch.setattr(fused_walk, "walk", lambda *a: walks.append(1) or real(*a))
    yield request.param
    assert bool(walks) == (request.param == "walk")


KNOB_SETS = [
    dict(softcap=2.0),
    dict(eps=0.1),
    dict(cw=True),
    dict(beta=0.01),
    dict(softcap=3.0, eps=0.2, cw=True, beta=0.02),
]
LOSSES = [("cross_entropy", {}), ("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3})]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("knobs", KNOB_SETS, ids=lambda k: "+".join(k))
@pytest.mark.parametrize("loss,opts", LOSSES, ids=[c[0] + str(c[1].get("alpha", "")) for c in LOSSES])
def test_knobs_match_the_unfused_reference(loss, opts, knobs, reduction, route):
    x, w, b, t, cw = _data()
    tau = 0.7 if loss != "cross_entropy" else 1.0
    kw = dict(softcap=knobs.get("softcap"), eps=knobs.get("eps", 0.0), cw=cw if knobs.get("cw") else None,
              beta=knobs.get("beta", 0.0))
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    out = fused_linear_loss(args[0], args[1], t, loss, args[2], tau=tau, reduction=reduction, chunk_size=4,
                            softcap=kw["softcap"], label_smoothing=kw["eps"], class_weight=kw["cw"],
                            z_loss=kw["beta"], **opts)
    refs = [a.clone().requires_grad_() for a in (x, w, b)]
    ref = _reference(loss, *refs, t, reduction=reduction, tau=tau, alpha=opts.get("alpha"), **kw)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    go = torch.linspace(0.5, 1.5, out.numel(), dtype=D).reshape(out.shape)
    grads = torch.autograd.grad(out, args, go)
    expected = torch.autograd.grad(ref, refs, go)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-11)


def test_cross_entropy_knobs_equal_torch_with_dense_smoothing():
    """A dense (probability) target with label smoothing is torch's as well."""
    x, w, b, t, _ = _data(1)
    q = torch.softmax(torch.randn(x.shape[0], V, dtype=D), -1)
    out = fused_linear_loss(x, w, q, bias=b, label_smoothing=0.3, chunk_size=3)
    torch.testing.assert_close(out, F.cross_entropy(x @ w.t() + b, q, label_smoothing=0.3), rtol=1e-12, atol=0)
    out = fused_linear_loss(x, w, q, "sparsemax", bias=b, label_smoothing=0.3, chunk_size=3)
    torch.testing.assert_close(out, L.sparsemax_loss(x @ w.t() + b, 0.7 * q + 0.3 / V), rtol=1e-12, atol=0)


def test_module_takes_the_knobs():
    x, w, b, t, cw = _data(2)
    head = FusedLinearLoss(5, V, "sparsemax", softcap=2.0, label_smoothing=0.1, class_weight=cw, z_loss=0.01,
                           dtype=D)
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.copy_(b)
    ref = _reference("sparsemax", x, w, b, t, reduction="mean", softcap=2.0, eps=0.1, cw=cw, beta=0.01)
    torch.testing.assert_close(head(x, t), ref, rtol=1e-12, atol=0)
    assert "softcap=2.0" in repr(head)
    head = FusedLinearLoss(5, V, "ts2", suppression=0.3, adaptive=True, tau=0.5, dtype=D)
    z = head.logits(x)
    torch.testing.assert_close(head(x, t), ts2_loss(z, t, suppression=0.3, adaptive=True, tau=0.5))
    assert "suppression=0.3, adaptive=True" in repr(head)
    assert "class_weight" not in FusedLinearLoss(5, V, class_weight=cw).state_dict()


@pytest.mark.parametrize("bad,match", [
    (dict(softcap=0.0), "softcap"),
    (dict(softcap=-1.0), "softcap"),
    (dict(label_smoothing=1.0), "label_smoothing"),
    (dict(label_smoothing=-0.1), "label_smoothing"),
    (dict(z_loss=-1.0), "z_loss"),
    (dict(z_loss=float("nan")), "z_loss"),
    (dict(class_weight=torch.full((V,), -1.0, dtype=D)), "class_weight"),
    (dict(class_weight=torch.full((V,), float("inf"), dtype=D)), "class_weight"),
    (dict(class_weight=torch.ones(V + 1, dtype=D)), "class_weight"),
    (dict(loss="topk_softmax_ce", k=2, label_smoothing=0.1), "label_smoothing"),
    (dict(loss="ts2", label_smoothing=0.1), "label_smoothing"),
    (dict(suppression=0.5), "suppression"),
    (dict(adaptive=True), "adaptive"),
    (dict(loss="ts2", suppression=-1.0), "suppression"),
    (dict(loss="ts2", suppression=float("inf")), "suppression"),
])
def test_bad_knobs_are_refused(bad, match):
    x, w, _, t, _ = _data()
    with pytest.raises(ValueError, match=match):
        fused_linear_loss(x, w, t, **bad)


def test_class_weight_is_refused_with_a_dense_target():
    x, w, _, _, cw = _data()
    q = torch.softmax(torch.randn(x.shape[0], V, dtype=D), -1)
    with pytest.raises(ValueError, match="class_weight"):
        fused_linear_loss(x, w, q, class_weight=cw)
    with pytest.raises(ValueError, match="class_weight"):
        FusedLinearLoss(5, V, "soft_topk", k=2, class_weight=cw)(x.float(), torch.zeros(x.shape[0], V))


# --- TS² -----------------------------------------------------------------------------------------


def ts2_authors(z, y, a=1.0, T=1.0, adaptive=False, ignore_index=-100):
    """The authors' formula, per row, on the entmax package (0 at ignored rows)."""
    keep = y != ignore_index
    zk, yk = z[keep], y[keep]
    rows = torch.arange(len(yk))
    fit = entmax.sparsemax_loss(zk * T, yk)
    p = entmax.sparsemax(zk * T, dim=-1)
    s = torch.softmax(zk, -1)
    off = p == 0
    off[rows, yk] = False
    mass = (s * off).sum(-1)
    penalty = -torch.log(1 - torch.minimum(torch.full_like(mass, 0.99), mass))
    if adaptive:
        penalty = penalty * (1 - p[rows, yk].detach())
    out = torch.zeros(len(y), dtype=z.dtype)
    out[keep] = fit + a * penalty
    return out


def _ts2_logits(v=600, n=7, seed=3):
    """Random rows plus one whose off-support softmax mass is above 0.99 (the clamp)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, dtype=D, generator=g) * 2
    z[0] = 1.9
    z[0, 0], z[0, 1] = 3.0, 2.5
    t = torch.randint(0, v, (n,), generator=g)
    t[0], t[4] = 0, -100
    return z, t


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("tau", [1.0, 0.5])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ts2_loss_matches_the_authors_formula(adaptive, tau, reduction):
    z, t = _ts2_logits()
    s = torch.softmax(z[0], -1)
    assert s[2:].sum() > 0.99  # the first row is clamped
    a = 0.7
    z1 = z.clone().requires_grad_()
    out = ts2_loss(z1, t, suppression=a, tau=tau, adaptive=adaptive, reduction=reduction)
    z2 = z.clone().requires_grad_()
    rows = ts2_authors(z2, t, a, 1 / tau, adaptive)
    ref = _reduce(rows, t != -100, reduction)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    go = torch.linspace(0.5, 1.5, out.numel(), dtype=D).reshape(out.shape)
    g1, = torch.autograd.grad(out, z1, go)
    g2, = torch.autograd.grad(ref, z2, go)
    torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-13)
    assert g1[4].abs().max() == 0


def test_ts2_loss_shapes_and_checks():
    z, t = _ts2_logits(v=8, n=6)
    zz = z.reshape(2, 3, 8).transpose(1, 2)  # (N, C, d1)
    torch.testing.assert_close(ts2_loss(zz, t.reshape(2, 3), reduction="none"),
                               ts2_loss(z, t, reduction="none").reshape(2, 3))
    assert ts2_loss(z.float(), t).dtype == torch.float32
    torch.testing.assert_close(ts2_loss(z, t, suppression=0.0), L.sparsemax_loss(z, t))
    with pytest.raises(ValueError, match="suppression"):
        ts2_loss(z, t, suppression=-0.5)
    with pytest.raises(TypeError, match="class-index"):
        ts2_loss(z, torch.softmax(z, -1))


@pytest.fixture(params=["gathered", "dense"])
def ts2_form(request, monkeypatch):
    """The fused TS² pass's two forms: the support's entries gathered (the
    CPU's) and dense masked sums (a GPU's, no wait on nonzero())."""
    monkeypatch.setattr(ts2_module, "GATHER_ON_CPU", request.param == "gathered")
    return request.param


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("route_ts2", ["rows", "walk"])
def test_fused_ts2_matches_the_authors_formula(adaptive, reduction, ts2_form, route_ts2, monkeypatch):
    if route_ts2 == "walk":
        monkeypatch.setattr(fused_module, "WALK_DTYPES", (D,))
    z, t = _ts2_logits(v=600, n=7)
    g = torch.Generator().manual_seed(5)
    h = 6
    x = torch.randn(7, h, dtype=D, generator=g)
    w = torch.randn(600, h, dtype=D, generator=g)
    x[0] = 0
    x[0, 0] = 1
    w[:, 0] = z[0]  # row 0's logits are the clamped row
    args = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    out = fused_linear_loss(*args, t, "ts2", suppression=0.4, adaptive=adaptive, tau=0.8, reduction=reduction,
                            chunk_size=3)
    refs = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    ref = _reduce(ts2_authors(refs[0] @ refs[1].t(), t, 0.4, 1 / 0.8, adaptive), t != -100, reduction)
    torch.testing.assert_close(out, ref, rtol=1e-11, atol=1e-13)
    go = torch.linspace(0.5, 1.5, out.numel(), dtype=D).reshape(out.shape)
    for a, e in zip(torch.autograd.grad(out, args, go), torch.autograd.grad(ref, refs, go)):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("adaptive", [False, True])
def test_fused_ts2_in_float32_matches_the_float64_formula(adaptive, ts2_form):
    # the one-pass form on float32 logits (softmax thresholded under tiny, the
    # off-support mass as Σs minus the support's): against the authors'
    # formula in float64 on the same inputs, to float32's rounding of logits of size ~3
    z, t = _ts2_logits(v=600, n=7)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(7, 6, dtype=D, generator=g)
    w = torch.randn(600, 6, dtype=D, generator=g)
    x[0] = 0
    x[0, 0] = 1
    w[:, 0] = z[0]
    args = [x.float().requires_grad_(), w.float().requires_grad_()]
    out = fused_linear_loss(*args, t, "ts2", suppression=0.4, adaptive=adaptive, tau=0.8, reduction="none",
                            chunk_size=4)
    refs = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    ref = ts2_authors(refs[0] @ refs[1].t(), t, 0.4, 1 / 0.8, adaptive)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    go = torch.linspace(0.5, 1.5, 7, dtype=D)
    for a, e in zip(torch.autograd.grad(out, args, go.float()), torch.autograd.grad(ref, refs, go)):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-5)


# --- return_stats --------------------------------------------------------------------------------


@pytest.mark.parametrize("loss,opts,mapping", [
    ("sparsemax", {}, lambda z: entmax.sparsemax(z, dim=-1)),
    ("ts2", {}, lambda z: entmax.sparsemax(z, dim=-1)),
    ("entmax15", {}, lambda z: entmax.entmax15(z, dim=-1)),
    ("cross_entropy", {}, lambda z: torch.softmax(z, -1)),
])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_stats_match_the_full_logits(loss, opts, mapping, reduction):
    x, w, b, t, _ = _data(4, n=13)
    t[5] = -100
    out, stats = fused_linear_loss(x, w, t, loss, b, reduction=reduction, z_loss=0.05, chunk_size=4,
                                   return_stats=True, **opts)
    plain = fused_linear_loss(x, w, t, loss, b, reduction=reduction, z_loss=0.05, chunk_size=4, **opts)
    torch.testing.assert_close(out, plain, rtol=0, atol=0)
    z = x @ w.t() + b
    keep = t != -100
    p = mapping(z)
    torch.testing.assert_close(stats.support, (p > 0).sum(-1)[keep].to(D).mean())
    torch.testing.assert_close(stats.accuracy, (z.argmax(-1) == t)[keep].to(D).mean())
    zl = torch.where(keep, 0.05 * torch.logsumexp(z, -1) ** 2, 0.0)
    torch.testing.assert_close(stats.z_loss, _reduce(zl, keep, reduction))
    assert not stats.support.requires_grad


# --- torch.compile -------------------------------------------------------------------------------


@pytest.mark.parametrize("loss,kw", [
    ("cross_entropy", dict(softcap=3.0, label_smoothing=0.1, class_weight=True, z_loss=0.01)),
    ("ts2", dict(softcap=3.0, z_loss=0.01, suppression=0.5, adaptive=True, return_stats=True)),
    ("sparsemax", dict(label_smoothing=0.1, class_weight=True, z_loss=0.01, reduction="none")),
])
def test_knobs_under_torch_compile_fullgraph(loss, kw):
    torch._dynamo.reset()
    x, w, b, t, cw = _data(6)
    if kw.get("class_weight"):
        kw = dict(kw, class_weight=cw)
    stats = kw.get("return_stats", False)

    def f(a, c, d):
        return fused_linear_loss(a, c, t, loss, d, chunk_size=4, **kw)

    args = [a.clone().requires_grad_() for a in (x, w, b)]
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    refs = [a.clone().requires_grad_() for a in (x, w, b)]
    ref = f(*refs)
    if stats:
        (out, st), (ref, rst) = out, ref
        for a, e in zip(st, rst):
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    go = torch.linspace(0.5, 1.5, out.numel(), dtype=D).reshape(out.shape)
    for a, e in zip(torch.autograd.grad(out, args, go), torch.autograd.grad(ref, refs, go)):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


def test_stats_are_counted_in_float32_for_half_inputs():
    """A support of 5000 classes is not a bfloat16 number (it rounds to 4992)."""
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(6, 8, generator=g) * 0.3).bfloat16()
    w = (torch.randn(5000, 8, generator=g) * 0.3).bfloat16()
    _, stats = fused_linear_loss(x, w, torch.arange(6), return_stats=True)
    assert stats.support.dtype == torch.float32 and stats.support.item() == 5000


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_knobs_on_the_top_k_losses(reduction):
    """topk_softmax_ce takes softcap, class_weight and z_loss (row × w[y]); soft_topk
    (dense targets) softcap and z_loss."""
    x, w, b, t, cw = _data(9)
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    out = fused_linear_loss(args[0], args[1], t, "topk_softmax_ce", args[2], k=3, softcap=2.0, class_weight=cw,
                            z_loss=0.03, reduction=reduction, chunk_size=4)
    refs = [a.clone().requires_grad_() for a in (x, w, b)]
    z = 2.0 * torch.tanh((refs[0] @ refs[1].t() + refs[2]) / 2.0)
    keep = t != -100
    idx = torch.where(keep, t, 0)
    rows = L.topk_softmax_cross_entropy(z, t, 3, reduction="none") * cw[idx]
    zl = torch.where(keep, 0.03 * torch.logsumexp(z, -1) ** 2, 0.0)
    ref = _reduce(rows, keep, reduction, torch.where(keep, cw[idx], 0.0).sum()) + _reduce(zl, keep, reduction)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    go = torch.linspace(0.5, 1.5, out.numel(), dtype=D).reshape(out.shape)
    for a, e in zip(torch.autograd.grad(out, args, go), torch.autograd.grad(ref, refs, go)):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)

    y = torch.zeros(x.shape[0], V, dtype=D)
    y[:, :2] = 1.0
    out = fused_linear_loss(x, w, y, "soft_topk", b, k=2, softcap=2.0, z_loss=0.03, reduction=reduction, chunk_size=4)
    z = 2.0 * torch.tanh((x @ w.t() + b) / 2.0)
    ref = _reduce(L.soft_topk_loss(z, y, 2, reduction="none") + 0.03 * torch.logsumexp(z, -1) ** 2,
                  torch.ones(x.shape[0], dtype=torch.bool), reduction)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)


def test_ts2_gradient_is_finite_where_every_other_class_is_masked():
    # one finite class (p = 1) and the target masked: the loss is +inf and, left
    # out by the caller, must not send NaN into the other rows' gradient; and a
    # row whose only unmasked classes are the support has no penalty mass
    inf = float("-inf")
    z = torch.tensor([[inf, inf, 1.0], [0.5, inf, 1.0], [0.3, -0.2, 1.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 2, 2])
    out = ts2_loss(z, t, reduction="none")
    assert out[0] == float("inf") and torch.isfinite(out[1:]).all()
    (g,) = torch.autograd.grad(torch.where(torch.isfinite(out), out, 0.0).sum(), z)
    assert torch.isfinite(g).all() and (g[0] == 0).all()
