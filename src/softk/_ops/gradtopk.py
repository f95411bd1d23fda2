r"""GradTopK: the gradient of the log of the k-th elementary symmetric polynomial.

With z = x/τ and w = exp(z),

.. math:: e_k(w) = \sum_{|S| = k} \prod_{i \in S} w_i, \qquad
          p = \nabla_z \log e_k(w), \qquad
          p_i = \frac{w_i\, e_{k-1}(w_{-i})}{e_k(w)} = P(i \in S)

where S is a random k-subset drawn with probability ∝ Π_{i∈S} w_i (the
conditional Poisson / k-DPP-of-a-diagonal marginals).  So 0 < p < 1, Σp = k,
k = 1 is softmax, τ → 0 gives the hard top-k (Su Jianlin 2024, "GradTopK").

Stability.  The textbook formulas subtract: Newton's identities alternate signs,
and the leave-one-out recursion e_j(w_{-i}) = e_j(w) − w_i e_{j−1}(w_{-i})
cancels catastrophically (in log space: log(a − b) with a ≈ b, NaN once
rounding gives b > a).  Here everything is a *sum of non-negative terms*,
by one of two algorithms that compute the same quantities (float64 throughout):

* the scan (:mod:`softk._backends.gradtopk.scan`): prefix and suffix tables of
  log e_j over the row, n sequential steps of small ops;
* the tree (:mod:`softk._backends.gradtopk.tree`): log e_j of the row as a balanced
  tree of truncated log-space polynomial products, and log e_{k−1}(w_{−i}) by
  the tree's outside pass; 2·log2(n) levels of a few large ops each.

:func:`algorithm` picks one: the tree on a GPU and, on the CPU, for k ≥ 32
or at most 16 rows (where the scan's n steps are overhead-bound), the scan
elsewhere (the crossover is in BENCHMARKS.md, "GradTopK: the tree algorithm
against the scan"); ``ALGORITHM`` forces one.  tests/maps/test_gradtopk_tree.py
holds both to 1e-10 (relative, in p) and 3e-11 (absolute, in H g) of the
mpmath oracle.

Scale.  Rows are shifted by their (k+1)-th largest entry r and entries more
than T ≈ 130 + log(2nk) above it (in z units) are lowered to T: they are in S
with probability 1 − O(e^−130), so no marginal moves by more than 2nk·e^−130
(see ``_clamp_margin``), and the algorithms see numbers of size ~T whatever the
offset, outlier or τ ([1e16, 0, 1], k = 2 gives [1, .2689, .7311] in
float64; x/τ is never formed).

The backward of p = ∇ log e_k is the Hessian–vector product H g, which is
the directional derivative of p along g.  Both algorithms compute it explicitly
by pushing forward-mode tangents through their own sums (softmax shares of
the terms), so there is no double backward through logsumexp (NaN at −inf
entries, and slow).

Work is O(nk) per row, all rows at once.  Memory: the scan keeps a few
float64 tables of (n+1)·R·(k+1) entries for R rows (about 0.5 GB at n = 4096,
k = 256, R = 8 in the backward); the tree keeps O(n log k) per row plus one
level's products (on the CPU in cache-sized blocks).  Larger batches are run in
chunks of rows so that a table stays within 256 MiB.  Times: see
benchmarks/cpu/gradtopk_scale.py and BENCHMARKS.md.  The result is cast back to
the input dtype.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from .._ops import lean as _lean
from .._backends.gradtopk.scan import solve_scan
from .._backends.gradtopk.tree import solve_tree
from ..threshold.rows import overflow_scale, row_status, shift_over_tau

_WORK = torch.float64


# Which algorithm computes the tables: "auto" (see :func:`algorithm`), "scan" or "tree".
ALGORITHM = "auto"

ALGORITHMS = {"scan": solve_scan, "tree": solve_tree}


def algorithm(rows: int, n: int, k: int, device: torch.device) -> str:
    """The algorithm for a chunk of ``rows`` rows of length n.

    The tree on a GPU (O(log n) launches instead of O(n)).  On the CPU the
    tree where k >= 32 or rows <= 16, the scan elsewhere (the crossover of
    ``benchmarks/cpu/gradtopk_scale.py --sweep``, in BENCHMARKS.md).
    """
    if ALGORITHM != "auto":
        if ALGORITHM not in ALGORITHMS:
            raise ValueError(f"softk._ops.gradtopk.ALGORITHM must be 'auto', 'scan' or 'tree', got {ALGORITHM!r}")
        return ALGORITHM
    if device.type != "cpu" or k >= 32 or rows <= 16:
        return "tree"
    return "scan"


# Rows per call of an algorithm are capped so one table holds at most this many
# float64 entries (256 MiB; the scan's backward holds about four such tables,
# the tree's products far less): the O(R·n·k) tables would otherwise grow with
# the batch without bound.
_TABLE_BUDGET = 1 << 25


def _solve_rows(z: Tensor, k: int, g: Tensor | None = None):
    """The chosen algorithm over row chunks that keep each table within the budget."""
    n = z.shape[-1]
    step = max(1, _TABLE_BUDGET // (2 * (n + 1) * (k + 1)))  # 2: prefix + suffix rows
    solve = ALGORITHMS[algorithm(min(step, z.shape[0]), n, k, z.device)]
    if z.shape[0] <= step:
        return solve(z, k, g)
    parts = [solve(z[i : i + step], k, None if g is None else g[i : i + step]) for i in range(0, z.shape[0], step)]
    log_ek = torch.cat([q[0] for q in parts])
    p = torch.cat([q[1] for q in parts])
    hg = None if g is None else torch.cat([q[2] for q in parts])
    return log_ek, p, hg


def _clamp_margin(n: int, k: int) -> float:
    """T such that an entry T or more above the (k+1)-th largest is in the
    random k-subset S with probability 1 to float64 rounding.

    Any S ∌ i holds some j outside the top k (w_j ≤ w_(k+1)); swapping j for i
    multiplies its weight by e^{z_i − z_j} ≥ e^T, and each S ∋ i is reached
    from at most n − k such S, so P(i ∉ S) ≤ (n − k) e^{−T}.  The law of S
    given i ∈ S does not involve w_i, so lowering such z_i to z_(k+1) + T
    moves every other marginal by at most 2 (n − k) e^{−T}; with at most k
    such entries, T = 130 + log(2nk) keeps the total below e^−130 ≈ 4e−57
    (absolute: far below float64's resolution of p near 1, and below the
    e^−100 tails that tests/maps/test_gradtopk.py checks at 1e−40).  The price is
    the tables' range, ≈ k·T: their rounding stays ~1e−14 relative."""
    return 130.0 + math.log(2.0 * n * k)


