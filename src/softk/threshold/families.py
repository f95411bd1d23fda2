r"""Threshold families: one place that says what each map *is*.

Every map in this package of the form

.. math:: p_i = f(z_i - \lambda), \qquad \textstyle\sum_i p_i = k, \qquad z = x / \tau

is described by a :class:`Family`:

* ``f`` and its derivative ``df`` (the map and the slope used by Newton),
* ``d_from_p``: the same slope written through the output ``p = f(u)``, so the
  backward pass needs only the saved output (but for ``slope_from_x``, below),
* ``F`` with ``F' = f`` and ``F(-inf) = 0``: the potential
  :math:`\Phi(z) = \sum_i F(z_i-\lambda) + k\lambda` whose gradient is ``p``,
* ``psi``, the convex conjugate of ``F``: :math:`\Omega(p) = \sum_i \psi(p_i)` is the
  regulariser, ``p = argmax_{p in C_k} <z, p> - Omega(p)``,
* how λ is found: ``knots`` + ``closed_form`` for piecewise families (the active
  set is located by bisection over the sorted breakpoints, then λ is solved
  exactly on it), or ``bracket`` for smooth families (safeguarded Newton).

A new family is a few lines: see :func:`sigmoid_family`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor

from .host import readable

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Family:
    name: str
    f: Callable[[Tensor], Tensor]
    df: Callable[[Tensor], Tensor]
    d_from_p: Callable[[Tensor], Tensor]
    F: Callable[[Tensor], Tensor]
    psi: Callable[[Tensor], Tensor]
    capped: bool  # f <= 1, so any k in [1, n] is feasible (the top-k families)
    knots: Optional[Callable[[Tensor], Tensor]] = None
    closed_form: Optional[Callable[[Tensor, int, Tensor], Tensor]] = None
    bracket: Optional[Callable[[Tensor, int, Tensor], tuple]] = None
    # True when g(λ) = Σ f(z-λ) is convex in λ: Newton started on the g > k side
    # then never overshoots.
    convex: bool = False
    # True when f(u) = 0 for u <= 0: only the largest entries can be in the
    # support, so λ can be found from a partial sort (fast_paths.solve_on_candidates).
    zero_below: bool = False
    # Newton runs on h(λ) = g(λ)^(1/q) − k^(1/q) when this is set: for entmax
    # with q = 1/(α−1) ≥ 1, h is convex and nearly linear (a q-norm of (z−λ)_+),
    # so Newton from the left reaches λ in a few steps instead of many.
    newton_power: float | Tensor | None = None
    # Optional shortcut for the piecewise families whose knots are the z's:
    # the support size ρ from the row sorted in descending order and shifted
    # by its maximum (−inf padding last), without bisection (see solve.py).
    support_size: Optional[Callable[[Tensor, Tensor, int], Tensor]] = None
    alpha: object = None  # entmax's α (the Triton kernels take it as a number)
    # u with f(u) = 1, for the simplex maps: a row whose only finite entry is z
    # has λ = z − unit (attention rows with a single key).  A number, or for a
    # tensor α one per row; None where no such offset is used.
    unit: object = None
    # The inverse of f on its support, u = f⁻¹(p) for p > 0.  For the simplex
    # maps (k = 1): with the row's largest entry p_max at u_max,
    # λ = z_max − f⁻¹(p_max) is the row's threshold, so a block of the row can
    # be mapped later from (z_max, f⁻¹(p_max)) alone (the fused loss's walk
    # over vocabulary blocks).  For ``slope_from_x``, below: the anchor of
    # the backward's u.  None where no such inverse is used.
    f_inv: Optional[Callable[[Tensor], Tensor]] = None
    # p as the maps write it, where that differs from f (which the solvers
    # sum): exp keeps its entries below saturation below 1.  None: f.
    written: Optional[Callable[[Tensor], Tensor]] = None
    # True when f′ cannot be read off p where p nears 1: for sigmoid and
    # laplace f′ ≈ 1 − p there, which p's rounding loses (all of it once p
    # rounds to 1, and with it the whole row's gradient when every entry lies
    # far from λ).  Their backward reads the input too, and forms
    # u = (x − x_j)/τ + f⁻¹(p_j) anchored at an entry j where f⁻¹ (``f_inv``,
    # which these families set) is well conditioned, p_j ≤ ½ above all; then
    # d = df(u) (softk._backends.torch.threshold.anchored_slope).
    slope_from_x: bool = False
    # (r, −r′, scale) at u = z − λ: Newton's function for λ, where the plain
    # Σf(u) − k loses what decides λ: with entries near 1 the sum's rounding
    # (an ulp of k) swamps the mass of the entries near 0, so Σf = k holds
    # on a whole flat of λ and their p are off by any factor.  r has the
    # sign of g(λ) − k; the scale is what r's rounding is relative to
    # (Newton stops at a few ulps of it).  The λ search uses it (sigmoid;
    # laplace has a closed form), and so does the backward's anchor on a row
    # whose every p lies above ½ (``slope_from_x``).  Called as
    # residual(u, k, logspace=True) it sums the tails in logs, for rows
    # where a tail underflows (r = ±inf).  None: Σf(u) − k, Σf′(u), k.
    residual: Optional[Callable[..., tuple]] = None
    if TYPE_CHECKING:  # set by __post_init__ (object.__setattr__: the class is frozen), not a field
        _kernels: tuple[Optional[int], bool, Optional[float]] = field(init=False)

    # Which kernels serve the family: one table, read by softk._backends.dispatch.  The
    # answers are computed once, in __post_init__ (every call asks them, and
    # functools.cached_property takes a lock that torch.compile cannot trace).
    def __post_init__(self):
        if self.name == "entmax" and isinstance(self.alpha, Tensor):
            kernel = None  # per-row α: PyTorch path
        else:
            kernel = KERNEL_IDS.get(self.name)
        native = kernel is not None and kernel in NATIVE_IDS and (
            kernel != KERNEL_IDS["entmax"] or 1.0 < float(self.alpha) <= 2.0)
        # a tensor α is read when asked (a value check of a batch, say), never here
        alpha_value = 1.5 if self.alpha is None else None if isinstance(self.alpha, Tensor) else float(self.alpha)
        object.__setattr__(self, "_kernels", (kernel, native, alpha_value))

    def p(self, u: Tensor) -> Tensor:
        """The map's output at u = z − λ: ``written``, or f."""
        return (self.written or self.f)(u)

    @property
    def kernel(self) -> Optional[int]:
        """The id of this family in the compiled CPU and Triton kernels (None: PyTorch path only)."""
        return self._kernels[0]

    @property
    def native(self) -> bool:
        """True when the compiled CPU kernels serve this family: the first five
        ids, and entmax only for 1 < α ≤ 2 (for α > 2, g is not convex and the
        C solver's Newton-from-below is not safe)."""
        return self._kernels[1]

    @property
    def alpha_value(self) -> float:
        """α as a float for the kernels (1.5 where the family has none)."""
        value = self._kernels[2]
        return float(self.alpha) if value is None else value  # type: ignore[arg-type]  # value is None only for a tensor α


