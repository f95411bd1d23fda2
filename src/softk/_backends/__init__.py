"""Where a call runs: ``registry`` (the backend setting, what is available),
``dispatch`` (one call to one backend), ``native/`` (the C kernels, built on
first use) and ``triton/`` (the GPU kernels).  Nothing here imports upward:
the kernels know the families' maths (:mod:`softk.threshold`), not the maps.
"""
