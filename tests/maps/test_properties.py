"""softk._maps.properties: the measured table agrees with the maths, each failure has
a witness recomputed by the NumPy reference, and failures of a method the
module has never seen are discovered by measuring."""

import importlib

import numpy as np
import pytest
import torch

import softk
from softk._ops.op import threshold_map
from softk.threshold import EXP

from ..oracle import maps as oracle, topk as ref

props = importlib.import_module("softk._maps.properties")
NAMES = ("sum_k", "range", "monotone", "shift_invariant", "limit_hard_topk", "k1_softmax")
ALL = dict.fromkeys(NAMES, True)

# What the maths says (each False has a witness below):
EXPECTED = {
    # the capped-simplex argmax: Σp = k, 0 ≤ p ≤ 1, monotone (f increasing),
    # shift invariant (λ absorbs the shift); k = 1 is softmax only for exp.
    "exp": ALL,
    "sigmoid": {**ALL, "k1_softmax": False},
    "laplace": {**ALL, "k1_softmax": False},
    "sparse": {**ALL, "k1_softmax": False},  # k = 1 is sparsemax
    # marginals of a k-subset distribution; e_1 = Σw gives softmax
    "grad": ALL,
    # k softmaxes (Σ = k), shifted by min z, first round is softmax
    "iterative": {**ALL, "range": False, "monotone": False},
    "weighted": {**ALL, "range": False, "monotone": False, "limit_hard_topk": False},
}


# shift_invariant is measured at exact offsets up to ±7e13 (float64): every
# method holds it on both CPU backends (rows are shifted before τ).


@pytest.mark.parametrize("method", softk._maps.soft_topk.METHODS)
def test_table_matches_the_maths(method):
    got = softk.properties(method)
    assert tuple(got) == NAMES and all(isinstance(v, bool) for v in got.values())
    without_shift = lambda d: {k: v for k, v in d.items() if k != "shift_invariant"}  # noqa: E731
    assert without_shift(got) == without_shift(EXPECTED[method])


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("method", softk._maps.soft_topk.METHODS)
def test_shift_invariant_at_large_offsets(backend, method):
    with softk.use_backend(backend):
        v = softk.property_violations(method)["shift_invariant"]
    assert v <= 1e-6  # properties()' default tol


def test_shifted_rows_are_exact():
    # z + c is exactly representable for every shift, so the exact map gives the
    # same p and any measured difference is the implementation's rounding.
    assert max(props._SHIFTS) * torch.finfo(torch.float64).eps == 2.0**-6
    for _, z, _ in props._inputs(0):
        zr, shifted = props._shifted_rows(z)
        assert (zr - z).abs().max() <= props._SHIFT_GRID / 2
        back = shifted.reshape(-1, *zr.shape) - torch.tensor([s * c for c in props._SHIFTS for s in (1.0, -1.0)],
                                                             dtype=torch.float64)[:, None, None]
        assert torch.equal(back, zr.expand_as(back))


def test_shift_measurement_catches_a_precision_loss(monkeypatch):
    """A method that is shift invariant in exact arithmetic but rounds its input
    to float32 (as a solver on raw rows loses c·eps) is reported, while the
    other properties, measured near the origin, still hold."""
    topk = importlib.import_module("softk._maps.soft_topk")
    fake = lambda x, k, dim, tau: threshold_map(x.float(), EXP, k, dim, tau).double()  # noqa: E731
    registry = {**topk._REGISTRY, "fake_float32": fake}
    monkeypatch.setattr(topk, "_REGISTRY", registry)
    monkeypatch.setattr(topk, "METHODS", tuple(registry))
    monkeypatch.setattr(props, "METHODS", tuple(registry))
    v = softk.property_violations("fake_float32")
    assert v["shift_invariant"] > 0.1  # z + 7e13 in float32 keeps no digit of z
    assert v["sum_k"] < 1e-5 and v["k1_softmax"] < 1e-5


def test_shifted_solver_is_bit_identical():
    # the compiled exp kernel and GradTopK work on shifted rows: exactly 0
    with softk.use_backend("native"):
        assert softk.property_violations("exp")["shift_invariant"] == 0.0
    assert softk.property_violations("grad")["shift_invariant"] == 0.0


