"""The products over each group's live keys (softk._backends.blockwise.support.Live),
with the products over each row's nonzeros that the CPU kernels take first
turned off:
the keys a group of query rows weights, the product and the scatter against
float64 NumPy sums, when they are taken, and whole calls that take them at
the default settings (sparsemax, long rows) against the float64 oracle,
forward and gradients, with masks, causal, GQA; the soft cap through them
against the reference backend."""

import numpy as np
import pytest
import torch

import softk
from softk._backends.blockwise import support

from ..oracle import attention as ora
from .test_attention import close, one_thread, run  # noqa: F401

F64 = torch.float64


def sparse_p(shape, share, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(shape, generator=g, dtype=dtype)
    return torch.where(torch.rand(shape, generator=g, dtype=dtype) < share, p, 0.0)


@pytest.fixture(autouse=True)
def no_row_products(monkeypatch):
    """The products over each row's nonzeros (support.rows_sparse), which the
    CPU kernels take before the live keys, turned off: these tests are of the
    live keys' path, the one taken where those kernels are not built."""
    monkeypatch.setattr(support, "ROW_SHARE", -1.0)


@pytest.fixture
def spy(monkeypatch):
    """The Live objects made, in order (None where the dense products ran)."""
    made = []
    of = support.Live.of.__func__

    def record(cls, *a, **kw):
        made.append(of(cls, *a, **kw))
        return made[-1]

    monkeypatch.setattr(support.Live, "of", classmethod(record))
    return made


def test_live_keys_are_each_groups_union_of_supports_first(monkeypatch):
    monkeypatch.setattr(support, "GROUP", 4)
    p = sparse_p((2, 3, 8, 50), 0.05)
    p[1, 2, :4] = 0.0  # a group that weights no key
    live = support.Live.of(p, True, float("inf"))
    B, Hkv, n, g, U = live.shape
    assert (n, g) == (2, 4)
    want = (p.reshape(2, 3, 2, 4, 50) != 0).any(-2)
    assert U == int(want.sum(-1).max())
    for b in range(2):
        for h in range(3):
            for i in range(2):
                keys = live.keys[b, h, i].tolist()
                cnt = int(want[b, h, i].sum())
                assert keys[:cnt] == want[b, h, i].nonzero().squeeze(1).tolist()  # the live keys, in order
                assert len(set(keys)) == U and not want[b, h, i, keys[cnt:]].any()  # then keys it does not weight


@pytest.mark.parametrize("vshape", [(2, 3, 50, 5), (1, 3, 50, 5), (2, 1, 50, 5), (2, 3, 61, 5)])
def test_live_product_and_scatter_equal_the_dense_sums(monkeypatch, vshape):
    monkeypatch.setattr(support, "GROUP", 4)
    p = sparse_p((2, 3, 8, 50), 0.1)
    v = torch.randn(vshape, generator=torch.Generator().manual_seed(1), dtype=F64)
    live = support.Live.of(p, True, float("inf"))
    vb = v.expand(2, 3, *vshape[2:])[:, :, :50]
    np.testing.assert_allclose(live.product(p, v).numpy(), (p @ vb).numpy(), rtol=0, atol=1e-13)
    do = torch.randn(2, 3, 8, 5, generator=torch.Generator().manual_seed(2), dtype=F64)
    acc = torch.zeros(2, 3, vshape[2], 5, dtype=F64)
    live.add(acc, live.weights(p).transpose(-1, -2) @ do.reshape(2, 3, 2, 4, 5))
    want = torch.zeros_like(acc)
    want[:, :, :50] = p.transpose(-1, -2) @ do
    np.testing.assert_allclose(acc.numpy(), want.numpy(), rtol=0, atol=1e-13)


def test_when_live_keys_are_taken(monkeypatch):
    monkeypatch.setattr(support, "GROUP", 4)
    p = sparse_p((1, 2, 8, 100), 0.02)
    assert support.Live.of(p, False) is None  # the softmax: no zeros
    assert support.Live.of(p, True, 0.5) is not None
    assert support.Live.of(p, True, 0.0) is None  # more live keys than the share
    assert support.Live.of(p[:, :, :6], True, float("inf")).shape[3] == 6  # rows not a multiple: one group
    nan = p.clone()
    nan[0, 1, 5, 7] = float("nan")
    live = support.Live.of(nan, True, float("inf"))
    assert 7 in live.keys[0, 1, 1].tolist()  # a NaN weight keeps its key: the row stays NaN


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [2, 1])
def test_sparsemax_over_live_keys_matches_oracle(spy, causal, hkv):
    # long rows and a narrow support: the default thresholds take the live keys, forward and backward
    B, H, L, S, E = 1, 2, 640, 640, 16
    g = torch.Generator().manual_seed(hkv)
    q, k, v = (torch.randn(*shape, generator=g, dtype=F64).requires_grad_()
               for shape in ((B, H, L, E), (B, hkv, S, E), (B, hkv, S, E)))
    mask = torch.rand(L, S, generator=g) > 0.2
    mask[5] = False  # a query with no key
    out = run("blockwise", q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, map="sparsemax", scale=4.0)
    assert spy and all(live is not None for live in spy)
    n_fwd = len(spy)
    dout = torch.randn(out.shape, generator=g, dtype=F64)
    got = torch.autograd.grad(out, [q, k, v], dout)
    assert len(spy) > n_fwd and all(live is not None for live in spy)
    args = [t.detach().numpy() for t in (q, k, v)]
    close(out.detach(), ora.attention(*args, mask.numpy(), causal, 4.0, "sparsemax")[0])
    for a, want in zip(got, ora.grads(*args, dout.numpy(), mask.numpy(), causal, 4.0, "sparsemax")):
        close(a, want)
    assert (out[:, :, 5] == 0).all() and (got[0][:, :, 5] == 0).all()


