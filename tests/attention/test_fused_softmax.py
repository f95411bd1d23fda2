"""map="softmax" on the blockwise backend through torch's fused CPU kernel
(softk._backends.blockwise.fused): the output and the gradients against the
NumPy float64 oracle with masks (bool, float, broadcast, fully masked rows),
causal, GQA (H_kv = H, a divisor, 1), L != S and a scale; which calls take
the route; and the route switched off gives the same answers."""

import numpy as np
import pytest
import torch

import softk
from softk._backends.blockwise import fused, rows
from softk.threshold.attention_maps import SOFTMAX_ID

from ..oracle import attention as ora
from .test_attention import close, one_thread, run  # noqa: F401

F64 = torch.float64


@pytest.fixture
def taken(monkeypatch):
    """Counts the fused forward and backward calls."""
    calls = {"forward": 0, "backward": 0}
    fwd, bwd = fused.attention_forward, fused.attention_backward

    def forward(*a, **kw):
        calls["forward"] += 1
        return fwd(*a, **kw)

    def backward(*a, **kw):
        calls["backward"] += 1
        return bwd(*a, **kw)

    monkeypatch.setattr(fused, "attention_forward", forward)
    monkeypatch.setattr(fused, "attention_backward", backward)
    return calls


def _mask(kind, B, H, L, S, dtype, dead=(2,)):
    m = torch.rand(B, H, L, S, generator=torch.Generator().manual_seed(5)) > 0.4
    for r in dead:
        m[:, :, r] = False  # a query with no key: output 0, zero gradients
    if kind is None:
        return None
    if kind == "bool":
        return m
    if kind == "bool_broadcast":  # one (L, S) mask for every batch and head
        return m[0, 0]
    return torch.zeros(B, H, L, S, dtype=dtype).masked_fill(~m, float("-inf"))


