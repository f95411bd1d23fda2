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
No softk package imports it; it imports the losses and everything below.
"""

from .losses import vocab_parallel_loss
from .fused import vocab_parallel_fused_linear_loss
from .maps import vocab_parallel_map

__all__ = ["vocab_parallel_loss", "vocab_parallel_map", "vocab_parallel_fused_linear_loss"]
