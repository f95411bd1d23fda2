"""softk.attention.varlen_attn on the Triton route (the fused kernels, in the
interpreter on the CPU): packed causal sequences with GQA, L_q != L_k with a
sliding window, and a paged cache, in float32, against each sequence alone
in the NumPy float64 oracle (tests/attention/test_varlen.py's)."""

import numpy as np
import pytest
import torch

import softk
from softk.attention import varlen_attn

tri = pytest.importorskip("softk._backends.triton.attention")

from ...attention.test_attention import one_thread  # noqa: E402,F401
from ...attention.test_varlen import ALPHA, _oracle, _packed  # noqa: E402


@pytest.fixture
def launches(monkeypatch):
    """The Triton forward launcher's calls (that the route is the fused kernels')."""
    calls = []
    real = tri.attention_forward
    monkeypatch.setattr(tri, "attention_forward", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    return calls


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "entmax"])
@pytest.mark.parametrize("lq, lk, window", [
    ([5, 1, 7], [5, 1, 7], (-1, 0)),   # packed causal (training)
    ([3, 2, 4], [6, 2, 9], (2, 0)),    # L_q != L_k, a causal sliding window, bottom-right aligned
])
def test_packed_sequences_on_the_triton_route(launches, name, lq, lk, window):
    q, k, v, cq, ck = _packed(lq, lk)
    alpha = torch.tensor(ALPHA, dtype=torch.float32) if name == "entmax" else None
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    with softk.use_backend("triton"):
        out = varlen_attn(*leaves, cq, ck, max(lq), max(lk), scale=0.7, window_size=window, enable_gqa=True,
                          map=name, alpha=alpha)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        got = [out, *torch.autograd.grad(out, leaves, dout)]
    assert len(launches) == len(lq)  # one fused call per sequence
    want = _oracle(q, k, v, dout.double(), cq, ck, window, name, 0.7)
    for g, w in zip(got, want):  # float32 kernels on O(1) inputs of a few keys
        np.testing.assert_allclose(g.detach().double().numpy(), w, atol=2e-5, rtol=1e-4)


def test_paged_decoding_on_the_triton_route(launches):
    lk, page = [5, 9, 1], 4
    q, k, v, _, ck = _packed([1, 1, 1], lk, seed=3)
    cq = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    used = torch.tensor(lk, dtype=torch.int32)
    table = torch.tensor([[0, 1, 0], [2, 3, 4], [5, 0, 0]], dtype=torch.int32)
    pool_k, pool_v = torch.full((6, page, 2, 5), float("nan")), torch.full((6, page, 2, 3), float("nan"))  # tails unread
    for i, n in enumerate(lk):
        k0 = int(ck[i])
        for p in range(-(-n // page)):
            rows = slice(k0 + p * page, k0 + min((p + 1) * page, n))
            pool_k[table[i, p], : rows.stop - rows.start] = k[rows].detach().float()
            pool_v[table[i, p], : rows.stop - rows.start] = v[rows].detach().float()
    with torch.no_grad(), softk.use_backend("triton"):
        got = varlen_attn(q.detach().float(), pool_k, pool_v, cq, None, 1, 9, seqused_k=used, block_table=table,
                          map="entmax15", enable_gqa=True)
    assert len(launches) == 1  # the three sequences' pages in one padded call
    want = _oracle(q, k, v, torch.zeros(3, 4, 3, dtype=torch.float64), cq, ck, (-1, -1), "entmax15", None)[0]
    np.testing.assert_allclose(got.double().numpy(), want, atol=2e-6, rtol=1e-5)
