r"""Compiled CPU kernels for the threshold maps that dominate real use.

``kernels.c`` / ``kernels_impl.h`` hold the algorithm (one C function per
direction, templated on float/double), :mod:`.build` compiles and loads it,
and this module is the launcher: it takes (rows, n) contiguous float32/float64
CPU tensors with the map's dimension last, splits the rows between
``torch.get_num_threads()`` threads (ctypes releases the GIL) and calls the
kernel.  :func:`softk.threshold.function.threshold_forward_support` and
``ThresholdFunction.backward`` call it when the backend resolves to "native"
(see :mod:`softk._backend`); every other case runs the PyTorch path.

Covered families (``FAMILY_IDS``): softmax (p = k·softmax), sparsemax,
entmax15, entmax with 1 < α ≤ 2, soft top-k "exp".  λ is found without
sorting: Newton from a lower bound over the surviving candidates, finished by
the family's closed form (exact for sparsemax, entmax15 and "exp"), see the
comments in ``kernels_impl.h``.  The backward is two passes over the row.

>>> import torch, softk
>>> x = torch.tensor([[0.5, 1.5, -1.0, 1.0]])
>>> with softk.use_backend("native"):
...     p = softk.sparsemax(x)
>>> p
tensor([[0.0000, 0.7500, 0.0000, 0.2500]])
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import math
import os
import threading

import torch
from torch import Tensor

from . import build

FAMILY_IDS = {"softmax": 0, "sparsemax": 1, "entmax15": 2, "entmax": 3, "exp": 4}
# Below this many elements one call on the calling thread beats a thread hand-off.
_PARALLEL_MIN = 1 << 15
_pool = None
_pool_size = 0
_pool_lock = threading.Lock()


def _forget_pool():
    # A forked child (e.g. a DataLoader worker) inherits the pool object but
    # not its threads: submitting to it would wait forever.
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def family_id(family):
    """The kernel id of ``family``, or None when the kernels do not cover it."""
    fid = FAMILY_IDS.get(family.name)
    if fid == 3:
        a = family.alpha
        if isinstance(a, Tensor) or not (1.0 < float(a) <= 2.0):
            return None  # per-row α and α > 2 (g not convex) stay on the PyTorch path
    return fid


def _alpha(family) -> float:
    return float(family.alpha) if family.alpha is not None else 1.5


def _chunks(rows: int, n: int):
    threads = max(1, torch.get_num_threads())
    if threads == 1 or rows * n < _PARALLEL_MIN or rows < 2:
        return [(0, rows)]
    step = math.ceil(rows / min(threads, rows))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def _run(calls):
    global _pool, _pool_size
    if len(calls) == 1:
        return [calls[0]()]
    with _pool_lock:
        if _pool is None or _pool_size < len(calls):
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="softk")
            _pool_size = len(calls)
        pool = _pool
    futures = [pool.submit(c) for c in calls[1:]]
    results = [calls[0]()]  # the calling thread takes the first chunk
    return results + [f.result() for f in futures]


def _empty(like: Tensor) -> Tensor:
    # Outputs are written by the kernels in full; tests swap this for a NaN fill.
    return torch.empty_like(like)


def _suffix(t: Tensor) -> str:
    if t.dtype == torch.float32:
        return "f32"
    if t.dtype == torch.float64:
        return "f64"
    raise TypeError(f"native kernels take float32/float64, got {t.dtype}")


def forward(family, z: Tensor, k: int, return_iters: bool = False):
    """p = f(z − λ), Σp = k along the last dimension of the CPU tensor ``z``.

    With ``return_iters`` also the largest number of solver rounds any row
    took (each round is one pass over that row's surviving candidates)."""
    lib = build.library()
    fid = family_id(family)
    rows_t = z.contiguous().view(-1, z.shape[-1])
    out = _empty(rows_t)
    rows, n = rows_t.shape
    fn = getattr(lib, f"softk_forward_{_suffix(z)}")
    elem = rows_t.element_size()
    x0, y0, alpha = rows_t.data_ptr(), out.data_ptr(), _alpha(family)

    def call(lo, hi):
        it = ctypes.c_int64(0)
        rc = fn(fid, x0 + lo * n * elem, y0 + lo * n * elem, hi - lo, n, float(k), alpha, ctypes.byref(it))
        if rc != 0:
            raise MemoryError(f"softk native kernel: no scratch memory for rows of {n} entries")
        return it.value

    iters = _run([lambda lo=lo, hi=hi: call(lo, hi) for lo, hi in _chunks(rows, n)]) if rows else [0]
    p = out.view(z.shape)
    return (p, max(iters)) if return_iters else p


def backward(family, p: Tensor, g: Tensor, tau: float) -> Tensor:
    """d ⊙ (g − Σ(d⊙g)/Σd) / τ along the last dimension, d = f′ read off ``p``."""
    lib = build.library()
    fid = family_id(family)
    prow = p.contiguous().view(-1, p.shape[-1])
    grow = g.to(p.dtype).contiguous().view(-1, p.shape[-1])
    dx = _empty(prow)
    rows, n = prow.shape
    fn = getattr(lib, f"softk_backward_{_suffix(p)}")
    elem = prow.element_size()
    p0, g0, d0, alpha = prow.data_ptr(), grow.data_ptr(), dx.data_ptr(), _alpha(family)

    def call(lo, hi):
        off = lo * n * elem
        fn(fid, p0 + off, g0 + off, d0 + off, hi - lo, n, 1.0 / tau, alpha)

    if rows:
        _run([lambda lo=lo, hi=hi: call(lo, hi) for lo, hi in _chunks(rows, n)])
    return dx.view(p.shape)
