"""The compiled CPU kernels on narrow rows (router and small-vocabulary
widths), which they solve LANES = 16 rows at a time, one row per vector lane,
against the NumPy float64 oracle (bisection, independent of the kernels).

What a lane-parallel solve can get wrong and a row-at-a-time one cannot:
a lane that stops early must keep its λ while its neighbours go on, a row
that takes a convention (NaN, +inf, fully masked, at most k finite entries)
must not disturb the others, the last group of fewer than 16 rows must be
written in full and nothing past it.  So the batches here mix rows of very
different scales and offsets (they stop after different rounds), put
convention rows at chosen lanes, and have row counts that leave a partial
group.  Outputs are pre-filled with NaN (an unwritten entry cannot pass),
and the output tensor carries a NaN guard row past the batch.
"""

import numpy as np
import pytest
import torch

import softk
from softk._backends import native
from softk.threshold import ENTMAX15, EXP, SOFTMAX, SPARSEMAX, entmax_family

from ..oracle import maps as oracle
from .test_native import TOL, reference

pytestmark = pytest.mark.skipif(not softk._backends.registry.native_available(), reason="needs a C compiler")

# Widths to one past each family's narrow limit (64 for "exp", 128 for
# softmax and entmax α > 1.25, 256 for sparsemax, entmax15 and entmax α ≤
# 1.25), where the row code takes over.
WIDTHS = [1, 2, 3, 5, 8, 15, 16, 17, 31, 32, 33, 48, 64, 65, 100, 127, 128, 129, 200, 256, 257]
FAMILIES = [("sparsemax", SPARSEMAX), ("entmax15", ENTMAX15)] + [
    (f"entmax{a}", entmax_family(a)) for a in (1.125, 1.3, 1.5, 1.75, 2.0)
]
# soft top-k "exp" and softmax take the narrow forward too (their backward is two dense passes already)
FORWARD = FAMILIES + [("exp", EXP), ("softmax", SOFTMAX)]


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    monkeypatch.setattr(native, "_empty", lambda like: torch.full_like(like, float("nan")))


def _ks(name, n):
    if name == "softmax":
        return [1, 3] if n > 3 else [1]
    return [k for k in (1, 2, 5) if k < n] or [1] if name in ("sparsemax", "exp") else [1]


def _mixed_rows(rng, rows, n):
    """Rows whose solves stop after different numbers of rounds: scales from
    1e-3 (nearly uniform: a wide support) to 1e3 (one entry), offsets up to
    1e6, a few ties at the top."""
    scale = 10.0 ** rng.uniform(-3, 3, size=(rows, 1))
    offset = rng.choice([0.0, 1e4, -1e6], size=(rows, 1))
    x = rng.normal(size=(rows, n)) * scale
    x[::7, : min(3, n)] = x[::7, :1]  # ties at the top
    return x + offset