def _prepare(x: Tensor, k: int, tau: float):
    """Rows of x (last dim) in float64 with the shared row conventions.

    Returns (z, active, filled, offset): z = min((x − r)/τ, T) with r the
    row's (k+1)-th largest entry (every entry far above it is certainly in S,
    see :func:`_clamp_margin`), so the tables see numbers of at most T + log
    terms whatever the row's offset, outlier or τ (x/τ alone overflows or
    rounds λ away: [1e16, 0, 1] gave [1, 1, 1]); ``offset`` (rows, 1) is
    what τ·log e_k loses to the shift and the clamp.
    """
    xw = x.to(_WORK)
    finite, active, broken = row_status(xw, k)
    filled = torch.where(broken, float("nan"), finite.to(_WORK))
    xs = torch.where(active, xw, 0.0).reshape(-1, x.shape[-1])  # filled rows get harmless values
    n = xs.shape[-1]
    if n > k:
        ref = torch.topk(xs, k + 1, dim=-1).values[:, k : k + 1]
        ref = torch.where(torch.isfinite(ref), ref, 0.0)
    else:
        ref = torch.zeros_like(xs[:, :1])
    margin = _clamp_margin(n, k)
    z = shift_over_tau(xs, ref, tau)  # entries so far below that this underflows have p = 0
    over = z > margin
    # τ·(z − T) on the clamped entries, in x's units (x − ref − Tτ, not ref + Tτ,
    # which rounds to ref when τ is tiny); every term times c (a power of 2,
    # exact), which keeps them finite near the float max
    c = overflow_scale(n + k)
    lost = torch.where(over, (xs * c - ref * c) - margin * (tau * c), 0.0).sum(-1, keepdim=True)
    return torch.where(over, margin, z), active, filled, (k * (ref * c) + lost, c)


