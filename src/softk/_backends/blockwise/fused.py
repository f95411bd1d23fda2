r"""Softmax attention on the CPU through torch's own fused kernel.

With map="softmax" softk's attention is torch's SDPA, O = softmax(scale·QKᵀ + M) V,
and torch's fused CPU kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``
and its backward) computes it without the L×S scores leaving the cache,
which a chunk of whole score rows (:mod:`.rows`) cannot.  It also follows
softk's conventions where they differ from the unfused SDPA: a query row
whose keys are all masked gets an output of 0 and zero gradients (its
log-sum-exp is 0 and every weight e^{−inf} = 0), and the causal mask is
top-left aligned for L ≠ S.

:func:`serves` says which calls take it: the softmax, no soft cap, at least
:data:`MIN_QUERIES` queries (decoding keeps whole score rows), float32
or float64 (half precision keeps softk's float32 compute: the fused kernel
rounds its weights to the input's precision), the CPU, values of the keys'
width (the kernel takes one head size), a mask of bool or of the query's
dtype, and no NaN or infinity in q and k and no NaN in a float mask
(softk makes a row with a NaN score NaN, where the fused kernel's running
maximum passes over a NaN and gives a row of NaN scores 0; a +inf score
makes the row NaN on both).  The
kernel takes only an additive mask of the query's dtype: a bool mask
becomes 0 / −inf (:func:`additive`) on its own storage, not on the
(B, H, L, S) view it is broadcast to.  Grouped heads (H_kv < H) are
repeated to H for the kernel, and the gradients of the repeats summed.

The forward returns m = 0 and lam = the row's log-sum-exp, so that
p_j = e^{s_j − m − lam} as for every kernel of op "attention"; the
backward hands the log-sum-exp back to torch's backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...threshold.attention_maps import SOFTMAX_ID

ENABLED = True  # tests switch it off to run the softmax on whole score rows or blocks of keys
# queries per call at least: the checks of q and k (:func:`_no_broken_row`) read every key once, which for
# a few queries against a long cache (decoding) is a large share of the attention's own time
MIN_QUERIES = 16


def serves(q: Tensor, k: Tensor, v: Tensor, mask, fam: int, softcap: float) -> bool:
    """Whether this call's softmax attention runs on torch's fused CPU kernel."""
    return (ENABLED and fam == SOFTMAX_ID and not softcap and q.device.type == "cpu" and q.shape[2] >= MIN_QUERIES
            and q.dtype in (torch.float32, torch.float64) and k.dtype == q.dtype and v.dtype == q.dtype
            and v.shape[-1] == q.shape[-1] and (mask is None or mask.dtype in (torch.bool, q.dtype))
            and _no_broken_row(q, k, mask))


def _no_broken_row(q: Tensor, k: Tensor, mask) -> bool:
    """Whether no query row's scores can all be NaN (or NaN and −inf): softk
    makes such a row NaN, where the fused kernel's running maximum passes
    over a NaN and gives the row 0, as if it were fully masked.  A finite
    sum of q and of k rules out every NaN and infinity in them (an overflow
    of the sum only sends the call to whole score rows), a sum of a float
    mask that is not NaN every NaN in it.  One reduction each: an elementwise
    isfinite costs as much as a decoding call's attention."""
    if not (bool(torch.isfinite(q.sum())) and bool(torch.isfinite(k.sum()))):
        return False
    return mask is None or mask.dtype == torch.bool or not bool(torch.isnan(_own(mask).sum()))


def _own(mask: Tensor) -> Tensor:
    """The mask narrowed to one entry along the dimensions it is broadcast along (stride 0)."""
    base = mask
    for d, (n, st) in enumerate(zip(mask.shape, mask.stride())):
        if n > 1 and st == 0:
            base = base.narrow(d, 0, 1)
    return base


def additive(mask, dtype) -> Tensor | None:
    """The mask as the kernel takes it: of ``dtype``, added to the scores.
    A bool mask is converted on its own entries: the dimensions it is
    broadcast along (stride 0) are narrowed to one entry first and expanded
    again after, so that a (L, S) mask broadcast to (B, H, L, S) costs L·S."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    base = _own(mask)
    add = torch.zeros(base.shape, dtype=dtype, device=mask.device).masked_fill_(~base, float("-inf"))
    return add.expand(mask.shape)


def _heads(t: Tensor, h: int) -> Tensor:
    """k or v (B, H_kv, S, E) with each key/value head repeated for its H / H_kv query heads."""
    hkv = t.shape[1]
    if hkv == h:
        return t
    if hkv == 1:
        return t.expand(t.shape[0], h, *t.shape[2:])
    return t.repeat_interleave(h // hkv, dim=1)


def _fold(g: Tensor, hkv: int) -> Tensor:
    """The gradient (B, H, S, E) of the repeated heads back on (B, H_kv, S, E): the sum over each group."""
    B, H = g.shape[:2]
    if hkv == H:
        return g
    return g.reshape(B, hkv, H // hkv, *g.shape[2:]).sum(2)


def _rows(t: Tensor) -> Tensor:
    """t with a unit stride along its last dimension, which the fused kernel
    assumes without checking (it reads a transposed, sliced or expanded
    head dimension as if it were packed); torch's SDPA ensures it before it
    calls the kernel, and so does this."""
    return t if t.stride(-1) == 1 else t.contiguous()


def attention_forward(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool, mask):
    """(out (B, H, L, E), m = 0 (B, H, L), lam = the log-sum-exp (B, H, L))."""
    H = q.shape[1]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _rows(q), _rows(_heads(k, H)), _rows(_heads(v, H)), 0.0, causal, attn_mask=additive(mask, q.dtype),
        scale=scale)
    return out, torch.zeros_like(lse), lse


def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lam: Tensor, *, scale: float,
                       causal: bool, mask):
    """(dq, dk, dv) from the forward's output and log-sum-exp ``lam``."""
    H, hkv = q.shape[1], k.shape[1]
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _rows(dout), _rows(q), _rows(_heads(k, H)), _rows(_heads(v, H)), _rows(out), lam, 0.0, causal,
        attn_mask=additive(mask, q.dtype), scale=scale)
    return dq, _fold(dk, hkv), _fold(dv, hkv)
