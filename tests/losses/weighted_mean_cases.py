"""The weighted means of the fused linear losses, shared by the single-device
tests (test_weighted_mean.py) and the ranks of the vocab-parallel ones.

"mean" with class weights w divides Σ_i w[y_i] L_i by Σ_i w[y_i] over the kept
rows, in the value and in every gradient.  That divisor is a sum of weights,
not a row count: it is legitimately below 1, and the cases below put it below
1, exactly at 1, above 1 and at 0 (no kept row, or kept rows whose weights are
all 0).  The reference is written here from that definition on the whole
float64 logits: torch's own ``F.cross_entropy(weight=w)`` rows for
cross-entropy, softk's unfused per-row losses (each checked against the NumPy
oracles elsewhere) times w[y] for the others.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from softk import losses as L

D = torch.float64
N, H, V = 10, 5, 12
IGNORED = (2, 7)

# every loss that takes class-index targets (soft_topk takes dense ones, and no class weight)
LOSSES = [
    ("cross_entropy", {}),
    ("softmax", {}),
    ("sparsemax", {}),
    ("entmax15", {}),
    ("entmax", {"alpha": 1.3}),
    ("topk_softmax_ce", {"k": 2}),
    ("ts2", {"suppression": 0.5}),
]

# Σ w[y] over the kept rows: below 1, exactly 1, above 1
WEIGHT_SUMS = ("below", "one", "above")


def data(seed: int = 0):
    """x (N, H), W (V, H), b (V,), t (N,) with rows IGNORED ignored."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, dtype=D, generator=g) * 1.5
    w = torch.randn(V, H, dtype=D, generator=g)
    b = torch.randn(V, dtype=D, generator=g)
    t = torch.randint(0, V, (N,), generator=g)
    t[list(IGNORED)] = -100
    return x, w, b, t


def class_weight(case: str, t: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Weights whose sum over the kept targets is 0.37 ("below"), 1 ("one", in
    exact binary arithmetic: 1/8 on each of the 8 kept rows) or 2.9 ("above")."""
    kept = t[t != -100]
    if case == "one":
        assert kept.numel() == 8
        return torch.full((V,), 0.125, dtype=D)
    g = torch.Generator().manual_seed(seed + 1)
    cw = torch.rand(V, dtype=D, generator=g) + 0.1
    return cw * ({"below": 0.37, "above": 2.9}[case] / cw[kept].sum())


def rows(loss, z, t, opts):
    """The per-row loss of logits z (M, V) at targets t, 0 on ignored rows (unweighted)."""
    if loss == "cross_entropy":
        return F.cross_entropy(z, t, reduction="none")
    if loss == "softmax":
        return L.softmax_loss(z, t, reduction="none")
    if loss == "sparsemax":
        return L.sparsemax_loss(z, t, reduction="none")
    if loss == "entmax15":
        return L.entmax15_loss(z, t, reduction="none")
    if loss == "entmax":
        return L.entmax_loss(z, t, opts["alpha"], reduction="none")
    if loss == "topk_softmax_ce":
        return L.topk_softmax_cross_entropy(z, t, opts["k"], reduction="none")
    return L.ts2_loss(z, t, reduction="none", **opts)


def reference(loss, x, w, b, t, cw, reduction, opts):
    """Σ w[y_i] L_i, divided by Σ w[y_i] over the kept rows for "mean", from the
    materialised logits (a weight sum > 0 only: the zero cases have no finite mean)."""
    z = x @ w.t() + b
    keep = t != -100
    wy = torch.where(keep, cw[torch.where(keep, t, 0)], 0.0)
    total = (rows(loss, z, t, opts) * wy).sum()
    if reduction == "sum":
        return total
    assert float(wy.sum()) > 0
    return total / wy.sum()
