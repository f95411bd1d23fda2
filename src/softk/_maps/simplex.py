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

from torch import Tensor

from .. import _dtensor

from .._validate import check_alpha, check_dim, check_input, check_tau
from ..threshold import ENTMAX15, SOFTMAX, SPARSEMAX
from ..threshold.families import entmax_by_alpha
from ..threshold.rows import over_tau
from .._ops.entmax_alpha import entmax_alpha
from .._ops.op import threshold_map
from .._ops.log_softmax import log_softmax as log_softmax_op, logsumexp as logsumexp_op


def _prepare(x, dim, tau):
    check_input(x)
    return check_dim(x, dim), check_tau(tau, allow_grad=True, x=x)


@_dtensor.entry("map", "softmax")
def softmax(x: Tensor, dim: int = -1, tau: float = 1.0) -> Tensor:
    r"""Softmax with temperature: :math:`p_i = e^{x_i/\tau} / \sum_j e^{x_j/\tau}`.

    The maximiser of :math:`\langle z, p\rangle + H(p)` over the simplex
    (Shannon entropy :math:`H`); the threshold map with :math:`f(u) = e^u` and
    :math:`\lambda = \operatorname{logsumexp}(z)`.  Large τ flattens it, τ → 0
    tends to the one-hot argmax.

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
    return log_softmax_op(x, dim, tau)


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
    return logsumexp_op(x, dim, tau, keepdim)


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

    λ from the closed form of the quadratic :math:`\sum_{i\in S} (z_i - \lambda)^2 = 4`
    on the support :math:`S`.
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
    entropy is still concave): :math:`p_i = [(1-\alpha)(\lambda - z_i)]^{-1/(1-\alpha)}`
    with :math:`\lambda > \max_i z_i`,
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
        z, t = (over_tau(x, tau, dim), 1.0) if isinstance(tau, Tensor) else (x, tau)
        return entmax_alpha(z.movedim(dim, -1), alpha, t).movedim(-1, dim).to(x.dtype)
    return threshold_map(x, entmax_by_alpha(alpha), 1, dim, tau)
