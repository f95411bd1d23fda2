r"""The fused policy statistics' pass over chunks of rows and its autograd rule.

For logits z = X Wᵀ + b (soft-capped to c·tanh(z/c) when asked), u = z/τ and
p = map(u), :func:`policy_pass` returns per row log p_y and the entropy H(p)
that the map maximises (p = argmax ⟨p, u⟩ + H(p)), one chunk of rows at a
time.  :class:`FusedLinearLogprobs` is the autograd rule of
:func:`softk.losses.fused_linear_logprobs`: its backward walks the chunks
again, recomputes each chunk's logits and p, forms

.. math:: G = g_\ell \odot \partial \log p_y / \partial z + g_H \odot \partial H / \partial z

per row (g_ℓ, g_H the incoming gradients) and adds G W, Gᵀ X and Σ G into
the gradients: no N×V tensor exists in either direction.  Every map here
has the Jacobian J v = (d ⊙ v − d (dᵀv)/Σd)/τ, with d = p for softmax and
d = p^{2−α} on the support of α-entmax (0 off it), and the derivatives are:

* softmax: ∂log p_y/∂z = (e_y − p)/τ, ∂H/∂z = −p ⊙ (log p + H)/τ, H the
  Shannon entropy;
* α-entmax (sparsemax α = 2): ∂log p_y/∂z = J e_y / p_y where p_y > 0 (0
  where p_y = 0: log p_y is −inf there and constant nearby), and
  ∂H/∂z = J ∇_p H with ∇_p H = −p^{α−1}/(α−1), H the Tsallis entropy
  (1 − Σ p^α)/(α(α−1));

then times the softcap's slope 1 − (z_c/c)².

For half-precision weights (:data:`WALK_DTYPES`) the backward walks the
vocabulary in blocks instead (:mod:`softk._ops.fused_walk`), so that no
float32 buffer of W's size exists: G is a function of z_j and a few numbers
per row that the forward keeps (:class:`PolicyTiles`).  With
dᵀv = −g_H/(α−1) + g_ℓ p_y^{1−α} (Σ p = 1), α-entmax's is

.. math:: G_j = \bigl(-\tfrac{g_H}{\alpha-1} p_j - \tfrac{d^\top v}{\sum d}\, p_j^{2-\alpha}
          + [j = y]\, g_\ell\, p_y^{1-\alpha}\bigr)/\tau,

and softmax's G_j = (g_ℓ [j = y] − p_j (g_H (log p_j + H) + g_ℓ))/τ, with
log p_j = u_j − m − log S.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..threshold.entmax_anchor import needs_anchor
from ..threshold.families import entmax_by_alpha
from . import fused_walk

# The input dtypes whose backward walks the vocabulary (no float32 buffer of
# W's size): the half dtypes.  A module constant, so that tests can run the
# walk in float64.
WALK_DTYPES = (torch.float16, torch.bfloat16)


def takes_walk(x: Tensor, spec: "PolicyMap", want_w: bool) -> bool:
    """Whether the pass for inputs ``x`` walks the vocabulary: half inputs
    whose weight needs a gradient, for softmax and α-entmax with α − 1 in
    [1/8, 1] (elsewhere p = f(u − λ) from a float λ loses digits)."""
    return want_w and x.dtype in WALK_DTYPES and (spec.probs is None or not needs_anchor(spec.alpha))


class PolicyMap(NamedTuple):
    """The map whose statistics a pass computes, already checked.

    ``alpha`` is 1 for softmax (Shannon entropy) and α > 1 for α-entmax
    (2 sparsemax, 1.5 entmax15); ``probs`` maps u (C, V) to p along the last
    dimension for α > 1 (None for softmax, whose p the pass forms itself)."""

    alpha: float
    tau: float
    softcap: Optional[float]
    probs: Optional[Callable[[Tensor], Tensor]]


def _acc_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _power(p: Tensor, e: float) -> Tensor:
    """p**e on the support (p > 0), 0 off it, for the exponents the maps need."""
    if e == 1.0:
        return p
    if e == 0.5:
        return p.sqrt()
    if e == 0.0:
        return (p > 0).to(p.dtype)
    pos = p > 0
    return torch.where(pos, torch.exp(e * torch.log(torch.where(pos, p, 1.0))), 0.0)


def _capped(z: Tensor, cap: Optional[float]) -> Tensor:
    """c·tanh(z/c), in place in the chunk's logits."""
    if cap is None:
        return z
    return z.div_(cap).tanh_().mul_(cap)


