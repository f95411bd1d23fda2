"""Rows at the edges that once gave a wrong answer without a word, with their
exact answers from the independent references (tests only; shared by the
torch/native tests here and the Triton interpreter tests).

* α-entmax with α in (1, 1.01]: (α − 1)·u is tiny and 1/(α − 1) huge, so
  p = ((α − 1)(z − λ))^{1/(α−1)} loses everything unless p is formed from a
  log-probability (an entry 500 below the rest summed to 158 on the torch
  path, and in float16/bfloat16 on every path).
* soft top-k where (x − r)/τ overflows float32: an entry of 3e37 at τ = 0.01
  turned the row into NaN.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from tests.oracle.mp import threshold_row

NEAR_ONE = (1.00001, 1.0001, 1.001, 1.01)
HALF = (torch.float16, torch.bfloat16)


def near_one_rows(dtype):
    """(x, τ) pairs: the repros, a dominant entry, offsets of 1e4 and 1e6
    (where the dtype holds them) and τ from 1e-3 to 1."""
    g = torch.Generator().manual_seed(0)
    rows = [
        (torch.tensor([[-500.0, 0.0, 0.0, 0.0]]), 1.0),
        (torch.tensor([[-0.5, 0.0, 0.0, 0.0], [-0.5, 0.0, 0.0, -0.0]]), 1e-3),
        (torch.tensor([[30.0, 0.0, 0.1, -2.0, 0.5]]), 1.0),
        (torch.randn(3, 9, generator=g), 1.0),
        (torch.randn(3, 40, generator=g) * 0.01 + 1e4, 1e-3),
        (torch.randn(2, 70, generator=g) * 3 + 1e4, 1e-3),
    ]
    if dtype in (torch.float32, torch.bfloat16):
        rows.append((torch.randn(2, 33, generator=g) * 0.01 + 1e6, 1e-3))
    return [(x.to(dtype), tau) for x, tau in rows]


def entmax_reference(x: torch.Tensor, alpha: float, tau: float) -> np.ndarray:
    """float64 p of the (rounded) rows x, from the mpmath oracle."""
    rows = x.double().numpy()
    return np.stack([_entmax_row(tuple(r), alpha, tau) for r in rows])


@functools.lru_cache(maxsize=None)
def _entmax_row(row: tuple, alpha: float, tau: float) -> np.ndarray:
    # cached: each backend of a process asks for the same rows
    return threshold_row("entmax", np.array(row), 1, tau=tau, alpha=alpha)


def tolerance(dtype, ref: np.ndarray) -> np.ndarray:
    """The float32 arithmetic's error (a few eps on entries of the support,
    whose offsets from the maximum are O(10) in z) plus the rounding of p to
    the output dtype (one ulp: Triton's interpreter rounds half-precision
    stores towards zero)."""
    return 8 * np.finfo(np.float32).eps + ref * torch.finfo(dtype).eps


# (row, k, τ, exact p): entries far above the rest saturate at 1, the others are 0
OVERFLOW_ROWS = [
    ([1.0, 2.0, 3e37], 2, 0.01, [0.0, 1.0, 1.0]),
    ([1.0, 2.0, 3e37], 3, 0.01, [1.0, 1.0, 1.0]),
    ([1.0, 2.0, 3e37], 1, 0.01, [0.0, 0.0, 1.0]),
    ([3e38, -1e38, -2e38, 0.0], 2, 1.0, None),
    ([1.0, 2.0, 3e37, 5e37, 0.5], 3, 1e-3, [0.0, 1.0, 1.0, 1.0, 0.0]),
    ([-3e37, 0.0, 1.0], 2, 0.01, [0.0, 1.0, 1.0]),
]
METHODS = ("exp", "sigmoid", "laplace", "sparse")


def overflow_reference(row, k, tau, method, exact):
    """The exact p where it is written out, else the mpmath oracle's."""
    if exact is not None:
        return np.array(exact)
    return threshold_row(method, np.array(row), k, tau=tau)
