r"""The blockwise backend's backward: p recomputed from q, k and λ.

Per query row, with p_j = f(u_j), u_j = s_j − m − lam, d_j = f′(u_j) and
dP_j = dO·v_j, the map's Jacobian is J = diag(d) − d dᵀ/Σd (symmetric), so

.. math:: \frac{\partial L}{\partial s_j} = d_j\,(dP_j - c), \qquad
          c = \frac{\sum_j d_j\,dP_j}{\sum_j d_j} = \frac{dO\cdot\sum_j d_j v_j}{\sum_j d_j},

which needs one extra row vector Σ_j d_j v_j (pass A) before the gradients
(pass B): dQ = scale·dS K, dK = scale·dSᵀQ, dV = PᵀdO.  For softmax d = p,
Σd = 1 and Σ_j p_j v_j is the output, so c = dO·O and pass A is skipped.

α-entmax with α per head (Peters et al. 2019, §3.2), in the
cancellation-free form of :mod:`softk.threshold.entmax_alpha` (a = α − 1,
ℓ_j = log p_j, S = Σ_j p_j ℓ_j, Γ = Σ_j p_j γ(−aℓ_j), γ(y) = e^y − 1 − y):

.. math:: \frac{\partial L}{\partial\alpha} = \sum_{\text{rows}}
   \frac{\Gamma\,\bigl(\sum_j p_j dP_j - a\sum_j p_j\ell_j dP_j\bigr) - (1 - aS)\sum_j p_j\gamma(-a\ell_j)\,dP_j}
        {a^2\,\sum_j d_j},

so pass A also sums S, Γ and the vectors Σ p ℓ v and Σ p γ v (dP_j = dO·v_j).
The textbook form, a difference of two terms of size 1/(α − 1), loses every
digit in float32 near α = 1; this one holds over (1, 2] and gives a head
whose rows have a single key dα = 0 exactly.
A row with no key taking part has d = 0: zero gradients.

Called with the default ``block``, :func:`attention_backward` follows the
forward's own routes: torch's fused kernel for the softmax it serves
(:mod:`.fused`), whole score rows where they fit (:mod:`.rows`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...threshold.rows import compute_dtype
from .blocks import NEG_INF, Blocks, query_chunks
from . import forward as blockwise, fused, rows
from .forward import probs
from ...threshold.attention_maps import ENTMAX_ID, SOFTMAX_ID, family
from ...threshold.entmax_alpha import p_gamma


def _slope(fam: int, a, s: Tensor, m: Tensor, lam: Tensor, p: Tensor) -> Tensor:
    if fam == SOFTMAX_ID:
        return p
    if fam == ENTMAX_ID:  # f′ = p^{2−α}, read off p (lam holds the saved threshold)
        return torch.where(p > 0, torch.exp((2 - a) * torch.log(torch.where(p > 0, p, 1.0))), torch.where(p != p, p, 0.0))
    u = torch.where(s == NEG_INF, NEG_INF, (s - torch.where(m > NEG_INF, m, 0.0)) - lam)  # NaN stays NaN
    return family(fam, a).df(u)


def _xlogx(p: Tensor) -> Tensor:
    return torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0)


def attention_backward(q, k, v, out, dout, m, lam, *, scale: float, causal: bool, mask, fam: int, alpha,
                       need_dalpha: bool, block: int | None = None, softcap: float = 0.0):
    """(dq, dk, dv, dalpha (H,) or None), each in its input's dtype (dalpha in the compute dtype)."""
    if block is None and fused.serves(q, k, v, mask, fam, softcap):  # the forward's own rules
        dq, dk, dv = fused.attention_backward(q, k, v, out, dout, lam, scale=scale, causal=causal, mask=mask)
        return dq, dk, dv, None
    if block is None and rows.serves(q, k.shape[2]):
        return rows.attention_backward(q, k, v, out, dout, m, lam, scale=scale, causal=causal, mask=mask, fam=fam,
                                       alpha=alpha, need_dalpha=need_dalpha, softcap=softcap)
    ct = compute_dtype(q.dtype)
    kc, vc = k.to(ct), v.to(ct)
    dk, dv = torch.zeros_like(kc), torch.zeros_like(vc)
    dqs, dalpha = [], None
    for i0, i1 in query_chunks(q):
        sl = slice(i0, i1)
        blk = Blocks(q[:, :, sl], kc, vc, None if mask is None else mask[:, :, sl], scale, causal, i0, softcap)
        dq, da = _chunk(blk, out[:, :, sl], dout[:, :, sl], m[:, :, sl], lam[:, :, sl], dk, dv, fam, alpha,
                        need_dalpha, block or blockwise.BLOCK)
        dqs.append(dq)
        dalpha = da if dalpha is None else dalpha + da
    return torch.cat(dqs, 2).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dalpha


