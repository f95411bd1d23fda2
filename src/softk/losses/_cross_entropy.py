r"""Cross-entropy with exactly torch's semantics, plus a temperature.

.. math:: \ell = -\sum_c w_c\, q_c \log \operatorname{softmax}(x/\tau)_c,
          \qquad q = (1-\varepsilon)\,y + \varepsilon/C,

with y the one-hot of the class index (or the given distribution), ε the label
smoothing and w the class weights; "mean" divides by Σ w_{t_i} over the
non-ignored rows.  The arithmetic *is* ``torch.nn.functional.cross_entropy``
(fused log-softmax + NLL, the numerically stable form the softmax seed
derives), called after softk's argument checks, so results are identical to
torch; ``tau`` divides the scores first (gradient (p − y)/τ).

Differences from torch, all refusals of input torch accepts silently or
with a terse message: ``target``'s shape is checked before any arithmetic; a
class index out of range is found by torch's own kernel (no extra pass over
the target) and reported with softk's message (on CUDA it is torch's device
assertion, see :mod:`softk.losses.targets`); a probability target must be a
distribution (>= 0, rows summing to 1); and
``ignore_index`` may not be set together with a probability target (torch
ignores it there).  Half-precision input is computed in float32 and the result
returned in the input dtype; with class indices (no class weights, no label
smoothing) on a backend whose fused softmax loss kernel reads half input as
it is (Triton), that kernel computes the loss and its gradient in one pass,
with no float32 copy of the logits.  That kernel divides by τ after
shifting each row by its maximum, so where x/τ overflows float32 (a
bfloat16 score near its largest value over a small τ) it gives the finite
loss where torch's arithmetic, and softk's other routes, give inf − inf =
NaN.  A row whose scores are all ``-inf`` gives NaN, as in torch (it has no
distribution to score).

Masked scores (``-inf``) with a probability target: the formula sums
q_c·log p_c over *every* class, and a masked class has log p_c = −inf, so a
zero target weight there gives 0·(−inf) = NaN, exactly as in torch:
``cross_entropy([[0, -inf, 1.]], [[.5, 0, .5]])`` is NaN.  Label smoothing
puts ε/C > 0 on the masked class, so the loss is +inf.  A class-index target
only reads log p_t and stays finite unless t itself is masked (+inf).
:func:`softk.losses.softmax_loss` on the same input is finite (0.1201): it is
the Fenchel–Young loss, which sums only over the classes the target weights
(0·log 0 = 0 and masked classes with y_c = 0 drop out), and for a
non-one-hot target it is KL(y ‖ p) = cross-entropy − H(y), not the
cross-entropy itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _dtensor
from .._backends import dispatch
from .._ops.fused_loss import fused_fenchel_young
from ..threshold.families import SOFTMAX


from .._validate import check_smoothing, require
from . import targets as tg
from ._one_pass import exp_

# The kernel under F.cross_entropy (its Python wrapper only maps the reduction
# to this enum).  The binding itself honours __torch_function__ and modes.
_cross_entropy_loss = torch._C._nn.cross_entropy_loss
_REDUCTION_ENUM = {"none": 0, "mean": 1, "sum": 2}
_FLOAT = (torch.float32, torch.float64)


def _check_weight(weight, n_classes: int, device) -> Tensor:
    if not isinstance(weight, Tensor):
        raise TypeError(f"weight must be a 1-D floating tensor of {n_classes} class weights, got {type(weight).__name__}")
    if not weight.is_floating_point() or weight.shape != (n_classes,):
        raise ValueError(
            f"weight must be a 1-D floating tensor of shape ({n_classes},) (one weight per class), "
            f"got dtype {weight.dtype} and shape {tuple(weight.shape)}"
        )
    weight = weight.to(device)
    require(torch.isfinite(weight), "weight must be finite")  # off the CPU: a device assertion
    return weight


@_dtensor.entry("loss", "cross_entropy")
def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight=None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    tau: float = 1.0,
) -> Tensor:
    r"""``torch.nn.functional.cross_entropy(input / tau, ...)`` with checked arguments.

    Args:
        input: scores (N, C, d1, ...) with classes on dim 1, or (C,).
        target: class indices (integer, ``input``'s shape without dim 1) or a
            float tensor shaped like ``input`` whose rows are distributions.
        weight: optional (C,) class weights.
        ignore_index: class index whose rows give 0 and are left out of "mean"
            (class-index targets only).
        reduction: "mean", "sum" or "none".
        label_smoothing: ε in [0, 1], mixing the target with the uniform 1/C.
        tau: temperature > 0.

    The arithmetic is ``torch.nn.functional.cross_entropy``'s (label smoothing
    mixes the target with the uniform 1/C), after checks that refuse, with
    softk's messages, inputs torch accepts silently or with a terse message: a
    ``target`` of the wrong shape, a probability target that is not a
    distribution, and ``ignore_index`` set together with a probability target.  The Fenchel–Young view: for one-hot targets this is
    :func:`softmax_loss`.  With ``-inf`` (masked) scores and a probability
    target the result is NaN, as in torch (0·log 0 at the masked class), where
    :func:`softmax_loss` stays finite.

    >>> import torch
    >>> x, y = torch.tensor([[0.0, -float("inf"), 1.0]]), torch.tensor([[0.5, 0.0, 0.5]])
    >>> cross_entropy(x, y), torch.nn.functional.cross_entropy(x, y)
    (tensor(nan), tensor(nan))
    >>> round(cross_entropy(torch.tensor([[0.0, 0.0, 0.0]]), torch.tensor([2])).item(), 6)  # log 3
    1.098612
    >>> round(cross_entropy(torch.tensor([[2.0, 0.0]]), torch.tensor([0]), tau=2.0).item(), 6)  # log(1 + 1/e)
    0.313262
    """
    if (weight is None and type(input) is Tensor and type(target) is Tensor and type(tau) is float
            and tau == 1.0 and type(label_smoothing) is float and label_smoothing == 0.0
            and type(ignore_index) is int and input.dtype in _FLOAT and target.dtype is torch.int64
            and input.is_cpu and target.is_cpu and reduction in _REDUCTION_ENUM):
        shape, tshape = input.shape, target.shape
        if len(shape) == 2 and len(tshape) == 1 and tshape[0] == shape[0] and shape[1]:
            # The common call, (N, C) scores and (N,) indices: every check below
            # passes, and torch's kernel is called as F.cross_entropy calls it.
            try:
                # the binding takes the reduction's enum, as F.cross_entropy gives it (its stub says str)
                return _cross_entropy_loss(input, target, None, _REDUCTION_ENUM[reduction], ignore_index, 0.0)  # type: ignore[arg-type]
            except (IndexError, RuntimeError):
                tg.index_target(input, target, ignore_index)  # softk's message for an index out of range
                raise
    tau, reduction, ignore_index = tg.check_loss_args(input, target, tau, reduction, ignore_index)
    if type(label_smoothing) is not float or not 0.0 <= label_smoothing <= 1.0:
        label_smoothing = check_smoothing(label_smoothing)
    shape, dtype = input.shape, input.dtype
    cdim = 0 if len(shape) == 1 else 1
    n_classes = shape[cdim]
    if n_classes == 0:
        raise ValueError(f"input must have at least one class along dim {cdim}, got shape {tuple(shape)}")
    ct = dtype if dtype == torch.float32 or dtype == torch.float64 else torch.float32  # the compute dtype
    if weight is not None:
        weight = _check_weight(weight, n_classes, input.device).to(ct)
    by_index = not target.is_floating_point()
    if by_index:
        # The range of the class indices is checked by torch's own kernel
        # (a device assertion on CUDA, an IndexError on the CPU, which is
        # turned into softk's message below): no extra pass over the target.
        tshape = target.shape
        if not (len(shape) == 2 and len(tshape) == 1 and tshape[0] == shape[0]):  # else (N, C) and (N,)
            tg.check_index_shape(input, target)
        if not (target.is_cpu and input.is_cpu) and target.device != input.device:
            target = target.to(input.device)
        if target.dtype != torch.int64:
            target = target.long()
    else:
        if ignore_index != -100:
            raise ValueError(
                "ignore_index applies to class-index targets only; torch ignores it for "
                "probability targets, softk refuses it rather than drop it silently"
            )
        target = tg.distribution_target(input, target, 1, capped=False)
        if target.dtype != ct:
            target = target.to(ct)
    if by_index and dtype != ct and weight is None and label_smoothing == 0.0:
        out = _fused_half(input, target, cdim, tau, reduction, ignore_index)
        if out is not None:
            return out
    x = input if dtype == ct else input.to(ct)
    if tau != 1.0:
        x = x / tau
    try:
        out = F.cross_entropy(
            x, target, weight=weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
        )
    except (IndexError, RuntimeError):
        if by_index:
            tg.index_target(input, target, ignore_index)  # softk's message for an index out of range
        raise
    return out if dtype == ct else out.to(dtype)


def _fused_half(input: Tensor, target: Tensor, cdim: int, tau: float, reduction: str, ignore_index: int):
    """Half-precision scores with class indices, where the fused softmax
    loss kernel reads them as they are (its module says ``CROSS_ENTROPY``:
    Triton): the loss and its gradient in one kernel, in float32 registers,
    with cross-entropy's rows, and no float32 copy of the logits (the tensor
    path's ``input.to(float32)``, 4 bytes an entry beside the input's 2, then
    log-softmax's output and its backward's).  For one-hot targets the
    softmax Fenchel–Young loss is cross-entropy: lse(x/τ) − x_t/τ, gradient
    (softmax(x/τ) − e_t)/τ.  None where no such kernel serves."""
    x = input if cdim == input.dim() - 1 else input.movedim(cdim, -1)
    kernel = dispatch.pick("fenchel_young", x, SOFTMAX, 1)
    if kernel is None or not kernel.impl.CROSS_ENTROPY:
        return None
    return fused_fenchel_young(x, target, SOFTMAX, 1, tau, reduction, ignore_index, kernel.backend,
                               lambda: tg.check_index_values(input, target, ignore_index), ce_rows=True)


def ce_in_place(ignore_index: int, tau: float):
    """Cross-entropy's rows and its gradient in one pass over the logits:
    ``f(z, t, w) -> rows`` overwrites z (C, V), float32/float64, with
    G = w·(softmax(z/τ) − e_t)/τ (0 on ignored rows), the gradient of Σ w_i L_i,
    where L_i = logsumexp(z_i/τ) − z_{i,t_i}/τ: no autograd graph and no
    buffer beside the logits."""

    def f(z, t, w):
        idx, keep = tg.index_target(z, t, ignore_index)  # the losses' own range check and message
        idx = idx.unsqueeze(1)
        if tau != 1.0:
            z.mul_(1.0 / tau)
        torch.log_softmax(z, 1, out=z)  # one fused kernel, in place (logsumexp is several)
        rows = torch.where(keep, -z.gather(1, idx).squeeze(1), 0.0)
        exp_(z)  # (underflowing terms exact zeros first, on the CPU)
        z.scatter_add_(1, idx, torch.full_like(rows, -1.0).unsqueeze(1))
        scale = (w.to(z.dtype) if w is not None else torch.ones_like(rows)) / tau
        z.mul_(torch.where(keep, scale, 0.0).unsqueeze(1))
        if not z.is_cpu or not bool(keep.all()):  # (no host read on a GPU)
            z.masked_fill_(~keep.unsqueeze(1), 0.0)  # a fully masked ignored row: NaN · 0 above
        return rows

    return f