def _shifted_reference(name, x, k):
    """The oracle on rows shifted by their finite maximum (exact, and the
    maps are shift invariant), so its bisection is not limited by the
    offset's ulp."""
    finite = np.isfinite(x)
    top = np.max(np.where(finite, x, -np.inf), axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return reference(name, np.where(np.isnan(x) | np.isposinf(x), x, x - top), k)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name,family", FORWARD)
@pytest.mark.parametrize("n", WIDTHS)
def test_mixed_rows_against_oracle(rng, dtype, name, family, n):
    """37 rows: two full groups of 16 and one of 5."""
    x = torch.tensor(_mixed_rows(rng, 37, n), dtype=dtype)
    for k in _ks(name, n):
        p = native.forward(family, x, k)
        ref = _shifted_reference(name, x.double().numpy(), k)
        np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name,family", FORWARD)
@pytest.mark.parametrize("n", [2, 16, 33, 128])
def test_convention_rows_in_every_lane(rng, dtype, name, family, n):
    """Each kind of convention row at lanes 0, 5 and 15 of a group, among
    ordinary rows; the ordinary rows must match the oracle and the
    convention rows their convention."""
    inf, nan = np.inf, np.nan
    kinds = {
        "nan": np.r_[0.5, nan, np.zeros(n - 2)],
        "posinf": np.r_[np.zeros(n - 1), inf],
        "masked": np.full(n, -inf),
        "one": np.r_[np.full(n - 1, -inf), 3.0],
        "two": np.r_[2.0, np.full(n - 2, -inf), -1.0],
    }
    for kind, row in kinds.items():
        for lane in (0, 5, 15):
            x = rng.normal(size=(21, n))
            x[lane] = row
            x[lane + 1, ::2] = -inf  # a partly masked neighbour
            x[lane + 1, 1] = 0.0
            xt = torch.tensor(x, dtype=dtype)
            # k = 2: the row of two finite entries has at most k, so 1 on both
            for k in (1, 2) if name in ("sparsemax", "exp") else (1,):
                p = native.forward(family, xt, k).double().numpy()
                ref = _shifted_reference(name, x, k)
                msg = f"{kind} at lane {lane}, k = {k}"
                np.testing.assert_allclose(p, ref, rtol=0, atol=TOL[dtype], equal_nan=True, err_msg=msg)
                if kind in ("nan", "posinf"):
                    assert np.isnan(p[lane]).all()


@pytest.mark.parametrize("name,family", FORWARD)
def test_partial_group_writes_its_rows_only(rng, name, family):
    """A batch of 3 rows, viewed out of a larger NaN-filled buffer: the rows
    are written in full and the row after them is untouched."""
    n = 10
    x = torch.tensor(rng.normal(size=(3, n)))
    buf = torch.full((4, n), float("nan"), dtype=torch.float64)
    native.forward(family, x, 1, out=buf[:3])
    np.testing.assert_allclose(buf[:3].numpy(), reference(name, x.numpy(), 1), rtol=0, atol=TOL[torch.float64])
    assert torch.isnan(buf[3]).all()


def test_sparsemax_ties_at_the_threshold_in_lanes():
    """Entries exactly at λ (p = 0 there) in every lane of a group: the
    support test must not stall on them, in any lane."""
    rows = [[1.5, 0.5, 0.0, -3.0], [1.0, 1.0, 0.0, -1.0]] * 9
    x = torch.tensor(rows, dtype=torch.float64)
    for k in (1, 2):
        p = native.forward(SPARSEMAX, x, k)
        np.testing.assert_allclose(p.numpy(), reference("sparsemax", x.numpy(), k), rtol=0, atol=1e-15)


@pytest.mark.parametrize("name,family", FORWARD)
def test_a_row_does_not_depend_on_its_neighbours(rng, name, family):
    """The same row alone and in each lane of a batch of other rows gives
    bit-identical p."""
    n = 24
    row = torch.tensor(rng.normal(size=(1, n)), dtype=torch.float32)
    alone = native.forward(family, row, 1)
    for lane in (0, 7, 15, 16, 19):
        batch = torch.tensor(_mixed_rows(rng, 20, n), dtype=torch.float32)
        batch[lane] = row[0]
        assert torch.equal(native.forward(family, batch, 1)[lane], alone[0])


@pytest.mark.parametrize("name,family", FAMILIES)
@pytest.mark.parametrize("n", [2, 16, 33, 64])
def test_backward_against_oracle_jacobian(rng, name, family, n):
    """The vjp on narrow rows (two dense passes; wide rows find the support
    first) = gᵀ J with J the oracle's central-difference Jacobian, on rows
    with masked entries, in float64 and float32.  (k = 2 only where every
    row has more than 2 finite entries: below, the convention's p = 1 on
    them is a definition, which the kernels do not differentiate.)"""
    k = 2 if name == "sparsemax" and n >= 16 else 1
    x = rng.normal(size=(3, n)) * 1.5
    x[1, ::3] = -np.inf
    x[1, 1] = 0.0
    g = rng.normal(size=(3, n))
    want = []
    for row, gr in zip(x, g):
        jac = oracle.numerical_jacobian(lambda r: reference(name, r[None], k)[0], row, eps=1e-6)
        want.append(gr @ np.where(np.isfinite(jac), jac, 0.0))
    want = np.stack(want)
    for dtype, atol in ((torch.float64, 2e-6), (torch.float32, 2e-5)):
        p = native.forward(family, torch.tensor(x, dtype=dtype), k)
        for tau in (1.0, 0.5):
            got = native.backward(family, p, torch.tensor(g, dtype=dtype), tau).double().numpy()
            np.testing.assert_allclose(got, want / tau, rtol=0, atol=atol * max(1.0, float(np.abs(g).max())))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name,family", FAMILIES)
def test_backward_of_convention_rows(dtype, name, family):
    """A NaN row's gradient is NaN; a fully masked row's and a one-entry
    row's are 0 (Σd there is 0, or d is 1 on one entry: g − g)."""
    n = 12
    x = torch.tensor([[0.5, float("nan")] + [0.0] * (n - 2), [float("-inf")] * n,
                      [float("-inf")] * (n - 1) + [2.0], list(range(n))], dtype=dtype)
    p = native.forward(family, x, 1)
    g = torch.arange(4 * n, dtype=dtype).reshape(4, n) - 20
    dx = native.backward(family, p, g, 1.0)
    assert torch.isnan(dx[0]).all()
    assert torch.equal(dx[1:3], torch.zeros(2, n, dtype=dtype))
    assert torch.isfinite(dx[3]).all()


def _vjp(name, p, g, tau):
    """d ⊙ (g − Σ(d g)/Σd)/τ with d = f′(u) written in p (NumPy, float64):
    1 on the support (sparsemax), √p (entmax15), p^{2−α} (entmax α)."""
    alpha = 2.0 if name == "sparsemax" else 1.5 if name == "entmax15" else float(name[len("entmax"):])
    d = np.where(p > 0, np.power(np.where(p > 0, p, 1.0), 2.0 - alpha), 0.0)
    coef = (d * g).sum(-1, keepdims=True) / d.sum(-1, keepdims=True)
    return d * (g - coef) / tau


@pytest.mark.parametrize("name,family", FAMILIES)
@pytest.mark.parametrize("n", [129, 300, 1024, 1025])
def test_backward_on_both_sides_of_the_dense_limit(rng, name, family, n):
    """Rows up to 1024 take two dense passes, wider ones the support's
    index list: both against the vjp written from the oracle's p."""
    x = rng.normal(size=(5, n)) * np.array([[0.1], [1.0], [3.0], [10.0], [1.0]])
    x[4, ::2] = -np.inf
    g = rng.normal(size=(5, n))
    ref_p = _shifted_reference(name, x, 1)
    for dtype, atol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        p = native.forward(family, torch.tensor(x, dtype=dtype), 1)
        for tau in (1.0, 0.5):
            got = native.backward(family, p, torch.tensor(g, dtype=dtype), tau).double().numpy()
            np.testing.assert_allclose(got, _vjp(name, ref_p, g, tau), rtol=0, atol=atol * float(np.abs(g).max()) / tau)


@pytest.mark.parametrize("name,family", FAMILIES)
def test_backward_over_several_blocks_of_rows(rng, name, family):
    """Short rows go through the backward in blocks of whole rows (2048
    entries): 300 rows of 8 make two blocks, the second partial."""
    x = rng.normal(size=(300, 8)) * 2
    x[::17, ::3] = -np.inf
    g = rng.normal(size=(300, 8))
    ref_p = _shifted_reference(name, x, 1)
    p = native.forward(family, torch.tensor(x), 1)
    got = native.backward(family, p, torch.tensor(g), 0.5).numpy()
    np.testing.assert_allclose(got, _vjp(name, ref_p, g, 0.5), rtol=0, atol=1e-12 * float(np.abs(g).max()) / 0.5)
