"""softk.properties: the measured table agrees with the maths, each failure has
a witness recomputed by the NumPy reference, and failures of a method the
module has never seen are discovered by measuring."""

import importlib

import numpy as np
import pytest
import torch

import softk
from softk.threshold import EXP, threshold_map

from . import oracle, oracle_topk as ref

props = importlib.import_module("softk.properties")
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


@pytest.mark.parametrize("method", softk.topk.METHODS)
def test_table_matches_the_maths(method):
    got = softk.properties(method)
    assert tuple(got) == NAMES and all(isinstance(v, bool) for v in got.values())
    assert got == EXPECTED[method]


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
    topk = importlib.import_module("softk.topk")
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