def gradtopk_forward(x: Tensor, k: int, tau: float) -> Tensor:
    """The marginals p (last dimension, float64), with the row conventions."""
    zs, active, filled, _ = _prepare(x, k, tau)
    _, p, _ = _solve_rows(zs, k)
    return torch.where(active, p.reshape(filled.shape), filled)


def gradtopk_hvp(x: Tensor, k: int, tau: float, g: Tensor) -> Tensor:
    """∂L/∂x = H(z) g / τ (H the Hessian of log e_k, symmetric), 0 on rows
    filled by convention (float64)."""
    zs, active, filled, _ = _prepare(x, k, tau)
    gs = torch.where(active, g.to(_WORK), 0.0).reshape(zs.shape)
    _, _, hg = _solve_rows(zs, k, gs)
    return torch.where(active, hg.reshape(filled.shape), 0.0) / tau


# ----------------------------------------------------------- autograd contract
# The tables are opaque custom ops (fake kernels, vmap rules: the rows are
# independent, so a batch dimension moves to the front), under autograd
# Functions with setup_context: vmap, jacrev, jacfwd, jvp and torch.compile
# work.  p's Jacobian is H/τ with H the (symmetric) Hessian of log e_k, so the
# jvp is the same Hessian–vector product as the backward.  Second derivatives
# of p would need third-order tables: differentiating the backward raises.
_SECOND_ORDER = (
    "soft_topk(method='grad') has first derivatives only (its backward is an explicit "
    "Hessian-vector product); for second derivatives use a threshold method, e.g. method='exp'"
)


def _gradtopk_kernel(x: Tensor, k: int, tau: float) -> Tensor:
    return gradtopk_forward(x, k, tau).to(x.dtype)


def _hvp_kernel(x: Tensor, g: Tensor, k: int, tau: float) -> Tensor:
    # a row with a NaN/+inf score: NaN gradient, as every threshold map's
    broken = (torch.isnan(x) | (x == float("inf"))).any(-1, keepdim=True)
    return torch.where(broken, float("nan"), gradtopk_hvp(x, k, tau, g)).to(x.dtype)


def _no_second_order(ctx, grad):
    raise NotImplementedError(_SECOND_ORDER)


def _log_ek_kernel(x: Tensor, k: int, tau: float) -> Tensor:
    return log_ek_rows(x, k, tau)[0].to(x.dtype)


# softk::gradtopk, gradtopk_hvp, log_ek: see _library(), which the library path runs before any forward below
gradtopk_op: Callable[..., Tensor]
gradtopk_hvp_op: Callable[..., Tensor]
log_ek_op: Callable[..., Tensor]
gradtopk_op = gradtopk_hvp_op = log_ek_op = None  # type: ignore[assignment]


@_lean.library
def _library():
    global gradtopk_op, gradtopk_hvp_op, log_ek_op
    gradtopk_op = _lean.custom_op("softk::gradtopk", _gradtopk_kernel)
    gradtopk_hvp_op = _lean.custom_op("softk::gradtopk_hvp", _hvp_kernel)
    # Differentiating the Hessian–vector product (a second derivative of p) fails loudly.
    gradtopk_hvp_op.register_autograd(_no_second_order)
    log_ek_op = _lean.custom_op("softk::log_ek", _log_ek_kernel, fake=lambda x, k, tau: x.new_empty(x.shape[:-1] + (1,)))