# Kernel ids shared by kernels_impl.h (native) and softk/_backends/triton/kernels.py.
KERNEL_IDS = {"softmax": 0, "sparsemax": 1, "entmax15": 2, "entmax": 3, "exp": 4, "sigmoid": 5, "laplace": 6, "sparse": 7}
NATIVE_IDS = frozenset(range(5))


def _sum(t: Tensor) -> Tensor:
    return t.sum(-1, keepdim=True)


def _lse(z: Tensor, mask: Tensor) -> Tensor:
    return torch.logsumexp(torch.where(mask, z, NEG_INF), -1, keepdim=True)


def _xlogx(p: Tensor) -> Tensor:
    return torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0)


def _knots_at_z(z: Tensor) -> Tensor:
    return z


# ---------------------------------------------------------------- exp: min(1, e^u)
def below_one(dtype: torch.dtype) -> float:
    """The largest float of ``dtype`` below 1."""
    return 1.0 - torch.finfo(dtype).eps / 2


def _exp_written(u: Tensor) -> Tensor:
    # p = 1 only where u > 0 (saturated, f′ = 0), below 1 where u ≤ 0: the
    # top entry of a row whose others lie far below has u ≈ −e^{−gap}, which
    # λ's rounding makes 0 and e^u rounds to 1, while f′ there is 1; the
    # backward reads f′ off p (d_from_p), where a 1 would zero the whole
    # row's gradient (at k = 1 this map is softmax, which never saturates).
    # An error of at most one ulp below 1.  (The solvers sum f itself: at
    # u = 0, g must count the 1.)
    e = torch.exp(torch.clamp(u, max=0.0))
    return torch.where(u <= 0, torch.clamp(e, max=below_one(u.dtype)), e)


