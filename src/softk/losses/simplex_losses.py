r"""Fenchel–Young losses of the k = 1 maps: softmax, sparsemax, entmax.

Each is :func:`~softk.losses.fenchel_young.fenchel_young_loss` with the map's
family, so L(x; y) = Φ(x/τ) + Ω(y) − ⟨x/τ, y⟩ ≥ 0, zero exactly when the map
outputs y, with gradient (p − y)/τ.  With a one-hot target e_t:

* softmax:   L = logsumexp(z) − z_t, the cross-entropy;
* sparsemax: L = ⟨z, p⟩ − ½‖p‖² − z_t + ½, Martins & Astudillo (2016)'s
  sparsemax loss (ICML 2016, "From softmax to sparsemax");
* entmax:    Peters, Niculae & Martins (2019), "Sparse sequence-to-sequence models".

On the CPU's compiled kernels and on Triton each of these takes the fused
loss kernel (one pass per row writes L and its gradient, see
:mod:`softk._ops.fused_loss`); see :func:`fenchel_young_loss` for what falls
back to the unfused path.

Targets: class indices, or a float tensor shaped like ``input`` whose rows are
probability distributions.  Multi-label targets must be normalised by the
caller, ``y / y.sum(1, keepdim=True)`` (Martins & Astudillo's multi-label
sparsemax loss uses exactly y/|y|); rows that do not sum to 1 are refused.
"""

from __future__ import annotations

from torch import Tensor

from .. import _dtensor

from ..threshold.families import ENTMAX15, SOFTMAX, SPARSEMAX, entmax_by_alpha, entmax_family
from .._validate import check_alpha
from .fenchel_young import fenchel_young_loss

_ARGS = """
    Args:
        input: scores (N, C, d1, ...) with classes on dim 1, or (C,).
        target: class indices (integer tensor shaped like ``input`` without
            dim 1) or a float tensor shaped like ``input`` whose rows along dim 1
            are probability distributions (>= 0, summing to 1).
        ignore_index: class index whose rows give 0 and are left out of "mean"
            (class-index targets only, as in torch).
        reduction: "mean", "sum" or "none".
        tau: temperature > 0; the loss is evaluated at ``input / tau``.
"""


