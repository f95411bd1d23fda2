"""softk.losses.fused_linear_logprobs against materialised float64 references.

The values are checked against the NumPy oracle (tests/oracle/maps.py: λ by
bisection from the maps' definitions), with log p_y and the entropies
computed here from the formulas.  The gradients are checked against autograd
through an independent torch reference (:func:`reference`: λ by bisection,
detached, then one Newton step, whose derivative is the implicit one), not
through softk's maps or their backward.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from softk.losses import fused_linear_logprobs
from softk._ops.fused_policy import FusedLinearLogprobs
from softk.losses.fused_policy import _policy_map
from softk.threshold.entmax_anchor import needs_anchor

from ..oracle import maps as OM

D = torch.float64

# (map, alpha argument, α of the entropy)
MAPS = [
    ("softmax", None, 1.0),
    ("sparsemax", None, 2.0),
    ("entmax15", None, 1.5),
    ("entmax", 1.3, 1.3),
    ("entmax", 1.75, 1.75),
    ("entmax", 2.5, 2.5),
    ("entmax", 1.0, 1.0),
]
MAP_IDS = [m if a is None else f"{m}-{a}" for m, a, _ in MAPS]

# (tau, softcap, chunk_size, bias, ignored rows)
SETTINGS = {
    "plain": (1.0, None, None, False, ()),
    "all-knobs": (0.7, 2.5, 3, True, (2, 7)),
    "hot-tau": (1.8, None, 4, True, (0,)),
    "chunk-1": (1.0, 4.0, 1, False, (5,)),
}


def _entmax_f(alpha):
    am1 = alpha - 1

    def f(v, power=1 / am1):
        s = am1 * v
        pos = s > 0
        return torch.where(pos, torch.where(pos, s, 1.0) ** power, 0.0)

    return f


def ref_probs(u, alpha):
    """α-entmax(u) along the last dim in float64, differentiable: λ by
    bisection (detached), then one Newton step λ₀ + (Σf(u−λ₀) − 1)/Σf′(u−λ₀),
    whose value is λ₀ to rounding and whose derivative is dλ/du = f′/Σf′."""
    if alpha == 1.0:
        return torch.softmax(u, -1)
    am1 = alpha - 1
    f = _entmax_f(alpha)
    with torch.no_grad():
        ud = u.detach()
        hi = ud.amax(-1, keepdim=True)
        lo = hi - 1 / am1  # the largest entry is 1 there: Σp >= 1
        for _ in range(200):
            mid = (lo + hi) / 2
            big = f(ud - mid).sum(-1, keepdim=True) >= 1
            lo, hi = torch.where(big, mid, lo), torch.where(big, hi, mid)
        lam0 = (lo + hi) / 2
    lam = lam0 + (f(u - lam0).sum(-1, keepdim=True) - 1) / f(u - lam0, 1 / am1 - 1).sum(-1, keepdim=True)
    return f(u - lam)


def reference(x, w, b, t, alpha, tau=1.0, softcap=None, ignore_index=-100):
    """(log p_y, H) from the materialised logits, differentiable in float64."""
    z = x @ w.T
    if b is not None:
        z = z + b
    return reference_from_logits(z, t, alpha, tau, softcap, ignore_index)


def reference_from_logits(z, t, alpha, tau=1.0, softcap=None, ignore_index=-100):
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    u = z / tau
    keep = t != ignore_index
    idx = torch.where(keep, t, 0).unsqueeze(-1)
    if alpha == 1.0:
        logp_all = torch.log_softmax(u, -1)
        ent = -(logp_all.exp() * logp_all).sum(-1)
        logp = logp_all.gather(-1, idx).squeeze(-1)
    else:
        p = ref_probs(u, alpha)
        py = p.gather(-1, idx).squeeze(-1)
        logp = torch.where(py > 0, torch.log(torch.where(py > 0, py, 1.0)), -math.inf)
        ent = (1 - (p**alpha).sum(-1)) / (alpha * (alpha - 1))
    return torch.where(keep, logp, 0.0), torch.where(keep, ent, 0.0)


def oracle_values(x, w, b, t, alpha, tau=1.0, softcap=None, ignore_index=-100):
    """(log p_y, H) in NumPy from the oracle's p."""
    z = x.detach().numpy() @ w.detach().numpy().T
    if b is not None:
        z = z + b.detach().numpy()
    if softcap is not None:
        z = softcap * np.tanh(z / softcap)
    flat = z.reshape(-1, z.shape[-1])
    p = OM.softmax(flat, tau=tau) if alpha == 1.0 else OM.entmax(flat, alpha, tau=tau)
    tt = t.reshape(-1).numpy()
    keep = tt != ignore_index
    py = p[np.arange(len(tt)), np.where(keep, tt, 0)]
    with np.errstate(divide="ignore"):
        logp = np.log(py)
    if alpha == 1.0:
        logs = np.log(np.where(p > 0, p, 1.0))
        ent = -(p * logs).sum(-1)
    else:
        ent = (1 - (p**alpha).sum(-1)) / (alpha * (alpha - 1))
    shape = t.shape
    return np.where(keep, logp, 0.0).reshape(shape), np.where(keep, ent, 0.0).reshape(shape)


