"""The blockwise attention in the interface of op "attention"
(:mod:`softk._backends.kernels`): ``forward(q, k, v, mask, alpha, scale,
causal, fam, softcap) -> (out, m, λ, tiles)`` and ``backward(q, k, v, out,
dout, m, λ, tiles, mask, alpha, scale, causal, fam, need_dalpha, softcap) ->
(dq, dk, dv, dα)``; ``alpha`` the per-head α (a tensor) or None.  The
blockwise kernel keeps no tile mask: ``tiles`` is empty."""

from __future__ import annotations

import torch

from . import backward as _backward
from . import forward as _forward


def tiles_numel(q, k, fam) -> int:
    return 0


def forward(q, k, v, mask, alpha, scale, causal, fam, softcap):
    a = alpha.detach() if alpha is not None else None
    out, m, lam = _forward.attention_forward(q, k, v, scale=scale, causal=causal, mask=mask, fam=fam, alpha=a,
                                             softcap=softcap)
    return out, m, lam, torch.zeros(0, dtype=torch.int8, device=q.device)


def backward(q, k, v, out, dout, m, lam, tiles, mask, alpha, scale, causal, fam, need_dalpha, softcap):
    a = alpha.detach() if alpha is not None else None
    return _backward.attention_backward(q, k, v, out, dout, m, lam, scale=scale, causal=causal, mask=mask, fam=fam,
                                        alpha=a, need_dalpha=need_dalpha, softcap=softcap)