def _exp_closed_form(z: Tensor, k: int, t: Tensor) -> Tensor:
    # Entries with z >= λ are saturated at 1; the rest are e^{z-λ}:
    #   n_sat + e^{-λ} Σ_unsat e^z = k  =>  λ = lse(z_unsat) - log(k - n_sat)
    sat = z >= t
    finite = z > NEG_INF
    return _lse(z, finite & ~sat) - torch.log(k - _sum(sat.to(z.dtype)))


EXP = Family(
    name="exp",
    f=lambda u: torch.exp(torch.clamp(u, max=0.0)),
    df=lambda u: torch.where(u <= 0, torch.exp(torch.clamp(u, max=0.0)), 0.0),
    d_from_p=lambda p: torch.where(p < 1, p, 0.0),
    F=lambda u: torch.where(u <= 0, torch.exp(torch.clamp(u, max=0.0)), 1.0 + u),
    psi=lambda p: _xlogx(p) - p,
    capped=True,
    knots=_knots_at_z,
    closed_form=_exp_closed_form,
    written=_exp_written,
)


# --------------------------------------------------- softmax: e^u (uncapped, k = 1)
SOFTMAX = Family(
    name="softmax",
    f=torch.exp,
    df=torch.exp,
    d_from_p=lambda p: p,
    F=torch.exp,
    psi=lambda p: _xlogx(p) - p,
    capped=False,
    # No knots: e^{-λ} Σ e^z = k has one closed form on the whole line.
    closed_form=lambda z, k, t: _lse(z, z > NEG_INF) - torch.log(torch.tensor(float(k), dtype=z.dtype)),
    unit=0.0,  # f(0) = 1
    f_inv=torch.log,
)


# ------------------------------------------ the two tails of f(u) + f(−u) = 1
def _tails_residual(tail: Callable[[Tensor], tuple], log_tail: Callable[[Tensor], tuple]) -> Callable[..., tuple]:
    """Newton's function for λ (``Family.residual``) of a map with
    f(u) + f(−u) = 1 (sigmoid, laplace), from ``tail(u)`` = (f(−|u|), f′(u))
    and ``log_tail(u)``, their logarithms.

    Σf(u) = k is A − B = k − c, with the two tails A = Σ_{u<0} f(u) and
    B = Σ_{u≥0} f(−u) and c = #{u ≥ 0}: k − c is exact, and A and B keep
    their relative precision however far the entries lie from λ.  Newton
    runs on r = log(A + a) − log(B + b), a − b = c − k with a, b ≥ 0: on
    the tails A and B are about sums of exponentials, so r is nearly linear
    in λ (Newton on A − B itself moves one unit of u a step there).

    With ``logspace`` the tails are summed as logs (log-sum-exp): where every
    entry of a tail lies so far from λ that its share underflows (float64
    rows spanning 1e40 and more, a mask value of the dtype's minimum), the
    plain sums give r = ±inf, and Newton no step; in logs r stays finite and
    nearly linear in λ, and one step crosses the whole gap."""

    def residual(u: Tensor, k, logspace: bool = False) -> tuple:
        up = u >= 0
        c = up.sum(-1, keepdim=True).to(u.dtype)
        a, b = torch.clamp(c - k, min=0.0), torch.clamp(k - c, min=0.0)
        if logspace:
            lt, ld = log_tail(u)
            la, sa = _log_side(lt, ld, ~up, a)
            lb, sb = _log_side(lt, ld, up, b)
            r, slope = la - lb, sa + sb
        else:
            t, d = tail(u)  # each entry's share of its tail, and f′
            tail_a = _sum(torch.where(up, 0.0, t)) + a
            tail_b = _sum(torch.where(up, t, 0.0)) + b
            r = torch.log(tail_a) - torch.log(tail_b)
            slope = (torch.where(tail_a > 0, _sum(torch.where(up, 0.0, d)) / tail_a, 0.0)
                     + torch.where(tail_b > 0, _sum(torch.where(up, d, 0.0)) / tail_b, 0.0))
        r = torch.where(r == r, r, 0.0)  # both tails empty: Σf = c = k exactly
        return r, slope, 1.0

    return residual


