"""Vocabulary-parallel maps and losses over torch.distributed (Megatron-style tensor parallelism).

Each rank of a process group holds the logits of one slice of the vocabulary;
:func:`vocab_parallel_map` returns this rank's slice of p and
:func:`vocab_parallel_loss` the loss of the whole row, both equal to the
single-device result on the concatenated logits, with a fixed number of
collectives per call (see :mod:`.threshold` for how λ is found).
:func:`vocab_parallel_fused_linear_loss` adds the output layer, with the
weight sharded by vocabulary, never holding more than a chunk of logits.
Here live the public functions, their cross-rank checks (``checks``), the
loss and map names (``families``), the collectives that find λ
(``threshold``) and the whole-row sums of the fused loss's knobs and of TS²'s
penalty (``_knobs``); their autograd rules are :mod:`softk._ops.distributed`.
:func:`context_parallel_attention` and :func:`context_parallel` shard
attention on the sequence instead (:mod:`.context`; the call's agreement
:mod:`.cp_plan`, the strategies :mod:`.cp_gather` and :mod:`.cp_ring`).
:mod:`.rl` gives per-token log-probabilities and entropies for RL, and
:mod:`.dtensor` the DTensor entry of the public maps and losses.
No softk package imports it (``softk/__init__`` does, to register that entry);
it imports the attention, the losses and everything below.
"""

from .losses import vocab_parallel_loss
from .fused import vocab_parallel_fused_linear_loss
from .maps import vocab_parallel_map
from .rl import vocab_parallel_entropy, vocab_parallel_log_softmax, vocab_parallel_logprobs
from .context import context_parallel, context_parallel_attention
from .. import _dtensor

__all__ = [
    "vocab_parallel_loss", "vocab_parallel_map", "vocab_parallel_fused_linear_loss",
    "vocab_parallel_log_softmax", "vocab_parallel_logprobs", "vocab_parallel_entropy",
    "context_parallel_attention", "context_parallel",
]


def _dtensor_handler(kind, name, fn, args, kwargs):
    # torch.distributed.tensor costs a second to import: only a call that got a DTensor pays it.
    from .dtensor import handle

    return handle(kind, name, fn, args, kwargs)


_dtensor.register(_dtensor_handler)