@pytest.mark.parametrize("name,alpha", [("sparsemax", None), ("entmax15", None), ("entmax", "learned")])
def test_softcap_through_live_keys_is_the_reference(monkeypatch, spy, name, alpha):
    monkeypatch.setattr(support, "GROUP", 2)
    monkeypatch.setattr(support, "LIVE_SHARE", float("inf"))
    monkeypatch.setattr(support, "LIVE_SHARE_BACKWARD", float("inf"))
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(*shape, generator=g, dtype=F64) * 2 for shape in ((2, 4, 6, 8), (2, 2, 9, 8), (2, 2, 9, 5)))
    a = torch.tensor([1.3, 1.5, 1.7, 2.0], dtype=F64) if alpha else None
    res = []
    for backend in ("native", "torch"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([a.clone().requires_grad_()] if alpha else [])
        with softk.use_backend(backend):
            out = softk.attention.scaled_dot_product_attention(*leaves[:3], map=name, alpha=leaves[3] if alpha else None,
                                                               softcap=0.8, is_causal=True, enable_gqa=True)
        res.append([out] + list(torch.autograd.grad(out, leaves, torch.ones_like(out))))
    assert spy and all(live is not None for live in spy)
    for x, y in zip(*res):
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("name, alpha", [("sparsemax", None), ("entmax15", None), ("entmax", 1.3)])
@pytest.mark.parametrize("L", [1, 20])
def test_no_live_key_at_all_takes_the_dense_products(spy, name, alpha, L):
    # every query row fully masked: p = 0 everywhere, no group has a live
    # key, and the output and every gradient are 0, as on the reference backend
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, n, e, generator=g, requires_grad=True) for n, e in ((L, 4), (3, 4), (3, 8)))
    mask = torch.zeros(L, 3, dtype=torch.bool)
    with softk.use_backend("native"):
        out = softk.scaled_dot_product_attention(q, k, v, attn_mask=mask, map=name, alpha=alpha)
    grads = torch.autograd.grad((out * torch.randn(out.shape, generator=g)).sum(), (q, k, v))
    assert spy and all(live is None for live in spy)
    for t in (out, *grads):
        assert torch.equal(t, torch.zeros_like(t))