def test_witnesses_from_the_reference():
    x = np.array([3.0, 2.0, 1.0, 0.0])
    p = ref.iterative(x, 2, tau=0.3)
    assert p[1] > p[0] + 0.02  # iterative: not monotone
    assert ref.iterative(np.array([0.0, 0.0, 0.0, 5.0]), 2, tau=0.3)[3] > 1.2  # iterative: p > 1
    q = ref.weighted(x, 2, tau=0.05)
    np.testing.assert_allclose(q[:2], [1.5, 0.5], atol=1e-6)  # weighted: p > 1 and wrong limit
    q = ref.weighted(x, 3, tau=1.0)
    assert q[1] > q[0] + 0.005  # weighted: not monotone
    z = np.array([[1.0, 0.2, -0.5, 2.0]])
    for method in ("sigmoid", "laplace", "sparse"):
        assert np.abs(oracle.soft_topk(z, 1, method=method) - oracle.softmax(z)).max() > 1e-3


def test_violations_are_numbers_and_tolerances_apply():
    v = softk.property_violations("sigmoid")
    assert set(v) == set(NAMES) and all(isinstance(t, float) and t >= 0 for t in v.values())
    # the smooth limit is measured, not assumed: sigmoid is σ(−10) ≈ 4.5e−5 away
    # at τ = 1/20 (gaps of 1, λ half-way), so a tighter limit_tol rejects it
    assert 1e-5 < v["limit_hard_topk"] < 1e-4
    assert softk.properties("sigmoid", limit_tol=1e-6)["limit_hard_topk"] is False
    assert softk.properties("sigmoid", limit_tol=1e-3)["limit_hard_topk"] is True


def test_deterministic_and_seeded():
    assert softk.property_violations("iterative") == softk.property_violations("iterative", seed=0)
    assert softk.properties("exp", seed=3) == EXPECTED["exp"]


@pytest.fixture
def fake_methods(monkeypatch):
    """Register methods the property module has never heard of."""
    topk = importlib.import_module("softk._maps.soft_topk")
    fakes = {
        # scales the exp map: Σp ≠ k, p > 1 where p = 1, and no longer softmax
        "fake_scaled": lambda x, k, dim, tau: 1.01 * threshold_map(x, EXP, k, dim, tau),
        # selects the *smallest* entries: not monotone, wrong limit
        "fake_reversed": lambda x, k, dim, tau: threshold_map(-x, EXP, k, dim, tau),
        # depends on the level of the scores
        "fake_level": lambda x, k, dim, tau: threshold_map(x * (1 + x.mean(dim, keepdim=True).abs()), EXP, k, dim, tau),
    }
    registry = {**topk._REGISTRY, **fakes}
    monkeypatch.setattr(topk, "_REGISTRY", registry)
    monkeypatch.setattr(topk, "METHODS", tuple(registry))
    monkeypatch.setattr(props, "METHODS", tuple(registry))
    return fakes


def test_failures_are_discovered_by_measuring(fake_methods):
    scaled = softk.properties("fake_scaled")
    assert not scaled["sum_k"] and not scaled["range"] and not scaled["k1_softmax"]
    assert scaled["monotone"] and scaled["shift_invariant"]
    rev = softk.properties("fake_reversed")
    assert not rev["monotone"] and not rev["limit_hard_topk"] and not rev["k1_softmax"]
    assert rev["sum_k"] and rev["range"] and rev["shift_invariant"]
    level = softk.properties("fake_level")
    assert not level["shift_invariant"] and level["sum_k"] and level["range"]


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="method"):
        softk.properties("softmax")
    with pytest.raises(ValueError, match="tol"):
        softk.properties("exp", tol=0.0)
    with pytest.raises(ValueError, match="limit_tol"):
        softk.properties("exp", limit_tol=-1.0)
    with pytest.raises(TypeError, match="seed"):
        softk.property_violations("exp", seed=1.5)


def test_module_inputs_are_float64():
    # The table is measured in float64.
    for _, z, lim in props._inputs(0):
        assert z.dtype == torch.float64 and lim.dtype == torch.float64


def test_the_seed_is_an_int_at_least_zero():
    # numpy's integers pass; a negative seed is refused by name, where numpy's
    # generator raised its own "expected non-negative integer"
    import numpy as np

    assert softk.property_violations("sparse", seed=np.int64(1)) == softk.property_violations("sparse", seed=1)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        softk.property_violations("sparse", seed=-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        softk.property_violations("sparse", seed=1.0)
