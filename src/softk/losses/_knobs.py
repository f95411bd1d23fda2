"""The knobs of the fused losses that language-model training uses, and their checks.

``softcap``, ``label_smoothing``, ``class_weight`` and ``z_loss`` of
:func:`softk.losses.fused_linear_loss`, :class:`softk.nn.FusedLinearLoss`,
:func:`softk.distributed.vocab_parallel_fused_linear_loss` and
:func:`softk.integrations.transformers.apply_softk`, checked with the other
options by :func:`softk.losses._options.loss_options`; what each does is
:func:`softk.losses.chunking.chunk_loss_fn`'s.  A knob given to a loss where
it is not defined is refused with a ValueError that names it.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

from .._validate import check_positive, finite, require


class Knobs(NamedTuple):
    softcap: float | None = None
    label_smoothing: float = 0.0
    class_weight: torch.Tensor | None = None
    z_loss: float = 0.0


NO_KNOBS = Knobs()


def check_knobs(loss: str, *, softcap=None, label_smoothing=0.0, class_weight=None, z_loss=0.0,
                dense: bool = False, vocab: int | None = None, device=None, dtype=None) -> Knobs:
    """The knobs' values, checked, and ``class_weight`` against the target kind
    (``dense``, for ``loss``'s message); ``class_weight`` must have ``vocab``
    entries (when given) and comes back as a float tensor on ``device``, in
    float64 for float64 scores (``dtype``: their sums of weights in float64
    too, not in the float32 of the weights).  Which
    losses take label smoothing is their record's
    (:attr:`softk.losses._registry.LossKind.smoothed`), checked by
    :func:`softk.losses._options.loss_options`."""
    if softcap is not None:
        softcap = check_positive(softcap, "softcap")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real):
        raise TypeError(f"label_smoothing must be a float in [0, 1), got {type(label_smoothing).__name__}")
    label_smoothing = float(label_smoothing)
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if isinstance(z_loss, bool) or not isinstance(z_loss, numbers.Real):
        raise TypeError(f"z_loss must be a number >= 0, got {type(z_loss).__name__}")
    z_loss = float(z_loss)
    if not (z_loss >= 0 and finite(z_loss)):
        raise ValueError(f"z_loss must be a finite number >= 0, got {z_loss}")
    if class_weight is not None:
        if dense:
            raise ValueError(
                f"class_weight applies to class-index targets only (row i is scaled by w[y_i]); loss={loss!r} "
                "got a dense (probability) target"
            )
        if not isinstance(class_weight, torch.Tensor) or not class_weight.is_floating_point() or class_weight.dim() != 1:
            got = tuple(class_weight.shape) if isinstance(class_weight, torch.Tensor) else type(class_weight).__name__
            raise TypeError(f"class_weight must be a 1-D floating tensor of one weight per class, got {got}")
        if vocab is not None and class_weight.shape[0] != vocab:
            raise ValueError(f"class_weight must have one weight per class, shape ({vocab},), got {tuple(class_weight.shape)}")
        class_weight = class_weight.detach()
        if device is not None:
            class_weight = class_weight.to(device)
        if class_weight.dtype not in (torch.float32, torch.float64):
            class_weight = class_weight.float()
        if dtype == torch.float64:
            class_weight = class_weight.double()
        require(torch.isfinite(class_weight) & (class_weight >= 0), "class_weight must be finite and >= 0 everywhere")
    return Knobs(softcap, label_smoothing, class_weight, z_loss)
