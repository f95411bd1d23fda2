"""The whole-row attention's backward for α-entmax away from α = 1 forms p
elementwise from the forward's row maximum and shifted threshold
(softk._backends.blockwise.rows.closed_form) where the rows have no native
kernel, instead of mapping the rows again: gradients (dα too) against the
NumPy float64 oracle, and in float32 against the backward that maps the rows
again.  Where the native kernel serves, the rows are mapped again."""

import numpy as np
import pytest
import torch

from softk._backends import registry
from softk._backends.blockwise import rows
from softk.threshold.attention_maps import ENTMAX_ID, SPARSEMAX_ID

from ..oracle import attention as ora
from .test_attention import bool_mask, close, one_thread, run  # noqa: F401

F64 = torch.float64


def test_which_calls_take_the_closed_form():
    t = torch.tensor
    assert rows.closed_form(ENTMAX_ID, t([1.3, 1.5, 2.0], dtype=F64))
    assert rows.closed_form(ENTMAX_ID, t([1.125]))
    assert not rows.closed_form(ENTMAX_ID, t([1.3, 1.05]))  # one head near 1: every row is mapped again
    assert not rows.closed_form(ENTMAX_ID, t([2.5], dtype=F64))
    assert not rows.closed_form(ENTMAX_ID, None)
    assert not rows.closed_form(SPARSEMAX_ID, t([1.3]))


def test_the_native_kernel_maps_the_rows_again(monkeypatch):
    """The closed form is taken only where the rows' native kernel does not serve."""
    a, f32 = torch.tensor([1.3, 1.5]), torch.empty(0)
    if registry.native_available():
        assert not rows.reads_threshold(ENTMAX_ID, a, f32)
        assert not rows.reads_threshold(ENTMAX_ID, a, f32.double())
    monkeypatch.setattr(registry, "native_available", lambda: False)
    assert rows.reads_threshold(ENTMAX_ID, a, f32)
    assert not rows.reads_threshold(ENTMAX_ID, torch.tensor([1.05]), f32)


def _force_closed_form(monkeypatch):
    monkeypatch.setattr(rows, "reads_threshold", lambda fam, a, scores: rows.closed_form(fam, a))


def _leaves(B=1, H=4, Hkv=2, L=13, S=21, E=6, Ev=3, seed=0, dtype=F64, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g, dtype=dtype) * spread).requires_grad_()
            for shape in ((B, H, L, E), (B, Hkv, S, E), (B, Hkv, S, Ev))]


@pytest.mark.parametrize("causal", [False, True])
def test_closed_form_grads_match_the_oracle(monkeypatch, causal):
    _force_closed_form(monkeypatch)
    taken = []
    real = rows._entmax_probs
    monkeypatch.setattr(rows, "_entmax_probs", lambda *a: taken.append(1) or real(*a))
    q, k, v = _leaves()
    mask = bool_mask(13, 21, dead_rows=(4,))
    alphas = [1.2, 1.5, 2.0, 1.7]
    a = torch.tensor(alphas, dtype=F64, requires_grad=True)
    out = run("blockwise", q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, map="entmax", alpha=a)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    got = torch.autograd.grad(out, [q, k, v, a], dout)
    assert taken
    args = (q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), dout.numpy())
    for g, want in zip(got, ora.grads(*args, mask.numpy(), causal, None, "entmax", np.array(alphas))):
        close(g, want)
    close(got[3], ora.dalpha(*args, np.array(alphas), mask.numpy(), causal), atol=1e-6, rtol=1e-6)
    assert (got[0][:, :, 4] == 0).all()  # the fully masked query


@pytest.mark.parametrize("alpha", [1.13, 1.3, 2.0])
@pytest.mark.parametrize("spread", [1.0, 3.0])
def test_closed_form_float32_grads_match_mapping_the_rows_again(monkeypatch, alpha, spread):
    """float32, rows of 300 keys, peaked (spread 3) or not: the closed form's
    gradients against the backward that maps the rows again, both against the
    float64 oracle."""
    q, k, v = _leaves(L=40, S=300, E=16, Ev=8, seed=5, dtype=torch.float32, spread=spread)
    dout = torch.randn(1, 4, 40, 8, generator=torch.Generator().manual_seed(6))

    def grads():
        out = run("blockwise", q, k, v, is_causal=True, enable_gqa=True, map="entmax", alpha=alpha)
        return torch.autograd.grad(out, [q, k, v], dout)

    _force_closed_form(monkeypatch)
    closed = grads()
    monkeypatch.setattr(rows, "reads_threshold", lambda fam, a, scores: False)
    mapped = grads()
    want = ora.grads(*(t.detach().double().numpy() for t in (q, k, v, dout)), None, True, None, "entmax",
                     np.full(4, alpha))
    for c, m, w in zip(closed, mapped, want):
        scale = np.abs(w).max()
        err_closed = np.abs(c.double().numpy() - w).max() / scale
        err_mapped = np.abs(m.double().numpy() - w).max() / scale
        assert err_closed < 2e-5, (err_closed, err_mapped)
        assert err_closed <= 4 * err_mapped + 1e-6, (err_closed, err_mapped)
