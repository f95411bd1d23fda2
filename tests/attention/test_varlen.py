"""softk.attention.varlen_attn: packed sequences against the NumPy oracle run
on each sequence alone, with the window written from its definition here."""

import numpy as np
import pytest
import torch

import softk
from softk.attention import _varlen as varlen_module, varlen_attn

from ..oracle import attention as ora

MAPS = ["softmax", "sparsemax", "entmax15", "entmax"]
ALPHA = np.array([1.3, 1.5, 1.7, 2.0])


def _window(lq, lk, left, right):
    # key j seen by query i iff pos - left <= j <= pos + right, pos = i + lk - lq, -1 unbounded
    keep = np.ones((lq, lk), dtype=bool)
    for i in range(lq):
        pos = i + lk - lq
        for j in range(lk):
            if (left >= 0 and j < pos - left) or (right >= 0 and j > pos + right):
                keep[i, j] = False
    return keep


def _packed(lq, lk, H=4, Hkv=2, D=5, Dv=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), H, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(lk), Hkv, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(lk), Hkv, Dv, generator=g, dtype=torch.float64, requires_grad=True)
    cq = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32)
    ck = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32)
    return q, k, v, cq, ck


def _oracle(q, k, v, dout, cq, ck, window, name, scale, used=None):
    """(out, dq, dk, dv) of each sequence alone, packed back."""
    outs, dqs = [], []
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    a = ALPHA if name == "entmax" else None
    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = int(cq[i]), int(cq[i + 1]), int(ck[i]), int(ck[i + 1])
        if used is not None:
            k1 = k0 + used[i]
        qi = q[q0:q1].detach().numpy().transpose(1, 0, 2)[None]
        ki = k[k0:k1].detach().numpy().transpose(1, 0, 2)[None]
        vi = v[k0:k1].detach().numpy().transpose(1, 0, 2)[None]
        doi = dout[q0:q1].numpy().transpose(1, 0, 2)[None]
        mask = np.broadcast_to(_window(q1 - q0, k1 - k0, *window), (1, q.shape[1], q1 - q0, k1 - k0))
        outs.append(ora.attention(qi, ki, vi, mask, False, scale, name, a)[0][0].transpose(1, 0, 2))
        gq, gk, gv = ora.grads(qi, ki, vi, doi, mask, False, scale, name, a)
        dqs.append(gq[0].transpose(1, 0, 2))
        dk[k0:k1] += gk[0].transpose(1, 0, 2)
        dv[k0:k1] += gv[0].transpose(1, 0, 2)
    return np.concatenate(outs), np.concatenate(dqs), dk, dv


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("lq, lk, window", [
    ([5, 1, 7], [5, 1, 7], (-1, 0)),   # packed causal (training)
    ([3, 2, 4], [6, 2, 9], (2, 0)),    # Lq != Lk, a causal sliding window, bottom-right aligned
    ([3, 2, 4], [6, 2, 9], (1, 2)),    # a two-sided window
    ([3, 2, 4], [6, 2, 9], (-1, -1)),  # full
])
def test_packed_sequences_match_each_sequence_alone(backend, name, lq, lk, window):
    q, k, v, cq, ck = _packed(lq, lk)
    scale = 0.7
    alpha = torch.tensor(ALPHA) if name == "entmax" else None
    with softk.use_backend(backend):
        out = varlen_attn(q, k, v, cq, ck, max(lq), max(lk), scale=scale, window_size=window, enable_gqa=True,
                          map=name, alpha=alpha)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        got = [out, *torch.autograd.grad(out, (q, k, v), dout)]
    want = _oracle(q, k, v, dout, cq, ck, window, name, scale)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.detach().numpy(), w, atol=1e-10, rtol=1e-9)


