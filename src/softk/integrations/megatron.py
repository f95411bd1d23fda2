r"""softk's losses in Megatron-LM's cross-entropy slot.

Megatron-LM computes the language-model loss from the vocab-parallel logits
with a callable of the shape of its ``vocab_parallel_cross_entropy``:

    ``target(logits, labels, tp_group) -> loss``

with ``logits`` (s, b, V/tp) this tensor-parallel rank's slice of the
vocabulary (rank r holds the r-th contiguous slice, as Megatron's
``VocabParallelEmbedding`` and output layer split it), ``labels`` (s, b)
global token ids, the same on every rank, and the per-token loss (s, b)
returned unreduced (Megatron masks and averages it itself).
:func:`megatron_loss` makes such a callable for every softk loss; under the
hood it is :func:`softk.distributed.vocab_parallel_loss`, so no rank holds the
whole vocabulary, the backward runs no collective, and the forward runs
1 + 2 all-reduces (softmax family), 3 all-reduces + 1 all-gather (sparsemax,
entmax, soft top-k "sparse") or 1 all-reduce + 1 all-gather (top-k softmax
cross-entropy).

Megatron is not imported: the callables only need ``torch.distributed``.

>>> import torch, torch.distributed as dist, tempfile, os
>>> f = os.path.join(tempfile.mkdtemp(), "pg")
>>> dist.init_process_group("gloo", init_method=f"file://{f}", rank=0, world_size=1)
>>> target = megatron_loss("sparsemax")
>>> target(torch.tensor([[[0.0, 1.0, 3.0]]]), torch.tensor([[2]]), None)
tensor([[0.]])
>>> dist.destroy_process_group()
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from ..distributed import vocab_parallel_loss
from ..distributed.families import loss_family
from ..distributed.losses import vocab_parallel_options
from ..losses._options import loss_options
from ..losses._registry import DEFAULT_LOSS, LOSSES

__all__ = ["megatron_loss", "SUPPORTED_LOSSES"]

#: Every loss name :func:`megatron_loss` takes (the vocab-parallel ones).
SUPPORTED_LOSSES = tuple(name for name in LOSSES)


def megatron_loss(
    loss: str = DEFAULT_LOSS, *, alpha=None, k: int = 1, method: str = "exp", tau: float = 1.0,
    ignore_index: int = -100, suppression=None, adaptive: bool = False,
) -> Callable[[Tensor, Tensor, object], Tensor]:
    r"""A callable ``target(logits[s, b, V/tp], labels[s, b], tp_group) -> loss[s, b]`` for Megatron-LM.

    Args:
        loss: a softk loss name, as in :func:`softk.distributed.vocab_parallel_loss`
            ("cross_entropy", "softmax", "sparsemax", "entmax15", "entmax",
            "soft_topk", "topk_softmax_ce", "ts2").
        alpha, k, method, tau, ignore_index, suppression, adaptive: that
            loss's options, checked here.  A label equal to ``ignore_index``
            gives 0.  soft_topk's ``method`` is "exp" by default, as on one
            device; vocabulary slices need "sparse" for k > 1 (a ValueError
            here says so).

    The callable takes this rank's logits slice (s, b, V/tp), the global
    labels (s, b) and the tensor-parallel process group (None: the world),
    and returns the unreduced per-token loss (s, b), differentiable with
    respect to the logits.  soft_topk takes dense targets, which Megatron's
    slot does not carry: pass them as ``labels`` (s, b, V/tp), sliced like the
    logits.
    """
    o = loss_options(loss, alpha=alpha, k=k, method=method, tau=tau, ignore_index=ignore_index,
                     suppression=suppression, adaptive=adaptive)
    loss_family(o)  # a loss the vocabulary slices cannot serve is refused now, not at the first step
    opts = vocab_parallel_options(o)

    def target(logits: Tensor, labels: Tensor, tp_group=None) -> Tensor:
        return vocab_parallel_loss(logits, labels, loss, group=tp_group, reduction="none", **opts)

    target.__name__ = f"softk_{loss}_vocab_parallel"
    target.__qualname__ = target.__name__
    return target
