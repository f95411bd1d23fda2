r"""Argument checks of :func:`softk.attention.scaled_dot_product_attention`.

Every bad argument is a TypeError or ValueError from here that names it and
says what was expected, before any kernel runs.  The checks follow
``torch.nn.functional.scaled_dot_product_attention``'s conventions:

* query (…, H, L, E), key (…, H_kv, S, E), value (…, H_kv, S, Ev), the
  leading (batch) dimensions broadcast together, at least 2-D (a 2-D input
  has one head);
* the same floating dtype and device for the three;
* H_kv == H, or H_kv == 1 (broadcast), or with ``enable_gqa`` any divisor
  of H (head h reads key/value head h // (H / H_kv));
* ``attn_mask`` a bool tensor (True = takes part) or a float tensor of the
  query's dtype, added to the scores, broadcastable to (…, H, L, S).

The result, :class:`Call`, holds the three tensors as (B, H, L, E),
(B, H_kv, S, E), (B, H_kv, S, Ev) and the mask expanded to (B, H, L, S) (a
view where the batch dimensions allow it), which is what every backend takes.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .._validate import FLOAT_DTYPES, check_positive, finite, require, unwrapped
from ..threshold.rows import ROUNDS_TO_ONE, compute_dtype
from ..threshold.attention_maps import ENTMAX_ID, MAPS, family_id


@dataclass
class Call:
    q: Tensor
    k: Tensor
    v: Tensor
    mask: Optional[Tensor]
    scale: float
    causal: bool
    fam: int
    alpha: Optional[Tensor]  # (H,) per-head α for fam 3 (a float α is expanded), else None
    alpha_value: object  # the α the reference backend passes to softk.entmax: a float or the (H,) tensor
    out_shape: tuple
    softcap: Optional[float] = None  # c > 0: scores capped to c·tanh(s/c) before the mask and the map

    @property
    def learnable(self) -> bool:
        return self.alpha is not None and self.alpha.requires_grad


def _tensor(t, name: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float64, float32, float16 or bfloat16), "
                        f"got dtype {t.dtype}")
    if t.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (…, L, E), got shape {tuple(t.shape)}")
    return t


def _flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _scale(scale, e: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(e)
    if isinstance(scale, Tensor) and scale.numel() == 1 and not scale.requires_grad:
        scale = scale.item()
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be None or a real number, got {type(scale).__name__}")
    if not finite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def _dropout(p) -> None:
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"dropout_p must be a number, got {type(p).__name__}")
    if not 0.0 <= p <= 1.0:  # type: ignore[operator]  # a numbers.Real compares with a float
        raise ValueError(f"dropout_p must be in [0, 1], got {p}")
    if p > 0:  # type: ignore[operator]
        raise ValueError(
            f"dropout_p={p}: softk's attention does not implement dropout on the attention weights "
            "(pass dropout_p=0.0, e.g. `dropout_p=p if self.training else 0.0` -> 0.0, and apply dropout "
            "to the attention output instead)"
        )


def _heads(h: int, hkv: int, hv: int, gqa: bool) -> None:
    if hkv != hv:
        raise ValueError(f"key and value must have the same number of heads, got {hkv} and {hv}")
    if gqa:
        if h % hkv:
            raise ValueError(f"enable_gqa=True needs the query's heads ({h}) to be a multiple of the key's ({hkv})")
    elif hkv not in (1, h):
        raise ValueError(f"key has {hkv} heads and query {h}: they must be equal (or key's 1); "
                         "pass enable_gqa=True for grouped-query attention")


# α-entmax attention is exact to the compute dtype's precision on (1, hi]:
# * near 1 (α < 1.125) both the blockwise and the Triton backends carry each
#   row's shifted threshold t = λ + 1/(α−1), which is O(log n), form p
#   through log1p, and the α-gradient in a form whose terms do not cancel
#   (softk.threshold.entmax_alpha), so α → 1 costs no precision; from 1.125
#   on they carry λ, whose z − λ does not cancel near α = 2;
# * above 2 the map is not Lipschitz at the edge of the support: p_j grows
#   like u^(1/(α−1)) and the Jacobian's p_j^(2−α) is unbounded as p_j → 0,
#   so the rounding of the scores q·k themselves moves p and the gradients
#   by up to (ε|s|)^(1/(α−1)): float32 stops at 2, float64 at 3.
# softk.entmax on a whole row of given scores is exact for every α (its
# anchor form): that is the map for other α.  tests/attention/test_grad.py
# holds the errors at the ends of these ranges.
ALPHA_RANGE = {torch.float32: (1.0, 2.0), torch.float64: (1.0, 3.0)}  # (lo, hi]: α > lo, α ≤ hi
_WHY = "above it the map is not Lipschitz at the support's edge and the rounding of q·k moves p; use softk.entmax on the scores for other α"


def alpha_range(dtype: torch.dtype) -> tuple[float, float]:
    """(lo, hi): the attention backends take lo < α ≤ hi for inputs of
    ``dtype`` (half and bfloat16 compute in float32).

    >>> alpha_range(torch.bfloat16), alpha_range(torch.float64)
    ((1.0, 2.0), (1.0, 3.0))
    """
    return ALPHA_RANGE[compute_dtype(dtype)]


def _rounded_lo(lo: float, dtype: torch.dtype) -> float:
    """The α bound in the compute dtype: an α that float32 rounds to 1 is 1 there."""
    return ROUNDS_TO_ONE if lo == 1 and compute_dtype(dtype) == torch.float32 else lo


def _ct_name(dtype: torch.dtype) -> str:
    return "float64" if dtype == torch.float64 else "float32-compute"


def _alpha(name: str, alpha, h: int, q: Tensor):
    """(fam, per-head α tensor or None, the α the reference passes on)."""
    if name not in MAPS:
        raise ValueError(f"map must be one of {list(MAPS)}, got {name!r}")
    if name != "entmax":
        if alpha is not None:
            raise ValueError(f"alpha is only used with map='entmax', got alpha={alpha!r} with map={name!r}")
        return family_id(name, None, False), None, None
    if alpha is None:
        alpha = 1.5
    if isinstance(alpha, Tensor):
        if not alpha.is_floating_point():
            raise TypeError(f"alpha must be a float or a floating-point tensor, got dtype {alpha.dtype}")
        if alpha.device != q.device:
            raise ValueError(f"alpha must be on the query's device ({q.device}), got {alpha.device}")
        if alpha.dim() == 0:
            alpha = alpha.expand(h)
        if tuple(alpha.shape) != (h,):
            raise ValueError(f"alpha must be a float or a tensor of shape (H,) = ({h},), one α per head, "
                             f"got shape {tuple(alpha.shape)}")
        a = unwrapped(alpha.detach())
        lo, hi = alpha_range(q.dtype)
        low = _rounded_lo(lo, q.dtype)
        require((a > low) & (a <= hi), lambda: f"alpha must lie in ({lo:g}, {hi:g}] for every head with "
                f"{_ct_name(q.dtype)} attention ({_WHY}), got {a.tolist()}"
                + ("; float32, where it is computed, rounds an α up to 1 + 2⁻²⁴ to 1" if low != lo else ""))
        return ENTMAX_ID, alpha, alpha
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a float > 1 or a tensor of shape (H,), got {type(alpha).__name__}")
    alpha = float(alpha)
    if not (alpha > 1 and finite(alpha)):
        raise ValueError(f"alpha must be a finite float > 1 (use map='softmax' for α = 1), got {alpha}")
    lo, hi = alpha_range(q.dtype)
    if not _rounded_lo(lo, q.dtype) < alpha <= hi:
        raise ValueError(f"alpha must lie in ({lo:g}, {hi:g}] with {_ct_name(q.dtype)} attention ({_WHY}), got {alpha}"
                         + (" (1 in float32, where it is computed)" if alpha <= ROUNDS_TO_ONE else ""))
    fam = family_id("entmax", alpha, False)
    ct = compute_dtype(q.dtype)
    return fam, (torch.full((h,), alpha, dtype=ct, device=q.device) if fam == ENTMAX_ID else None), alpha


def _mask(mask, q: Tensor, target: tuple) -> Optional[Tensor]:
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"attn_mask must be None or a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and mask.dtype != q.dtype:
        raise TypeError(f"attn_mask must be a bool tensor (True = takes part) or a float tensor of the query's "
                        f"dtype {q.dtype} (added to the scores), got dtype {mask.dtype}")
    if mask.device != q.device:
        raise ValueError(f"attn_mask must be on the query's device ({q.device}), got {mask.device}")
    if mask.requires_grad:
        raise ValueError("attn_mask requires grad, but softk's attention gives no gradient to the mask; "
                         "pass attn_mask.detach()")
    try:
        ok = torch.broadcast_shapes(tuple(mask.shape), target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"attn_mask of shape {tuple(mask.shape)} must broadcast to the attention weights' "
                         f"shape (…, H, L, S) = {target}")
    return mask


def check_softcap(softcap) -> Optional[float]:
    """None, or a finite float c > 0 (Gemma 2's attention logit soft-capping)."""
    return None if softcap is None else check_positive(softcap, "softcap")


def check_call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, map, alpha,
               softcap=None) -> Call:
    """Validate the arguments and bring them to the (B, H, L, E) layout."""
    q, k, v = _tensor(query, "query"), _tensor(key, "key"), _tensor(value, "value")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"query, key and value must have the same dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    for t, name in ((k, "key"), (v, "value")):
        if t.device != q.device:
            raise ValueError(f"{name} must be on the query's device ({q.device}), got {t.device}")
    _dropout(dropout_p)
    causal, gqa = _flag(is_causal, "is_causal"), _flag(enable_gqa, "enable_gqa")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"key's last dimension must be the query's E = {q.shape[-1]}, got key shape {tuple(k.shape)}")
    if q.shape[-1] == 0:
        raise ValueError("query's last dimension E must be at least 1, got 0")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"value must have as many rows S as key ({k.shape[-2]}), got value shape {tuple(v.shape)}")
    nd = max(q.dim(), k.dim(), v.dim(), 3)
    q, k, v = (t.reshape((1,) * (nd - t.dim()) + tuple(t.shape)) for t in (q, k, v))
    h, hkv = q.shape[-3], k.shape[-3]
    _heads(h, hkv, v.shape[-3], gqa)
    try:
        batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    except RuntimeError:
        raise ValueError(f"the batch dimensions of query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)} (all but the last three) must broadcast together") from None
    fam, alpha_t, alpha_ref = _alpha(map, alpha, h, q)
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    mask = _mask(attn_mask, q, tuple(batch) + (h, L, S))
    n = math.prod(batch)
    q = q.expand(*batch, h, L, E).reshape(n, h, L, E)
    k = k.expand(*batch, hkv, S, E).reshape(n, hkv, S, E)
    v = v.expand(*batch, hkv, S, Ev).reshape(n, hkv, S, Ev)
    if mask is not None:
        mask = mask.expand(*batch, h, L, S).reshape(n, h, L, S)
    # torch's output has the inputs' largest rank (a 2-D call has no head dimension)
    out_shape = (tuple(batch) + (h, L, Ev))[nd - max(query.dim(), key.dim(), value.dim()):]
    return Call(q, k, v, mask, _scale(scale, E), causal, fam, alpha_t, alpha_ref, out_shape, check_softcap(softcap))
