"""sparsemax and its Fenchel–Young loss in torch, by sort and cumsum
(Martins & Astudillo 2016, Algorithm 1), for the tests that need a reference
autograd can differentiate or that runs on DTensor's local shards (the NumPy
oracle in :mod:`.maps` is the bisection one)."""

from __future__ import annotations

import torch


def sparsemax(z):
    """sparsemax along the last dimension of z (finite entries)."""
    zs, _ = z.sort(-1, descending=True)
    cs = zs.cumsum(-1)
    j = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    k = (1 + j * zs > cs).sum(-1, keepdim=True)
    return (z - (cs.gather(-1, k - 1) - 1) / k).clamp_min(0)


def sparsemax_loss_rows(z, y):
    """⟨z, p⟩ − ½‖p‖² + ½ − z_y per row (Ω = ½‖p‖²), p = sparsemax(z), y valid class indices."""
    p = sparsemax(z)
    zy = z.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    return (z * p).sum(-1) - 0.5 * (p * p).sum(-1) + 0.5 - zy