def _data(lead, h, v, *, bias, ignored=(), seed=0, scale=2.0, dtype=D):
    """Hidden states, a head whose logits spread over a few units (sparse maps
    keep several classes, not all), and targets that are the argmax for half
    of the rows (inside every support) and uniform for the others (often
    outside a sparse support: log p = −inf there)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, h, dtype=D, generator=g)
    w = torch.randn(v, h, dtype=D, generator=g) * (scale / h**0.5)
    b = torch.randn(v, dtype=D, generator=g) * 0.5 if bias else None
    z = x @ w.T + (0 if b is None else b)
    t = torch.where(torch.rand(lead, generator=g) < 0.5, z.argmax(-1), torch.randint(0, v, lead, generator=g))
    flat = t.view(-1)
    for i in ignored:
        flat[i] = -100
    cast = lambda a: None if a is None else a.to(dtype).requires_grad_()  # noqa: E731
    return cast(x), cast(w), cast(b), t


def _objective(logp, ent, seed=1):
    """Σ a_i ℓ_i + Σ c_i H_i with random a, c (a policy-gradient term and an
    entropy bonus); −inf log-probabilities (zero gradient) enter as 0."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(logp.shape, dtype=D, generator=g)
    c = torch.randn(logp.shape, dtype=D, generator=g)
    finite = torch.isfinite(logp)
    return (torch.where(finite, logp, 0.0).double() * a).sum() + (ent.double() * c).sum()


def _close_grads(got, want, rtol):
    for name, g1, g2 in zip(("input", "weight", "bias"), got, want):
        if g2 is None:
            assert g1 is None
            continue
        scale = g2.abs().max().item()
        err = (g1.double() - g2).abs().max().item()
        assert err <= rtol * scale, f"grad {name}: max error {err:.3g} > {rtol:.1g} × {scale:.3g}"


