"""Where a call runs.

``registry`` holds the setting (``softk.use_backend``, ``SOFTK_BACKEND``)
and what can run here; ``kernels`` is the one table of kernels, ``(op,
backend) → Kernel``, each saying what it serves; ``dispatch.pick`` chooses
one kernel per call, in one vocabulary ("torch", "native", "triton"), and
``softk.explain`` shows why; ``call_mode`` says whether a call is plain
eager.  The kernels themselves: ``torch/`` (tensor code, the reference),
``native/`` (the C kernels, built on first use), ``triton/`` (the GPU
kernels), ``blockwise/`` (attention over blocks of keys) and ``gradtopk/``
(GradTopK's scan and tree).  Nothing here imports upward: the kernels know
the families' maths (:mod:`softk.threshold`), not the maps.  Imported by
:mod:`softk._ops`, the maps, the losses, attention and ``softk/__init__``;
imports only :mod:`softk.threshold` and ``softk._validate``.
"""
