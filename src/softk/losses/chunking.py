r"""The per-chunk pieces of :func:`softk.losses.fused_linear_loss`.

* :func:`auto_chunk_size`: how many rows of logits to hold at once;
* :func:`chunk_loss_fn`: the public loss named by ``loss``, per row.

The pass over the chunks and its autograd rule are
:mod:`softk._ops.fused_linear`'s.  The gradient of each chunk comes from the
public loss itself (``torch.autograd.grad`` on the chunk's logits), so the
chunk runs on whatever backend that loss dispatches to (compiled CPU
kernels, Triton on CUDA, or the PyTorch reference); for the Fenchel–Young
losses it is (p − y)/τ.
"""

from __future__ import annotations

from .._validate import LOSSES
from ._cross_entropy import cross_entropy
from .simplex_losses import entmax15_loss, entmax_loss, softmax_loss, sparsemax_loss
from .topk_loss import soft_topk_loss
from ._topk_softmax_ce import topk_softmax_cross_entropy

# Below this many logits per chunk (4 Mi elements, 16 MiB in float32) the
# per-chunk matmuls get so small that their overhead dominates; above it the
# chunk is still a small fraction of the N×V logits of any large vocabulary.
MIN_CHUNK_ELEMENTS = 1 << 22
# On a GPU the floor is 128 Mi logits (256 MiB in bfloat16).  Every chunk
# adds its V×H weight-gradient product into the float32 accumulator, a pass
# over V×H that costs as much as the chunk's matmuls when the chunk has a few
# hundred rows; with this floor a chunk has about a thousand rows or more at
# the vocabularies of today's language models, and is still a small part of
# the N×V logits.
MIN_CHUNK_ELEMENTS_GPU = 1 << 27


def auto_chunk_size(rows: int, hidden: int, vocab: int, device_type: str = "cpu") -> int:
    """Rows per chunk: the largest power of two C with C·V ≤ max(N·H, floor), clamped to [1, N].

    The budget is Liger-Kernel's (its fused linear cross-entropy takes the
    next power of two ≥ N / ⌈V/H⌉): one chunk of logits costs about as much
    memory as the input X itself.  Here the power of two is rounded down, so
    the chunk stays within the budget, and the budget has a floor so that
    small hidden sizes do not give tiny matmuls: 4 Mi logits on the CPU,
    128 Mi on any other device (``device_type`` other than "cpu").

    >>> auto_chunk_size(4096, 256, 65536)   # max(2^20, 2^22) / 2^16
    64
    >>> auto_chunk_size(8192, 4096, 131072)  # Liger's rule gives the same 256
    256
    >>> auto_chunk_size(8192, 768, 50257, "cuda")  # GPT-2 on a GPU: 2^27 / 50257 → 2048
    2048
    """
    budget = max(rows * hidden, MIN_CHUNK_ELEMENTS if device_type == "cpu" else MIN_CHUNK_ELEMENTS_GPU)
    c = max(1, budget // max(vocab, 1))
    c = 1 << (c.bit_length() - 1)  # largest power of two <= c
    return max(1, min(c, rows))


# The per-row loss of each name of softk._validate.LOSSES, as
# ``make(alpha, k, method, tau, ignore_index) -> fn(logits (C, V), target) -> (C,)``.
_CHUNK_LOSSES = {
    "cross_entropy": lambda a, k, m, tau, ii: lambda z, t: cross_entropy(z, t, ignore_index=ii, reduction="none",
                                                                          tau=tau),
    "softmax": lambda a, k, m, tau, ii: lambda z, t: softmax_loss(z, t, ii, "none", tau),
    "sparsemax": lambda a, k, m, tau, ii: lambda z, t: sparsemax_loss(z, t, ii, "none", tau),
    "entmax15": lambda a, k, m, tau, ii: lambda z, t: entmax15_loss(z, t, ii, "none", tau),
    "entmax": lambda a, k, m, tau, ii: lambda z, t: entmax_loss(z, t, a, ii, "none", tau),
    "soft_topk": lambda a, k, m, tau, ii: lambda z, t: soft_topk_loss(z, t, k, m, tau, "none"),
    "topk_softmax_ce": lambda a, k, m, tau, ii: lambda z, t: topk_softmax_cross_entropy(z, t, k, ii, "none", tau),
}
assert set(_CHUNK_LOSSES) == set(LOSSES), "every loss name has a chunk loss"


def chunk_loss_fn(loss: str, *, alpha, k: int, method: str, tau: float, ignore_index: int):
    """The public loss ``loss`` (a name of :data:`softk._validate.LOSSES`, checked)
    as ``fn(logits (C, V), target) -> (C,)`` (reduction "none")."""
    return _CHUNK_LOSSES[loss](alpha, k, method, tau, ignore_index)