def _chunk_logits(xc: Tensor, w: Tensor, bias: Optional[Tensor]) -> Tensor:
    """X_c Wᵀ + b in ``w``'s (accumulation) dtype: half inputs are upcast first,
    so the logits tile is float32 whatever the inputs' precision."""
    xc = xc.to(w.dtype)
    if bias is None:
        return xc @ w.t()
    return torch.addmm(bias.to(w.dtype), xc, w.t())


def _softmax_rows(u: Tensor, idx: Tensor):
    """(log p_y, H, m, log S) of softmax(u) per row; u becomes u − max u in
    place and its exponential is returned as e (p = e/S).  H = log S − ⟨p, u −
    max u⟩: every term is small, so H keeps its absolute precision when the
    logits are large."""
    m = u.amax(-1, keepdim=True)
    u.sub_(m)
    e = torch.exp(u)
    s = e.sum(-1, keepdim=True)
    log_s = s.log()
    ent = (log_s - torch.linalg.vecdot(e, u).unsqueeze(-1) / s).squeeze(-1)
    logp = u.gather(-1, idx.unsqueeze(-1)).squeeze(-1) - log_s.squeeze(-1)
    return logp, ent, e, s, log_s


def _tsallis(p: Tensor, alpha: float) -> Tensor:
    """(1 − Σ p^α)/(α(α−1)) as Σ p (1 − p^{α−1})/(α(α−1)): a sum of terms ≥ 0,
    without the cancellation of 1 − Σ p^α as α → 1 (expm1 there)."""
    am1 = alpha - 1
    if alpha in (1.5, 2.0):
        gap = 1 - _power(p, am1)
    else:
        pos = p > 0
        gap = torch.where(pos, -torch.expm1(am1 * torch.log(torch.where(pos, p, 1.0))), 0.0)
    return torch.linalg.vecdot(p, gap) / (alpha * am1)


def chunk_forward(z: Tensor, idx: Tensor, spec: PolicyMap, want_entropy: bool):
    """(log p_y (C,), H (C,) or None) for a chunk's logits ``z`` (C, V)
    (overwritten) and class indices ``idx`` (C,) (ignored rows already
    replaced by a valid index)."""
    u = _capped(z, spec.softcap)
    if spec.tau != 1.0:
        u.div_(spec.tau)
    if spec.probs is None:
        logp, ent, _, _, _ = _softmax_rows(u, idx)
        return logp, (ent if want_entropy else None)
    p = spec.probs(u)
    py = p.gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    return py.log(), (_tsallis(p, spec.alpha) if want_entropy else None)


# Where the backward of a sparse map runs on the live columns of G (the
# union of the chunk's supports) instead of all V: on the CPU, as the fused
# linear loss does (its products there were never slower on the columns);
# elsewhere the dense products, whose tiles a GPU's matrix units take whole.
LIVE_COLUMNS_DEVICES = frozenset({"cpu"})


