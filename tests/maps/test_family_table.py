"""entmax_by_alpha keeps one family per float α: the same object on every
call, the closed forms at α = 1, 1.5 and 2, a 0-d tensor α's own family
(the tensor path), and a bounded table that keeps the closed forms."""

import torch

from softk.threshold import families
from softk.threshold.families import ENTMAX15, SOFTMAX, SPARSEMAX, entmax_by_alpha


def test_a_float_alpha_gets_one_family():
    fam = entmax_by_alpha(1.3)
    assert fam is entmax_by_alpha(1.3)
    assert fam.name == "entmax" and fam.alpha_value == 1.3 and fam.native
    assert entmax_by_alpha(1.31) is not fam and entmax_by_alpha(1.31).alpha_value == 1.31


def test_the_closed_forms():
    assert entmax_by_alpha(1.0) is SOFTMAX and entmax_by_alpha(1) is SOFTMAX
    assert entmax_by_alpha(1.5) is ENTMAX15
    assert entmax_by_alpha(2.0) is SPARSEMAX and entmax_by_alpha(2) is SPARSEMAX
    assert entmax_by_alpha(torch.tensor(1.5)) is ENTMAX15


def test_a_tensor_alpha_keeps_its_own_family():
    entmax_by_alpha(1.3)  # a float 1.3 in the table must not answer for the tensor
    a = torch.tensor(1.3, dtype=torch.float64)
    fam = entmax_by_alpha(a)
    assert isinstance(fam.alpha, torch.Tensor) and fam.alpha is a
    assert fam is not entmax_by_alpha(1.3)


def test_the_table_is_bounded(monkeypatch):
    monkeypatch.setattr(families, "_BY_ALPHA", dict(families._BY_ALPHA))
    for i in range(3 * families._BY_ALPHA_MAX):
        fam = entmax_by_alpha(1.1 + i * 1e-4)
        assert fam.alpha_value == 1.1 + i * 1e-4
        assert len(families._BY_ALPHA) <= families._BY_ALPHA_MAX
    assert families._BY_ALPHA[1.5] is ENTMAX15 and families._BY_ALPHA[1.0] is SOFTMAX
