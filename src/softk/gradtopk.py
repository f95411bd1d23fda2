r"""GradTopK: the gradient of the log of the k-th elementary symmetric polynomial.

With z = x/τ and w = exp(z),

.. math:: e_k(w) = \sum_{|S| = k} \prod_{i \in S} w_i, \qquad
          p = \nabla_z \log e_k(w), \qquad
          p_i = \frac{w_i\, e_{k-1}(w_{-i})}{e_k(w)} = P(i \in S)

where S is a random k-subset drawn with probability ∝ Π_{i∈S} w_i (the
conditional Poisson / k-DPP-of-a-diagonal marginals).  So 0 < p < 1, Σp = k,
k = 1 is softmax, τ → 0 gives the hard top-k (Su Jianlin 2024, "GradTopK").

Stability.  The textbook routes subtract: Newton's identities alternate signs,
and the leave-one-out recursion e_j(w_{-i}) = e_j(w) − w_i e_{j−1}(w_{-i})
cancels catastrophically (in log space: log(a − b) with a ≈ b, NaN once
rounding gives b > a).  Here everything is a *sum of non-negative terms*:

* prefix tables  A[i, j] = log e_j(w_1..w_i)  by
  A[i, j] = logaddexp(A[i−1, j], z_i + A[i−1, j−1]), truncated at j ≤ k;
* suffix tables  B[i, j] = log e_j(w_{i+1}..w_n)  by the same recurrence run
  backwards;
* marginals (forward–backward):
  log p_i = z_i + logsumexp_a(A[i−1, a] + B[i, k−1−a]) − A[n, k].

Scale.  Rows are shifted by their (k+1)-th largest entry r and entries more
than T ≈ 130 + log(2nk) above it (in z units) are lowered to T: they are in S
with probability 1 − O(e^−130), so no marginal moves (see ``_clamp_margin``),
and the tables hold numbers of size ~T whatever the offset, outlier or τ
([1e16, 0, 1], k = 2 gives [1, .2689, .7311] in float64; x/τ is never formed).

The backward of p = ∇ log e_k is the Hessian–vector product H g, which is
the directional derivative of p along g.  It is computed explicitly by pushing
forward-mode tangents through the same two recurrences (their weights
exp(A[i−1, j] − A[i, j]) are read off the stored tables), so there is no
double backward through logaddexp (NaN at −inf entries, and slow).

Work and memory are O(nk) per row, all rows at once; the only Python loop
runs over the n positions.  Memory is a few float64 tables of (n+1)·R·(k+1)
entries for R rows (forward 2, backward 4 plus the (n, R, k) pair terms: about
0.5 GB at n = 4096, k = 256, R = 8; peak RSS grew by 0.53 GB); larger
batches are run in chunks of rows so that a table stays within 256 MiB
(about 1 GiB at the peak of the backward).  Measured (benchmarks/gradtopk_scale.py):
n = 4096, k = 256, batch 8, float32 forward + backward ≈ 2.7 s on 2 busy CPU
cores.  Everything is accumulated in float64 and the result is cast back
to the input dtype: the same recurrence run in float32 at n = 200, k = 40,
x ~ N(0, 50²) was measured 4.9e-4 off per entry and 9.7e-3 off in Σp (float64:
5.8e-13 per entry).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .threshold.rows import row_status

NEG_INF = float("-inf")
_WORK = torch.float64


def _table(zt: Tensor, k: int) -> Tensor:
    """Log elementary symmetric polynomials of prefixes.

    zt is (n, R).  Returns T of shape (n + 1, R, k + 1) with
    T[i, :, j] = log e_j(w_1..w_i), j = 0..k (truncated at k: higher degrees
    never feed e_k).
    """
    n, r = zt.shape
    t = torch.full((n + 1, r, k + 1), NEG_INF, dtype=zt.dtype, device=zt.device)
    t[:, :, 0] = 0.0
    rows, zs = t.unbind(0), zt.unbind(0)
    for i in range(n):
        # e_j(.., w) = e_j(..) + w e_{j-1}(..): two non-negative terms.
        torch.logaddexp(rows[i][:, 1:], zs[i][:, None] + rows[i][:, :-1], out=rows[i + 1][:, 1:])
    return t


# Positions whose recurrence weights are materialised at once in _tangent: big
# enough to vectorise, small enough to stay in cache.
_BLOCK = 128


def _tangent(t: Tensor, zt: Tensor, gt: Tensor) -> Tensor:
    """Forward-mode tangent dT of a table from :func:`_table` along gt (n, R).

    T[i+1, j] = log(e^{T[i, j]} + e^{z_i + T[i, j−1]}), so
    dT[i+1, j] = (1 − β) dT[i, j] + β (g_i + dT[i, j−1]) with
    β = exp(z_i + T[i, j−1] − T[i+1, j]) ∈ [0, 1] the second term's share.
    Where e_j = 0 (T = −inf) β is NaN; it is set to 0 and dT stays 0 there.
    """
    n = zt.shape[0]
    dt = torch.zeros_like(t)
    drows = dt.unbind(0)
    for b0 in range(0, n, _BLOCK):
        b1 = min(n, b0 + _BLOCK)
        beta = zt[b0:b1, :, None] + t[b0:b1, :, :-1]
        beta.sub_(t[b0 + 1 : b1 + 1, :, 1:]).exp_().nan_to_num_(nan=0.0)
        alpha = (1 - beta).unbind(0)
        bg = (beta * gt[b0:b1, :, None]).unbind(0)
        beta = beta.unbind(0)
        for s in range(b1 - b0):
            src, out = drows[b0 + s], drows[b0 + s + 1][:, 1:]
            torch.addcmul(bg[s], alpha[s], src[:, 1:], out=out)
            out.addcmul_(beta[s], src[:, :-1])
    return dt


def _log_pairs(t: Tensor, r: int, k: int) -> Tensor:
    """P[i, :, a] = A[i, a] + B[i+1, k−1−a] (a = 0..k−1, i = 0..n−1): the
    log-terms of e_{k−1}(w_{−i}) split between the items before and after i.

    ``t`` stacks the prefix table A (rows :r) and the prefix table of the
    reversed sequence (rows r:), so B[i] (suffix after i) is that table's row n − i.
    """
    n = t.shape[0] - 1
    return t[:-1, :r, :k] + t[:n, r:, :k].flip(0, -1)


def _solve(z: Tensor, k: int, g: Tensor | None = None):
    """For finite-or-(−inf) rows z (R, n) with more than k finite entries:
    (log e_k (R,), p (R, n), H g (R, n) or None), all in float64."""
    # log e_k(w) shifts by k·c when z shifts by c and p does not: work with
    # z − max z so the tables hold numbers of moderate size.
    top = z.amax(-1, keepdim=True)
    r = z.shape[0]
    zt = (z - top).t()  # (n, R): one position per step
    # Prefix and suffix tables in one pass: the suffix table is the prefix
    # table of the reversed sequence, run as R extra rows.
    zz = torch.cat([zt, zt.flip(0)], dim=1).contiguous()
    t = _table(zz, k)
    log_ek = t[-1, :r, k]
    pairs = _log_pairs(t, r, k)
    # c_i = log e_{k−1}(w_{−i}) is finite: a row here has > k finite entries.
    c = torch.logsumexp(pairs, -1)  # (n, R)
    # 0 < p < 1 exactly; the exponent's rounding (~1e-13 at |z| ~ 100) can
    # put a saturated p a few ulps above 1, which would break log(1 − p).
    p = torch.exp(zt + c - log_ek).clamp(max=1.0).t()
    if g is None:
        return log_ek + k * top.squeeze(-1), p, None
    gt = g.t()
    dt = _tangent(t, zz, torch.cat([gt, gt.flip(0)], dim=1))
    share = pairs.sub_(c[:, :, None]).exp_()  # softmax weights of the log-terms
    dc = (share * _log_pairs(dt, r, k)).sum(-1)  # tangent of c
    mean = (p * g).sum(-1, keepdim=True)  # tangent of log e_k is <p, g>
    hg = p * (g + dc.t() - mean)
    return log_ek + k * top.squeeze(-1), p, hg


# Rows per call of _solve are capped so one table holds at most this many
# float64 entries (256 MiB; the backward holds about four such tables): the
# O(R·n·k) tables would otherwise grow with the batch without bound.
_TABLE_BUDGET = 1 << 25


def _solve_rows(z: Tensor, k: int, g: Tensor | None = None):
    """:func:`_solve` over row chunks that keep each table within the budget."""
    n = z.shape[-1]
    step = max(1, _TABLE_BUDGET // (2 * (n + 1) * (k + 1)))  # 2: prefix + suffix rows
    if z.shape[0] <= step:
        return _solve(z, k, g)
    parts = [
        _solve(z[i : i + step], k, None if g is None else g[i : i + step]) for i in range(0, z.shape[0], step)
    ]
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
    e^−100 tails that tests/test_gradtopk.py checks at 1e−40).  The price is
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
    z = (xs - ref) / tau  # entries so far below that this underflows have p = 0
    over = z > margin
    # τ·(z − T) on the clamped entries, in x's units (x − ref − Tτ, not ref + Tτ,
    # which rounds to ref when τ is tiny)
    lost = torch.where(over, (xs - ref) - margin * tau, 0.0).sum(-1, keepdim=True)
    return torch.where(over, margin, z), active, filled, k * ref + lost


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


def _front(info, t: Tensor, bdim):
    return t.expand(info.batch_size, *t.shape) if bdim is None else t.movedim(bdim, 0)


@torch.library.custom_op("softk::gradtopk", mutates_args=())
def gradtopk_op(x: Tensor, k: int, tau: float) -> Tensor:
    return gradtopk_forward(x, k, tau).to(x.dtype)


@torch.library.custom_op("softk::gradtopk_hvp", mutates_args=())
def gradtopk_hvp_op(x: Tensor, g: Tensor, k: int, tau: float) -> Tensor:
    return gradtopk_hvp(x, k, tau, g).to(x.dtype)


@gradtopk_op.register_fake
def _(x, k, tau):
    return torch.empty_like(x)


@gradtopk_hvp_op.register_fake
def _(x, g, k, tau):
    return torch.empty_like(x)


def _no_second_order(ctx, grad):
    raise NotImplementedError(_SECOND_ORDER)


# Differentiating the Hessian–vector product (a second derivative of p) fails loudly.
gradtopk_hvp_op.register_autograd(_no_second_order)
gradtopk_op.register_vmap(lambda info, d, x, k, tau: (gradtopk_op(_front(info, x, d[0]), k, tau), 0))
gradtopk_hvp_op.register_vmap(
    lambda info, d, x, g, k, tau: (gradtopk_hvp_op(_front(info, x, d[0]), _front(info, g, d[1]), k, tau), 0)
)


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
        return gradtopk_hvp_op(x, g, ctx.k, ctx.tau), None, None


class _GradTopKJvp(GradTopKFunction):
    @staticmethod
    def jvp(ctx, v, *_):
        (x,) = ctx.saved_tensors
        return gradtopk_hvp_op(x, v, ctx.k, ctx.tau)


def log_ek_rows(x: Tensor, k: int, tau: float) -> tuple[Tensor, Tensor]:
    """(τ·log e_k(exp(x/τ)), p) on the last dimension (keepdim), float64.

    Rows with at most k finite entries give the sum of their finite entries
    (e_k of exactly k weights is their product; with fewer, the convention p = 1
    on the finite entries makes the value Σ of them, gradient p); NaN/+inf rows
    give NaN.
    """
    zs, active, filled, offset = _prepare(x, k, tau)
    log_ek, p, _ = _solve_rows(zs, k)
    shape = filled.shape[:-1] + (1,)
    xf = x.to(_WORK)
    finite_sum = torch.where(filled > 0, xf, 0.0).sum(-1, keepdim=True)
    broken = torch.isnan(filled).any(-1, keepdim=True)
    conv = torch.where(broken, float("nan"), finite_sum)
    value = torch.where(active, (tau * log_ek[:, None] + offset).reshape(shape), conv)
    return value, torch.where(active, p.reshape(filled.shape), filled)


@torch.library.custom_op("softk::log_ek", mutates_args=())
def log_ek_op(x: Tensor, k: int, tau: float) -> Tensor:
    return log_ek_rows(x, k, tau)[0].to(x.dtype)


@log_ek_op.register_fake
def _(x, k, tau):
    return x.new_empty(x.shape[:-1] + (1,))


log_ek_op.register_vmap(lambda info, d, x, k, tau: (log_ek_op(_front(info, x, d[0]), k, tau), 0))


def _apply_gradtopk(x: Tensor, k: int, tau: float) -> Tensor:
    fn = GradTopKFunction if torch.compiler.is_compiling() else _GradTopKJvp
    return fn.apply(x, k, tau)


class LogEkFunction(_SavesInput):
    """τ·log e_k(exp(x/τ)) along the last dimension (keepdim); gradient p
    (computed through GradTopK, so the Hessian of the value is p's Jacobian)."""

    @staticmethod
    def forward(x: Tensor, k: int, tau: float) -> Tensor:
        return log_ek_op(x, k, tau)

    @staticmethod
    def backward(ctx, g: Tensor):
        (x,) = ctx.saved_tensors
        return g * _apply_gradtopk(x, ctx.k, ctx.tau), None, None


class _LogEkJvp(LogEkFunction):
    @staticmethod
    def jvp(ctx, v, *_):
        (x,) = ctx.saved_tensors
        return (_apply_gradtopk(x, ctx.k, ctx.tau) * v).sum(-1, keepdim=True)


def gradtopk(x: Tensor, k: int, dim: int, tau: float) -> Tensor:
    """Launcher for ``soft_topk(method="grad")`` (arguments already validated)."""
    if x.numel() == 0:
        return x * 0
    return _apply_gradtopk(x.movedim(dim, -1), k, tau).movedim(-1, dim)


def log_ek(x: Tensor, k: int, dim: int, tau: float, keepdim: bool = False) -> Tensor:
    """τ·log e_k(exp(x/τ)) along ``dim`` (arguments already validated)."""
    fn = LogEkFunction if torch.compiler.is_compiling() else _LogEkJvp
    out = fn.apply(x.movedim(dim, -1), k, tau).movedim(-1, dim)
    return out if keepdim else out.squeeze(dim)