def _log_side(lt: Tensor, ld: Tensor, side: Tensor, extra: Tensor) -> tuple:
    """(log T, Σf′/T) of one tail T = Σ_side e^{lt} + extra, the shares and
    slopes given as logs: both summed relative to the side's largest share,
    so that the slope, a ratio of two such sums, keeps its digits where the
    shares' logs are huge (−1e307: log T = −1e307 + log 3 rounds to −1e307)."""
    m = torch.where(side, lt, NEG_INF).amax(-1, keepdim=True)
    ms = torch.where(m > NEG_INF, m, 0.0)
    st = _sum(torch.where(side, torch.exp(lt - ms), 0.0))
    sd = _sum(torch.where(side, torch.exp(ld - ms), 0.0))
    ex = torch.exp(torch.log(extra) - ms)  # extra·e^{−m}, inf where extra dwarfs the shares
    total = st + ex
    log_t = torch.where(torch.isinf(ex), torch.log(extra), ms + torch.log(total))
    return log_t, torch.where(total > 0, sd / total, 0.0)


def _laplace_tail(u: Tensor) -> tuple:
    t = 0.5 * torch.exp(-torch.abs(u))  # e^{−|u|}/2 = f′(u)
    return t, t


def _laplace_log_tail(u: Tensor) -> tuple:
    lt = -torch.abs(u) - math.log(2.0)
    return lt, lt


# ------------------------------------ laplace: Laplace CDF, 1 - e^{-u}/2 | e^{u}/2
def _log_c_plus_hypot(c: Tensor, s: Tensor) -> Tensor:
    # log(c + sqrt(c^2 + e^s)) for c >= 0 without overflow or cancellation.
    logc = torch.log(c)
    return torch.logaddexp(logc, 0.5 * torch.logaddexp(2 * logc, s))


def _laplace_closed_form(z: Tensor, k: int, t: Tensor) -> Tensor:
    # Upper set U (z >= λ): 1 - e^{λ-z}/2; lower set: e^{z-λ}/2.  With
    # A = Σ_U e^{-z}, B = Σ_lower e^{z}, c = k - |U| and w = e^λ:
    #   (A/2) w^2 + c w - B/2 = 0,
    # solved in log space (a = log A, b = log B, s = a + b) in the form that has
    # no cancellation for either sign of c.
    finite = z > NEG_INF
    upper = z >= t
    a = _lse(-z, upper)
    b = _lse(z, finite & ~upper)
    c = k - _sum(upper.to(z.dtype))
    s = a + b
    pos = b - _log_c_plus_hypot(torch.clamp(c, min=0.0), s)
    neg = _log_c_plus_hypot(torch.clamp(-c, min=0.0), s) - a
    return torch.where(c > 0, pos, neg)


LAPLACE = Family(
    name="laplace",
    f=lambda u: torch.where(
        u >= 0, 1 - 0.5 * torch.exp(-torch.clamp(u, min=0.0)), 0.5 * torch.exp(torch.clamp(u, max=0.0))
    ),
    df=lambda u: 0.5 * torch.exp(-torch.abs(u)),
    d_from_p=lambda p: torch.minimum(p, 1 - p),
    F=lambda u: torch.where(
        u >= 0,
        u + 0.5 * torch.exp(-torch.clamp(u, min=0.0)),
        0.5 * torch.exp(torch.clamp(u, max=0.0)),
    ),
    # ψ(p) = p log 2p - p for p < 1/2, and the mirror image for p >= 1/2.
    psi=lambda p: torch.where(
        p < 0.5,
        _xlogx(2 * p) / 2 - p,
        _xlogx(2 * (1 - p)) / 2 - (1 - p),
    ),
    capped=True,
    knots=_knots_at_z,
    closed_form=_laplace_closed_form,
    f_inv=lambda p: torch.where(p <= 0.5, torch.log(2 * p), -torch.log(2 * (1 - p))),
    slope_from_x=True,
    residual=_tails_residual(_laplace_tail, _laplace_log_tail),  # the closed form finds λ; the backward's anchor uses this
)


# ------------------------------------------- sparse: clip(u, 0, 1), the capped simplex
def _clip_closed_form(z: Tensor, k: int, t: Tensor) -> Tensor:
    # Saturated (z - λ >= 1) count 1 each, linear ones z - λ:
    #   n_sat + Σ_lin z - n_lin λ = k
    u = z - t
    sat = u >= 1
    lin = (u > 0) & ~sat
    n_lin = _sum(lin.to(z.dtype))
    lam = (_sum(torch.where(lin, z, 0.0)) + _sum(sat.to(z.dtype)) - k) / n_lin
    # n_lin == 0: g is flat (every entry at a vertex) and any λ in the bracket works.
    return torch.where(n_lin > 0, lam, t)