@pytest.fixture(params=["chunks", "walk"])
def route(request, monkeypatch):
    """The backward's two routes in float64: the chunks of rows (float32 and
    float64 inputs) and the walk over vocabulary blocks (half inputs, here
    run in float64 so that it is held to float64's rounding)."""
    import softk._ops.fused_policy as FP
    from softk._ops import fused_walk

    walks, decided = [], []
    real, real_takes = fused_walk.walk, FP.takes_walk
    monkeypatch.setattr(fused_walk, "walk", lambda *a: walks.append(1) or real(*a))
    monkeypatch.setattr(FP, "takes_walk", lambda *a: decided.append(real_takes(*a)) or decided[-1])
    if request.param == "walk":
        monkeypatch.setattr(FP, "WALK_DTYPES", (D,))
    yield SimpleNamespace(leg=request.param, walks=walks)
    # the backward walks exactly where the policy says so, and the chunks leg never
    assert bool(walks) == any(decided) and (request.param == "walk" or not walks)


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name,alpha,a", MAPS, ids=MAP_IDS)
def test_values_and_gradients(name, alpha, a, setting, route):
    """Values and gradients against the float64 oracle on both backward routes
    (the walk serves softmax and 1.125 ≤ α ≤ 2: α = 2.5 takes the chunks)."""
    tau, cap, chunk, bias, ignored = SETTINGS[setting]
    lead = (11,) if setting != "hot-tau" else (2, 5)
    x, w, b, t = _data(lead, 6, 17, bias=bias, ignored=ignored)
    logp, ent = fused_linear_logprobs(x, w, t, name, b, alpha=alpha, tau=tau, softcap=cap, chunk_size=chunk)
    assert logp.shape == ent.shape == lead and logp.dtype == ent.dtype == D

    want_logp, want_ent = oracle_values(x, w, b, t, a, tau, cap)
    # float64 rounding on both sides: the oracle's λ is exact to a few ulps, and log p_y scales p_y's error by 1/p_y
    np.testing.assert_allclose(logp.detach().numpy(), want_logp, rtol=2e-12, atol=1e-13)
    np.testing.assert_allclose(ent.detach().numpy(), want_ent, rtol=2e-12, atol=1e-14)
    if a > 1 and tau <= 1:
        # the cases reach both sides of the support (−inf and finite log-probabilities;
        # at τ > 1 the support of α near 1 may hold every class)
        kept = t != -100
        assert torch.isinf(logp[kept]).any() and torch.isfinite(logp[kept]).any()
    ignored_rows = t == -100
    assert (logp[ignored_rows] == 0).all() and (ent[ignored_rows] == 0).all()

    params = (x, w) if b is None else (x, w, b)
    got = torch.autograd.grad(_objective(logp, ent), params)
    ref_logp, ref_ent = reference(x, w, b, t, a, tau, cap)
    torch.testing.assert_close(ref_logp, logp.detach(), rtol=2e-12, atol=1e-13)  # the references agree
    want = torch.autograd.grad(_objective(ref_logp, ref_ent), params)
    _close_grads(got, want, 1e-12)
    # ignored rows get no gradient
    assert (got[0].reshape(-1, 6)[ignored_rows.reshape(-1)] == 0).all()
    assert bool(route.walks) == (route.leg == "walk" and (a == 1.0 or not needs_anchor(a)))


@pytest.mark.parametrize("name,alpha,a", MAPS[:4], ids=MAP_IDS[:4])
def test_one_output_only(name, alpha, a):
    """The gradient of either output alone: entropy=False, and entropy
    returned but left out of the objective (its incoming gradient is None)."""
    x, w, b, t = _data((9,), 5, 13, bias=True, ignored=(4,))
    ref_logp, ref_ent = reference(x, w, b, t, a, 0.9)
    finite = torch.isfinite(ref_logp)
    g = torch.linspace(-1, 1, 9, dtype=D)

    logp = fused_linear_logprobs(x, w, t, name, b, alpha=alpha, tau=0.9, chunk_size=2, entropy=False)
    assert isinstance(logp, torch.Tensor)
    got = torch.autograd.grad((torch.where(finite, logp, 0.0) * g).sum(), (x, w, b))
    want = torch.autograd.grad((torch.where(finite, ref_logp, 0.0) * g).sum(), (x, w, b), retain_graph=True)
    _close_grads(got, want, 1e-12)

    logp, ent = fused_linear_logprobs(x, w, t, name, b, alpha=alpha, tau=0.9, chunk_size=2)
    got = torch.autograd.grad((ent * g).sum(), (x, w, b))
    want = torch.autograd.grad((ref_ent * g).sum(), (x, w, b))
    _close_grads(got, want, 1e-12)


