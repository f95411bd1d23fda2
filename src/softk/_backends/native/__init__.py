r"""Compiled CPU kernels for the threshold maps that dominate real use.

``kernels.c`` / ``kernels_impl.h`` hold the algorithm (one C function per
direction, templated on float/double), :mod:`.build` compiles and loads it,
and this module is the launcher: it takes contiguous float32/float64 CPU
tensors with the map's dimension last, views them as (rows, n) and calls the
kernel, which splits the rows between ``torch.get_num_threads()`` OpenMP
threads (torch's own pool on Linux, see :mod:`.build`).  :mod:`.threshold` is its interface as the "native" kernel of op "threshold"
(:mod:`softk._backends.kernels`), which runs where the dispatcher picks it;
every other case runs the torch kernel.
Imported by :mod:`softk._backends.dispatch`, the ops of :mod:`softk._ops`
(the fused losses) and the losses (its ``BadTarget``); imports only
:mod:`softk.threshold`.

Covered families (``Family.native``): softmax (p = k·softmax), sparsemax,
entmax15, entmax with 1 < α ≤ 2, soft top-k "exp".  λ is found without
sorting: Newton from a lower bound over the surviving candidates, finished by
the family's closed form (exact for sparsemax, entmax15 and "exp"), see the
comments in ``kernels_impl.h``.  The backward reads p once and touches g only
on the support for the sparse families (two passes for the dense ones).

>>> import torch, softk
>>> x = torch.tensor([[0.5, 1.5, -1.0, 1.0]])
>>> with softk.use_backend("native"):
...     p = softk.sparsemax(x)
>>> p
tensor([[0.0000, 0.7500, 0.0000, 0.2500]])
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from . import build

# Below this many elements one thread beats waking the others.
_PARALLEL_MIN = 1 << 15


def family_id(family):
    """The kernel id of ``family``, or None when the kernels do not cover it
    (the table is :data:`softk.threshold.families.KERNEL_IDS`)."""
    return family.kernel if family.native else None


def _empty(like: Tensor) -> Tensor:
    # Outputs are written by the kernels in full; tests swap this for a NaN fill.
    return torch.empty_like(like)


def _checked_out(out: Tensor, like: Tensor) -> Tensor:
    if out.shape != like.shape or out.dtype != like.dtype or not out.is_contiguous() or not out.is_cpu:
        raise ValueError(f"out must be a contiguous CPU tensor of shape {tuple(like.shape)} and dtype {like.dtype}, "
                         f"got {tuple(out.shape)} {out.dtype}")
    return out


_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_FUNCTIONS: dict = {}


def entry(name: str, dtype: torch.dtype):
    """The library's ctypes entry point ``softk_<name>_<f32|f64>`` for
    ``dtype``, looked up once (a per-call getattr on the CDLL costs more
    than a small row's kernel): every native launcher's lookup."""
    fn = _FUNCTIONS.get((name, dtype))
    if fn is None:
        suffix = _SUFFIX.get(dtype)
        if suffix is None:
            raise TypeError(f"native kernels take float32/float64, got {dtype}")
        fn = _FUNCTIONS[name, dtype] = getattr(build.library(), f"softk_{name}_{suffix}")
    return fn


def forward(family, z: Tensor, k: int, return_iters: bool = False, out: Tensor | None = None):
    """p = f(z − λ), Σp = k along the last dimension of the CPU tensor ``z``.

    With ``return_iters`` also the largest number of solver rounds any row
    took (each round is one pass over that row's surviving candidates).
    ``out``: a contiguous tensor of z's shape and dtype for p (a caller that
    maps many chunks in turn keeps one, rather than fresh memory for each,
    whose first writes fault its pages in)."""
    if not z.is_contiguous():
        z = z.contiguous()
    out = _empty(z) if out is None else _checked_out(out, z)
    n = z.shape[-1]
    size = z.numel()
    rows = size // n if n else 0
    it = ctypes.c_int64(0) if return_iters else None
    if rows:
        threads = 1 if size < _PARALLEL_MIN else max(1, min(torch.get_num_threads(), rows))
        rc = entry("forward_threads", z.dtype)(family_id(family), z.data_ptr(), out.data_ptr(), rows, n, float(k),
                                           family.alpha_value, None if it is None else ctypes.byref(it), threads)
        if rc == -3:
            raise ValueError(f"softk native kernel: rows of {n} entries (at most 2**31 - 1 for {family.name})")
        if rc != 0:
            raise MemoryError(f"softk native kernel: no scratch memory for rows of {n} entries")
    return (out, 0 if it is None else it.value) if return_iters else out


def backward(family, p: Tensor, g: Tensor, tau: float, out: Tensor | None = None) -> Tensor:
    """d ⊙ (g − Σ(d⊙g)/Σd) / τ along the last dimension, d = f′ read off
    ``p``; ``out`` as in :func:`forward`."""
    if not p.is_contiguous():
        p = p.contiguous()
    if g.dtype != p.dtype:
        g = g.to(p.dtype)
    if not g.is_contiguous():
        g = g.contiguous()
    dx = _empty(p) if out is None else _checked_out(out, p)
    n = p.shape[-1]
    size = p.numel()
    rows = size // n if n else 0
    if rows:
        threads = 1 if size < _PARALLEL_MIN else max(1, min(torch.get_num_threads(), rows))
        rc = entry("backward_threads", p.dtype)(family_id(family), p.data_ptr(), g.data_ptr(), dx.data_ptr(), rows, n,
                                            1.0 / tau, family.alpha_value, threads)
        if rc != 0:
            raise MemoryError(f"softk native kernel: no scratch memory for rows of {n} entries")
    return dx