SPARSE = Family(
    name="sparse",
    f=lambda u: torch.clamp(u, 0.0, 1.0),
    df=lambda u: ((u > 0) & (u < 1)).to(u.dtype),
    d_from_p=lambda p: ((p > 0) & (p < 1)).to(p.dtype),
    F=lambda u: torch.where(u >= 1, u - 0.5, 0.5 * torch.clamp(u, min=0.0) ** 2),
    psi=lambda p: 0.5 * p * p,
    capped=True,
    knots=lambda z: torch.cat([z, z - 1], dim=-1),
    closed_form=_clip_closed_form,
    zero_below=True,
)


# ---------------------------------------------- sparsemax: max(u, 0) (uncapped, k = 1)
def _relu_closed_form(z: Tensor, k: int, t: Tensor) -> Tensor:
    # Support S = {z > λ}:  Σ_S z - |S| λ = k
    supp = z > t
    n_s = _sum(supp.to(z.dtype))
    return (_sum(torch.where(supp, z, 0.0)) - k) / n_s


def _relu_support_size(s: Tensor, finite: Tensor, k: int) -> Tensor:
    # Top-j support is consistent iff s_j > λ_j = (Σ_{i≤j} s_i − k)/j; the
    # consistent j form a prefix (Martins & Astudillo 2016, Prop. 1).
    j = torch.arange(1, s.shape[-1] + 1, device=s.device, dtype=s.dtype)
    s0 = torch.where(finite, s, 0.0)
    return (finite & (j * s0 - s0.cumsum(-1) + k > 0)).sum(-1, keepdim=True)


SPARSEMAX = Family(
    name="sparsemax",
    f=lambda u: torch.clamp(u, min=0.0),
    df=lambda u: (u > 0).to(u.dtype),
    d_from_p=lambda p: (p > 0).to(p.dtype),
    F=lambda u: 0.5 * torch.clamp(u, min=0.0) ** 2,
    psi=lambda p: 0.5 * p * p,
    capped=False,
    knots=_knots_at_z,
    closed_form=_relu_closed_form,
    convex=True,
    zero_below=True,
    support_size=_relu_support_size,
    unit=1.0,  # f(1) = 1
    f_inv=lambda p: p,
)


# ----------------------------------------------- entmax15: (u/2)_+^2 (uncapped, k = 1)
def _entmax15_closed_form(z: Tensor, k: int, t: Tensor) -> Tensor:
    # Support S = {z > λ}: Σ_S (z - λ)^2 = 4k.  With μ the mean and ss the
    # centred sum of squares of z on S:  |S| (μ - λ)^2 = 4k - ss.
    supp = z > t
    n_s = _sum(supp.to(z.dtype))
    mu = _sum(torch.where(supp, z, 0.0)) / n_s
    ss = _sum(torch.where(supp, (z - mu) ** 2, 0.0))
    return mu - torch.sqrt(torch.clamp(4 * k - ss, min=0.0) / n_s)


def _entmax15_support_size(s: Tensor, finite: Tensor, k: int) -> Tensor:
    # Top-j support is consistent iff s_j > λ_j = μ_j − sqrt((4k − ss_j)/j)
    # (Peters et al. 2019, Alg. 2); s is shifted by the row max, so on the
    # support |s| ≤ 2 and the one-pass variance has no cancellation to speak of.
    j = torch.arange(1, s.shape[-1] + 1, device=s.device, dtype=s.dtype)
    s0 = torch.where(finite, s, 0.0)
    mu = s0.cumsum(-1) / j
    ss = (s0 * s0).cumsum(-1) - j * mu * mu
    lam = mu - torch.sqrt(torch.clamp(4 * k - ss, min=0.0) / j)
    return (finite & (s0 > lam)).sum(-1, keepdim=True)


ENTMAX15 = Family(
    name="entmax15",
    f=lambda u: 0.25 * torch.clamp(u, min=0.0) ** 2,
    df=lambda u: 0.5 * torch.clamp(u, min=0.0),
    d_from_p=torch.sqrt,
    F=lambda u: torch.clamp(u, min=0.0) ** 3 / 12.0,
    psi=lambda p: p * torch.sqrt(p) / 0.75,
    capped=False,
    knots=_knots_at_z,
    closed_form=_entmax15_closed_form,
    convex=True,
    zero_below=True,
    support_size=_entmax15_support_size,
    unit=2.0,  # f(2) = 1
    f_inv=lambda p: 2 * torch.sqrt(p),
)