def chunk_grad(z: Tensor, idx: Tensor, spec: PolicyMap, go_logp: Optional[Tensor], go_ent: Optional[Tensor],
               ent: Optional[Tensor]):
    """``(G, cols)``: G = ∂(Σ_i g_ℓ,i log p_{y_i} + g_H,i H_i)/∂z for a chunk's
    logits ``z`` (C, V) (overwritten, and possibly returned as G), the
    incoming gradients ``go_logp`` and ``go_ent`` (C,) (None: zero; 0 at
    ignored rows) and the forward's entropies ``ent`` (C,) (needed by
    softmax's ∂H/∂z).  ``cols`` None: G is (C, V); else G is (C, K), the
    columns ``cols`` (K,) of the full G, which is 0 in every other column."""
    zc = _capped(z, spec.softcap)
    # the softcap's slope, 1 − tanh², before u overwrites the capped logits
    slope = None if spec.softcap is None else 1 - (zc / spec.softcap).square()
    u = zc.div_(spec.tau) if spec.tau != 1.0 else zc
    rows = torch.arange(u.shape[0], device=u.device)
    cols = None
    if spec.probs is None:
        _, _, e, s, log_s = _softmax_rows(u, idx)
        p = e.div_(s)
        # G = g_ℓ (e_y − p) − g_H p (log p + H), log p = (u − max u) − log S
        if go_ent is None:
            g = p.mul_(-go_logp.unsqueeze(-1))  # type: ignore[union-attr]  # one of the two is given
        else:
            a = (ent - log_s.squeeze(-1)) * go_ent
            if go_logp is not None:
                a = a + go_logp
            g = p.mul_(u.mul_(go_ent.unsqueeze(-1)).add_(a.unsqueeze(-1)).neg_())
        if go_logp is not None:
            g[rows, idx] += go_logp
    else:
        alpha = spec.alpha
        p = spec.probs(u)
        del u, z
        py = p[rows, idx]
        at = idx
        if p.device.type in LIVE_COLUMNS_DEVICES:
            # G = J v is 0 off the supports: work on their union only
            cols = (p > 0).any(0).nonzero().squeeze(1)
            p = p.index_select(1, cols)
            slope = None if slope is None else slope.index_select(1, cols)
            # a target with p_y > 0 is one of the columns; the others add nothing
            at = torch.searchsorted(cols, idx).clamp(max=max(cols.numel() - 1, 0))
        d = _power(p, 2 - alpha)  # a new tensor: 2 − α ≠ 1 for α > 1
        dsum = d.sum(-1, keepdim=True)  # > 0: the support is never empty
        # v = ∇_p of g_ℓ log p_y + g_H H on the support; G = J v
        if go_ent is not None:
            v = _power(p, alpha - 1) * (-go_ent / (alpha - 1)).unsqueeze(-1)
        else:
            v = torch.zeros_like(p)
        if go_logp is not None:
            live = py > 0
            v[rows, at] += torch.where(live, go_logp / torch.where(live, py, 1.0), 0.0)
        del p
        # J v = d ⊙ v − d (dᵀv)/Σd
        dv = v.mul_(d)
        g = dv.sub_(d.mul_(dv.sum(-1, keepdim=True) / dsum))
    if spec.tau != 1.0:
        g.div_(spec.tau)
    if slope is not None:
        g.mul_(slope)
    return g, cols


def accumulate_weight_grad(gw: Tensor, g: Tensor, xc: Tensor, cols: Optional[Tensor] = None) -> None:
    """gw += Gᵀ X_c (into the rows ``cols`` of gw when G holds those columns
    only), the weight gradient's accumulation in ``gw``'s dtype (float32 for
    half inputs).  One function, so that the form of the accumulation (its
    buffer's dtype, the product's precision) can change in one place."""
    if cols is None:
        gw.addmm_(g.t(), xc.to(gw.dtype))
    else:
        gw.index_add_(0, cols, g.t() @ xc.to(gw.dtype))


def policy_pass(x: Tensor, weight: Tensor, bias: Optional[Tensor], target: Tensor, keep: Tensor,
                spec: PolicyMap, chunk: int, want_entropy: bool):
    """The forward over the rows of ``x`` (M, H): ``(log p_y (M,), H (M,) or
    None)`` in float32 (float64 for float64 input), 0 at the rows where
    ``keep`` is False."""
    m = x.shape[0]
    acc = _acc_dtype(x)
    w = weight.to(acc)
    logp = torch.zeros(m, dtype=acc, device=x.device)
    ent = torch.zeros(m, dtype=acc, device=x.device) if want_entropy else None
    idx = torch.where(keep, target, 0)
    for s in range(0, m, chunk):
        e = min(s + chunk, m)
        z = _chunk_logits(x[s:e], w, bias)
        lp, h = chunk_forward(z, idx[s:e], spec, want_entropy)
        del z
        logp[s:e] = torch.where(keep[s:e], lp, 0.0)
        if ent is not None:
            ent[s:e] = torch.where(keep[s:e], h, 0.0)  # type: ignore[arg-type]  # h is given with want_entropy
    return logp, ent


def policy_backward(x, weight, bias, target, keep, spec: PolicyMap, chunk: int, go_logp, go_ent, ent, want):
    """The gradients ``(grad_x, grad_w, grad_b)`` (None where ``want`` says so)
    for the incoming ``go_logp`` and ``go_ent`` (M,) (None: zero), the
    logits recomputed one chunk at a time; in the accumulation dtype."""
    m = x.shape[0]
    acc = _acc_dtype(x)
    w = weight.to(acc)
    want_x, want_w, want_b = want
    gx = torch.empty(x.shape, dtype=acc, device=x.device) if want_x else None
    gw = torch.zeros(weight.shape, dtype=acc, device=x.device) if want_w else None
    gb = torch.zeros(weight.shape[0], dtype=acc, device=x.device) if want_b else None
    idx = torch.where(keep, target, 0)
    # ignored rows get no gradient: their incoming gradients are taken as 0
    go_logp = None if go_logp is None else torch.where(keep, go_logp.to(acc), 0.0)
    go_ent = None if go_ent is None else torch.where(keep, go_ent.to(acc), 0.0)
    for s in range(0, m, chunk):
        e = min(s + chunk, m)
        z = _chunk_logits(x[s:e], w, bias)
        g, cols = chunk_grad(z, idx[s:e], spec, None if go_logp is None else go_logp[s:e],
                             None if go_ent is None else go_ent[s:e], None if ent is None else ent[s:e])
        del z
        if gx is not None:
            torch.mm(g, w if cols is None else w.index_select(0, cols), out=gx[s:e])
        if gw is not None:
            accumulate_weight_grad(gw, g, x[s:e], cols)
        if gb is not None:
            if cols is None:
                gb += g.sum(0)
            else:
                gb.index_add_(0, cols, g.sum(0))
        del g
    return gx, gw, gb


