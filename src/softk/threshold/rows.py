r"""The row prelude: what every map, loss and potential does before and after λ.

Every operator here works on *rows*: the reduced dimension moved last.  This
module holds the conventions all of them share, so that they are written once:

* the compute dtype (half inputs are computed in float32);
* the scaled row z = (x − max x)/τ, shifted by the row's finite maximum
  *before* dividing by τ, so that neither a large offset nor a tiny τ
  overflows or rounds the entries that carry the mass (the maps are
  invariant to a per-row shift);
* the row status: ``-inf`` entries are removed; a row with m ≤ k finite
  entries (m = 0 is a fully masked row) gets p = 1 on its finite entries and
  0 elsewhere, with a zero gradient; a row holding NaN or +inf is NaN;
* the empty-input guard.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .host import readable
from .solve import lambda_reference

NEG_INF = float("-inf")
#: The largest α that float32 rounds to 1 (1 + 2⁻²⁴, a tie, goes to even):
#: a float32 kernel handed α − 1 = 0 there would divide by it.
ROUNDS_TO_ONE = 1 + 2.0**-24


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half inputs are computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def finite_max(z: Tensor) -> Tensor:
    """Maximum of each row's entries (keepdim), 0 where it is not finite
    (fully masked rows, and NaN/+inf rows, which the conventions fill)."""
    m = z.amax(-1, keepdim=True)
    return torch.where(torch.isfinite(m), m, 0.0)


def overflow_scale(n: int) -> float:
    """A power of 2 at most 1/(4n): a sum of n terms, each at most twice the
    float max in size, times it stays finite (and each term exact, above
    the subnormals)."""
    return 2.0 ** -(max(n, 1) - 1).bit_length() / 4


def _divide(d: Tensor, tau) -> Tensor:
    """d/τ for a float τ, or for a learnable τ (a tensor that requires grad).

    A learnable τ gets its gradient −Σ g·(d/τ)/τ, formed as that: autograd's
    rule for a quotient, −g·d/τ², overflows below τ ≈ 1e-19 in float32, and
    gives 0·∞ = NaN on an entry masked with −inf, whose g is 0.  So τ enters
    only through s = exp(log τ̄ − log τ) (τ̄ = τ detached: s = 1 exactly,
    ∂s/∂τ = −1/τ), and only on the entries whose quotient is finite (a
    masked entry, or one whose quotient overflowed, has p and g = 0 there).
    Plain tensor ops: double backward, forward mode, vmap and compile follow
    from them.
    """
    if not isinstance(tau, Tensor):
        return d / tau
    t = tau.to(d.dtype)
    q = d / t.detach()
    live = torch.isfinite(q)
    s = torch.exp(torch.log(t.detach()) - torch.log(t))
    return torch.where(live, torch.where(live, q, 0.0) * s, q)


def over_tau(x: Tensor, tau: Tensor, dim: int = -1, k=1, capped: bool = False) -> Tensor:
    """x/τ along ``dim`` for a τ that requires grad, with autograd, in the
    compute dtype (the caller casts its result back to x's dtype); see
    :func:`over_tau_shifted`, whose first result it is."""
    return over_tau_shifted(x, tau, dim, k, capped)[0]


def over_tau_shifted(x: Tensor, tau: Tensor, dim: int = -1, k=1, capped: bool = False):
    """((x − r)/τ, r) along ``dim`` for a τ that requires grad: the quotient
    with autograd, in the compute dtype, and the shift r (detached, size 1
    along ``dim``).

    Formed as (x − r)/τ (:func:`shift_over_tau`), r the entry the map's λ is
    carried relative to (:func:`softk.threshold.solve.lambda_reference`,
    detached; ``k`` and ``capped`` as there): the maps and their losses are
    invariant to a shift of a row, x/τ alone overflows at a small τ where
    the shifted row does not, and a shift by the maximum alone would round
    the entries near a top-k threshold to ulp(outlier/τ).  A finite entry
    whose quotient overflows is kept finite, as in :func:`scaled_rows`, so
    that the top-k maps still count it.
    """
    ct = compute_dtype(x.dtype)
    z = (x if x.dtype == ct else x.to(ct)).movedim(dim, -1)
    ref = lambda_reference(z.detach(), k, capped)
    q = shift_over_tau(z, ref, tau)
    big = torch.finfo(ct).max
    q = torch.where(torch.isfinite(z), q.clamp(-big, big), q)
    return q.movedim(-1, dim), ref.movedim(-1, dim)


def shift_over_tau(z: Tensor, r: Tensor, tau, check: bool = True) -> Tensor:
    """(z − r)/τ for a float τ or a learnable one (:func:`_divide`), r a
    shift of each row (a tensor that broadcasts against z).

    For entries of both signs near the float max, z − r overflows where
    (z − r)/τ does not (τ > 1): there it is formed from the halves,
    2·(z/2 − r/2)/τ, exact as they are.  With ``check`` (a float τ, on the
    CPU) one read says whether any entry needs it, which only eager kernel
    code may do; elsewhere the fix always runs, and for a learnable τ
    (whose autograd form must stay branch-free tensor code) it always runs.
    """
    d = z - r
    learnable = isinstance(tau, Tensor)
    if not learnable and tau == 1.0:
        return d
    q = _divide(d, tau)
    if learnable or (tau > 1.0 and (not (check and z.is_cpu) or bool(torch.isinf(d).any()))):
        over = torch.isinf(d) & torch.isfinite(z)
        q = torch.where(over, 2.0 * _divide(torch.where(over, z * 0.5 - r * 0.5, 0.0), tau), q)
    return q


def scaled_rows(x: Tensor, tau: float, family=None, k=1, shift: bool = True) -> Tensor:
    """z = (x − r)/τ in the compute dtype, r the entry λ is carried relative
    to (:func:`softk.threshold.solve.lambda_reference`: the row's maximum for
    the k = 1 maps, its k-th largest entry for the top-k families).

    Shifting *before* dividing keeps every difference near the threshold
    exact: x/τ first would round each entry to ulp(x/τ) (tiny τ), and a shift
    by the maximum alone would round the entries near a top-k threshold to
    ulp(outlier).  No autograd is needed: the maps are shift invariant and
    their backward takes τ separately.  ``shift=False`` (the compiled
    kernels at τ = 1, which find λ relative to the row themselves) skips it.
    A finite entry whose z overflows becomes the largest finite value (p = 1
    there for the top-k maps), never +inf, which is kept for +inf in x; for
    the top-k maps (and any map with k ≠ 1) one that overflows below becomes
    the smallest finite value, so that it still counts as a finite entry.
    """
    ct = compute_dtype(x.dtype)
    z = x if x.dtype == ct else x.to(ct)
    capped = family is not None and family.capped
    if shift:
        z = shift_over_tau(z, lambda_reference(z, k, capped), tau)
    elif tau != 1.0:
        z = z / tau
    # Σp = k > 1 (a top-k family, or a k = 1 map asked for more mass): a row
    # of at most k finite entries gets 1 on each, so none may read as masked
    topk = isinstance(k, Tensor) or k != 1
    if (tau < 1.0 or topk) and z.numel():
        # A finite entry far from the reference (a top-k threshold, or any
        # entry once divided by a small τ) can overflow.  Above, +inf would
        # mark the row broken: it becomes the largest finite value instead
        # (p = 1 on it for the capped maps, as in the limit).  Below, −inf
        # would drop the entry from the count of finite entries that the
        # top-k maps' row convention reads (a row with at most k finite
        # entries gets 1 on each): it becomes the smallest finite value (p = 0
        # on it otherwise, as in the limit).  On the CPU one aminmax (no sync
        # cost) tells whether either can have happened, and the three-op
        # fixes run only then; elsewhere they always run rather than read a
        # device value back, or under a compiler or a transform, which
        # cannot branch on a value (:func:`~softk.threshold.host.readable`).
        fix_hi, fix_lo = True, topk
        if z.is_cpu and readable(z):
            lo, hi = (float(t) for t in torch.aminmax(z))
            fix_hi, fix_lo = not hi < float("inf"), topk and lo == float("-inf")
        big = torch.finfo(z.dtype).max
        if fix_hi:
            z = torch.where((z == float("inf")) & (x != float("inf")), big, z)
        if fix_lo:
            z = torch.where((z == float("-inf")) & (x != float("-inf")), -big, z)
    return z


def masked_logsumexp(v: Tensor, keep: Tensor) -> Tensor:
    """logsumexp over the last dimension's entries in ``keep`` (keepdim), −inf
    where there is none, with no NaN in its derivatives there (a logsumexp of
    −inf alone has them)."""
    some = keep.any(-1, keepdim=True)
    lse = torch.logsumexp(torch.where(keep, v, torch.where(some, NEG_INF, 0.0)), -1, keepdim=True)
    return torch.where(some, lse, NEG_INF)


def broken_rows(z: Tensor) -> Tensor:
    """The rows (keepdim) holding NaN or +inf: NaN, value and gradient, by the
    row convention."""
    return (torch.isnan(z) | (z == float("inf"))).any(-1, keepdim=True)


def row_status(z: Tensor, k: int):
    """(finite mask, rows to solve, broken rows) for a (..., n) tensor."""
    finite = z > NEG_INF
    broken = broken_rows(z)
    saturated = finite.sum(-1, keepdim=True) <= k
    return finite, ~(broken | saturated), broken


def fill_rows(z: Tensor, p: Tensor, active: Tensor, broken: Tensor) -> Tensor:
    """Apply the row conventions to the rows that were not solved."""
    if bool(active.all()):
        return p
    filled = torch.where(broken, float("nan"), (z > NEG_INF).to(z.dtype))
    return torch.where(active, p, filled)


def empty_like_result(x: Tensor) -> Tensor:
    """The result for an input with no element (keeps autograd connected)."""
    return x * 0