@_dtensor.entry("loss", "softmax_loss")
def softmax_loss(input: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean", tau: float = 1.0) -> Tensor:
    r"""Fenchel–Young loss of softmax: :math:`\operatorname{lse}(z) - \langle z, y\rangle + \sum_i y_i\log y_i`.

    Equal to ``KL(y ‖ softmax(z))`` and, for one-hot y, to the cross-entropy
    (use :func:`cross_entropy` for torch's exact arguments: class weights,
    label smoothing).  For any other y it is the cross-entropy minus the
    entropy H(y).

    Masked scores differ from :func:`cross_entropy`: on
    ``x = [[0, -inf, 1.]]`` with ``y = [[.5, 0, .5]]`` this loss is
    KL(y ‖ p) = ½ log(½/p₁) + ½ log(½/p₃) = 0.1201 (p = softmax(x) =
    [0.2689, 0, 0.7311]), because the Fenchel–Young loss only involves
    classes with y_c > 0 (the terms y_c·z_c and y_c log y_c are 0 where
    y_c = 0, even when z_c = −inf), while ``cross_entropy`` and
    ``torch.nn.functional.cross_entropy`` form 0·log p_c = 0·(−inf) = NaN.
    A target with mass on a masked class gives +inf in both.
    {args}
    >>> import torch
    >>> round(softmax_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([1])).item(), 6)  # log 2
    0.693147
    >>> x, y = torch.tensor([[0.0, -float("inf"), 1.0]]), torch.tensor([[0.5, 0.0, 0.5]])
    >>> round(softmax_loss(x, y).item(), 4)  # cross_entropy(x, y) is NaN, as in torch
    0.1201
    """
    return fenchel_young_loss(input, target, SOFTMAX, 1, ignore_index, reduction, tau)


@_dtensor.entry("loss", "sparsemax_loss")
def sparsemax_loss(input: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean", tau: float = 1.0) -> Tensor:
    r"""Sparsemax loss (Martins & Astudillo, 2016):
    :math:`\langle z, p\rangle - \tfrac12\|p\|^2 + \tfrac12\|y\|^2 - \langle z, y\rangle`, p = sparsemax(z).

    Zero as soon as sparsemax puts all its mass on the target, i.e. once the
    target score leads the runner-up by a margin of 1 (for a one-hot target).
    {args}
    >>> import torch
    >>> sparsemax_loss(torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([2]))
    tensor(0.)
    >>> sparsemax_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
    tensor(0.2500)
    """
    return fenchel_young_loss(input, target, SPARSEMAX, 1, ignore_index, reduction, tau)


@_dtensor.entry("loss", "entmax15_loss")
def entmax15_loss(input: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean", tau: float = 1.0) -> Tensor:
    r"""1.5-entmax loss: :math:`\Phi(z) + \tfrac43\sum_i y_i^{3/2} - \langle z, y\rangle`, Φ the potential of entmax15.

    Example by hand: z = (0, 0) gives p = (½, ½), :math:`\Phi = -\tfrac43 \cdot 2 \cdot (\tfrac12)^{3/2}`,
    :math:`\Omega(e_0) = \tfrac43`, so :math:`L = \tfrac43 - \tfrac23\sqrt2 \approx 0.3905`.
    {args}
    >>> import torch
    >>> entmax15_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
    tensor(0.3905)
    """
    return fenchel_young_loss(input, target, ENTMAX15, 1, ignore_index, reduction, tau)


@_dtensor.entry("loss", "entmax_loss")
def entmax_loss(
    input: Tensor, target: Tensor, alpha: float = 1.5, ignore_index: int = -100, reduction: str = "mean", tau: float = 1.0
) -> Tensor:
    r"""α-entmax loss, :math:`\Omega(y) = \sum_i y_i^\alpha / (\alpha(\alpha-1))` (Tsallis); α = 1 is :func:`softmax_loss`,
    1.5 :func:`entmax15_loss`, 2 :func:`sparsemax_loss` (those use their exact maps).

    ``alpha`` is a float >= 1, or a tensor of one α per row (broadcastable to
    ``input`` with size 1 along the class dim 1), which may require grad: then
    ∂L/∂α = ∂Ω_α(y)/∂α − ∂Ω_α(p)/∂α (the envelope theorem), so α can be
    learnt with the loss (it runs on the PyTorch path).  Other α solve the map by safeguarded Newton to
    the working precision.  On the CPU's compiled kernels a float 1.125 ≤ α ≤ 2 takes the fused
    loss kernel (one pass per row writes the loss and its gradient); α nearer 1 (whose λ ≈
    −1/(α − 1) would leave the fused loss eps/(α − 1) of its value), α > 2 and a tensor α take
    the unfused path.
    {args}
    >>> import torch
    >>> x, t = torch.tensor([[0.0, 0.5, 2.0]]), torch.tensor([1])
    >>> bool(entmax_loss(x, t, alpha=2.0) == sparsemax_loss(x, t))
    True
    """
    if isinstance(alpha, Tensor) and isinstance(input, Tensor) and input.dim() > 0:
        # one α per row (learnable): broadcast like entmax's, rows along the class dim
        cdim = 1 if input.dim() > 1 else 0
        alpha = check_alpha(alpha, input, cdim)
        return fenchel_young_loss(input, target, entmax_family(alpha),
                                  1, ignore_index, reduction, tau)
    family = entmax_by_alpha(check_alpha(alpha, None, -1))
    return fenchel_young_loss(input, target, family, 1, ignore_index, reduction, tau)


for _fn in (softmax_loss, sparsemax_loss, entmax15_loss, entmax_loss):
    _fn.__doc__ = _fn.__doc__.replace("{args}", _ARGS)
