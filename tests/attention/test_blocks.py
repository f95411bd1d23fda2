"""The blockwise backend's score blocks (softk._backends.blockwise.blocks.Blocks.scores)
written into a reused buffer, with the cap, the mask and the causal mask applied in
place, against the reference backend's float64 scores (softk.attention.reference.scores);
and the whole-row path's in-place accumulation of dK and dV."""

import pytest
import torch

from softk._backends.blockwise import rows
from softk._backends.blockwise.blocks import Blocks
from softk.attention import reference

F64 = torch.float64


def _inputs(B=2, H=4, Hkv=2, L=11, S=13, E=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g, dtype=F64)
    k = torch.randn(B, Hkv, S, E, generator=g, dtype=F64)
    v = torch.randn(B, Hkv, S, E, generator=g, dtype=F64)
    return q, k, v, g


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("softcap", [0.0, 2.5])
def test_scores_into_a_buffer_match_the_reference(causal, mask_kind, softcap):
    q, k, v, g = _inputs()
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(B, H, L, S, generator=g) > 0.3
    elif mask_kind == "float":
        mask = torch.randn(B, H, L, S, generator=g, dtype=F64)
    G = H // k.shape[1]
    want = reference.scores(q, k.repeat_interleave(G, 1), mask, 0.3, causal, softcap or None)
    # a buffer of garbage, larger than any block: whatever it held before must not leak into the scores
    buf = torch.full((B * H * L * S + 7,), float("nan"), dtype=F64)
    for i0, i1 in [(0, 4), (4, 9), (9, 11)]:  # chunks of queries, the later ones starting past key 0
        blk = Blocks(q[:, :, i0:i1], k, v, None if mask is None else mask[:, :, i0:i1], 0.3, causal, i0, softcap)
        for j0, j1 in [(0, blk.S), (0, 3), (2, 7), (5, blk.S)]:  # spans before, across and after the diagonal
            if j1 <= j0:
                continue
            got = blk.scores(j0, j1, out=buf)
            fresh = blk.scores(j0, j1)
            ref = blk.heads(got)
            torch.testing.assert_close(ref, want[:, :, i0:i1, j0:j1], rtol=1e-12, atol=1e-12)
            assert torch.equal(got, fresh)
            assert got.data_ptr() == buf.data_ptr()


def test_causal_scores_hide_exactly_the_later_keys():
    q, k, v, _ = _inputs(L=9, S=9)
    blk = Blocks(q[:, :, 3:7], k, v, None, 1.0, True, 3)
    s = blk.heads(blk.scores(0, blk.S, out=torch.empty(q.numel() * 9, dtype=F64)))
    hidden = torch.isinf(s[0, 0])
    want = torch.arange(blk.S).unsqueeze(0) > torch.arange(3, 7).unsqueeze(1)
    assert torch.equal(hidden, want)


@pytest.mark.parametrize("S", [13, 6])
def test_accumulate_adds_the_transposed_product(S):
    g = torch.Generator().manual_seed(1)
    acc = torch.randn(2, 3, 13, 5, generator=g, dtype=F64)
    a = torch.randn(2, 3, 4, S, generator=g, dtype=F64)
    b = torch.randn(2, 3, 4, 5, generator=g, dtype=F64)
    want = acc.clone()
    want[:, :, :S] += torch.einsum("bhrs,bhre->bhse", a, b)
    rows._accumulate(acc, a, b)
    torch.testing.assert_close(acc, want, rtol=1e-12, atol=1e-12)
    # a non-contiguous accumulator takes the general sum
    acc_t = torch.randn(2, 3, 5, 13, generator=g, dtype=F64).transpose(-1, -2)
    want = acc_t.clone()
    want[:, :, :S] += torch.einsum("bhrs,bhre->bhse", a, b)
    rows._accumulate(acc_t, a, b)
    torch.testing.assert_close(acc_t, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("B, H, L, S", [(1, 4, 2048, 2048), (1, 4, 8192, 8192), (8, 32, 4096, 8192), (4, 8, 1, 1 << 18),
                                        (1, 1, 5, 7)])
def test_whole_row_chunks_cover_the_queries_within_their_budget(B, H, L, S):
    q = torch.empty(B, H, L, 1)
    spans = sorted(rows._chunks(q, S))
    assert spans[0][0] == 0 and spans[-1][1] == L
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    step = spans[-1][1] - spans[-1][0] if len(spans) == 1 else spans[0][1] - spans[0][0]
    row = B * H * S
    # CHUNK scores, or more (up to CHUNK_MAX) so that a chunk has CHUNK_QUERIES queries, and one query at least
    assert step == min(L, max(1, rows.CHUNK // row, min(rows.CHUNK_QUERIES, rows.CHUNK_MAX // row)))
    assert step * row <= max(rows.CHUNK_MAX, row)
    assert step >= min(L, rows.CHUNK_QUERIES) or (step + 1) * row > rows.CHUNK_MAX
    assert rows._workspace(q, S, torch.float32).numel() == B * H * step * S