# --------------------------------------------------------- sigmoid: σ(u), any k
_SIGMOID_NARROW = 64.0  # a bracket this wide or less: Newton crosses it in a few steps


def _sigmoid_bracket(z: Tensor, k, finite: Tensor) -> tuple:
    # With m finite entries and r = logit(k/m): at λ = min z - r every σ >= k/m,
    # at λ = max z - r every σ <= k/m, so Σσ brackets k.  Narrowed by the
    # order statistics around k (K = ⌊k⌋, J = ⌈k⌉, z_(i) the i-th largest):
    # at λ = z_(K+1) − log(k/(K+1−k)) the top K+1 entries have σ ≥ k/(K+1),
    # and at λ = z_(J) + log((1−s)/s), s = (k−J+1)/(m−J+1), the entries from
    # the J-th on have σ ≤ s: so Newton starts among the entries near the
    # threshold, not across a row whose entries lie far apart (50 units of z
    # between neighbours: one crossed per step, past the iteration cap).
    m = _sum(finite.to(z.dtype))
    r = torch.logit(k / m)
    zf = torch.where(finite, z, NEG_INF)
    zmax = zf.amax(-1, keepdim=True)
    zmin = torch.where(finite, z, float("inf")).amin(-1, keepdim=True)
    lo, hi = zmin - r, zmax - r
    if not bool((hi - lo > _SIGMOID_NARROW).any()):  # (the solver runs eagerly, on rows)
        return lo, hi
    n = z.shape[-1]
    kt = torch.as_tensor(k, dtype=z.dtype, device=z.device)
    big_k, big_j = torch.floor(kt), torch.clamp(torch.ceil(kt), min=1.0)
    if isinstance(k, Tensor):
        v = torch.sort(zf, dim=-1, descending=True).values
        z_k1 = v.gather(-1, torch.clamp(big_k, max=n - 1).long().expand(*v.shape[:-1], 1))
        z_j = v.gather(-1, torch.clamp(big_j - 1, max=n - 1).long().expand(*v.shape[:-1], 1))
    else:
        top = torch.topk(zf, min(int(big_k) + 1, n), dim=-1).values
        z_k1 = top[..., int(big_k) : int(big_k) + 1] if int(big_k) < n else torch.full_like(zmax, NEG_INF)
        z_j = top[..., int(big_j) - 1 : int(big_j)]
    lo_k = z_k1 - torch.log(kt / (big_k + 1 - kt))
    sj = (kt - big_j + 1) / (m - big_j + 1)
    hi_k = z_j + torch.log((1 - sj) / sj)
    lo = torch.where((big_k + 1 <= m) & torch.isfinite(lo_k), torch.maximum(lo, lo_k), lo)
    hi = torch.where((sj > 0) & (sj < 1) & torch.isfinite(hi_k), torch.minimum(hi, hi_k), hi)
    return lo, torch.maximum(hi, lo)


def _sigmoid_slope(u: Tensor) -> Tensor:
    # σ(u)σ(−u) = e/(1 + e)², e = e^{−|u|}: keeps float32's subnormals, where
    # torch.sigmoid(−|u|) = 1/(1 + e^{|u|}) is 0 from |u| = 88.7 on (the
    # backward's slopes of a row whose entries all lie far from λ)
    e = torch.exp(-torch.abs(u))
    return e / ((1 + e) * (1 + e))


def _sigmoid_tail(u: Tensor) -> tuple:
    # torch.sigmoid's flush below u = −88.7 (float32) costs the sums nothing:
    # a tail it empties is summed again as logs (_tails_residual)
    t = torch.sigmoid(-torch.abs(u))  # σ(−|u|)
    return t, t * (1 - t)


def _sigmoid_log_tail(u: Tensor) -> tuple:
    lt = torch.nn.functional.logsigmoid(-torch.abs(u))
    return lt, lt + torch.nn.functional.logsigmoid(torch.abs(u))


def sigmoid_family() -> Family:
    return Family(
        name="sigmoid",
        f=torch.sigmoid,
        df=_sigmoid_slope,
        d_from_p=lambda p: p * (1 - p),
        F=torch.nn.functional.softplus,
        psi=lambda p: _xlogx(p) + _xlogx(1 - p),
        capped=True,
        bracket=_sigmoid_bracket,
        f_inv=torch.logit,
        slope_from_x=True,
        residual=_tails_residual(_sigmoid_tail, _sigmoid_log_tail),
    )


