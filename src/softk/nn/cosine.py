"""``CosineClassifier``: the NormFace head, logits ``scale · cos(feature, class weight)``.

See :func:`softk.losses.cosine_logits` for the map and
:func:`softk.losses.normface_loss_bound` / :func:`softk.losses.normface_min_scale`
for why the scale must grow with the number of classes.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from ..losses.normface import cosine_logits, normface_min_scale


class CosineClassifier(nn.Module):
    """``softk.losses.cosine_logits(x, self.weight, self.scale)`` as a layer.

    Args:
        in_features: feature size d.
        num_classes: C; ``weight`` is a (C, d) parameter, initialised like ``nn.Linear``'s.
        scale: a float > 0, or "normface" for ``normface_min_scale(num_classes, normface_loss)``,
            the smallest scale whose NormFace loss floor is ``normface_loss``.
        learn_scale: make the scale a parameter (stored as its log, ``log_scale``,
            so it stays positive), initialised at the value above.
        normface_loss: the loss floor used by ``scale="normface"``.
    """

    def __init__(self, in_features: int, num_classes: int, scale="normface", learn_scale: bool = False, normface_loss: float = 0.01):
        super().__init__()
        for name, v in (("in_features", in_features), ("num_classes", num_classes)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if scale == "normface":
            scale = normface_min_scale(num_classes, normface_loss)
        elif isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not (0 < float(scale) < math.inf):
            raise ValueError(f'scale must be a finite float > 0 or "normface", got {scale!r}')
        self.in_features, self.num_classes, self.learn_scale = int(in_features), int(num_classes), bool(learn_scale)
        self.weight = nn.Parameter(torch.empty(num_classes, in_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # as nn.Linear
        if self.learn_scale:
            if float(scale) > torch.finfo(torch.float32).max:  # exp(log_scale) is the float32 parameter's
                raise ValueError(f"scale={scale!r} is beyond float32, which holds the learnable scale's parameter")
            self.log_scale = nn.Parameter(torch.tensor(math.log(float(scale))))
        else:
            self._scale = float(scale)

    @property
    def scale(self):
        """The current scale: a float, or a 0-d tensor when learnable."""
        return self.log_scale.exp() if self.learn_scale else self._scale

    def forward(self, x):
        return cosine_logits(x, self.weight, self.scale)

    def extra_repr(self) -> str:
        s = float(self.scale.detach() if isinstance(self.scale, torch.Tensor) else self.scale)  # (no warning: a detached read)
        return f"in_features={self.in_features}, num_classes={self.num_classes}, scale={s:.4g}, learn_scale={self.learn_scale}"