class PolicyTiles:
    """G of Σ_i g_ℓ,i log p_{y_i} + g_H,i H_i on any block of classes from the
    rows' numbers: (m, log S, H) for softmax, (m, d, Σ p^{2−α}, p_y) for
    α-entmax, m the row's max of u = z/τ and λ = m − d its threshold (see
    the module's formula).  ``grad`` is :func:`softk._ops.fused_walk.walk`'s
    tile form, its row weights (R, 2) the incoming (g_ℓ, g_H)."""

    def __init__(self, spec: "PolicyMap"):
        self.spec = spec
        self.family = None if spec.probs is None else entmax_by_alpha(spec.alpha)

    def stats(self, u: Tensor, idx: Tensor, want_entropy: bool):
        """(log p_y, H or None, the rows' numbers (C, k), p > 0 or None) of the
        chunk's u = cap(z)/τ (C, V), overwritten."""
        spec = self.spec
        m = u.amax(-1)
        if spec.probs is None:
            logp, ent, _, _, log_s = _softmax_rows(u, idx)
            return logp, ent if want_entropy else None, torch.stack([m, log_s.squeeze(-1), ent], 1), None
        p = spec.probs(u)
        py = p.gather(-1, idx.unsqueeze(-1)).squeeze(-1)
        d = self.family.f_inv(p.amax(-1))  # type: ignore[union-attr, misc]  # the α-entmax families have f⁻¹
        dsum = _power(p, 2 - spec.alpha).sum(-1)
        ent = _tsallis(p, spec.alpha) if want_entropy else None
        return py.log(), ent, torch.stack([m, d, dsum, py], 1), p > 0

    def grad(self, z: Tensor, lo: int, stats: Tensor, t: Tensor, weights: Tensor) -> Tensor:
        """G on the tile z (R, B) of classes lo ... (overwritten), rows' numbers
        ``stats``, class indices ``t`` (R,) and incoming (g_ℓ, g_H) (R, 2)."""
        spec = self.spec
        zc = _capped(z, spec.softcap)
        slope = None if spec.softcap is None else 1 - (zc / spec.softcap).square()
        u = zc.div_(spec.tau) if spec.tau != 1.0 else zc
        gl, gh = weights[:, 0], weights[:, 1]
        at = t - lo
        inside = (at >= 0) & (at < u.shape[1])
        if self.family is None:
            q = u.sub_(stats[:, 0:1]).sub_(stats[:, 1:2])  # log p
            p = torch.exp(q)
            g = q.mul_(gh.unsqueeze(1)).add_((gh * stats[:, 2] + gl).unsqueeze(1)).mul_(p).neg_()
            fused_walk.add_at(g, at, inside, gl)
        else:
            am1 = self.spec.alpha - 1
            p = self.family.f(u.sub_(stats[:, 0:1]).add_(stats[:, 1:2]))
            py, dsum = stats[:, 3], stats[:, 2]
            live = py > 0
            py_term = torch.where(live, gl * torch.exp(-am1 * torch.log(torch.where(live, py, 1.0))), 0.0)
            c = (-gh / am1 + py_term) / dsum
            g = _power(p, 2 - self.spec.alpha).mul_(-c.unsqueeze(1)).add_(p.mul_((-gh / am1).unsqueeze(1)))
            fused_walk.add_at(g, at, inside, py_term)
        if spec.tau != 1.0:
            g.div_(spec.tau)
        if slope is not None:
            g.mul_(slope)
        return g


