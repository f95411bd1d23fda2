"""``FusedLinearLoss``: an output layer and its loss in one module, never holding N×V logits."""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from ..losses._options import loss_options
from ..losses._registry import DEFAULT_LOSS, LOSSES
from ..losses.fused_linear import fused_linear_loss


class FusedLinearLoss(nn.Module):
    r"""``nn.Linear(in_features, num_classes, bias)`` followed by a softk loss, fused.

    The default loss is "cross_entropy", as for torch's
    ``F.linear_cross_entropy`` and Liger-Kernel's fused linear cross-entropy.
    ``forward(input (..., in_features), target)`` returns
    :func:`softk.losses.fused_linear_loss` ``(input, self.weight, target, loss, self.bias, ...)``,
    so the (N, num_classes) logits are only ever held a chunk of rows at a
    time.  Parameters are initialised as in ``nn.Linear`` (uniform in
    ±1/√in_features); the weight is (num_classes, in_features), so a trained
    ``nn.Linear``'s state dict loads into it.  For inference, ``logits(input)``
    is the plain linear layer.  The knobs ``softcap``, ``label_smoothing``,
    ``class_weight`` (a non-persistent buffer), ``z_loss`` and TS²'s ``suppression``
    and ``adaptive`` are :func:`~softk.losses.fused_linear_loss`'s, checked at
    construction.

    >>> import torch
    >>> head = FusedLinearLoss(8, 100, loss="entmax15")
    >>> x, t = torch.randn(5, 8), torch.randint(0, 100, (5,))
    >>> loss = head(x, t)
    >>> loss.backward()
    >>> head.weight.grad.shape
    torch.Size([100, 8])
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        loss: str = DEFAULT_LOSS,
        bias: bool = True,
        *,
        alpha=None,
        k: int = 1,
        method: str = "exp",
        tau: float = 1.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        chunk_size=None,
        softcap=None, label_smoothing: float = 0.0, class_weight=None, z_loss: float = 0.0,  # the knobs
        suppression=None, adaptive: bool = False,  # TS²'s
        device=None,
        dtype=None,
    ):
        super().__init__()
        for name, v in (("in_features", in_features), ("num_classes", num_classes)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        o = loss_options(loss, alpha=alpha, k=k, method=method, tau=tau, ignore_index=ignore_index,
                         reduction=reduction, chunk_size=chunk_size, softcap=softcap,
                         label_smoothing=label_smoothing, class_weight=class_weight, z_loss=z_loss,
                         suppression=suppression, adaptive=adaptive, vocab=int(num_classes), device=device)
        if isinstance(o.k, numbers.Real) and o.k > num_classes:  # (the call would refuse it; say so here)
            raise ValueError(f"k must be at most num_classes = {num_classes}, got {o.k}")
        self.in_features, self.num_classes = int(in_features), int(num_classes)
        self.loss, self.alpha, self.k, self.method = o.loss, o.alpha, o.k, o.method
        self.suppression, self.adaptive = o.suppression, o.adaptive
        self.tau, self.ignore_index, self.reduction, self.chunk_size = o.tau, o.ignore_index, o.reduction, o.chunk_size
        self.softcap, self.label_smoothing, self.z_loss = o.softcap, o.label_smoothing, o.z_loss
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(num_classes, in_features, **kw))
        self.bias = nn.Parameter(torch.empty(num_classes, **kw)) if bias else None
        # a buffer: it follows the module to its device (not in the state dict, which stays nn.Linear's)
        self.register_buffer("class_weight", o.class_weight, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def logits(self, input: torch.Tensor) -> torch.Tensor:
        """The full logits ``input @ weight.T + bias`` (for inference; this does hold N×V)."""
        return nn.functional.linear(input, self.weight, self.bias)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return fused_linear_loss(
            input, self.weight, target, self.loss, self.bias,
            alpha=self.alpha, k=self.k, method=self.method, tau=self.tau,
            ignore_index=self.ignore_index, reduction=self.reduction, chunk_size=self.chunk_size,
            softcap=self.softcap, label_smoothing=self.label_smoothing, class_weight=self.class_weight,
            z_loss=self.z_loss, suppression=self.suppression, adaptive=self.adaptive,
        )

    def extra_repr(self) -> str:
        extra = "".join(f", {name}={getattr(self, name)!r}" for name in LOSSES[self.loss].options)
        extra += f", softcap={self.softcap}" if self.softcap is not None else ""
        extra += f", label_smoothing={self.label_smoothing}" if self.label_smoothing else ""
        extra += ", class_weight=(...)" if self.class_weight is not None else ""
        extra += f", z_loss={self.z_loss}" if self.z_loss else ""
        return (
            f"in_features={self.in_features}, num_classes={self.num_classes}, bias={self.bias is not None}, "
            f"loss={self.loss!r}{extra}, tau={self.tau}, reduction={self.reduction!r}, chunk_size={self.chunk_size}"
        )
