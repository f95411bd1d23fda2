"""The sparse attention forward's gathered λ (softk._backends.triton.attention_gather)
in the interpreter: the keys above a lower bound of λ gathered into a
per-row buffer in the max sweep (sparsemax) or in a second sweep above the
root over group maxima (entmax15, α-entmax for 1.5 ≤ α ≤ 2), λ solved on
the buffer, and p·V on the tiles holding the support only.

Against the NumPy float64 oracle (tests/oracle/attention.py), with the
buffer shrunk so that its compaction (the bound raised to the root over the
buffer) and its overflow (the row handed to the general search) both run;
a row's output does not depend on the rows sharing its program; the tile
mask handed to the backward is the oracle's support, tile by tile; and on
random inputs no row needs the general search; and a property test over
lengths, maps, spreads, masks and buffer sizes."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tri = pytest.importorskip("softk._backends.triton.attention")

from ...oracle import attention as ora  # noqa: E402

F32 = torch.float32
FAMS = {"sparsemax": 1, "entmax15": 2, "entmax": 3}


@pytest.fixture(autouse=True)
def nan_filled(monkeypatch):
    monkeypatch.setattr(tri, "_empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype,
                                                                               device=device))


def _inputs(L, S, E=16, H=2, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, L, E, generator=g) * spread
    k = torch.randn(1, H, S, E, generator=g)
    v = torch.randn(1, H, S, 8, generator=g)
    return q, k, v


def _run(q, k, v, name, alpha, causal=False, mask=None, stats=None):
    a = torch.full((q.shape[1],), float(alpha), dtype=F32)
    return tri.attention_forward(q, k, v, scale=q.shape[-1] ** -0.5, causal=causal, mask=mask, fam=FAMS[name],
                                 alpha=a, stats=stats)


def _oracle(q, k, v, name, alpha, causal=False, mask=None):
    args = [t.double().numpy() for t in (q, k, v)]
    m = None if mask is None else mask.numpy()
    return ora.attention(*args, m, causal, q.shape[-1] ** -0.5, name, alpha)[0]


CASES = [("sparsemax", 2.0), ("entmax15", 1.5), ("entmax", 1.5), ("entmax", 1.75), ("entmax", 2.0)]


@pytest.mark.parametrize("slots", [64, 16, 8])
@pytest.mark.parametrize("name,alpha", CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_gathered_lambda_matches_the_oracle(monkeypatch, slots, name, alpha, causal):
    # 8 slots: most rows compact, many overflow to the general search;
    # 16: some compact; 64: neither, at these lengths
    monkeypatch.setattr(tri, "SLOTS", slots)
    q, k, v = _inputs(70, 150)
    mask = torch.rand(1, 2, 70, 150, generator=torch.Generator().manual_seed(5)) > 0.1
    mask[0, 1, 4] = False  # a fully masked row
    stats: dict = {}
    out, m, lam = _run(q, k, v, name, alpha, causal, mask, stats)
    if slots == 8:  # the paths this size is here for ran
        assert stats["raised"].sum() > 0 and stats["searched"].sum() > 0
    elif slots == 64:
        assert stats["raised"].sum() == 0 and stats["searched"].sum() == 0
    np.testing.assert_allclose(out.double().numpy(), _oracle(q, k, v, name, alpha, causal, mask), atol=2e-5,
                               rtol=2e-5)
    assert (out[0, 1, 4] == 0).all() and lam[0, 1, 4] == float("inf")


@pytest.mark.parametrize("name,alpha", CASES[:2])
def test_a_row_does_not_depend_on_its_neighbours(monkeypatch, name, alpha):
    monkeypatch.setattr(tri, "SLOTS", 8)  # compactions and overflows, decided row by row
    q, k, v = _inputs(64, 300)
    stats: dict = {}
    alone = _run(q, k, v, name, alpha, stats=stats)[0]
    assert stats["raised"].sum() > 0 and stats["searched"].sum() > 0
    q2 = _inputs(64, 300, seed=9, spread=3.0)[0]  # peaked neighbours: they compact and search elsewhere
    keep = torch.arange(64) % 3 == 0
    q2[:, :, keep] = q[:, :, keep]
    mixed = _run(q2, k, v, name, alpha)[0]
    assert torch.equal(alone[:, :, keep], mixed[:, :, keep])


@pytest.mark.parametrize("name,alpha", CASES[:3])
def test_random_rows_need_no_search_and_the_tiles_are_the_support(name, alpha):
    q, k, v = _inputs(128, 512, E=64)
    stats: dict = {}
    _run(q, k, v, name, alpha, stats=stats)
    assert stats["passes"].max().item() == 0 and stats["searched"].max().item() == 0  # every row served by its buffer
    s = ora.scores(q.double().numpy(), k.double().numpy(), scale=0.125)
    p = ora.weights(s, name, alpha)
    want = (p.reshape(1, 2, 2, 64, 8, 64) > 0).any(axis=(3, 5)).reshape(4, 8)
    assert stats["live"].numpy().astype(bool).tolist() == want.tolist()
    assert stats["pv"].tolist() == want.sum(1).tolist()


def test_alpha_outside_the_buffer_range_takes_the_search():
    q, k, v = _inputs(64, 128, E=64)
    stats: dict = {}
    out, _, _ = _run(q, k, v, "entmax", 1.3, stats=stats)
    assert stats["passes"].min().item() > 0
    np.testing.assert_allclose(out.double().numpy(), _oracle(q, k, v, "entmax", 1.3), atol=2e-5, rtol=2e-5)


@st.composite
def _cases(draw):
    name, alpha = draw(st.sampled_from(CASES))
    L, S = draw(st.integers(1, 80)), draw(st.integers(1, 200))
    seed = draw(st.integers(0, 2**31 - 1))
    spread = draw(st.sampled_from([0.1, 1.0, 4.0]))  # flat rows (wide supports) to peaked ones
    causal = draw(st.booleans())
    masked = draw(st.booleans())
    slots = draw(st.sampled_from([8, 64]))
    return name, alpha, L, S, seed, spread, causal, masked, slots


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_property_gathered_lambda_matches_the_oracle(case):
    name, alpha, L, S, seed, spread, causal, masked, slots = case
    q, k, v = _inputs(L, S, seed=seed, spread=spread)
    mask = None
    if masked:
        mask = torch.rand(1, 2, L, S, generator=torch.Generator().manual_seed(seed + 1)) > 0.3
    old = tri.SLOTS
    tri.SLOTS = slots
    try:
        out = _run(q, k, v, name, alpha, causal, mask)[0]
    finally:
        tri.SLOTS = old
    np.testing.assert_allclose(out.double().numpy(), _oracle(q, k, v, name, alpha, causal, mask), atol=3e-5,
                               rtol=3e-5)
