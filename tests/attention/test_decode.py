"""Decoding on the blockwise backend: a few queries against a long cache take
whole score rows when one query's rows over the batch and heads are few
enough (rows.ROW_SCORES), with P·V over the support, else the search over
key blocks with longer blocks; both against the NumPy float64 oracle, value
and gradients, and the route each takes."""

import pytest
import torch

from softk._backends.blockwise import forward as blockwise, rows, support

from ..oracle import attention as ora
from .test_attention import close, run

F64 = torch.float64


def decode_inputs(B=2, H=4, Hkv=2, L=1, S=300, E=8, Ev=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=F64).requires_grad_()
            for shape in ((B, H, L, E), (B, Hkv, S, E), (B, Hkv, S, Ev))]


@pytest.mark.parametrize("name,alpha", [("sparsemax", None), ("entmax15", None), ("entmax", 1.3), ("softmax", None)])
@pytest.mark.parametrize("whole_rows", [True, False])
@pytest.mark.parametrize("L", [1, 3])
def test_decoding_past_rows_max_matches_oracle(monkeypatch, name, alpha, whole_rows, L):
    q, k, v = decode_inputs(L=L)
    B, H, S = q.shape[0], q.shape[1], k.shape[2]
    monkeypatch.setattr(rows, "ROWS_MAX", 0)  # every S is "long"
    monkeypatch.setattr(rows, "ROW_SCORES", B * H * S if whole_rows else B * H * S - 1)
    monkeypatch.setattr(blockwise, "BLOCK", 16)
    monkeypatch.setattr(blockwise, "BLOCK_SCORES", 16 * 40)  # B·H_kv·R = 8·L rows: blocks of 80 keys at L = 1
    monkeypatch.setattr(support, "GATHER_SHARE", float("inf"))
    taken = []
    real = rows.attention_forward
    monkeypatch.setattr(rows, "attention_forward", lambda *a, **kw: taken.append(1) or real(*a, **kw))
    mask = torch.rand(L, S, generator=torch.Generator().manual_seed(2)) > 0.2
    out = run("blockwise", q, k, v, attn_mask=mask, enable_gqa=True, map=name, alpha=alpha)
    assert bool(taken) == whole_rows
    a = alpha
    args = [t.detach().numpy() for t in (q, k, v)]
    close(out.detach(), ora.attention(*args, mask.numpy(), False, None, name, a)[0])
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    got = torch.autograd.grad(out, (q, k, v), dout)
    for g, want in zip(got, ora.grads(*args, dout.numpy(), mask.numpy(), False, None, name, a)):
        close(g, want)


def test_longer_blocks_only_for_few_rows(monkeypatch):
    q, k, v = decode_inputs(B=1, H=2, Hkv=1, L=1, S=4096)
    blk = blockwise.Blocks(q.detach(), k.detach(), v.detach(), None, 1.0, False)
    assert blockwise._block(blk) == blockwise.BLOCK_SCORES // 2 // blockwise.BLOCK * blockwise.BLOCK
    q, k, v = decode_inputs(B=4, H=8, Hkv=8, L=64, S=4096)
    blk = blockwise.Blocks(q.detach(), k.detach(), v.detach(), None, 1.0, False)
    assert blockwise._block(blk) == blockwise.BLOCK  # a prefill chunk: 2048 rows


def test_the_gather_skips_most_values_on_a_decoding_support():
    # one query against 4096 keys: the support of sparsemax is a few keys
    q, k, v = (t.detach() for t in decode_inputs(B=1, H=2, Hkv=2, L=1, S=4096, E=16))
    p = torch.tensor(ora.weights(ora.scores(q.numpy(), k.numpy()), "sparsemax"))
    keys, pages = support.skipped(p)
    live = (p.numpy() != 0).any(-2)
    assert keys == pytest.approx(1 - live.mean()) and keys > 0.99
    assert support.gathers(p, True)
    close(run("blockwise", q, k, v, map="sparsemax"), ora.attention(q.numpy(), k.numpy(), v.numpy(),
                                                                    name="sparsemax")[0])
