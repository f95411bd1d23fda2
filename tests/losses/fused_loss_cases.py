"""Shared cases of the fused-loss tests on the CPU (tests/test_losses_fused_*.py):
adversarial rows, targets, and the NumPy float64 oracle's per-row loss and
gradient (tests/oracle_losses.py for L, tests/oracle.py for p)."""

import numpy as np
import pytest
import torch

import softk
from softk.threshold.families import ENTMAX15, EXP, SOFTMAX, SPARSEMAX, entmax_family

from ..oracle import maps as oracle, losses as oracle_losses

# label -> (family, oracle name, α): every family the native kernels serve
FAMS = {
    "softmax": (SOFTMAX, "softmax", None),
    "sparsemax": (SPARSEMAX, "sparsemax", None),
    "entmax15": (ENTMAX15, "entmax", 1.5),
    "entmax1.3": (entmax_family(1.3), "entmax", 1.3),
    "exp": (EXP, "exp", None),
}
LABELS = sorted(FAMS)
R, N = 11, 13
IGNORED = 9  # the row whose class index is ignore_index

native_only = pytest.mark.skipif(not softk._backends.registry.native_available(), reason="no C compiler here")


def rows(rng, dtype, n=N, offset=1e4):
    """Adversarial rows, exactly representable in ``dtype`` (returned as float64)."""
    x = rng.normal(size=(R, n)) * 2
    x[1, ::3] = -np.inf  # masked entries (the index target of row 1 is one)
    x[2] = -np.inf  # fully masked
    x[3] = -np.inf
    x[3, 4] = 0.5  # a single finite entry
    x[4, 7] = np.nan  # a broken row
    x[5] = x[5] * 0.05
    x[5, 2] = 30.0  # one dominant entry
    x[6] = rng.integers(-1, 2, size=n) * 0.5  # ties
    x[7] = offset + np.round(x[7] * 16) / 16  # far from the origin (exact in float32 up to 1e6)
    x[8] = x[8] * 1e-3  # small scores
    x[10, 5] = np.inf  # a +inf entry: a broken row too
    return torch.tensor(x).to(dtype).double().numpy()


def index_target(rng, n=N):
    t = rng.integers(0, n, size=R)
    t[1], t[2], t[3] = 0, 0, 4  # masked class (+inf), fully masked (+inf), the one finite entry (0)
    t[IGNORED] = -100
    return t


def dense_target(rng, xn, k):
    """Rows of the map's domain summing to k exactly in float32, zero on masked
    classes, except row 2 (and 3 for k > 1) which put mass on masked classes
    (+inf); row 6 a multi-hot (exactly k ones)."""
    masked = np.isneginf(xn)
    scores = np.where(masked, -np.inf, rng.normal(size=xn.shape) * 2)
    scores[2] = rng.normal(size=xn.shape[1])
    if k > 1:
        scores[3] = rng.normal(size=xn.shape[1])
    y = oracle.softmax(scores) if k == 1 else oracle.soft_topk(scores, k, -1, 1.0, "sigmoid")
    y[6] = 0.0
    y[6, np.flatnonzero(~masked[6])[:k]] = 1.0
    y = np.round(y * 2.0**20) / 2.0**20
    j = np.argmax(y * (1 - y), axis=1)
    y[np.arange(len(y)), j] += k - y.sum(1)
    return y


def p_oracle(label, xn, k, tau):
    """The oracle's map p(x/τ) on rows (float64); ``k`` an int or one per row."""
    _, name, alpha = FAMS[label]
    if np.ndim(k):
        return np.stack([p_oracle(label, r[None], int(kr), tau)[0] for r, kr in zip(xn, k)])
    if name == "softmax":
        return oracle.softmax(xn, tau=tau)
    if name == "sparsemax":
        return oracle.sparsemax(xn, tau=tau)
    if name == "entmax":
        return oracle.entmax(xn, alpha, tau=tau)
    return oracle.soft_topk(xn, k, -1, tau, name)


def oracle_rows(label, xn, y, keep, k, tau):
    """Per-row L and the per-row gradient (p − y)/τ (0 on ignored rows)."""
    _, name, alpha = FAMS[label]
    if np.ndim(k):
        loss = np.array([oracle_losses.fy_row(name, r / tau, yr, int(kr), alpha) for r, yr, kr in zip(xn, y, k)])
        loss = np.where(keep, loss, 0.0)
    else:
        loss = oracle_losses.fy_loss(name, xn, y, k, tau, alpha, keep=keep)
    grad = np.where(keep[:, None], (p_oracle(label, xn, k, tau) - y) / tau, 0.0)
    return loss, grad


def tol(dtype):
    """Relative tolerance: the compute dtype's rounding over a row of N (float64: the
    oracle's own bisection, 1e4 from the origin, is exact to ~1e-12)
    terms; a half input is computed in float32 and rounded once (twice for a
    gradient scaled by a per-row incoming gradient)."""
    return {torch.float64: 1e-10, torch.float32: 4e-6, torch.bfloat16: 2 * 2.0**-8, torch.float16: 2 * 2.0**-11}[dtype]


def assert_close(out, ref, dtype, atol):
    out = out.double().numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=tol(dtype), atol=atol, equal_nan=True)


def atol(dtype, scale=1.0):
    return scale * {torch.float64: 1e-10, torch.float32: 4e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]


@pytest.fixture
def nan_outputs(monkeypatch):
    """Outputs of the native loss kernels prefilled with NaN: an element the
    kernel forgets to write fails the comparison."""
    import softk._backends.native.loss as launcher

    monkeypatch.setattr(launcher, "_empty", lambda shape, like: like.new_full(shape, float("nan")))


@pytest.fixture
def fused_calls(monkeypatch):
    """Records (family name, dtype, target kind, wants a gradient) of every
    call of the native fused loss kernel."""
    import softk._backends.native.loss as launcher

    calls = []
    run = launcher.fenchel_young_fused_rows

    def spy(z, target, family, *a, **kw):
        calls.append((family.name, z.dtype, "dense" if target.dim() == 2 else "index", kw.get("want_grad", True)))
        return run(z, target, family, *a, **kw)

    monkeypatch.setattr(launcher, "fenchel_young_fused_rows", spy)
    return calls