@pytest.mark.parametrize("name,alpha", [("softmax", None), ("sparsemax", None), ("entmax15", None), ("entmax", 1.3)])
def test_gradcheck(name, alpha):
    """Finite differences in float64 on a tiny case, both outputs (targets in
    the support, so that log p_y is finite and differentiable)."""
    x, w, b, _ = _data((4,), 3, 6, bias=True, seed=3)
    t = (x @ w.T + b).argmax(-1).detach()
    t[2] = -100

    def f(x, w, b):
        return fused_linear_logprobs(x, w, t, name, b, alpha=alpha, tau=0.8, softcap=3.0, chunk_size=3)

    assert torch.autograd.gradcheck(f, (x, w, b))


def test_masked_rows_inside_the_pass():
    """Off the CPU the ignored rows stay in the pass and are masked there:
    the same values and gradients as the reference, zeros at those rows."""
    x, w, b, t = _data((8,), 4, 9, bias=True, ignored=(1, 6))
    keep = t != -100
    spec = _policy_map("entmax15", None, 1.2, 2.0)
    logp, ent = FusedLinearLogprobs.apply(x, w, b, torch.where(keep, t, 0), keep, spec, 3, True)
    ref_logp, ref_ent = reference(x, w, b, t, 1.5, 1.2, 2.0)
    torch.testing.assert_close(logp, ref_logp, rtol=2e-12, atol=1e-13)
    torch.testing.assert_close(ent, ref_ent, rtol=2e-12, atol=1e-14)
    got = torch.autograd.grad(_objective(logp, ent), (x, w, b))
    want = torch.autograd.grad(_objective(ref_logp, ref_ent), (x, w, b))
    _close_grads(got, want, 1e-12)
    assert (got[0][~keep] == 0).all()


@pytest.mark.parametrize("live", [True, False], ids=["live-columns", "dense"])
@pytest.mark.parametrize("name,alpha,a", MAPS[1:4], ids=MAP_IDS[1:4])
def test_sparse_backward_products(name, alpha, a, live, monkeypatch):
    """The sparse maps' backward on the CPU runs on the live columns (the
    union of the chunk's supports); elsewhere the dense products: both forms
    against the reference, with a support that leaves most classes out."""
    import softk._ops.fused_policy as FP

    monkeypatch.setattr(FP, "LIVE_COLUMNS_DEVICES", frozenset({"cpu"}) if live else frozenset())
    x, w, b, t = _data((12,), 6, 40, bias=True, ignored=(5,), scale=4.0, seed=7)
    logp, ent = fused_linear_logprobs(x, w, t, name, b, alpha=alpha, tau=0.8, softcap=5.0, chunk_size=5)
    ref_logp, ref_ent = reference(x, w, b, t, a, 0.8, 5.0)
    got = torch.autograd.grad(_objective(logp, ent), (x, w, b))
    want = torch.autograd.grad(_objective(ref_logp, ref_ent), (x, w, b))
    _close_grads(got, want, 1e-12)
    # the case has columns outside every support (the live form skips them)
    p = ref_probs((5.0 * torch.tanh((x @ w.T + b) / 5.0) / 0.8).detach(), a)
    assert not (p > 0).any(0).all()


def test_no_kept_row_and_no_row():
    x, w, b, _ = _data((5,), 4, 7, bias=True)
    t = torch.full((5,), -100)
    logp, ent = fused_linear_logprobs(x, w, t, "sparsemax", b)
    assert (logp == 0).all() and (ent == 0).all()
    gx, gw, gb = torch.autograd.grad(logp.sum() + ent.sum(), (x, w, b))
    assert not gx.any() and not gw.any() and not gb.any()

    x0 = torch.zeros(0, 4, dtype=D, requires_grad=True)
    logp, ent = fused_linear_logprobs(x0, w, torch.zeros(0, dtype=torch.long), "entmax15", b)
    assert logp.shape == ent.shape == (0,)
    gw, = torch.autograd.grad((logp.sum() + ent.sum()), (w,), allow_unused=True)
    assert gw is None or not gw.any()