SIGMOID = sigmoid_family()


def _tsallis_psi(alpha) -> Callable[[Tensor], Tensor]:
    """ψ(p) = (p^α − p)/(α(α−1)) of α-entmax (any α ≠ 1 > 0): Tsallis'
    p^α/(α(α−1)) less a term linear in p, which cancels wherever ψ is summed
    over two points of the simplex (the losses' Ω(y) − Ω(p), the potential
    less ψ(1) per unit mass), and which would not cancel where Σy is 1 only
    to its dtype (bfloat16 targets) and would add (Σy − 1)/(α(α−1)).  In
    the expm1 form no term is 1/(α − 1)-sized, so α near 1 keeps its digits."""
    am1 = alpha - 1

    def psi(p: Tensor) -> Tensor:
        pos = p > 0
        return torch.where(pos, p * torch.expm1(am1 * torch.log(torch.where(pos, p, 1.0))), 0.0) / (alpha * am1)

    return psi


# ----------------------------------- entmax: [(α-1)u]_+^{1/(α-1)} for any α > 1
def entmax_family(alpha) -> Family:
    """α-entmax, α > 1 (a float, or a tensor broadcastable to the rows' shape
    with size 1 in the last dimension).  α = 2 is sparsemax, α = 1.5 entmax15."""
    am1 = alpha - 1
    beta = 1 / am1  # exponent of f

    def pos_pow(u, e):
        # [(α-1)u]_+^e with 0 outside the support, for any sign of e.
        s = am1 * u
        pos = s > 0
        return torch.where(pos, torch.exp(e * torch.log(torch.where(pos, s, 1.0))), 0.0)

    def bracket(z, k, finite):
        # Entmax is a k = 1 map.  p_max = 1 at λ = max z - 1/(α-1), so Σp >= 1;
        # p_max = 1/m at λ = max z - (1/m)^(α-1)/(α-1), so Σp <= 1.
        m = _sum(finite.to(z.dtype))
        zmax = torch.where(finite, z, NEG_INF).amax(-1, keepdim=True)
        return zmax - 1 / am1, zmax - (1 / m) ** am1 / am1

    return Family(
        name="entmax",
        f=lambda u: pos_pow(u, beta),
        df=lambda u: pos_pow(u, beta - 1),
        d_from_p=lambda p: torch.where(
            p > 0, torch.exp((2 - alpha) * torch.log(torch.where(p > 0, p, 1.0))), 0.0
        ),
        F=lambda u: pos_pow(u, beta + 1) / alpha,
        psi=_tsallis_psi(alpha),
        capped=False,
        bracket=bracket,
        # [u]_+^β is convex for β >= 1 (α <= 2); for α > 2 Newton is safeguarded.
        # (a float α without a tensor round trip: it costs more than a small row's map;
        # a tensor α that cannot be read is taken as not convex, which serves every α)
        convex=(bool(torch.all(alpha <= 2)) if readable(alpha) else False) if isinstance(alpha, Tensor)
        else bool(alpha <= 2),
        zero_below=True,
        # For α > 2 (q < 1) h is not convex: plain Newton (q = 1) there.
        newton_power=torch.clamp(beta, min=1.0) if isinstance(beta, Tensor) else max(beta, 1.0),
        alpha=alpha,
        unit=beta,  # f(1/(α−1)) = 1
        f_inv=lambda p: torch.exp(am1 * torch.log(p)) / am1,  # p^(α−1)/(α−1)
    )


THRESHOLD_METHODS = {"exp": EXP, "sigmoid": SIGMOID, "laplace": LAPLACE, "sparse": SPARSE}



# entmax_by_alpha's families, one per float α seen (a Family is frozen, so one
# object serves every call; building one costs more than a small row's map).
# Bounded: a sweep over many α values starts the table again.
_CLOSED_FORMS: dict[float, Family] = {1.0: SOFTMAX, 1.5: ENTMAX15, 2.0: SPARSEMAX}
_BY_ALPHA: dict[float, Family] = dict(_CLOSED_FORMS)
_BY_ALPHA_MAX = 256