class _Hvp(torch.autograd.Function):
    """H g / τ (the backward of GradTopK), with no derivative of its own."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, g: Tensor, k: int, tau: float) -> Tensor:
        return gradtopk_hvp_op(x, g, k, tau)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(_SECOND_ORDER)


# GradTopK's derivatives stop at the first order (its Hessian–vector product
# has none of its own), so under torch.compile around a transform other than
# vmap its paths refuse rather than give a derivative they cannot (through=False)
_HVP = _lean.Paths(_Hvp, _hvp_kernel, lambda x, g, *_: (x, g), register=_library, through=False)


class _SavesInput(torch.autograd.Function):
    """An op of (x, k, τ) on rows whose derivatives read x (GradTopK, log e_k)."""

    generate_vmap_rule = True

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, k, tau = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.k, ctx.tau = k, tau


class GradTopKFunction(_SavesInput):
    """p = ∇ log e_k(exp(x/τ)) along the last dimension; backward H g / τ."""

    @staticmethod
    def forward(x: Tensor, k: int, tau: float) -> Tensor:
        return gradtopk_op(x, k, tau)

    @staticmethod
    def backward(ctx, g: Tensor):
        (x,) = ctx.saved_tensors
        return _HVP.apply(x, g, ctx.k, ctx.tau), None, None


class _GradTopKJvp(GradTopKFunction):
    @staticmethod
    def jvp(ctx, v, *_):
        (x,) = ctx.saved_tensors
        return _HVP.apply(x, v, ctx.k, ctx.tau)


_GRADTOPK = _lean.Paths(_GradTopKJvp, _gradtopk_kernel, lambda x, *_: (x,), compiled=GradTopKFunction,
                         register=_library, through=False)


def log_ek_rows(x: Tensor, k: int, tau: float) -> tuple[Tensor, Tensor]:
    """(τ·log e_k(exp(x/τ)), p) on the last dimension (keepdim), float64.

    Rows with at most k finite entries give the sum of their finite entries
    (e_k of exactly k weights is their product; with fewer, the convention p = 1
    on the finite entries makes the value Σ of them, gradient p); NaN/+inf rows
    give NaN.
    """
    zs, active, filled, (offset, c) = _prepare(x, k, tau)
    log_ek, p, _ = _solve_rows(zs, k)
    shape = filled.shape[:-1] + (1,)
    xf = x.to(_WORK)
    fc = overflow_scale(xf.shape[-1])  # the sum scaled, finite near the float max where it is
    finite_sum = torch.where(filled > 0, xf * fc, 0.0).sum(-1, keepdim=True) / fc
    broken = torch.isnan(filled).any(-1, keepdim=True)
    conv = torch.where(broken, float("nan"), finite_sum)
    # (offset and τ·log e_k scaled by c, as _prepare's sums: the value is
    # inf only where it overflows itself)
    value = torch.where(active, (((tau * c) * log_ek[:, None] + offset) / c).reshape(shape), conv)
    return value, torch.where(active, p.reshape(filled.shape), filled)


class LogEkFunction(_SavesInput):
    """τ·log e_k(exp(x/τ)) along the last dimension (keepdim); gradient p
    (computed through GradTopK, so the Hessian of the value is p's Jacobian)."""

    @staticmethod
    def forward(x: Tensor, k: int, tau: float) -> Tensor:
        return log_ek_op(x, k, tau)

    @staticmethod
    def backward(ctx, g: Tensor):
        (x,) = ctx.saved_tensors
        return g * _GRADTOPK.apply(x, ctx.k, ctx.tau), None, None


class _LogEkJvp(LogEkFunction):
    @staticmethod
    def jvp(ctx, v, *_):
        (x,) = ctx.saved_tensors
        return (_GRADTOPK.apply(x, ctx.k, ctx.tau) * v).sum(-1, keepdim=True)


_LOG_EK = _lean.Paths(_LogEkJvp, _log_ek_kernel, lambda x, *_: (x,), compiled=LogEkFunction, register=_library,
                      through=False)


def gradtopk(x: Tensor, k: int, dim: int, tau: float) -> Tensor:
    """Launcher for ``soft_topk(method="grad")`` (arguments already validated)."""
    if x.numel() == 0:
        return x * 0
    return _GRADTOPK.apply(x.movedim(dim, -1), k, tau).movedim(-1, dim)


def log_ek(x: Tensor, k: int, dim: int, tau: float, keepdim: bool = False) -> Tensor:
    """τ·log e_k(exp(x/τ)) along ``dim`` (arguments already validated)."""
    out = _LOG_EK.apply(x.movedim(dim, -1), k, tau).movedim(-1, dim)
    return out if keepdim else out.squeeze(dim)
