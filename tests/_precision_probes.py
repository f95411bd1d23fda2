"""Whether the PyTorch path already has the two pieces of issue 12 that live in
softk/threshold/function.py (the lead's part): the row prelude that hands the
solver (x − r)/τ, and p taken from ``solve.solve_probs``.  Tests that need
them are xfailed (not skipped: they still run) while a probe is False, and
must pass once it flips.
"""

import torch

import softk


def _probe_prelude() -> bool:
    """True when the PyTorch path is exact at a large offset."""
    with softk.use_backend("torch"):
        p = softk.sparsemax(torch.full((3,), 1000.3), tau=1e-3)
    return bool(torch.all(torch.abs(p - 1 / 3) <= 1e-7))


def _probe_probs() -> bool:
    """True when float-α entmax on the PyTorch path takes p from the solver
    rather than f(z − λ) with a float λ."""
    with softk.use_backend("torch"):
        p = softk.entmax(torch.tensor([0.0, -0.21782390773296356]), alpha=5.0)
    return abs(float(p[1]) - 0.03386) < 1e-4


def _probe_softmax() -> bool:
    """True when softk.softmax shifts before dividing by τ (simplex.py)."""
    with softk.use_backend("torch"):
        p = softk.softmax(torch.tensor([3e38, 0.0]), tau=0.5)
    return bool(torch.equal(p, torch.tensor([1.0, 0.0])))


PRELUDE_EXACT = _probe_prelude()
SOFTMAX_SHIFTED = _probe_softmax()
PROBS_EXACT = _probe_probs()
