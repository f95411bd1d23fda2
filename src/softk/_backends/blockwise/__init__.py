"""The memory-efficient attention kernels in PyTorch: blocks of keys, never the L×S scores.

``forward`` (the λ search over key blocks and the output), ``backward``
(dq, dk, dv and dα from the saved λ, recomputing p block by block) and
``blocks`` (the block and chunk iterators).  :mod:`softk._ops.attention`
runs them for the "blockwise" backend (the CPU, float64 inputs, any device
without Triton; :func:`softk._backends.dispatch.attention_backend` decides);
they import only :mod:`softk.threshold`.
"""