def _paged(lk, page, k, v, ck, order):
    """key and value pools of pages of ``page`` keys, shuffled by ``order``, and the block table."""
    npages = [-(-n // page) for n in lk]
    pool_k = torch.full((len(order), page) + tuple(k.shape[1:]), float("nan"), dtype=torch.float64)
    pool_v = torch.full((len(order), page) + tuple(v.shape[1:]), float("nan"), dtype=torch.float64)
    table = torch.full((len(lk), max(npages) + 1), 10 ** 6, dtype=torch.int32)  # unused entries: out of range
    logical = 0
    for i, n in enumerate(lk):
        k0 = int(ck[i])
        for p in range(npages[i]):
            rows = slice(k0 + p * page, k0 + min((p + 1) * page, n))
            slot = order[logical]
            pool_k[slot, : rows.stop - rows.start] = k[rows].detach()
            pool_v[slot, : rows.stop - rows.start] = v[rows].detach()
            table[i, p] = slot
            logical += 1
    return pool_k, pool_v, table


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("lq, window", [([1, 1, 1, 1], (-1, -1)), ([2, 0, 3, 1], (-1, 0)), ([2, 1, 3, 1], (2, 0))])
def test_paged_queries_match_each_sequence_alone(monkeypatch, batched, name, lq, window):
    # one padded call over every sequence's pages (DECODE_QUERIES) or one call per
    # sequence: ragged caches of 5, 9, 1 and 7 keys in shuffled pages of 4, whose
    # padding is NaN (never read: a read would make the output NaN)
    monkeypatch.setattr(varlen_module, "DECODE_QUERIES", 16 if batched else 0)
    lk, page = [5, 9, 1, 7], 4
    q, k, v, cq, ck = _packed(lq, lk, seed=7)
    pool_k, pool_v, table = _paged(lk, page, k, v, ck, [4, 0, 2, 5, 1, 3, 7, 6])
    alpha = torch.tensor(ALPHA) if name == "entmax" else None
    with torch.no_grad():
        got = varlen_attn(q, pool_k, pool_v, cq, None, 3, 9, seqused_k=torch.tensor(lk, dtype=torch.int32),
                          block_table=table, window_size=window, map=name, alpha=alpha, enable_gqa=True)
    want = _oracle(q, k, v, torch.zeros(sum(lq), 4, 3, dtype=torch.float64), cq, ck, window, name, None)[0]
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)


def test_a_block_table_page_outside_the_pool_is_refused():
    lk, page = [5, 9], 4
    q, k, v, cq, ck = _packed([1, 1], lk, seed=8)
    pool_k, pool_v, table = _paged(lk, page, k, v, ck, [0, 1, 2, 3, 4])
    table[1, 2] = 5  # the third page of the second sequence (in use): the pool holds 5
    with pytest.raises(ValueError, match="block_table's pages in use must index the pool of 5 pages"):
        varlen_attn(q.detach(), pool_k, pool_v, cq, None, 1, 9, seqused_k=torch.tensor(lk, dtype=torch.int32),
                    block_table=table, enable_gqa=True)


def test_seqused_k_uses_the_first_keys_of_a_larger_slot():
    q, k, v, cq, ck = _packed([2, 3], [6, 6], seed=4)
    used = torch.tensor([4, 6], dtype=torch.int32)
    with torch.no_grad():
        got = varlen_attn(q, k, v, cq, ck, 3, 6, seqused_k=used, map="sparsemax", enable_gqa=True)
    want = _oracle(q, k, v, torch.zeros(5, 4, 3, dtype=torch.float64), cq, ck, (-1, -1), "sparsemax", None,
                   used=[4, 6])[0]
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)


def test_a_query_that_sees_no_key_gets_zero():
    # causal, bottom-right aligned with more queries than keys: pos = i + 2 - 3, so
    # query 0 sees no key (pos = -1): output 0 and no gradient
    q, k, v, cq, ck = _packed([3], [2], seed=5)
    out = varlen_attn(q, k, v, cq, ck, 3, 2, window_size=(-1, 0), map="entmax15", enable_gqa=True)
    assert (out[0] == 0).all() and (out[1:] != 0).any()
    (gq,) = torch.autograd.grad(out.sum(), q)
    assert (gq[0] == 0).all()
    q, k, v, cq, ck = _packed([2, 2], [0, 3], seed=6)
    out = varlen_attn(q, k, v, cq, ck, 2, 3, map="sparsemax", enable_gqa=True)
    assert (out[:2] == 0).all() and (out[2:] != 0).any()


CU = torch.tensor([0, 2, 5], dtype=torch.int32)


@pytest.mark.parametrize("kw, match", [
    (dict(cu_seq_q=CU.long()), "cu_seq_q must be a 1-D int32"),
    (dict(cu_seq_q=torch.tensor([1, 2, 5], dtype=torch.int32)), "cu_seq_q must start at 0"),
    (dict(cu_seq_q=torch.tensor([0, 3, 2], dtype=torch.int32)), "never decrease"),
    (dict(cu_seq_q=torch.tensor([0, 2, 4], dtype=torch.int32)), "end at the packed length 5"),
    (dict(cu_seq_k=torch.tensor([0, 5], dtype=torch.int32)), "cu_seq_k must hold N \\+ 1 = 3"),
    (dict(max_q=2), "max_q = 2 is smaller"),
    (dict(max_k=1), "max_k = 1 is smaller"),
    (dict(window_size=(-2, 0)), "window_size must be"),
    (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), "block_table needs seqused_k"),
    (dict(seqused_k=torch.tensor([3, 1], dtype=torch.int32)), "seqused_k must not exceed"),
    (dict(softcap=0.0), "softcap must be"),
])
def test_bad_input_is_refused(kw, match):
    q, k, v, _, _ = _packed([2, 3], [2, 3])
    args = dict(cu_seq_q=CU, cu_seq_k=CU, max_q=3, max_k=3)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        varlen_attn(q, k, v, args["cu_seq_q"], args["cu_seq_k"], args["max_q"], args["max_k"],
                    **{n: a for n, a in kw.items() if n not in ("cu_seq_q", "cu_seq_k", "max_q", "max_k")},
                    enable_gqa=True)


