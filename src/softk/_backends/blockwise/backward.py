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
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...threshold.rows import compute_dtype
from .blocks import NEG_INF, Blocks, query_chunks
from . import forward as blockwise, rows
from .forward import probs
from ...threshold.attention_maps import ENTMAX_ID, SOFTMAX_ID, family
from ...threshold.entmax_alpha import p_gamma


def _slope(fam: int, a, s: Tensor, m: Tensor, lam: Tensor, p: Tensor) -> Tensor:
    if fam == SOFTMAX_ID:
        return p
    if fam == ENTMAX_ID:  # f′ = p^{2−α}, read off p (lam holds the shifted threshold)
        return torch.where(p > 0, torch.exp((2 - a) * torch.log(torch.where(p > 0, p, 1.0))), torch.where(p != p, p, 0.0))
    u = torch.where(s == NEG_INF, NEG_INF, (s - torch.where(m > NEG_INF, m, 0.0)) - lam)  # NaN stays NaN
    return family(fam, a).df(u)


def _xlogx(p: Tensor) -> Tensor:
    return torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0)


def attention_backward(q, k, v, out, dout, m, lam, *, scale: float, causal: bool, mask, fam: int, alpha,
                       need_dalpha: bool, block: int | None = None, softcap: float = 0.0):
    """(dq, dk, dv, dalpha (H,) or None), each in its input's dtype (dalpha in the compute dtype)."""
    if block is None and rows.serves(q, k.shape[2]):  # the forward's own rule: whole score rows
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
    need_dalpha = need_dalpha and a is not None
    spans = blk.spans(block)

    if fam == SOFTMAX_ID and out.dtype == ct:
        c = (do * blk.rows(out)).sum(-1, keepdim=True)  # Σ_j p_j dP_j = dO·out
    else:  # pass A (and softmax with a half-precision out: its rounding in c = dO·out
        # is multiplied by |k| in dq, a large error when the keys share an offset)
        sd = torch.zeros_like(m)
        sdv = torch.zeros_like(do)
        if need_dalpha:
            h_ent, plv = torch.zeros_like(m), torch.zeros_like(do)
            gam, pgv = torch.zeros_like(m), torch.zeros_like(do)
        for j0, j1 in spans:
            s = blk.scores(j0, j1)
            p = probs(fam, a, s, m, lam)
            d = _slope(fam, a, s, m, lam, p)
            sd = sd + d.sum(-1, keepdim=True)
            sdv = sdv + d @ blk.v[:, :, j0:j1]
            if need_dalpha:
                pl = _xlogx(p)
                h_ent = h_ent + pl.sum(-1, keepdim=True)
                plv = plv + pl @ blk.v[:, :, j0:j1]
                pg = p_gamma(p, torch.log(torch.where(p > 0, p, 1.0)), d, a - 1)  # type: ignore[operator]  # need_dalpha: a is set
                gam = gam + pg.sum(-1, keepdim=True)
                pgv = pgv + pg @ blk.v[:, :, j0:j1]
        some = sd > 0
        c = torch.where(some, (do * sdv).sum(-1, keepdim=True) / torch.where(some, sd, 1.0), 0.0)

    dq = torch.zeros_like(blk.q)
    pdp = torch.zeros_like(m) if need_dalpha else None
    for j0, j1 in spans:  # pass B
        s = blk.scores(j0, j1)
        p = probs(fam, a, s, m, lam)
        dp = do @ blk.v[:, :, j0:j1].transpose(-1, -2)
        ds = _slope(fam, a, s, m, lam, p) * (dp - c)
        if blk.softcap:  # through the cap: dS of the scaled products
            ds = ds * blk.cap_slope(j0, j1)
        dq = dq + ds @ blk.k[:, :, j0:j1]
        dk[:, :, j0:j1] += ds.transpose(-1, -2) @ blk.q  # blk.q is scale·q
        dv[:, :, j0:j1] += p.transpose(-1, -2) @ do
        if need_dalpha:
            pdp = pdp + (p * dp).sum(-1, keepdim=True)  # type: ignore[operator]  # need_dalpha: pdp is set

    dalpha = None
    if need_dalpha:
        assert a is not None and pdp is not None  # need_dalpha: both are set
        am1 = a - 1
        pldp = (do * plv).sum(-1, keepdim=True)
        pgdp = (do * pgv).sum(-1, keepdim=True)
        some = sd > 0
        row = torch.where(some, (gam * (pdp - am1 * pldp) - (1 - am1 * h_ent) * pgdp)
                          / (am1**2 * torch.where(some, sd, 1.0)), 0.0)
        dalpha = row.reshape(row.shape[0], blk.hkv, blk.G, blk.L).sum((0, 3)).reshape(-1)
    return blk.heads(dq * blk.scale), dalpha
