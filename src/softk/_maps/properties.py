r"""Measure which properties of a smooth top-k a ``soft_topk`` method actually has.

Nothing here is a list of known answers: each property is checked by running
the method on a fixed, seeded set of generated inputs and comparing the
output with what the property demands.  The properties (p = soft_topk(x, k),
computed in float64):

=================  ==========================================================
sum_k              Σp = k on every row
range              0 ≤ p ≤ 1
monotone           x_i > x_j ⇒ p_i ≥ p_j
shift_invariant    p(x + c) = p(x) for constants c up to ±2^−6/eps (see below)
limit_hard_topk    at small τ (scores ≥ 1 apart, τ = 1/20) p is within
                   ``limit_tol`` of the k-hot mask of the top k.  τ is kept
                   where e^{−1/τ} is far above float64 rounding, so a wrong
                   limit is not hidden by 1 − p rounding to 0 (at τ = 1/40 the
                   "weighted" method's p_max rounds to exactly 1 and it looks
                   right).
k1_softmax         k = 1 gives softmax(x/τ)
=================  ==========================================================

A property holds when its worst violation over all inputs is at most ``tol``
(``limit_tol`` for the limit, whose smooth methods are still ~e^{−10} away
at τ = 1/20).
``property_violations`` returns those worst violations themselves.

**Shift invariance at scale.**  Every map here is exactly shift invariant in
exact arithmetic, so the property is about precision: an implementation that
solves for λ on the raw row carries λ ≈ c and loses about c·eps to
cancellation, while one that works on z − max z (as the compiled kernels do)
loses nothing.  The shifts are ±3.75 and ±2^j/eps for j = −36, −26, −16, −6
(eps of float64: ±6.6e4, 6.7e7, 6.9e10, 7.0e13).  The largest, where
c·eps = 2^−6, is the float64 counterpart of a float32 offset of
2^−6/eps₃₂ ≈ 1.3e5, between the offsets 1e4 and 1e6 at which float32
sparsemax on the PyTorch path drifts visibly.  The shifted
rows use z rounded to multiples of 2^−5, so z + c is exact in float64 (it
lies below 2^47, where the spacing is at most 2^−6): the exact map gives the
same p at z and z + c, and no allowance for input rounding is needed.  The
tolerance is therefore the same ``tol`` as the other properties, and the
measured gap is the implementation's own rounding: 0 for a solver on shifted
rows, of the order of c·eps for one that is not.
The measurement runs on the backend in force (:func:`softk.use_backend`), so
``with softk.use_backend("torch")`` measures the PyTorch path.
"""

from __future__ import annotations

import numbers

from functools import lru_cache

import numpy as np
import torch

from .._backends.registry import backend as current_backend
from .._validate import check_choice, check_tau
from .hard import hard_topk
from .simplex import softmax
from .soft_topk import METHODS, soft_topk

PROPERTY_NAMES = ("sum_k", "range", "monotone", "shift_invariant", "limit_hard_topk", "k1_softmax")

# Separation of the scores and τ used for the limit: gaps of 1 at τ = 1/20 put
# the non-selected mass near e^{−20} ≈ 2e−9, well below the tolerance and well
# above float64 rounding.
_LIMIT_TAU = 0.05


def _inputs(seed: int):
    """(n, z, limit rows) per row length n.

    z holds x/τ for τ in {0.3, 1} (every method depends on x and τ only
    through x/τ, so all temperatures run in one call at τ = 1) of Gaussian
    rows at several scales, an evenly spaced row and a row with one outlier
    (where iterative schemes overshoot).  The limit rows are random
    permutations of 0..n−1 (scores 1 apart) divided by τ = 1/20.
    """
    gen = np.random.default_rng(seed)
    out = []
    for n in (4, 7, 12):
        xs = [gen.normal(size=(4, n)) * s for s in (0.5, 2.0, 6.0)]
        xs.append(np.linspace(0.0, n - 1.0, n)[None, ::-1].copy())
        spike = np.zeros((1, n))
        spike[0, -1] = 5.0
        xs.append(spike)
        x = np.concatenate(xs)
        z = np.concatenate([x / tau for tau in (0.3, 1.0)])
        perms = np.stack([gen.permutation(n) for _ in range(4)]).astype(np.float64)
        out.append((n, torch.tensor(z), torch.tensor(perms / _LIMIT_TAU)))
    return out


def _monotone_violation(x: torch.Tensor, p: torch.Tensor) -> float:
    """max over pairs with x_i > x_j of p_j − p_i (rows are short: all pairs)."""
    above = x[:, :, None] > x[:, None, :]
    gap = p[:, None, :] - p[:, :, None]  # [r, i, j] = p_j − p_i
    return float(torch.clamp(torch.where(above, gap, 0.0), min=0).max())


