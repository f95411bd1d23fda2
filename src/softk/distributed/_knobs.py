r"""The fused loss's knobs and TS²'s penalty over a vocabulary split between ranks.

Each term needs a sum over the whole row (Σ_j z_j, z_y, logsumexp), which is
formed as *local + (global − local).detach()*: the value is the global one,
identical on every rank, and the gradient with respect to this rank's logits
is the local part's, which is the exact partial derivative of the global sum.
For logsumexp the differentiable part is Σ_j s_j·(z_j − z_j.detach()) with
s the global softmax's local slice, whose gradient is s.  So every term is
an ordinary expression of the local logits, its gradient local, and the
backward runs no collective.
"""

from __future__ import annotations

import torch

from .._ops.distributed import all_reduce
from ..losses._ts2 import CLAMP
from ..threshold.rows import compute_dtype


def global_sum(local, group):
    """Σ over the ranks of ``local`` (M,): the global value, the local gradient."""
    total = all_reduce(local.detach().clone(), "sum", group)
    return local + (total - local.detach())


def global_lse(z, group):
    """logsumexp over the whole row of the local slices z (M, V_r): the global
    value, with gradient s (the global softmax's local columns).  2 all-reduces."""
    zd = z.detach()
    mx = all_reduce(zd.amax(-1), "max", group)
    mx = torch.where(torch.isfinite(mx), mx, 0.0)
    s = all_reduce(torch.exp(zd - mx.unsqueeze(-1)).sum(-1), "sum", group)
    lse = mx + torch.log(s)
    p = torch.exp(zd - lse.unsqueeze(-1))
    p = torch.where(p > 0, p, 0.0)
    diff = torch.where(torch.isfinite(zd), z - zd, 0.0)
    return lse + (p * diff).sum(-1), mx


def target_score(z, owned, local_index, group):
    """z_y over the whole row (0 at rows whose target no rank owns): 1 all-reduce."""
    mine = torch.where(owned, z.gather(-1, local_index.unsqueeze(-1)).squeeze(-1), 0.0)
    return global_sum(mine, group)


def ts2_penalty(x, p, owned, local_index, keep, suppression, adaptive, group):
    """TS²'s −log(1 − min(0.99, m)) per row, times ``suppression`` (and 1 − p_y
    with ``adaptive``): x (M, V_r) this rank's logits (differentiable), p
    (M, V_r) its columns of the global sparsemax(x/τ).  m = Σ_{p_j = 0, j ≠ y}
    softmax(x)_j = A·exp(c − lse), A = Σ_off exp(x_j − c) over every rank.
    3 all-reduces, 4 with ``adaptive``."""
    li = local_index.unsqueeze(-1)
    # ignored rows add no penalty, and their scores are left out of it: on a
    # padding row masked with −inf, lse = −inf made m = 0·e^{+inf} = NaN,
    # whose gradient the where below does not stop (keep is the same on
    # every rank, so the collectives are unchanged)
    x = torch.where(keep.unsqueeze(-1), x, 0.0)
    off = (p == 0) & ~torch.zeros_like(p, dtype=torch.bool).scatter_(-1, li, owned.unsqueeze(-1))
    lse, c = global_lse(x, group)
    a_local = torch.where(off, torch.exp(x - c.unsqueeze(-1)), 0.0).sum(-1)  # c the row's max: no overflow
    m = global_sum(a_local, group) * torch.exp(c - lse)
    penalty = -torch.log1p(-torch.clamp(m, max=CLAMP))
    if adaptive:
        py = torch.where(owned, p.gather(-1, local_index.unsqueeze(-1)).squeeze(-1), 0.0)
        py = all_reduce(py, "sum", group)
        penalty = penalty * (1 - py)
    return torch.where(keep, suppression * penalty, 0.0)


def knobbed_rows(rows, z, t, o, *, start, vocab, z_scale, group):
    """The per-row loss ``rows`` (M,) of this rank's logits z (M, V_r) (already
    soft-capped, and with a dense target already smoothed) with the label
    smoothing of a class-index target, the class weights and the z-loss of
    the options ``o`` applied, as :func:`softk.losses.chunking.chunk_loss_fn`
    does on one device; ``start`` is this rank's first global class, ``vocab`` V."""
    ct = compute_dtype(z.dtype)
    zc, rows = z.to(ct), rows.to(ct)
    tau, ignore_index, kind = o.tau, o.ignore_index, o.kind
    eps, weight, beta = o.label_smoothing, o.class_weight, o.z_loss
    keep, weighted = None, False
    if not t.is_floating_point():
        t = t.to(z.device).long()
        keep = t != ignore_index
        idx = torch.where(keep, t, 0)
        local = t - start
        owned = keep & (local >= 0) & (local < z.shape[-1])
        li = torch.where(owned, local, 0)
        if eps:
            zs = zc / tau if tau != 1.0 else zc
            if kind.torch_cross_entropy and weight is not None:
                # torch's formula: (1−ε)·w_y·(lse − z_y) + (ε/V)·Σ_c w_c·(lse − z_c)
                w_local = weight[start:start + z.shape[-1]].to(ct)
                lse, _ = global_lse(zs, group)
                smooth = (lse * weight.sum().to(ct) - global_sum((w_local * zs).sum(-1), group)) / vocab
                rows = torch.where(keep, (1 - eps) * rows * weight.to(ct)[idx] + eps * smooth, 0.0)
                weighted = True
            else:
                # L(q) − L(e_y) = ε(z_y − mean z) + Ω(q) − ψ(1), q = (1−ε)e_y + ε/V (0 for cross-entropy)
                const = 0.0
                if not kind.torch_cross_entropy:
                    q = torch.tensor([1 - eps + eps / vocab, eps / vocab, 1.0], dtype=torch.float64)
                    psi = kind.family(o).psi(q).tolist()
                    const = psi[0] + (vocab - 1) * psi[1] - psi[2]
                lin = target_score(zs, owned, li, group) - global_sum(zs.sum(-1), group) / vocab
                rows = rows + torch.where(keep, eps * lin + const, 0.0)
        if weight is not None and not weighted:
            rows = rows * weight.to(ct)[idx]
    if beta:
        lse, _ = global_lse(zc, group)
        zl = beta * lse * lse
        if keep is not None:
            zl = torch.where(keep, zl, 0.0)
        rows = rows + zl * z_scale
    return rows
