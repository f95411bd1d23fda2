"""Where a call runs: ``registry`` (the backend setting, what is available),
``dispatch`` (one call to one backend), ``native/`` (the C kernels, built on
first use) and ``triton/`` (the GPU kernels).  Nothing here imports upward:
the kernels know the families' maths (:mod:`softk.threshold`), not the maps.
Also here: ``blockwise/`` (the CPU attention kernels) and ``gradtopk/``
(GradTopK's scan and tree).  ``dispatch`` is the one dispatcher: every call
with more than one backend asks it where to run.  Imported by
:mod:`softk._ops`, the maps, the losses, attention and ``softk/__init__``
(the backend setting); imports only :mod:`softk.threshold` and ``softk._validate``.
"""