def test_chunks_agree():
    """Every chunk size gives the same numbers (each row is computed alone)."""
    x, w, b, t = _data((13,), 8, 21, bias=True, ignored=(3,))
    outs = [fused_linear_logprobs(x, w, t, "entmax", b, alpha=1.6, chunk_size=c) for c in (1, 4, 13, None)]
    for logp, ent in outs[1:]:
        torch.testing.assert_close(logp, outs[0][0], rtol=1e-12, atol=0)
        torch.testing.assert_close(ent, outs[0][1], rtol=1e-12, atol=1e-15)


def _sensitivity(z, t, a, tau):
    """‖∂ℓ_i/∂z_i‖₁ and ‖∂H_i/∂z_i‖₁ per row at the float64 logits ``z``: how far
    each output moves per unit of error in its row's logits (to first order)."""
    jac = torch.autograd.functional.jacobian(lambda z: reference_from_logits(z, t, a, tau), z)
    rows = torch.arange(z.shape[0])
    return tuple(j[rows, rows].abs().sum(-1).nan_to_num(0.0) for j in jac)


def _bf16_case(name, alpha, a, tau=0.9):
    h, v, n = 64, 50, 16
    x, w, b, t = _data((n,), h, v, bias=True, ignored=(3,), seed=5, dtype=torch.bfloat16)
    # the bf16 parameters upcast exactly: the reference sees the same numbers
    x64, w64, b64 = (p.detach().double().requires_grad_() for p in (x, w, b))
    z64 = (x64 @ w64.T + b64).detach()
    # A float32 logit is a dot product of H terms plus the bias: off by at most
    # H·2⁻²⁴·Σ_k|x_k w_k| + 2⁻²⁴|b| (the classic bound on a recursive sum);
    # the map's own float32 solve moves λ by a few ulps of the largest |z|.
    dz = (h * 2.0**-24 * (x64.abs() @ w64.abs().T) + 2.0**-24 * b64.abs()).amax(-1).detach()
    dz = dz + 4 * 2.0**-24 * z64.abs().amax(-1)
    return x, w, b, t, (x64, w64, b64), z64, dz


@pytest.mark.parametrize("name,alpha,a", MAPS[:4], ids=MAP_IDS[:4])
def test_bfloat16(name, alpha, a):
    """bfloat16 inputs: the logits tile is formed in float32, so against the
    float64 reference on the same (bf16-rounded) inputs the only errors are
    float32's.  Each output is off by at most its sensitivity to its row's
    logits (‖∂out/∂z‖₁, from the reference) times the logits' float32 error
    bound, plus float32's rounding of the output itself (a few ulps); logits
    rounded to bf16 (off by 2⁻⁹|z|) break that bound
    (test_bfloat16_bound_needs_float32_logits).  The gradients come back in
    bf16: each entry within bf16's unit roundoff 2⁻⁸ of the reference, plus
    float32's sums, well below 10⁻⁴ of the largest entry."""
    tau = 0.9
    x, w, b, t, (x64, w64, b64), z64, dz = _bf16_case(name, alpha, a, tau)
    logp, ent = fused_linear_logprobs(x, w, t, name, b, alpha=alpha, tau=tau, chunk_size=5)
    assert logp.dtype == ent.dtype == torch.float32
    ref_logp, ref_ent = reference(x64, w64, b64, t, a, tau)
    gain_logp, gain_ent = _sensitivity(z64, t, a, tau)
    finite = torch.isfinite(ref_logp)
    assert torch.equal(torch.isfinite(logp), finite)
    ulps = 4 * 2.0**-24
    err_logp = (logp.double() - ref_logp).where(finite, 0.0).abs()
    err_ent = (ent.double() - ref_ent).abs()
    assert (err_logp <= gain_logp * dz + ulps * ref_logp.where(finite, 0.0).abs()).all()
    assert (err_ent <= gain_ent * dz + ulps * ref_ent.abs()).all()

    got = torch.autograd.grad(_objective(logp, ent), (x, w, b))
    want = torch.autograd.grad(_objective(ref_logp, ref_ent), (x64, w64, b64))
    assert all(g.dtype == torch.bfloat16 for g in got)
    for g1, g2 in zip(got, want):
        err = (g1.double() - g2).abs()
        assert (err <= 2.0**-8 * g2.abs() + 1e-4 * g2.abs().max()).all(), err.max().item()


