"""Which α take the anchored form of α-entmax (``needs_anchor``): a Python
float is tested without making a tensor, and must give the tensor test's
answer, at the edges 1.125 and 2 and beyond them."""

import math

import pytest
import torch

from softk.threshold.entmax_anchor import needs_anchor

EDGES = [1.0, 1.00001, 1.1249999999999998, 1.125, 1.1250000000000002, 1.5, 1.9999999999999998, 2.0,
         2.0000000000000004, 50.0, math.inf, math.nan]


@pytest.mark.parametrize("alpha", EDGES + [2, 3])
def test_a_number_gets_the_tensor_answer(alpha):
    a = float(alpha) - 1  # the rule itself, in float64: outside [0.125, 1]
    expect = a < 0.125 or a > 1
    assert needs_anchor(alpha) is expect
    assert needs_anchor(torch.tensor(alpha, dtype=torch.float64)) is expect


def test_a_tensor_of_alphas_asks_whether_any_needs_it():
    assert needs_anchor(torch.tensor([1.5, 1.7])) is False
    assert needs_anchor(torch.tensor([1.5, 1.1])) is True
