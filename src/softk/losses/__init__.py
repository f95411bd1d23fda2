"""Losses: cross-entropy with torch's semantics, Fenchel–Young losses of every
threshold map (softmax, sparsemax, entmax, smooth top-k), sparse-softmax
cross-entropy, TS² (sparsemax plus a penalty on the softmax mass off its
support), and the regularisers and bounds of normalised-feature heads.

All take scores (N, C, d1, ...) with classes on dim 1 (or (C,)), like
``torch.nn.functional.cross_entropy``.  Here live the public losses, their
target checks (``targets``), the table of the losses taken by name
(``_registry``) and their options (``_options``), and the fused linear
loss's chunks (``chunking``) and knobs (``_knobs``); their autograd rules are
in :mod:`softk._ops`.  Imported by
attention, compat, distributed, nn and integrations; imports the maps and below.
"""

from ._cross_entropy import cross_entropy
from ._feature_incay import feature_incay
from .fenchel_young import fenchel_young_loss
from .normmax_fy import normmax_loss
from .margins import cross_entropy_floor, cross_entropy_margin
from .normface import cosine_logits, normface_loss_bound, normface_min_scale
from .simplex_losses import entmax15_loss, entmax_loss, softmax_loss, sparsemax_loss
from .topk_loss import soft_topk_loss
from ._topk_softmax_ce import topk_softmax_cross_entropy
from ._ts2 import ts2_loss

from .fused_linear import FusedLossStats, fused_linear_loss
from .fused_policy import fused_linear_logprobs

__all__ = [
    "cross_entropy",
    "topk_softmax_cross_entropy",
    "fenchel_young_loss",
    "softmax_loss",
    "sparsemax_loss",
    "entmax15_loss",
    "entmax_loss",
    "soft_topk_loss",
    "ts2_loss",
    "normmax_loss",
    "feature_incay",
    "cosine_logits",
    "normface_loss_bound",
    "normface_min_scale",
    "cross_entropy_margin",
    "cross_entropy_floor",
]
__all__ += ["fused_linear_loss", "FusedLossStats", "fused_linear_logprobs"]