def _chunk(blk: Blocks, out, dout, m, lam, dk, dv, fam, alpha, need_dalpha, block):
    """dq of one chunk of queries; adds its share to dk and dv (in place); dα (or None)."""
    ct = blk.ct
    a = blk.per_row(alpha) if alpha is not None and fam == 3 else None
    m, lam = blk.rows(m.to(ct)).unsqueeze(-1), blk.rows(lam.to(ct)).unsqueeze(-1)
    do = blk.rows(dout.to(ct))
    rule = RowRule(fam, a, m, lam, do, need_dalpha and a is not None)
    spans = blk.spans(block)
    if rule.needs_sums(out):
        for j0, j1 in spans:  # pass A
            rule.add_sums(blk.scores(j0, j1), blk.v[:, :, j0:j1])
    rule.finish_sums(None if rule.needs_sums(out) else blk.rows(out))
    dq = torch.zeros_like(blk.q)
    for j0, j1 in spans:  # pass B
        cap = blk.cap_slope(j0, j1) if blk.softcap else None
        dq_b, dk_b, dv_b = rule.grads(blk.scores(j0, j1), blk.k[:, :, j0:j1], blk.v[:, :, j0:j1], blk.q, cap)
        dq = dq + dq_b
        dk[:, :, j0:j1] += dk_b
        dv[:, :, j0:j1] += dv_b
    dalpha = rule.dalpha(blk.hkv, blk.G, blk.L) if rule.need_dalpha else None
    return blk.heads(dq * blk.scale), dalpha


class RowRule:
    """The backward of a chunk of query rows, fed blocks of keys in any order:
    pass A (:meth:`add_sums`) sums Σd, Σd·v and, for dα, S, Γ, Σpℓv, Σpγv
    over every key; :meth:`finish_sums` turns them into c; pass B
    (:meth:`grads`) gives each block's share of dq and its dk, dv.  The rows
    are (B, H_kv, R, ·): ``m``, ``lam`` the forward's statistics, ``do`` dO."""

    def __init__(self, fam: int, a, m: Tensor, lam: Tensor, do: Tensor, need_dalpha: bool):
        self.fam, self.a, self.m, self.lam, self.do, self.need_dalpha = fam, a, m, lam, do, need_dalpha
        self.sd, self.sdv = torch.zeros_like(m), torch.zeros_like(do)
        if need_dalpha:
            self.h_ent, self.plv = torch.zeros_like(m), torch.zeros_like(do)
            self.gam, self.pgv = torch.zeros_like(m), torch.zeros_like(do)
            self.pdp = torch.zeros_like(m)
        self.c: Tensor | None = None

    def needs_sums(self, out) -> bool:
        """Whether pass A runs: always but for softmax with an ``out`` in the
        compute dtype (Σ_j p_j dP_j = dO·out; a half-precision out's rounding
        in c is multiplied by |k| in dq, a large error when the keys share an
        offset).  ``out`` None: the output is not at hand."""
        return not (self.fam == SOFTMAX_ID and out is not None and out.dtype == self.m.dtype)

    def add_sums(self, s: Tensor, v: Tensor) -> None:
        p = probs(self.fam, self.a, s, self.m, self.lam)
        d = _slope(self.fam, self.a, s, self.m, self.lam, p)
        self.sd = self.sd + d.sum(-1, keepdim=True)
        self.sdv = self.sdv + d @ v
        if self.need_dalpha:
            pl = _xlogx(p)
            self.h_ent = self.h_ent + pl.sum(-1, keepdim=True)
            self.plv = self.plv + pl @ v
            pg = p_gamma(p, torch.log(torch.where(p > 0, p, 1.0)), d, self.a - 1)
            self.gam = self.gam + pg.sum(-1, keepdim=True)
            self.pgv = self.pgv + pg @ v

    def finish_sums(self, out) -> None:
        """c from pass A's sums, or (``out`` given, softmax) c = dO·out."""
        if out is not None:
            self.c = (self.do * out).sum(-1, keepdim=True)
            return
        some = self.sd > 0
        self.c = torch.where(some, (self.do * self.sdv).sum(-1, keepdim=True) / torch.where(some, self.sd, 1.0), 0.0)

    def grads(self, s: Tensor, k: Tensor, v: Tensor, qs: Tensor, cap_slope):
        """(dq share before the scale, dk, dv) of a block: scores s, keys k,
        values v, the scaled queries qs; ``cap_slope`` the soft cap's
        derivative on the block (None without a cap)."""
        assert self.c is not None, "finish_sums comes before grads"
        p = probs(self.fam, self.a, s, self.m, self.lam)
        dp = self.do @ v.transpose(-1, -2)
        ds = _slope(self.fam, self.a, s, self.m, self.lam, p) * (dp - self.c)
        if cap_slope is not None:  # through the cap: dS of the scaled products
            ds = ds * cap_slope
        if self.need_dalpha:
            self.pdp = self.pdp + (p * dp).sum(-1, keepdim=True)
        return ds @ k, ds.transpose(-1, -2) @ qs, p.transpose(-1, -2) @ self.do

    def dalpha(self, hkv: int, groups: int, length: int) -> Tensor:
        """dα per head (H,) from the rows' sums, after pass B."""
        am1 = self.a - 1
        pldp = (self.do * self.plv).sum(-1, keepdim=True)
        pgdp = (self.do * self.pgv).sum(-1, keepdim=True)
        some = self.sd > 0
        row = torch.where(some, (self.gam * (self.pdp - am1 * pldp) - (1 - am1 * self.h_ent) * pgdp)
                          / (am1**2 * torch.where(some, self.sd, 1.0)), 0.0)
        return row.reshape(row.shape[0], hkv, groups, length).sum((0, 3)).reshape(-1)