def test_a_paged_cache_takes_no_gradient():
    q, _, _, _, _ = _packed([1], [1])
    pool = torch.zeros(1, 4, 2, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="paged KV cache .* is for inference"):
        varlen_attn(q, pool, pool, torch.tensor([0, 1], dtype=torch.int32), None, 1, 4,
                    seqused_k=torch.tensor([3], dtype=torch.int32), block_table=torch.zeros(1, 1, dtype=torch.int32),
                    enable_gqa=True)


def _lse_oracle(q, k, cq, ck, window, scale, softcap=None, used=None):
    """(T_q, H) log-sum-exp of each query's capped, scaled scores over the keys it sees, in NumPy."""
    out = []
    H, Hkv = q.shape[1], k.shape[1]
    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = int(cq[i]), int(cq[i + 1]), int(ck[i]), int(ck[i + 1])
        k1 = k1 if used is None else k0 + used[i]
        qi, ki = q[q0:q1].detach().numpy(), k[k0:k1].detach().numpy()
        keep = _window(q1 - q0, k1 - k0, *window)
        rows = np.full((q1 - q0, H), -np.inf)
        for h in range(H):
            s = qi[:, h] @ ki[:, h // (H // Hkv)].T * (qi.shape[-1] ** -0.5 if scale is None else scale)
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            for t in range(q1 - q0):
                seen = s[t][keep[t]]
                if seen.size:
                    rows[t, h] = seen.max() + np.log(np.exp(seen - seen.max()).sum())
        out.append(rows)
    return np.concatenate(out)


@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("lq, lk, window", [([5, 1, 7], [5, 1, 7], (-1, 0)), ([3, 2, 4], [6, 2, 9], (1, 2))])
def test_the_log_sum_exp_torch_asks_for(lq, lk, window, softcap):
    from torch.nn.attention.varlen import AuxRequest

    q, k, v, cq, ck = _packed(lq, lk)
    out, lse = varlen_attn(q, k, v, cq, ck, max(lq), max(lk), return_aux=AuxRequest(lse=True), num_splits=1,
                           window_size=window, enable_gqa=True, map="softmax", softcap=softcap, scale=0.7)
    np.testing.assert_allclose(lse.detach().numpy(), _lse_oracle(q, k, cq, ck, window, 0.7, softcap), rtol=1e-12)
    plain = varlen_attn(q, k, v, cq, ck, max(lq), max(lk), return_aux=AuxRequest(lse=False), window_size=window,
                        enable_gqa=True, map="softmax", softcap=softcap, scale=0.7)
    assert torch.equal(plain, out)


@pytest.mark.parametrize("batched", [True, False])
def test_the_log_sum_exp_from_a_paged_cache(monkeypatch, batched):
    from torch.nn.attention.varlen import AuxRequest

    monkeypatch.setattr(varlen_module, "DECODE_QUERIES", 16 if batched else 0)
    lq, lk, window = [2, 0, 3, 1], [5, 9, 1, 7], (2, 0)
    q, k, v, cq, ck = _packed(lq, lk, seed=7)
    pool_k, pool_v, table = _paged(lk, 4, k, v, ck, [4, 0, 2, 5, 1, 3, 7, 6])
    with torch.no_grad():
        _, lse = varlen_attn(q, pool_k, pool_v, cq, None, 3, 9, seqused_k=torch.tensor(lk, dtype=torch.int32),
                             block_table=table, window_size=window, map="softmax", enable_gqa=True,
                             return_aux=AuxRequest(lse=True))
    np.testing.assert_allclose(lse.numpy(), _lse_oracle(q, k, cq, ck, window, None), rtol=1e-12)


def test_the_log_sum_exp_is_the_softmax_s_alone():
    from torch.nn.attention.varlen import AuxRequest

    q, k, v, cq, ck = _packed([2], [2])
    with pytest.raises(ValueError, match="return_aux=AuxRequest\\(lse=True\\).*map='entmax15' has none"):
        varlen_attn(q, k, v, cq, ck, 2, 2, return_aux=AuxRequest(lse=True), enable_gqa=True)
    with pytest.raises(TypeError, match="return_aux must be None or"):
        varlen_attn(q, k, v, cq, ck, 2, 2, return_aux=True, enable_gqa=True)
    with pytest.raises(ValueError, match="num_splits must be None or an int >= 1"):
        varlen_attn(q, k, v, cq, ck, 2, 2, num_splits=0, enable_gqa=True)