@pytest.mark.parametrize("name,alpha,a", [MAPS[0], MAPS[3]], ids=[MAP_IDS[0], MAP_IDS[3]])
def test_bfloat16_bound_needs_float32_logits(name, alpha, a):
    """The bound of test_bfloat16 can fail: log-probabilities from logits
    rounded to bf16 break it."""
    tau = 0.9
    x, w, b, t, (x64, w64, b64), z64, dz = _bf16_case(name, alpha, a, tau)
    ref_logp, _ = reference(x64, w64, b64, t, a, tau)
    gain_logp, _ = _sensitivity(z64, t, a, tau)
    rounded, _ = reference_from_logits((x @ w.T + b).double(), t, a, tau)
    finite = torch.isfinite(ref_logp) & torch.isfinite(rounded)
    err = (rounded - ref_logp).where(finite, 0.0).abs()
    assert (err > gain_logp * dz + 4 * 2.0**-24 * ref_logp.where(finite, 0.0).abs()).any()


@pytest.mark.parametrize("alpha,walks", [(None, True), (1.3, True), (1.05, False), (2.5, False)])
def test_half_weights_walk_the_vocabulary(alpha, walks, monkeypatch):
    """Half inputs: the backward walks the vocabulary in blocks (no float32
    buffer of W's size), except for α-entmax near 1 or above 2, whose p from
    a float threshold loses digits; those keep the chunks' float32 accumulator."""
    import softk._ops.fused_policy as FP
    from softk._ops import fused_walk

    seen, accumulated = [], []
    real_walk, real_acc = fused_walk.walk, FP.accumulate_weight_grad
    monkeypatch.setattr(fused_walk, "walk", lambda *a: seen.append(a[1].dtype) or real_walk(*a))
    monkeypatch.setattr(FP, "accumulate_weight_grad", lambda gw, *a: accumulated.append(gw.dtype) or real_acc(gw, *a))
    x, w, b, t = _data((6,), 8, 10, bias=True, dtype=torch.bfloat16)
    name = "sparsemax" if alpha is None else "entmax"
    logp, ent = fused_linear_logprobs(x, w, t, name, b, alpha=alpha, chunk_size=2)
    (logp.nan_to_num(neginf=0).sum() + ent.sum()).backward()
    if walks:
        assert seen == [torch.bfloat16] and accumulated == []
    else:
        assert seen == [] and set(accumulated) == {torch.float32}
    assert w.grad.dtype == torch.bfloat16


def test_leading_dims_and_integer_targets():
    x, w, b, t = _data((2, 3, 4), 5, 8, bias=False)
    logp, ent = fused_linear_logprobs(x, w, t.int(), "softmax")
    want_logp, want_ent = oracle_values(x, w, None, t, 1.0)
    assert logp.shape == (2, 3, 4)
    np.testing.assert_allclose(logp.detach().numpy(), want_logp, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ent.detach().numpy(), want_ent, rtol=1e-12, atol=1e-14)


def _ok():
    # seeded, and small logits: every map's p has more than one class in its support (entropy > 0)
    g = torch.Generator().manual_seed(0)
    x = 0.1 * torch.randn(4, 3, dtype=D, generator=g)
    w = torch.randn(7, 3, dtype=D, generator=g)
    return x, w, torch.tensor([0, 1, 6, -100])


