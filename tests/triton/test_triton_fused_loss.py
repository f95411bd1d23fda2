"""The fused Fenchel–Young loss kernel (softk.triton.loss_kernel) through the
interpreter: loss values and gradients against the NumPy float64 oracle
(tests/oracle_losses.py for L, tests/oracle.py for p) and against the unfused
route ("torch" backend), for every family it serves, class-index and dense
targets, the reductions and ignore_index, masked / fully masked / NaN rows,
ties, a dominant entry, offsets of 1e4, τ ≠ 1 and float32/bf16/fp16; that the
kernel runs (and nothing shaped like a half input is made in float32); double
backward, forward AD, torch.func and torch.compile; a compile for sm_90."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import softk
from softk.losses.fenchel_young import fenchel_young_loss
from softk.threshold.families import KERNEL_IDS, by_name, entmax_family
from .. import oracle, oracle_losses

# label -> (family, oracle name, α)
FAMS = {
    "softmax": (by_name("softmax"), "softmax", None),
    "sparsemax": (by_name("sparsemax"), "sparsemax", None),
    "entmax15": (by_name("entmax15"), "entmax", 1.5),
    "entmax1.3": (entmax_family(1.3), "entmax", 1.3),
    "entmax2.5": (entmax_family(2.5), "entmax", 2.5),
    "exp": (by_name("exp"), "exp", None),
    "sigmoid": (by_name("sigmoid"), "sigmoid", None),
    "laplace": (by_name("laplace"), "laplace", None),
    "sparse": (by_name("sparse"), "sparse", None),
}
LABELS = sorted(FAMS)
R, N = 10, 13
IGNORED = 9  # the row whose class index is ignore_index


def _p(label, xn, k, tau):
    """The oracle's map p(x/τ) on rows (float64)."""
    _, name, alpha = FAMS[label]
    if name == "softmax":
        return oracle.softmax(xn, tau=tau)
    if name == "sparsemax":
        return oracle.sparsemax(xn, tau=tau)
    if name == "entmax":
        return oracle.entmax(xn, alpha, tau=tau)
    return oracle.soft_topk(xn, k, -1, tau, name)


def _rows(rng, dtype, n=N):
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
    x[7] = 1e4 + x[7]  # far from the origin
    x[8] = x[8] * 1e-3  # small scores (τ small relative to the spread)
    return torch.tensor(x).to(dtype).double().numpy()


def _index_target(rng, n=N):
    t = rng.integers(0, n, size=R)
    t[1], t[2], t[3] = 0, 0, 4  # masked class (+inf), fully masked (+inf), the one finite entry (0)
    t[IGNORED] = -100
    return t


def _dense_target(rng, xn, k):
    """Rows of the map's domain, zero on masked classes, except rows 2 (and 3
    for k > 1) which put mass on masked classes (+inf); row 6 a multi-hot."""
    masked = np.isneginf(xn)
    scores = np.where(masked, -np.inf, rng.normal(size=xn.shape) * 2)
    scores[2] = rng.normal(size=xn.shape[1])
    if k > 1:
        scores[3] = rng.normal(size=xn.shape[1])
    y = oracle.softmax(scores) if k == 1 else oracle.soft_topk(scores, k, -1, 1.0, "sigmoid")
    y[6] = 0.0
    y[6, np.flatnonzero(~masked[6])[:k]] = 1.0
    # Rows summing to k exactly in float32 (multiples of 2^-20, one entry
    # inside (0, 1) taking the remainder): L is then shift invariant, so an
    # oracle row far from the origin does not weigh the rounding of Σy by λ.
    y = np.round(y * 2.0**20) / 2.0**20
    j = np.argmax(y * (1 - y), axis=1)
    y[np.arange(len(y)), j] += k - y.sum(1)
    return y


def _case(rng, label, kind, dtype):
    """(x, target tensor, dense target as float64 rows, keep mask, k)."""
    xn = _rows(rng, dtype)
    k = 2 if kind == "dense" and FAMS[label][0].capped else 1
    if kind == "index":
        t = _index_target(rng)
        keep = t != -100
        return xn, torch.tensor(t), np.eye(N)[np.where(keep, t, 0)], keep, k
    y = _dense_target(rng, xn, k)
    return xn, torch.tensor(y, dtype=torch.float32), y, np.ones(R, bool), k


def _oracle_rows(label, xn, y, keep, k, tau):
    """Per-row L and the per-row gradient (p − y)/τ (0 on ignored rows)."""
    _, name, alpha = FAMS[label]
    loss = oracle_losses.fy_loss(name, xn, y, k, tau, alpha, keep=keep)
    grad = np.where(keep[:, None], (_p(label, xn, k, tau) - y) / tau, 0.0)
    return loss, grad


def _run(x, target, label, k, tau, reduction="none", weights=None, backend="triton"):
    xt = x.clone().requires_grad_()
    with softk.use_backend(backend):
        loss = fenchel_young_loss(xt, target, FAMS[label][0], k, reduction=reduction, tau=tau)
    (loss if weights is None else loss * weights).sum().backward()
    return loss.detach(), xt.grad


def _tol(dtype, roundings=1):
    """Relative tolerance: float32 arithmetic inside, and each rounding to a
    half dtype costs up to half its eps, except that Triton's interpreter
    truncates float32 -> bf16 (a whole eps; the GPU rounds to nearest, and
    fp16 is rounded to nearest in both).  A half gradient scaled by a per-row
    incoming gradient is rounded twice: once when the kernel writes
    (p − y)/τ, once in the backward's product."""
    half_eps = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-11}
    return 4e-6 if dtype == torch.float32 else roundings * half_eps[dtype]


def _assert_close(out, ref, dtype, atol, roundings=1):
    out = out.double().numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=_tol(dtype, roundings), atol=atol, equal_nan=True)


@pytest.mark.parametrize("kind", ["index", "dense"])
@pytest.mark.parametrize("label", LABELS)
def test_rows_match_oracle_and_the_unfused_route(rng, label, kind):
    # float32 for every family, and a half dtype taking turns (both for each target kind)
    i = LABELS.index(label) + (kind == "dense")
    for dtype in (torch.float32, (torch.bfloat16, torch.float16)[i % 2]):
        xn, target, y, keep, k = _case(rng, label, kind, dtype)
        x = torch.tensor(xn).to(dtype)
        w = torch.tensor(rng.uniform(0.5, 2.0, size=R), dtype=dtype)  # per-row incoming gradient
        tau = 0.5  # τ ≠ 1, exact in binary: x/τ is what the oracle sees, also at 1e4
        loss, grad = _run(x, target, label, k, tau, weights=w)
        assert loss.dtype == grad.dtype == dtype
        ref_loss, ref_grad = _oracle_rows(label, xn, y, keep, k, tau)
        _assert_close(loss, ref_loss, dtype, atol=2e-5)
        _assert_close(grad, ref_grad * w.double().numpy()[:, None], dtype, atol=4e-6, roundings=2)
        assert np.isposinf(loss[[1, 2] if kind == "index" else [2]].double().numpy()).all()
        assert torch.isnan(loss[4]) and torch.isnan(grad[4]).all()
        if kind == "index":
            assert loss[IGNORED] == 0 and (grad[IGNORED] == 0).all()
        # the unfused route ("torch" backend) within rounding
        u_loss, u_grad = _run(x, target, label, k, tau, weights=w, backend="torch")
        _assert_close(loss, u_loss.double().numpy(), dtype, atol=2e-5)
        _assert_close(grad, u_grad.double().numpy(), dtype, atol=4e-6, roundings=3)
