r"""Maps onto the probability simplex (k = 1): softmax, sparsemax, entmax.

All of them solve the regularised argmax

.. math:: p = \arg\max_{p \in \Delta} \langle z, p\rangle - \Omega(p), \qquad z = x/\tau,

and have the threshold form p_i = f(z_i − λ), Σp = 1 (see :mod:`softk.threshold`).
Every function here takes any shape and ``dim``, float64/32/16/bfloat16 input
(half precision is computed in float32 and returned in the input dtype), and
follows the row conventions of :mod:`softk.threshold.rows`: ``-inf`` entries
are removed, a fully masked row gives zeros (log-probabilities ``-inf``) with a
zero gradient, a NaN stays in its row.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import _dtensor

from .._backends import dispatch
from .._ops import lean as _lean
from .._validate import check_alpha, check_dim, check_input, check_tau
from ..threshold import ENTMAX15, SOFTMAX, SPARSEMAX
from ..threshold.families import entmax_by_alpha
from .._ops.entmax_alpha import entmax_alpha
from .._ops.op import threshold_map
from ..threshold.rows import compute_dtype, empty_like_result
from .._ops.softmax_triton import log_softmax_rows, logsumexp_rows


def _prepare(x, dim, tau):
    check_input(x)
    return check_dim(x, dim), check_tau(tau, allow_grad=True)


def _log_normaliser(x: Tensor, dim: int, tau):
    """(s, m, lse, empty): s = (x − m)/τ with m the finite row max (so x/τ
    never overflows), lse = logsumexp(s), and the fully masked rows, whose s
    is replaced by zeros so that neither lse nor its gradient is NaN there.
    Plain tensor code (no data-dependent branch), so vmap, compile and double
    backward see ordinary ops."""
    z = x.to(compute_dtype(x.dtype))
    m = z.detach().amax(dim, keepdim=True)
    empty = m == float("-inf")
    # a row holding NaN or +inf is NaN (the row convention), its gradient too:
    # NaN is added, so the gradient flows into the NaN it meets
    broken = torch.where((m != m) | (m == float("inf")), float("nan"), 0.0)
    m = torch.where(torch.isfinite(m), m, 0.0)
    s = torch.where(empty, 0.0, (z - m) / tau + broken)
    return s, m, torch.logsumexp(s, dim, keepdim=True), empty


# The fast path of log_softmax/logsumexp: torch's own fused ops, which shift
# by the row max themselves (so τ = 1 needs no shift of ours), with one check
# that every row was ordinary.  A row that is fully masked, or holds NaN or
# +inf, follows softk's row conventions, which torch's ops do not (they give
# NaN, or a NaN gradient): such calls take the general tensor code above.
# Eager CPU calls only: the check reads a value (a data-dependent branch that
# vmap and compile cannot take, and a host sync on a device).
def _eager_cpu(x: Tensor, tau) -> bool:
    return not isinstance(tau, Tensor) and x.is_cpu and _lean.eager(x)


def _shifted(x: Tensor, dim: int, tau: float):
    """(z, m): z = x − m (m the row max, τ = 1: None, no shift needed) over τ,
    in the compute dtype; None where a row max is not finite."""
    ct = compute_dtype(x.dtype)
    if tau == 1.0:
        return (x if x.dtype == ct else x.to(ct)), None
    m = x.detach().amax(dim, keepdim=True).to(ct)
    if not bool(torch.isfinite(m).all()):
        return None
    return (x.to(ct) - m) / tau, m


def _torch_log_softmax(x: Tensor, dim: int, tau: float):
    zm = _shifted(x, dim, tau)
    if zm is None:
        return None
    y = torch.log_softmax(zm[0], dim)
    if math.isnan(y.detach().amax().item()):  # NaN iff some row is not ordinary
        return None
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _torch_logsumexp(x: Tensor, dim: int, tau: float, keepdim: bool):
    zm = _shifted(x, dim, tau)
    if zm is None:
        return None
    z, m = zm
    out = torch.logsumexp(z, dim, keepdim=True)
    if not bool(torch.isfinite(out.detach()).all()):
        return None
    if m is not None:
        out = m + out * tau
    if not keepdim:
        out = out.squeeze(dim)
    return out if out.dtype == x.dtype else out.to(x.dtype)


@_dtensor.entry("map", "softmax")
def softmax(x: Tensor, dim: int = -1, tau: float = 1.0) -> Tensor:
    r"""Softmax with temperature: :math:`p_i = e^{x_i/\tau} / \sum_j e^{x_j/\tau}`.

    The maximiser of ⟨z, p⟩ + H(p) over the simplex (Shannon entropy H); the
    threshold map with f(u) = e^u and λ = logsumexp(z).  Large τ flattens it,
    τ → 0 tends to the one-hot argmax.

    Args:
        x: scores, any shape, floating point.
        dim: the dimension that sums to 1.
        tau: temperature > 0.

    Returns:
        A tensor shaped like ``x`` in ``x.dtype``.  A row whose entries are all
        ``-inf`` gives zeros (``torch.softmax`` gives NaN).  On the "triton"
        backend (CUDA tensors) the forward is one dedicated kernel that reads
        each row once, up to 16,384 entries.

    Example:

    >>> import torch, softk
    >>> softk.softmax(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    tensor([0.0321, 0.0871, 0.2369, 0.6439])
    """
    dim, tau = _prepare(x, dim, tau)
    return threshold_map(x, SOFTMAX, 1, dim, tau)


@_dtensor.entry("map", "log_softmax")
def log_softmax(x: Tensor, dim: int = -1, tau: float = 1.0) -> Tensor:
    r"""``log(softmax(x, dim, tau))`` computed stably: :math:`z_i - \operatorname{logsumexp}(z)`.

    A fully masked row gives ``-inf`` everywhere with a zero gradient.  Where
    the backend is "triton" (CUDA tensors under "auto") one Triton kernel
    reads each row once (twice above 16,384 entries) and writes log p.

    >>> import torch, softk
    >>> softk.log_softmax(torch.tensor([0.0, 0.0]))
    tensor([-0.6931, -0.6931])
    """
    dim, tau = _prepare(x, dim, tau)
    if x.numel() == 0:
        return empty_like_result(x)
    if dispatch.log_softmax_backend(x, tau) == "triton":
        return log_softmax_rows(x.movedim(dim, -1), tau).movedim(-1, dim)
    if _eager_cpu(x, tau):
        y = _torch_log_softmax(x, dim, tau)
        if y is not None:
            return y
    s, _, lse, empty = _log_normaliser(x, dim, tau)
    return torch.where(empty, float("-inf"), s - lse).to(x.dtype)


def logsumexp(x: Tensor, dim: int = -1, tau: float = 1.0, keepdim: bool = False) -> Tensor:
    r"""The smooth maximum :math:`\tau \log \sum_i e^{x_i/\tau}`.

    Tends to ``max(x)`` as τ → 0 and its gradient is ``softmax(x, dim, tau)``.
    A fully masked row gives ``-inf`` with a zero gradient.  Where the backend
    is "triton" one Triton kernel computes it (and its gradient g·p).

    >>> import torch, softk
    >>> round(softk.logsumexp(torch.tensor([1.0, 2.0, 3.0, 4.0])).item(), 4)
    4.4402
    """
    dim, tau = _prepare(x, dim, tau)
    if x.numel() == 0:  # the log of an empty sum is -inf; an empty batch stays empty
        return torch.logsumexp(x, dim, keepdim=keepdim)
    if dispatch.log_softmax_backend(x, tau) == "triton":
        out = logsumexp_rows(x.movedim(dim, -1), tau)
        return out.unsqueeze(dim) if keepdim else out
    if _eager_cpu(x, tau):
        out = _torch_logsumexp(x, dim, tau, keepdim)
        if out is not None:
            return out
    _, m, lse, empty = _log_normaliser(x, dim, tau)
    out = torch.where(empty, float("-inf"), m + lse * tau)
    if not keepdim:
        out = out.squeeze(dim)
    return out.to(x.dtype)


@_dtensor.entry("map", "sparsemax")
def sparsemax(x: Tensor, dim: int = -1, tau: float = 1.0) -> Tensor:
    r"""Sparsemax (Martins & Astudillo, 2016): the Euclidean projection of x/τ onto the simplex.

    .. math:: p = \arg\min_{p\in\Delta} \|p - x/\tau\|^2, \qquad p_i = [z_i - \lambda]_+,

    with z = x/τ and λ exact, :math:`\lambda = (\sum_{i\in S} z_i - 1)/|S|` on the
    support S.  Entries below λ get exactly zero.  Equals α-entmax with α = 2
    and ``soft_topk(x, 1, method="sparse")``.

    How S is found depends on the backend.  The compiled CPU kernels and the
    Triton kernels do not sort the row: the CPU kernels take a lower bound on
    λ from the row's block maxima and iterate on the few entries above it;
    the Triton kernels iterate
    :math:`\lambda \leftarrow (\sum_{z_i>\lambda} z_i - 1)/\#\{i : z_i > \lambda\}`
    from max(z) − 1, one pass over the row per step, until the support stops
    changing.  The PyTorch path sorts: with :math:`z_{(1)} \ge z_{(2)} \ge \dots`
    the sorted row, S is its j largest entries for the largest j with
    :math:`z_{(j)} > (\sum_{i\le j} z_{(i)} - 1)/j`, read off the cumulative
    sums (Martins & Astudillo's rule); on rows of 64 entries or more it sorts
    only the entries above the lower bound from the block maxima.

    >>> import torch, softk
    >>> softk.sparsemax(torch.tensor([0.1, 1.0, 1.5]))
    tensor([0.0000, 0.2500, 0.7500])
    """
    dim, tau = _prepare(x, dim, tau)
    return threshold_map(x, SPARSEMAX, 1, dim, tau)


@_dtensor.entry("map", "entmax15")
def entmax15(x: Tensor, dim: int = -1, tau: float = 1.0) -> Tensor:
    r"""1.5-entmax (Peters, Niculae & Martins, 2019), exactly.

    .. math:: p = \arg\max_{p\in\Delta} \langle z,p\rangle + \tfrac{4}{3}\bigl(1-\textstyle\sum_i p_i^{3/2}\bigr),
              \qquad p_i = \bigl[(z_i-\lambda)/2\bigr]_+^2,

    λ from the closed form of the quadratic Σ_S (z_i − λ)² = 4 on the support S.
    Sparse like sparsemax but smoother (its Jacobian is continuous).

    >>> import torch, softk
    >>> softk.entmax15(torch.tensor([0.0, 1.0, 2.0]))
    tensor([0.0000, 0.1693, 0.8307])
    """
    dim, tau = _prepare(x, dim, tau)
    return threshold_map(x, ENTMAX15, 1, dim, tau)


@_dtensor.entry("map", "entmax")
def entmax(x: Tensor, alpha=1.5, dim: int = -1, tau: float = 1.0) -> Tensor:
    r"""α-entmax (Peters, Niculae & Martins, 2019): Tsallis-regularised argmax.

    .. math:: p = \arg\max_{p\in\Delta} \langle z,p\rangle + \frac{1 - \sum_i p_i^\alpha}{\alpha(\alpha-1)},
              \qquad p_i = [(\alpha-1)(z_i-\lambda)]_+^{1/(\alpha-1)}.

    α = 1 is softmax, α = 1.5 is :func:`entmax15`, α = 2 is :func:`sparsemax`
    (those three use their exact closed forms).  Other α: λ by safeguarded
    Newton, and p from the anchor form of :mod:`softk.threshold.entmax_anchor`
    (differences of entries, logs and softplus), so p is at the working
    precision for every α: α → 1⁺ tends continuously to softmax, and a large α
    keeps its small support entries.  There is no ceiling on α: a huge α
    (1e10, 1e300) gives the argmax limit (uniform on ties); α = inf itself is
    refused (use ``softk.hard_topk(x, 1)``).

    α < 1 is refused.  The maths does define a map for 0 < α < 1 (the Tsallis
    entropy is still concave): p_i = [(1−α)(λ − z_i)]^{−1/(1−α)} with λ > max z,
    dense and with polynomial tails, never sparse.  It is not offered here:
    it is neither sparse like entmax nor softmax, and nothing in the seeds or
    the entmax package (which also requires α > 1) asks for it.

    Args:
        x: scores, any shape.
        alpha: a float >= 1, or a floating tensor >= 1 broadcastable to ``x``
            with size 1 along ``dim`` (one α per row).  A tensor α that requires
            grad receives a gradient (see :mod:`softk.threshold.entmax_alpha`).
        dim: the dimension that sums to 1.
        tau: temperature > 0.

    >>> import torch, softk
    >>> x = torch.tensor([0.0, 1.0, 2.0])
    >>> torch.allclose(softk.entmax(x, alpha=2.0), softk.sparsemax(x))
    True
    >>> p = softk.entmax(x, alpha=1.25)
    >>> round(p.sum().item(), 6), bool((p > 0).all())
    (1.0, True)
    """
    dim, tau = _prepare(x, dim, tau)
    alpha = check_alpha(alpha, x, dim)
    if isinstance(alpha, Tensor):
        if x.numel() == 0:
            return x * 0
        if isinstance(tau, Tensor):
            x, tau = x / tau.to(x.dtype), 1.0
        out = entmax_alpha(x.movedim(dim, -1), alpha, tau)
        return out.movedim(-1, dim)
    return threshold_map(x, entmax_by_alpha(alpha), 1, dim, tau)