@pytest.mark.parametrize("change,error,match", [
    (dict(weight=torch.randn(7, 2, dtype=D)), ValueError, "weight has in_features=2"),
    (dict(weight=torch.randn(7, dtype=D)), ValueError, "weight must be a 2-D tensor"),
    (dict(weight=torch.randn(7, 3)), TypeError, "weight must have input's dtype"),
    (dict(bias=torch.randn(6, dtype=D)), ValueError, r"bias must be None or a tensor of shape \(7,\)"),
    (dict(input=torch.randint(0, 3, (4, 3))), TypeError, "input must be a floating-point tensor"),
    (dict(map="relu"), ValueError, "map must be one of"),
    (dict(map="entmax"), ValueError, "map='entmax' needs alpha"),
    (dict(map="entmax", alpha=0.5), ValueError, "alpha must be a finite float >= 1"),
    (dict(map="entmax", alpha=torch.tensor([1.5])), TypeError, "alpha must be a float here"),
    (dict(map="sparsemax", alpha=1.5), ValueError, "alpha applies to map='entmax' only"),
    (dict(tau=0.0), ValueError, "tau must be a finite number > 0"),
    (dict(tau=-1.0), ValueError, "tau must be a finite number > 0"),
    (dict(softcap=0.0), ValueError, "softcap must be a finite number > 0"),
    (dict(softcap="big"), TypeError, "softcap must be a positive number"),
    (dict(chunk_size=0), ValueError, "chunk_size must be None or an int >= 1"),
    (dict(target=torch.tensor([0.0, 1.0, 2.0, 3.0])), TypeError, "target must be an integer tensor"),
    (dict(target=torch.tensor([True, False, True, True])), TypeError, "target must be an integer tensor"),
    (dict(target=[0, 1, 2, 3]), TypeError, "target must be a torch.Tensor"),
    (dict(target=torch.tensor([0, 1, 2])), ValueError, r"target must have shape \(4,\)"),
    (dict(target=torch.tensor([0, 1, 7, 2])), ValueError, r"target holds class index 7, outside \[0, 7\)"),
    (dict(target=torch.tensor([0, -1, 2, 2])), ValueError, r"target holds class index -1"),
    (dict(ignore_index=1.5), TypeError, "ignore_index must be an int"),
    (dict(entropy=1), TypeError, "entropy must be a bool"),
])
def test_errors(change, error, match):
    x, w, t = _ok()
    args = dict(input=x, weight=w, target=t, map="softmax", bias=None)
    args.update(change)
    with pytest.raises(error, match=match):
        fused_linear_logprobs(**args)


def test_torch_func_transforms_are_a_clear_error():
    # the old-style Function raised from deep inside torch ("must override
    # the setup_context staticmethod")
    x, w, t = _ok()
    with pytest.raises(NotImplementedError, match="does not run under torch.func transforms"):
        torch.func.jacrev(lambda v: fused_linear_logprobs(x, v, t))(w)


def test_ignore_index_other_than_default():
    x, w, t = _ok()
    t = torch.tensor([0, 1, 6, 3])
    logp, ent = fused_linear_logprobs(x, w, t, "entmax15", ignore_index=3)
    assert logp[3] == 0 and ent[3] == 0 and ent[0] > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("target", [[-100, -100], []])
def test_logprobs_with_no_kept_row_give_zero_gradients(dtype, target):
    # half precision: with every row ignored (or none at all) the walk kept
    # no numbers and the backward raised AttributeError deep inside
    t = torch.tensor(target, dtype=torch.long)
    h = torch.randn(t.numel(), 8, dtype=dtype, requires_grad=True)
    w = torch.randn(5, 8, dtype=dtype, requires_grad=True)
    b = torch.randn(5, dtype=dtype, requires_grad=True)
    logp, ent = fused_linear_logprobs(h, w, t, bias=b)
    assert logp.tolist() == ent.tolist() == [0.0] * t.numel()
    (logp.sum() + ent.sum()).backward()
    for p in (h, w, b):
        assert torch.equal(p.grad, torch.zeros_like(p))