def walk_pass(x, weight, bias, target, keep, spec: "PolicyMap", chunk: int, plan, want_entropy: bool):
    """The forward of the walk: ``(log p_y, H or None, the rows' numbers,
    live blocks or None)``, the chunks' logits formed in float32 from W's
    blocks (no float32 copy of W)."""
    m, v = x.shape[0], weight.shape[0]
    acc = _acc_dtype(x)
    block = plan[0]
    tiles = PolicyTiles(spec)
    blocks = fused_walk.WeightBlocks(weight, bias, x, block)
    xr = fused_walk.rows_of(x)
    idx = torch.where(keep, target, 0)
    logp = torch.zeros(m, dtype=acc, device=x.device)
    ent = torch.zeros(m, dtype=acc, device=x.device) if want_entropy else None
    stats = live = None
    nb = -(-v // block)
    for s in range(0, m, plan[2]):
        e = min(s + plan[2], m)
        z = torch.empty(e - s, v, dtype=acc, device=x.device)
        for lo in range(0, v, block):
            hi = min(lo + block, v)
            z[:, lo:hi] = blocks.logits(xr[s:e], blocks(lo, hi), lo, hi)
        u = _capped(z, spec.softcap)
        if spec.tau != 1.0:
            u.div_(spec.tau)
        lp, h, st, sup = tiles.stats(u, idx[s:e], want_entropy)
        del z, u
        logp[s:e] = torch.where(keep[s:e], lp, 0.0)
        if ent is not None:
            ent[s:e] = torch.where(keep[s:e], h, 0.0)  # type: ignore[arg-type]  # h is given with want_entropy
        if stats is None:
            stats = torch.empty(m, st.shape[1], dtype=acc, device=x.device)
        stats[s:e] = st
        if sup is not None and x.is_cpu:
            if live is None:
                live = torch.empty(m, nb, dtype=torch.bool, device=x.device)
            live[s:e] = fused_walk.live_blocks(sup, idx[s:e], block, nb)
    return logp, ent, tiles, stats, live


class FusedLinearLogprobs(torch.autograd.Function):
    """(log p_y, H) of map((X Wᵀ + b)/τ) over chunks of rows, the backward
    recomputing each chunk; see :func:`softk.losses.fused_linear_logprobs`."""

    @staticmethod
    def forward(ctx, x, weight, bias, target, keep, spec, chunk, want_entropy):
        ctx.spec, ctx.chunk, ctx.tiles = spec, chunk, None
        if takes_walk(x, spec, weight.requires_grad):
            ctx.plan = fused_walk.plan(x.shape[0], x.shape[1], weight.shape[0], chunk)
            logp, ent, ctx.tiles, stats, live = walk_pass(x, weight, bias, target, keep, spec, chunk, ctx.plan,
                                                          want_entropy)
            ctx.walked = (stats, live)
        else:
            logp, ent = policy_pass(x, weight, bias, target, keep, spec, chunk, want_entropy)
        out_dtype = logp.dtype
        ctx.save_for_backward(x, weight, bias, target, keep, ent)
        ctx.set_materialize_grads(False)
        if ent is None:
            ent = torch.zeros(0, dtype=out_dtype, device=x.device)
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx, go_logp, go_ent):
        x, weight, bias, target, keep, ent = ctx.saved_tensors
        want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2])
        if ent is None or ent.numel() != x.shape[0]:
            go_ent = None
        if (go_logp is None and go_ent is None) or not any(want):
            return None, None, None, None, None, None, None, None
        if x.shape[0] == 0:  # no rows (the walk keeps no numbers for them): zero gradients
            zero = lambda t, w: torch.zeros_like(t) if w else None  # noqa: E731
            return zero(x, want[0]), zero(weight, want[1]), zero(bias, want[2]), None, None, None, None, None
        if ctx.tiles is not None:
            stats, live = ctx.walked
            acc = stats.dtype
            weights = torch.stack([torch.zeros(x.shape[0], dtype=acc, device=x.device) if g is None
                                   else torch.where(keep, g.to(acc), 0.0) for g in (go_logp, go_ent)], 1)
            idx = torch.where(keep, target, 0)
            gx, gw, gb = fused_walk.walk(x, weight, bias, idx, ctx.tiles, stats, live, weights, want, ctx.plan)
        else:
            gx, gw, gb = policy_backward(x, weight, bias, target, keep, ctx.spec, ctx.chunk, go_logp, go_ent, ent,
                                         want)
        cast = lambda g, ref: None if g is None else g.to(ref.dtype)  # noqa: E731
        return cast(gx, x), cast(gw, weight), cast(gb, bias), None, None, None, None, None