def property_violations(method: str, seed: int = 0) -> dict:
    """Worst violation of each property (0 = holds exactly) for ``method``.

    >>> import softk
    >>> v = softk.property_violations("sparse")
    >>> sorted(v) == sorted(softk.properties("sparse"))
    True
    """
    check_choice(method, METHODS, "method")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be an int >= 0 (numpy's generator takes no negative seed), got {seed}")
    return dict(_measure(method, int(seed), current_backend()))


# Shifts of the shift_invariant rows: a small one, then ±2^j/eps (see the
# module docstring); _SHIFT_GRID makes z + c exact for all of them.
_EPS = torch.finfo(torch.float64).eps
_SHIFTS = (3.75,) + tuple(2.0**j / _EPS for j in (-36, -26, -16, -6))
_SHIFT_GRID = 2.0**-5


def _shifted_rows(z: torch.Tensor):
    """(z rounded to the grid, the rounded rows shifted by ±c for every c)."""
    zr = torch.round(z / _SHIFT_GRID) * _SHIFT_GRID
    return zr, torch.cat([zr + sign * c for c in _SHIFTS for sign in (1.0, -1.0)])


@lru_cache(maxsize=64)
def _measure(method: str, seed: int, backend_name: str) -> tuple:
    # deterministic, and the CLI asks for both views; the key holds the backend
    # in force because the result depends on it
    worst = dict.fromkeys(PROPERTY_NAMES, 0.0)

    def note(name, value):
        value = float(value)
        worst[name] = max(worst[name], value if value == value else float("inf"))

    for n, z, lim in _inputs(seed):
        r = z.shape[0]
        zr, shifted_in = _shifted_rows(z)
        for k in sorted({1, 2, n // 2, n - 1}):
            # one call per (n, k): the rows, the rounded rows, the limit rows, the shifted rows
            out = soft_topk(torch.cat([z, zr, lim, shifted_in]), k, method=method)
            p, p_r = out[:r], out[r : 2 * r]
            p_lim = out[2 * r : 2 * r + lim.shape[0]]
            shifted = out[2 * r + lim.shape[0] :].reshape(-1, r, n)
            note("sum_k", (p.sum(-1) - k).abs().max())
            note("range", torch.clamp(torch.maximum(-p, p - 1), min=0).max())
            note("monotone", _monotone_violation(z, p))
            note("shift_invariant", (shifted - p_r).abs().max())
            note("limit_hard_topk", (p_lim - hard_topk(lim, k)).abs().max())
            if k == 1:
                note("k1_softmax", (p - softmax(z)).abs().max())
    return tuple(worst.items())


def properties(method: str, seed: int = 0, tol: float = 1e-6, limit_tol: float = 1e-3) -> dict:
    r"""Which properties of a smooth top-k ``soft_topk(..., method=method)`` has
    (sums to k, lies in [0, 1], monotone, shift invariant, tends to the hard
    top-k, is softmax at k = 1), measured on generated inputs.

    Args:
        method: a ``soft_topk`` method: "exp", "sigmoid", "laplace", "sparse",
            "grad", "iterative" or "weighted".
        seed: seed of the generated inputs (the result is deterministic).
        tol: largest violation still counted as "holds" (computations are in
            float64; the exact methods are within ~1e-12).
        limit_tol: the same for ``limit_hard_topk`` (at τ = 1/20 "sigmoid"
            is 4.5e-5 and "laplace" 2.3e-5 from the mask; "weighted" 1.0).

    Returns:
        A dict from each property's name to a bool, True where the property
        holds.  The names, with what each demands of p = soft_topk(x, k):
        ``sum_k`` (Σp = k on every row), ``range`` (0 ≤ p ≤ 1), ``monotone``
        (:math:`x_i > x_j \Rightarrow p_i \ge p_j`), ``shift_invariant``
        (:math:`p(x + c) = p(x)` for constants :math:`|c| \le 2^{-6}/\varepsilon`,
        ε float64's machine epsilon), ``limit_hard_topk`` (at τ = 1/20, scores
        at least 1 apart, p is within ``limit_tol`` of the k-hot mask) and
        ``k1_softmax`` (k = 1 gives :math:`\operatorname{softmax}(x/\tau)`).

    >>> import softk
    >>> softk.properties("exp")["range"], softk.properties("iterative")["range"]
    (True, False)
    """
    tol = check_tau(tol, "tol")
    limit_tol = check_tau(limit_tol, "limit_tol")
    bound = dict.fromkeys(PROPERTY_NAMES, tol)
    bound["limit_hard_topk"] = limit_tol
    return {name: v <= bound[name] for name, v in property_violations(method, seed).items()}