def entmax_by_alpha(alpha: float) -> Family:
    """α-entmax's family for a float α >= 1 (already checked): the exact
    closed-form families at α = 1 (softmax), 1.5 and 2 (sparsemax)."""
    a = float(alpha)
    if not isinstance(alpha, (float, int)):  # a 0-d tensor: its own family unless a closed form
        return _CLOSED_FORMS.get(a) or entmax_family(alpha)
    fam = _BY_ALPHA.get(a)
    if fam is None:
        if len(_BY_ALPHA) >= _BY_ALPHA_MAX:
            for key in list(_BY_ALPHA):  # a copy taken in one step: another thread may insert meanwhile
                if key not in _CLOSED_FORMS:
                    _BY_ALPHA.pop(key, None)
        fam = _BY_ALPHA[a] = entmax_family(alpha)
    return fam


def by_name(name: str, alpha: float = 1.5) -> Family:
    """The family called ``name``: "softmax", "sparsemax", "entmax15",
    "entmax" (with ``alpha``) or a soft top-k threshold method."""
    if name == "entmax":
        return entmax_by_alpha(alpha)
    return {"softmax": SOFTMAX, "sparsemax": SPARSEMAX, "entmax15": ENTMAX15, **THRESHOLD_METHODS}[name]


# ------------------- dense α-entmax, 0 < α < 1: [(α−1)u]^{1/(α−1)} with every u < 0
def entmax_dense_family(alpha) -> Family:
    r"""α-entmax for 0 < α < 1: the Tsallis-regularised argmax that is *dense*.

    With a = α − 1 < 0, p_i = [(1−α)(λ − z_i)]^{−1/(1−α)} with λ > max z:
    every finite entry is positive (polynomial tails, never sparse), and
    α → 1⁻ tends to softmax.  Ω(p) = Σ p^α / (α(α−1)) is still convex for
    0 < α < 1, so the map is the unique maximiser of ⟨z, p⟩ − Ω(p) on the
    simplex.  λ is taken in the frame λ' = λ − 1/(1−α), where

    .. math:: p_i = f(z_i - \lambda'), \qquad f(u) = (1 + a u)^{1/a} = e^{\log(1 + a u)/a}

    (u < −1/a; f → e^u as α → 1⁻): λ itself lies 1/(1−α) above max z and
    holds the z − λ that make p to eps/(1−α) only, which near α = 1 is all
    of their digits; λ' is of the order of the row's spread.
    g(λ') = Σ f(z − λ') is decreasing and convex, and h = g^a is a power mean
    with exponent a < 0, concave in λ': Newton on h from the left (g ≥ 1)
    never overshoots (``newton_power = 1/a``).  The bracket is entmax's,
    shifted: p_max = 1 at λ' = max z, p_max = 1/m at
    λ' = max z + (m^{1−α} − 1)/(1−α).  f is +inf from its pole u = −1/a on,
    a side the bracket never visits.  PyTorch path only (no kernel id).

    ``alpha`` is a float in (0, 1) or a tensor of such values shaped like the
    rows' first dimensions + (1,).  The entmax package's ``entmax_bisect``
    computes this map for α < 1 (softk.compat.entmax serves it from here).
    """
    am1 = alpha - 1
    beta = 1 / am1

    def pow_shifted(u, e):
        # (1 + a u)^{e/a} for 1 + a u > 0; +inf from the pole on, where
        # the exponents e/a of f′, f and F are all negative; u = −inf (a
        # masked entry) gives 0
        s = torch.log1p(am1 * u)
        return torch.where(s == s, torch.exp(e * beta * s), float("inf"))

    def bracket(z, k, finite):
        m = _sum(finite.to(z.dtype))
        zmax = torch.where(finite, z, NEG_INF).amax(-1, keepdim=True)
        return zmax, zmax - torch.expm1(-am1 * torch.log(m)) / am1

    return Family(
        name="entmax_dense",
        f=lambda u: pow_shifted(u, 1.0),
        df=lambda u: pow_shifted(u, 1.0 - am1),
        d_from_p=lambda p: torch.exp((2 - alpha) * torch.log(p)),
        F=lambda u: pow_shifted(u, alpha) / alpha,
        # (F(u) here is the original F(u − 1/(1−α)), whose conjugate adds
        # p/(1−α): a term linear in p, which _tsallis_psi's ψ leaves out too)
        psi=_tsallis_psi(alpha),
        capped=False,
        bracket=bracket,
        convex=True,
        newton_power=beta,
        alpha=alpha,
    )

