"""The memory-efficient attention kernels in PyTorch: blocks of keys, never the L×S scores.

``forward`` (the λ search over key blocks and the output), ``backward``
(dq, dk, dv and dα from the saved λ, recomputing p block by block) and
``blocks`` (the block and chunk iterators), ``rows`` (whole score rows,
which the CPU takes for most shapes), ``support`` (the products over the
keys with p > 0), ``fused`` (the softmax on torch's fused CPU kernel), and ``kernel``, their interface
as the "native" kernel of op "attention" (:mod:`softk._backends.kernels`:
the CPU, float64 inputs, any device without Triton), which
:mod:`softk._ops.attention` runs.  They import only :mod:`softk.threshold`
and the dispatcher (their rows' own threshold kernels).
"""