@pytest.mark.parametrize("dtype,atol", [(F64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("hkv", [4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [None, "bool", "bool_broadcast", "float"])
@pytest.mark.parametrize("L,S", [(17, 29), (29, 17)])
def test_fused_softmax_matches_oracle(taken, dtype, atol, hkv, causal, mask, L, S):
    B, H, E = 2, 4, 8
    g = torch.Generator().manual_seed(L + 7 * hkv)
    q, k, v = (torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()
               for shape in ((B, H, L, E), (B, hkv, S, E), (B, hkv, S, E)))
    m = _mask(mask, B, H, L, S, dtype)
    out = run("blockwise", q, k, v, attn_mask=m, is_causal=causal, enable_gqa=True, map="softmax", scale=0.4)
    dout = torch.randn(out.shape, generator=g, dtype=dtype)
    got = torch.autograd.grad(out, [q, k, v], dout)
    assert taken == {"forward": 1, "backward": 1}
    args = [t.detach().to(F64).numpy() for t in (q, k, v)]
    m_np = None if m is None else (m.numpy() if m.dtype == torch.bool else m.to(F64).numpy())
    close(out.detach(), ora.attention(*args, m_np, causal, 0.4, "softmax")[0], atol=atol, rtol=atol)
    for a, want in zip(got, ora.grads(*args, dout.to(F64).numpy(), m_np, causal, 0.4, "softmax")):
        close(a, want, atol=atol, rtol=atol)
    if mask is not None:  # the fully masked query: output 0 and no gradient, not NaN
        assert (out[:, :, 2] == 0).all()
        assert (got[0][:, :, 2] == 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_fused_and_whole_rows_agree(monkeypatch, causal):
    q, k, v = (torch.randn(1, 4, 40, 16, generator=torch.Generator().manual_seed(i), dtype=F64).requires_grad_()
               for i in range(3))
    mask = _mask("bool", 1, 4, 40, 40, F64, dead=(0, 9))
    res = []
    for on in (True, False):
        monkeypatch.setattr(fused, "ENABLED", on)
        out = run("blockwise", q, k, v, attn_mask=mask, is_causal=causal, map="softmax")
        res.append([out] + list(torch.autograd.grad(out, [q, k, v], torch.ones_like(out))))
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("where", ["q", "k", "mask_nan"])
def test_a_nan_score_keeps_its_row_nan(taken, where):
    # the fused kernel would give a query row with a NaN score 0: such calls keep the whole score rows
    q, k, v = (torch.randn(1, 2, 16, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    mask = torch.zeros(16, 16)
    if where == "q":
        q[0, 1, 3, 0] = float("nan")
    elif where == "k":
        k[0, 1, 2, 0] = float("nan")
    else:
        mask[3, 1] = float("nan")
    out = run("blockwise", q, k, v, attn_mask=mask, map="softmax")
    assert taken["forward"] == 0
    assert torch.isnan(out[0, 1, 3]).all()
    if where != "k":
        assert not torch.isnan(out[0, :, :3]).any()


def test_which_calls_take_it():
    q = torch.randn(1, 2, 16, 4)
    kv = torch.randn(1, 2, 5, 4)
    assert fused.serves(q, kv, kv, None, SOFTMAX_ID, 0.0)
    assert fused.serves(q, kv, kv, torch.ones(1, 2, 16, 5, dtype=torch.bool), SOFTMAX_ID, 0.0)
    assert not fused.serves(q[:, :, :15], kv, kv, None, SOFTMAX_ID, 0.0)  # decoding keeps whole score rows
    assert not fused.serves(q, kv, kv, None, SOFTMAX_ID + 1, 0.0)  # a sparse map
    assert not fused.serves(q, kv, kv, None, SOFTMAX_ID, 5.0)  # a soft cap
    assert not fused.serves(q, kv, torch.randn(1, 2, 5, 3), None, SOFTMAX_ID, 0.0)  # Ev != E
    h = q.to(torch.bfloat16), kv.to(torch.bfloat16)
    assert not fused.serves(h[0], h[1], h[1], None, SOFTMAX_ID, 0.0)  # half precision computes in float32


def test_bool_mask_is_converted_on_its_own_entries():
    m = torch.rand(6, 7) > 0.5
    add = fused.additive(m.expand(3, 4, 6, 7), torch.float32)
    assert add.shape == (3, 4, 6, 7) and add.stride()[:2] == (0, 0)
    np.testing.assert_array_equal(add[2, 3].numpy(), np.where(m.numpy(), 0.0, -np.inf))


def test_whole_rows_still_serve_the_rest():
    # the route takes only the softmax: the sparse maps keep the whole score rows
    q = torch.randn(1, 2, 3, 4)
    assert rows.serves(q, 5)


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t's values with a head dimension that is not packed: stored
    transposed, a slice of every other entry, or expanded from one entry."""
    if layout == "transposed":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "sliced":
        return torch.stack([t, torch.zeros_like(t)], -1).flatten(-2)[..., ::2]
    return t[..., :1].expand(t.shape)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded"])
@pytest.mark.parametrize("which", ["q", "k", "v", "dout"])
def test_a_head_dimension_that_is_not_packed(taken, layout, which):
    # the fused kernel reads the head dimension as packed without checking:
    # a transposed key cache (k = kᵀ.transpose(-1, -2)) gave errors of 1-2
    # on O(1) outputs, and gradients as far off
    B, H, L, S, E = 2, 3, 20, 24, 8
    g = torch.Generator().manual_seed(3)
    base = {n: torch.randn(*shape, generator=g, dtype=F64)
            for n, shape in (("q", (B, H, L, E)), ("k", (B, H, S, E)), ("v", (B, H, S, E)), ("dout", (B, H, L, E)))}
    if which != "dout":
        base[which] = _laid_out(base[which], layout)
        assert base[which].stride(-1) != 1
    q, k, v = (base[n].clone() if base[n].stride(-1) == 1 else base[n] for n in "qkv")
    q, k, v = (t.requires_grad_() if t.is_leaf else t for t in (q, k, v))
    leaves = [t for t in (q, k, v) if t.requires_grad]
    out = softk.scaled_dot_product_attention(q, k, v, map="softmax", is_causal=True)  # the CPU's default route
    dout = _laid_out(base["dout"], layout) if which == "dout" else base["dout"]
    got = torch.autograd.grad(out, leaves, dout)
    assert taken == {"forward": 1, "backward": 1}
    args = [t.detach().numpy() for t in (q, k, v)]
    close(out.detach(), ora.attention(*args, None, True, None, "softmax")[0], atol=1e-10, rtol=1e-10)
    want = ora.grads(*args, dout.numpy(), None, True, None, "softmax")
    for a, w in zip(got, [w for t, w in zip((q, k, v), want) if t.requires_grad]):
        close(a, w, atol=1e-10, rtol=1e-10)
