r"""The blockwise backend's forward: blocks of keys, λ from softk's solver.

Same interface as the Triton launcher (:mod:`softk._backends.triton.attention`):
``attention_forward(q, k, v, *, scale, causal, mask, fam, alpha)`` returns
(out, m, lam) with m the row maximum of the scores and lam the threshold
relative to it, so that p_j = f(s_j − m − lam).  It never holds more than
a block of scores per row at once (``BLOCK`` keys, plus up to ``CAP``
candidates), for a chunk of queries at a time
(:func:`.blocks.query_chunks`), whatever L and S.  Called with the default
``block`` and ``cap``, it hands the softmax that torch's fused CPU kernel
computes exactly to :mod:`.fused`, and rows that fit to :mod:`.rows`
(whole score rows), before any of this.

**softmax** (id 0): one pass, the online logsumexp: the running maximum m,
Σ e^{s−m} and Σ e^{s−m} v rescaled whenever m grows; lam = log Σ e^{s−m}.

**sparsemax, entmax15, α-entmax** (ids 1–3, f(u) = 0 for u ≤ 0).  Adding
keys to a row only raises its λ (g(λ) = Σ f(s − λ) grows pointwise), so
after each block of keys the exact λ of the keys seen so far is a lower
bound of the row's λ, and every key at or below it has p = 0 for good.
Pass 1 therefore keeps, per row, only the candidates above the current λ:
it merges them with the next block's keys above it, finds the λ of the
merged set exactly with the family's solver
(:func:`softk.threshold.solve.solve_lambda`, on the row shifted by its
running maximum), and drops what falls below.  That λ is exact for the
keys seen: the dropped keys add f = 0 at any λ at or above the old one.
After the last block it is the row's λ.  A row whose candidates exceed
``CAP`` (a wide support: entmax with α near 1, near-equal scores) stops
buffering and is solved at the end on whole score rows, by the same
solver, in chunks of at most max(BLOCK·R, S) scores.  Pass 2 recomputes
each block of scores and accumulates f(s − m − lam)·V.

For α-entmax (id 3) with α − 1 < NEAR_ONE the saved threshold is
t = lam + 1/(α−1) instead, refined (:func:`refine_t`), and
p = (1 + (α−1)(z − t))_+^{1/(α−1)} is formed through log1p; from NEAR_ONE on
it is lam, and p = ((α−1)(z − lam))_+^{1/(α−1)} (:func:`entmax_p`,
:func:`saved_threshold`).

A row with no key taking part gets m = −inf, lam = 0 and output 0; a row
with one key gets p = 1 on it; a row with a NaN or +inf score is NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...threshold.solve import solve_lambda
from ...threshold.rows import compute_dtype
from . import fused, rows
from .blocks import NEG_INF, Blocks, query_chunks
from ...threshold.attention_maps import ENTMAX_ID, SOFTMAX_ID, family, unit_offset
from ...threshold.entmax_anchor import NEAR_ONE

BLOCK = 256  # keys per block of scores, at least
BLOCK_SCORES = 1 << 17  # scores per block over a chunk's rows: few rows (decoding) take longer blocks
CAP = 256  # candidates kept per row before the row is solved on whole score rows


def attention_forward(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool, mask, fam: int, alpha,
                      block: int | None = None, cap: int | None = None, softcap: float = 0.0):
    """(out (B, H, L, Ev) in q's dtype, m (B, H, L), lam (B, H, L)) in the compute dtype;
    ``softcap`` c > 0 caps the scaled products to c·tanh(·/c) (:mod:`.blocks`)."""
    if block is None and cap is None and fused.serves(q, k, v, mask, fam, softcap):
        return fused.attention_forward(q, k, v, scale=scale, causal=causal, mask=mask)
    if block is None and cap is None and rows.serves(q, k.shape[2]):
        return rows.attention_forward(q, k, v, scale=scale, causal=causal, mask=mask, fam=fam, alpha=alpha,
                                      softcap=softcap)
    ct = compute_dtype(q.dtype)
    kc, vc = k.to(ct), v.to(ct)
    parts = []
    for i0, i1 in query_chunks(q):
        blk = Blocks(q[:, :, i0:i1], kc, vc, None if mask is None else mask[:, :, i0:i1], scale, causal, i0, softcap)
        parts.append(_chunk(blk, fam, alpha, block or _block(blk), cap or CAP))
    out, m, lam = (torch.cat(t, 2) for t in zip(*parts))
    return out.to(q.dtype), m, lam


def _block(blk: Blocks) -> int:
    """Keys per block for a chunk: BLOCK, or for a chunk of few rows (one query
    per head against a long cache) a multiple of it up to BLOCK_SCORES scores
    over the rows, so that the per-block work of pass 1 (the merge and the
    solve) is not paid S / BLOCK times for a handful of rows."""
    rows = blk.q.shape[0] * blk.hkv * blk.R
    return max(BLOCK, BLOCK_SCORES // max(rows, 1) // BLOCK * BLOCK)


def _chunk(blk: Blocks, fam: int, alpha, block: int, cap: int):
    """(out, m, lam) of one chunk of queries, (B, H, Lc, ...)."""
    if fam == SOFTMAX_ID:
        out, m, lam = _softmax(blk, block)
    else:
        a = blk.per_row(alpha) if alpha is not None and fam == 3 else None
        m, lam = _threshold(blk, fam, a, block, cap)
        if fam == ENTMAX_ID:  # near α = 1 the shifted threshold t = λ + 1/(α−1), refined
            lam = refine_t(blk, a, m, saved_threshold(lam, a - 1), block)  # type: ignore[operator]  # entmax: a is α per row
        out = _output(blk, fam, a, m, lam, block)
    return blk.heads(out), blk.heads(m.squeeze(-1)), blk.heads(lam.squeeze(-1))


def _softmax(blk: Blocks, block: int):
    online = OnlineSoftmax((blk.q.shape[0], blk.hkv, blk.R, 1), blk.v.shape[-1], blk.ct, blk.q.device)
    for j0, j1 in blk.spans(block):
        online.add(blk.scores(j0, j1), blk.v[:, :, j0:j1])
    return online.result()


class OnlineSoftmax:
    """Softmax's one pass over blocks of keys, in any order: the running
    maximum m, Σ e^{s−m} and Σ e^{s−m} v, rescaled whenever m grows."""

    def __init__(self, shape: tuple, ev: int, ct, device):
        self.m = torch.full(shape, NEG_INF, dtype=ct, device=device)
        self.total = torch.zeros(shape, dtype=ct, device=device)
        self.acc = torch.zeros(*shape[:3], ev, dtype=ct, device=device)

    def add(self, s: Tensor, v: Tensor) -> None:
        """A block of scores s (…, R, n) and its values v (…, n, Ev)."""
        m_new = torch.maximum(self.m, s.amax(-1, keepdim=True))
        base = torch.where(m_new > NEG_INF, m_new, 0.0)  # fully masked so far: every term is 0
        p = torch.exp(s - base)
        rescale = torch.exp(self.m - base)
        self.total = self.total * rescale + p.sum(-1, keepdim=True)
        self.acc = self.acc * rescale + p @ v
        self.m = m_new

    def result(self):
        """(out, m, lam) with lam = log Σ e^{s−m} (0 for a row with no key)."""
        some = self.total > 0
        lam = torch.where(some, torch.log(torch.where(some, self.total, 1.0)), 0.0)
        return self.acc / torch.where(some, self.total, 1.0), self.m, lam


def _compact(vals: Tensor, keep: Tensor) -> Tensor:
    """The kept entries of each row (in any order), −inf padded, width max(#kept)."""
    kept = torch.where(keep, vals, NEG_INF)
    width = int(keep.sum(-1).max()) if keep.numel() else 0
    if width == vals.shape[-1]:
        return kept
    return torch.topk(kept, width, dim=-1, sorted=False).values  # the kept entries are each row's largest


def solve(fam: int, a, z: Tensor, lower) -> Tensor:
    """λ (relative to the shift of z) of rows z (max 0 where finite): the
    family's solver on rows with ≥ 2 finite entries, 0 − c on rows with one
    (f(c) = 1), ``lower`` (−inf where none) on rows with none."""
    nfin = (z > NEG_INF).sum(-1, keepdim=True)
    active = nfin >= 2
    lam = torch.where(nfin == 1, -unit_offset(fam, a), lower)
    if bool(active.any()):
        fam_rows = family(fam, a)
        below = None if lower is None else torch.where(active, lower, NEG_INF)
        solved = solve_lambda(fam_rows, torch.where(active, z, 0.0), 1, active, below)
        lam = torch.where(active, solved, lam)
    return lam


def _threshold(blk: Blocks, fam: int, a, block: int, cap: int):
    """Pass 1: (m, lam) per row, (B, H_kv, R, 1)."""
    search = Search((blk.q.shape[0], blk.hkv, blk.R, 1), blk.ct, blk.q.device, fam, a, cap)
    for j0, j1 in blk.spans(block):
        search.add(blk.scores(j0, j1))
    if bool(search.dense.any()):
        search.lam = _solve_dense(blk, fam, a, search.dense, search.m, search.lam)
    return search.result()


class Search:
    """Pass 1's state per row, fed blocks of scores in any order: the running
    maximum m, the exact λ (relative to m) of the keys seen so far, and the
    candidates above it; a row whose candidates exceed ``cap`` is flagged
    ``dense`` and stops buffering (its λ is then found on whole score rows)."""

    def __init__(self, shape: tuple, ct, device, fam: int, a, cap: int):
        self.fam, self.a, self.cap = fam, a, cap
        self.m = torch.full(shape, NEG_INF, dtype=ct, device=device)
        self.lam = torch.full(shape, NEG_INF, dtype=ct, device=device)  # relative to m; −inf: no key yet
        self.cand = torch.empty(*shape[:3], 0, dtype=ct, device=device)  # raw scores above m + lam
        self.dense = torch.zeros(shape, dtype=torch.bool, device=device)
        self.broken = torch.zeros(shape, dtype=torch.bool, device=device)  # a NaN or +inf score: the row is NaN

    def add(self, s: Tensor) -> None:
        """A block of scores (…, R, n) of every row."""
        m, lam = self.m, self.lam
        self.broken = self.broken | (torch.isnan(s) | (s == float("inf"))).any(-1, keepdim=True)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        base = torch.where(m_new > NEG_INF, m_new, 0.0)
        lower = torch.where(lam > NEG_INF, lam + (torch.where(m > NEG_INF, m, 0.0) - base), NEG_INF)
        z = torch.cat([self.cand, torch.where(self.dense, NEG_INF, s)], -1) - base
        z = _compact(z, z > lower)  # keys at or below the old λ stay at p = 0
        self.lam = solve(self.fam, self.a, z, lower)
        keep = z > self.lam
        over = keep.sum(-1, keepdim=True) > self.cap
        if bool(over.any()):
            self.dense = self.dense | over
            keep = keep & ~over
        self.cand = _compact(z + base, keep)
        self.m = m_new

    def result(self):
        """(m, lam): lam 0 on a row with no key, NaN on a broken row."""
        lam = torch.where(self.m > NEG_INF, self.lam, 0.0)
        return self.m, torch.where(self.broken, float("nan"), lam)


def _solve_dense(blk: Blocks, fam: int, a, dense: Tensor, m: Tensor, lam: Tensor) -> Tensor:
    """λ of the rows flagged ``dense``, from whole score rows (a chunk of rows
    at a time, per batch and key/value head)."""
    lam = lam.clone()
    b_idx, h_idx, r_idx, _ = dense.nonzero(as_tuple=True)
    chunk = max(1, (BLOCK * blk.R) // max(blk.S, 1))
    for bh in torch.unique(b_idx * blk.hkv + h_idx).tolist():
        b, h = divmod(bh, blk.hkv)
        rows = r_idx[(b_idx == b) & (h_idx == h)]
        for c0 in range(0, rows.numel(), chunk):
            r = rows[c0:c0 + chunk]
            z = blk.row_scores(b, h, r) - m[b, h, r]
            ar = None if a is None else a[0, h, r]
            lam[b, h, r] = solve(fam, ar, z, torch.full_like(z[:, :1], NEG_INF))
    return lam


def probs(fam: int, a, s: Tensor, m: Tensor, lam: Tensor) -> Tensor:
    """p = f(s − m − lam) on a block of scores (0 where s = −inf); for
    α-entmax ``lam`` is its saved threshold (:func:`entmax_p`)."""
    if fam == ENTMAX_ID:
        return entmax_p(s - torch.where(m > NEG_INF, m, 0.0), lam, a - 1)
    u = torch.where(s == NEG_INF, NEG_INF, (s - torch.where(m > NEG_INF, m, 0.0)) - lam)  # NaN stays NaN
    return torch.exp(u) if fam == SOFTMAX_ID else family(fam, a).f(u)


def saved_threshold(lam: Tensor, am1) -> Tensor:
    """What α-entmax saves of a row's λ (a = α − 1, per row): the shifted
    threshold t = λ + 1/a where a < NEAR_ONE, λ itself elsewhere
    (:func:`entmax_p` says why)."""
    return torch.where(torch.as_tensor(am1 < NEAR_ONE, device=lam.device), lam + 1 / am1, lam)


def entmax_p(z: Tensor, th: Tensor, am1) -> Tensor:
    """α-entmax p from z = s − m and the saved threshold θ (a = α − 1):

    * a < NEAR_ONE: θ = t = λ + 1/a and p = (1 + a(z − t))_+^{1/a} through
      log1p, so that p keeps its relative precision as α → 1 (λ, of size
      1/a, would round every p by eps/a; t is O(log n));
    * a ≥ NEAR_ONE: θ = λ and p = (a(z − λ))_+^{1/a}: there t's rounding,
      eps/a, would be the one to cancel, in 1 + a(z − t) where p is small
      (wide supports near α = 2), while z − λ rounds as sparsemax's does
      (|λ| ≤ 1/a ≤ 1/NEAR_ONE).

    NaN stays NaN, z = −inf gives 0."""
    x = am1 * (z - th)
    near = torch.as_tensor(am1 < NEAR_ONE, device=z.device)
    if bool(near.all()):
        inside = x > -1
        p = torch.exp(torch.log1p(torch.where(inside, x, 0.0)) / am1)
    elif not bool(near.any()):
        inside = x > 0
        p = torch.exp(torch.log(torch.where(inside, x, 1.0)) / am1)
    else:  # heads on both sides
        inside = x > torch.where(near, -1.0, 0.0)
        lg = torch.where(near, torch.log1p(torch.where(inside, x, 0.0)), torch.log(torch.where(inside, x, 1.0)))
        p = torch.exp(lg / am1)
    return torch.where(inside, p, torch.where(x != x, x, 0.0))


def refine_t(blk: Blocks, a, m: Tensor, t: Tensor, block: int, steps: int = 6) -> Tensor:
    """t to its own precision on the rows with α − 1 < 1/8: Newton on
    G(t) = Σ_j p_j = 1 (G′ = −Σ_j p_j^{1−a}; G is convex and decreasing) from
    the solver's t, whose λ was rounded to ulp(1/(α−1)); one pass over the
    key blocks per step, stopping where the steps fall below t's resolution."""
    am1 = a - 1
    near = refining(am1, m, t)
    if not bool(near.any()):
        return t
    for _ in range(steps):
        g = torch.zeros_like(t)
        e = torch.zeros_like(t)
        for j0, j1 in blk.spans(block):
            dg, de = newton_terms(blk.scores(j0, j1) - torch.where(m > NEG_INF, m, 0.0), t, am1)
            g, e = g + dg, e + de
        t, near = newton_step(t, near, g, e)
        if not bool(near.any()):
            break
    return t


def refining(am1, m: Tensor, t: Tensor) -> Tensor:
    """The rows whose t :func:`refine_t` refines: α − 1 < NEAR_ONE, a key, t finite."""
    return (am1 < NEAR_ONE) & (m > NEG_INF) & torch.isfinite(t)


def newton_terms(z: Tensor, t: Tensor, am1):
    """A block's share (G, −G′) of Newton's step on G(t) = Σ_j p_j, z = s − m."""
    p = entmax_p(z, t, am1)
    e = torch.where(p > 0, torch.exp((1 - am1) * torch.log(torch.where(p > 0, p, 1.0))), 0.0)
    return p.sum(-1, keepdim=True), e.sum(-1, keepdim=True)


def newton_step(t: Tensor, near: Tensor, g: Tensor, e: Tensor):
    """(t, near) after one step on the rows ``near``; a row leaves ``near``
    when its step falls below t's resolution."""
    eps = torch.finfo(t.dtype).eps
    step = torch.where(near & (e > 0), (g - 1) / torch.where(e > 0, e, 1.0), 0.0)
    t = t + step
    return t, near & (step.abs() > 2 * eps * torch.clamp(t.abs(), min=1.0))


def _output(blk: Blocks, fam: int, a, m: Tensor, lam: Tensor, block: int) -> Tensor:
    """Pass 2: Σ_j p_j v_j."""
    acc = torch.zeros(blk.q.shape[0], blk.hkv, blk.R, blk.v.shape[-1], dtype=blk.ct, device=blk.q.device)
    for j0, j1 in blk.spans(block):
        acc = acc + probs(fam, a, blk.scores(j0, j1), m, lam) @ blk.v[:, :, j0:j1]
    return acc
