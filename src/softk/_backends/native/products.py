"""Attention's products with a sparse map's P on the left, over P's nonzeros
(``kernels_products.h``): P·X, dP = A·Bᵀ sampled on P's support, and
acc += Pᵀ·X in place.

Every tensor is a CPU float32/float64 tensor of one dtype, P (…, R, S) with
its leading dimensions the groups (batch × key/value heads), the right factor
(…, S' ≥ S, E) with the same leading dimensions (only its first S rows are
read).  :func:`serves` says where they apply; callers take the dense
products elsewhere.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import registry
from . import _PARALLEL_MIN, _SUFFIX, entry
from .threshold import ROW_MAX


def serves(p: Tensor, *others: Tensor) -> bool:
    """Whether the kernels take ``p`` and ``others``: CPU, one dtype of
    float32/float64, rows of at most ROW_MAX keys (the kernels index them
    with int32), and the kernels on (built, and not ``SOFTK_NATIVE=0``)."""
    if not p.is_cpu or p.dtype not in _SUFFIX or p.shape[-1] > ROW_MAX:
        return False
    if any(not t.is_cpu or t.dtype != p.dtype for t in others):
        return False
    return registry.native_available()


def _groups(p: Tensor, x: Tensor):
    """(G, R, S, E, group stride of x) with x made contiguous in its groups' layout."""
    *lead, R, S = p.shape
    G = 1
    for d in lead:
        G *= d
    x = x.expand(*lead, *x.shape[-2:]).contiguous()
    return G, R, S, x.shape[-1], x.shape[-2] * x.shape[-1], x


def _empty(shape, dtype) -> Tensor:
    # Outputs are written by the kernels in full; tests swap this for a NaN fill.
    return torch.empty(shape, dtype=dtype)


def _threads(work: int) -> int:
    return 1 if work < _PARALLEL_MIN else max(1, torch.get_num_threads())


def _check(rc: int) -> None:
    if rc != 0:
        raise MemoryError("softk native kernel: no scratch memory for the sparse products")


def mm(p: Tensor, x: Tensor) -> Tensor:
    """P·X (…, R, E) over P's nonzeros, X (…, S' ≥ S, E)."""
    p = p.contiguous()
    G, R, S, E, xg, x = _groups(p, x)
    out = _empty((*p.shape[:-1], E), p.dtype)
    if G * R:
        _check(entry("sparse_mm", p.dtype)(p.data_ptr(), x.data_ptr(), out.data_ptr(), G, R, S, E, xg,
                                               _threads(p.numel())))
    return out


def sampled(p: Tensor, a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """(…, R, S): A·Bᵀ where P is nonzero, 0 elsewhere; A (…, R, E), B (…, S' ≥ S, E);
    written into ``out`` (contiguous, P's shape and dtype) when given."""
    p, a = p.contiguous(), a.expand(*p.shape[:-1], a.shape[-1]).contiguous()
    G, R, S, E, bg, b = _groups(p, b)
    out = _empty(p.shape, p.dtype) if out is None else out
    assert out.is_contiguous() and out.shape == p.shape and out.dtype == p.dtype, (out.shape, p.shape)
    if G * R:
        _check(entry("sparse_sampled", p.dtype)(p.data_ptr(), a.data_ptr(), b.data_ptr(), out.data_ptr(), G, R,
                                                    S, E, bg, _threads(p.numel())))
    return out


def mm_t_(acc: Tensor, p: Tensor, x: Tensor) -> None:
    """acc[…, :S, :] += Pᵀ·X in place over P's nonzeros: P (…, R, S), X (…, R, E),
    acc (…, S' ≥ S, E) contiguous with P's leading dimensions."""
    p, x = p.contiguous(), x.expand(*p.shape[:-1], x.shape[-1]).contiguous()
    *lead, R, S = p.shape
    G = p.numel() // max(R * S, 1) if R * S else 0
    assert acc.is_contiguous() and tuple(acc.shape[:-2]) == tuple(lead), (acc.shape, p.shape)
    if G * R:
        _check(entry("sparse_mm_t", p.dtype)(p.data_ptr(), x.data_ptr(), acc.data_ptr(), G, R, S, x.shape[-1],
                                                 acc.shape[-2] * acc.shape[-1], _threads(p.numel())))
