r"""The reference backend: the scores materialised, softk's maps on them.

.. math:: S = \mathrm{scale}\cdot QK^\top + M, \qquad P = \mathrm{map}(S)\ \text{(rows)}, \qquad O = PV,

with M the additive mask (−inf where a boolean mask is False or the causal
mask hides a key).  Every step is a differentiable softk or torch op, so
autograd gives the gradients of q, k, v and a tensor α (through
:func:`softk.entmax`'s α gradient), second derivatives included.  It holds
the (…, H, L, S) scores and weights: for tests and small sizes.  Half
inputs are computed in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._maps import simplex
from .._ops.op import threshold_map
from ..threshold.rows import compute_dtype
from .checks import Call
from ..threshold.attention_maps import ENTMAX_ID, family


def products(q: Tensor, k: Tensor) -> Tensor:
    """Q·Kᵀ, differentiated as if a query or key with a non-finite component
    were not there.  Such a product is ±inf or NaN; where it is −inf the
    weight is 0 and dS is 0, yet the backward of the plain product forms
    dS·K and dSᵀ·Q, where 0·inf is NaN and spreads over the whole row of dq
    (or dk).  The product of the rows with a non-finite component zeroed is
    differentiated instead, and the entries it gets wrong are the plain
    product's, detached: their derivative is 0 wherever the result is not
    NaN anyway (a weight of 0, or a softcap's tanh flat at ±inf).  Every
    other entry is the plain product exactly: an entry of a product depends
    on its own row and column only."""
    qf, kf = torch.isfinite(q).all(-1, keepdim=True), torch.isfinite(k).all(-1, keepdim=True)
    s = torch.where(qf, q, 0) @ torch.where(kf, k, 0).transpose(-1, -2)
    return torch.where(qf & kf.transpose(-1, -2), s, q.detach() @ k.detach().transpose(-1, -2))


def scores(q: Tensor, k: Tensor, mask, scale: float, causal: bool, softcap=None) -> Tensor:
    """(B, H, L, S) scores in the compute dtype, −inf where a key does not take part
    (k already has one head per query head); ``softcap`` c caps the scaled
    products to c·tanh(·/c) before the mask."""
    s = products(q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = torch.where(mask, s, float("-inf")) if mask.dtype == torch.bool else s + mask.to(s.dtype)
    if causal:
        L, S = s.shape[-2:]
        hide = torch.ones(L, S, dtype=torch.bool, device=s.device).triu(1)  # key j > query i
        s = s.masked_fill(hide, float("-inf"))
    return s


def weights(s: Tensor, call: Call) -> Tensor:
    """P = map(S) along the keys."""
    if call.fam == ENTMAX_ID:
        alpha = call.alpha_value
        if isinstance(alpha, Tensor):  # one α per head: broadcast over (B, H, L, 1)
            alpha = alpha.reshape(-1, 1, 1)
        return simplex.entmax(s, alpha)
    return threshold_map(s, family(call.fam), 1, s.dim() - 1, 1.0)


def attention(call: Call) -> Tensor:
    """(B, H, L, Ev) in the query's dtype."""
    ct = compute_dtype(call.q.dtype)
    q, k, v = call.q.to(ct), call.k.to(ct), call.v.to(ct)
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    p = weights(scores(q, k, call.mask, call.scale, call.causal, call.softcap), call)
    return (p @ v).to(call.q.dtype)
