r"""α-entmax for every α > 0, as entmax's ``entmax_bisect`` takes it.

α ≥ 1 is softk's :func:`softk.entmax` (exact; α = 1 is softmax, where the
bisection returns the uniform distribution).  0 < α < 1 — which
``entmax_bisect`` computes and entmax's own tests exercise — is the dense
Tsallis map of :func:`softk.threshold.families.entmax_dense_family`:
p_i = [(1−α)(λ − z_i)]^{−1/(1−α)}, λ > max z by safeguarded Newton.  Its
autograd (:mod:`softk._ops.entmax_dense`, the same implicit
differentiation as for α > 1, Peters et al. 2019, §3.2) is eager only (no
vmap or torch.compile; neither has entmax's).
A tensor α mixing rows below and above 1 runs each part on its own map.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...losses.normmax_fy import fenchel_young_rows
from ..._maps.simplex import entmax as softk_entmax
from ..._ops.entmax_dense import entmax_dense
from ..._ops.fenchel_young import tsallis_alpha_partial, tsallis_alpha_term
from ...losses import entmax_loss as softk_entmax_loss
from ...threshold.rows import compute_dtype
from ..._validate import per_row, unwrapped


def _dense(X: Tensor, alpha, dim: int) -> Tensor:
    if X.numel() == 0:
        return X * 0
    rows = X.movedim(dim, -1)
    # a float α stays a double: rounded to float32, 1 − 1e-9 would be 1
    a = per_row(alpha, X, dim, "alpha") if isinstance(alpha, Tensor) else torch.tensor(alpha, dtype=torch.float64, device=X.device)
    return entmax_dense(rows, a).movedim(-1, dim)


def _split(alpha: Tensor):
    """(rows below 1, whether any row is, whether every row is), read through torch.func wrappers."""
    low = alpha.detach() < 1
    every = unwrapped(alpha.detach()) < 1
    return low, bool(every.any()), bool(every.all())


def entmax_any_alpha(X: Tensor, alpha, dim: int) -> Tensor:
    """α-entmax along ``dim`` for α > 0 (checked): a float, or a tensor in entmax's layout."""
    if not isinstance(alpha, Tensor):
        return softk_entmax(X, alpha, dim) if alpha >= 1 else _dense(X, alpha, dim)
    low, some, every = _split(alpha)
    if not some:
        return softk_entmax(X, alpha, dim)
    p_low = _dense(X, torch.where(low, alpha, 0.5), dim)
    if every:
        return p_low
    return torch.where(low, p_low, softk_entmax(X, torch.where(low, 2.0, alpha), dim))


# --------------------------------------------------------------------- the loss
def _tsallis(v: Tensor, a) -> Tensor:
    """Ω_α(v) = (Σ v^α − 1)/(α(α−1)) on rows (keepdim) of the simplex, as
    Σ v expm1((α−1) log v)/(α(α−1)) (equal where Σv = 1): no terms of size
    1/(α − 1) to cancel as α → 1."""
    return tsallis_alpha_term(v, torch.as_tensor(a, dtype=v.dtype, device=v.device))


def _d_tsallis(v: Tensor, a) -> Tensor:
    """∂Ω_α(v)/∂α of :func:`_tsallis`, with its series near α = 1."""
    return tsallis_alpha_partial(v, torch.as_tensor(a, dtype=v.dtype, device=v.device))


def _dense_loss(X: Tensor, target: Tensor, alpha) -> Tensor:
    """The Fenchel–Young loss of the dense map (rows of X, classes last), per row."""
    ct = compute_dtype(X.dtype)
    x = X.to(ct)
    a = per_row(alpha, X, 1, "alpha").to(ct) if isinstance(alpha, Tensor) else alpha
    # (a float α as a double: rounded to float32, 1 − 1e-9 would be 1)
    p = entmax_dense(x, a if isinstance(a, Tensor) else torch.tensor(a, dtype=torch.float64, device=x.device))
    y = torch.nn.functional.one_hot(target.long(), x.shape[-1]).to(ct)
    return fenchel_young_rows(x, p, y, _tsallis, _d_tsallis, a).squeeze(-1).to(X.dtype)


def entmax_loss_any_alpha(X: Tensor, target: Tensor, alpha) -> Tensor:
    """Per-row α-entmax loss for α > 0 (checked) on entmax's (n, C) layout."""
    if not isinstance(alpha, Tensor):
        return softk_entmax_loss(X, target, alpha, reduction="none") if alpha >= 1 else _dense_loss(X, target, alpha)
    low, some, every = _split(alpha)
    if not some:
        return softk_entmax_loss(X, target, alpha, reduction="none")
    low_rows = per_row(low, X, 1, "alpha").squeeze(-1)
    loss_low = _dense_loss(X, target, torch.where(low, alpha, 0.5))
    if every:
        return loss_low
    return torch.where(low_rows, loss_low, softk_entmax_loss(X, target, torch.where(low, 2.0, alpha), reduction="none"))
