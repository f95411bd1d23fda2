r"""The sparse Fenchel–Young losses in one pass over a chunk's logits, for the fused loss on the CPU.

For sparsemax and 1.5-entmax with class indices, p = map(z/τ) has a small
support, and with Ω(p) = Σ_j ψ(p_j), ψ(0) = 0, Σ_j p_j = 1,

.. math:: L = \langle p, z/\tau\rangle - \Omega(p) + \Omega(e_y) - z_y/\tau
            = \sum_{j \in \operatorname{supp} p} \bigl[p_j (z_j - z_y)/\tau - \psi(p_j)\bigr] + \psi(1),

.. math:: G = w\,(p - e_y)/\tau,

so the row's loss (:func:`softk.losses._one_pass.support_rows`) and the
gradient's live columns (the union of the rows' supports and targets) come
from the support's entries alone:
:func:`live_in_place` returns them, and the fused pass runs its backward
products on those columns without ever forming G (C, V), scanning it for
its live columns or gathering them (what the generic path does after
autograd).  Entmax with another α keeps the generic path: its ψ(p) = (p^α − p)/(α(α−1))
cancels as α → 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._one_pass import support_rows
from .targets import index_target


def live_in_place(fmap, family, ignore_index: int, tau: float):
    """``f(z, t, w) -> (rows (C,), gs (C, K), cols (K,))`` for the loss of the
    map ``fmap`` (sparsemax or entmax15) and its ``family`` (whose ψ gives Ω),
    z (C, V) float32/float64 logits (read, not kept), t (C,) class indices,
    w (C,) row weights or None: the rows' losses (0 at ignored rows) and
    G = w·(p − e_y)/τ on its live columns ``cols`` (increasing class indices:
    the kept rows' supports and targets), G[:, cols] = ``gs``; G is 0 in every
    other column."""

    def f(z: Tensor, t: Tensor, w):
        idx, keep = index_target(z, t, ignore_index)
        p = fmap(z, tau=tau) if tau != 1.0 else fmap(z)
        r, j = p.nonzero(as_tuple=True)
        zy = z.gather(1, idx.unsqueeze(1)).squeeze(1)
        rows = torch.where(keep, support_rows(z, zy, p, r, j, tau, family.psi), 0.0)
        kept = keep[r]
        cols = torch.unique(torch.cat([j[kept], idx[keep]]))  # sorted
        scale = torch.where(keep, w.to(z.dtype) if w is not None else torch.ones_like(zy), 0.0) / tau
        gs = p.index_select(1, cols)
        at = torch.searchsorted(cols, idx).clamp(max=max(cols.numel() - 1, 0))
        if cols.numel():
            gs.scatter_add_(1, at.unsqueeze(1), torch.where(keep, -1.0, 0.0).to(gs.dtype).unsqueeze(1))
        gs.mul_(scale.unsqueeze(1))
        return rows, gs, cols

    return f
