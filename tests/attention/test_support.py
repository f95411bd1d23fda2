"""P·V over the support (softk._backends.blockwise.support): the gathered sum
against a float64 NumPy product, the choice between it and the dense
matmul, and the skip counts against a NumPy count."""

import numpy as np
import pytest
import torch

from softk._backends.blockwise import support


def sparse_p(shape, share, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(shape, generator=g, dtype=dtype)
    return torch.where(torch.rand(shape, generator=g, dtype=dtype) < share, p, 0.0)


def numpy_pv(p, v):
    p, v = p.double().numpy(), v.double().numpy()
    S = p.shape[-1]
    return np.einsum("bhrs,bhse->bhre", p, np.broadcast_to(v[:, :, :S], p.shape[:2] + (S, v.shape[-1])))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-13), (torch.float32, 1e-5)])
@pytest.mark.parametrize("vshape", [(2, 3, 40, 5), (1, 3, 40, 5), (2, 1, 40, 5), (2, 3, 57, 5)])
def test_gathered_product_equals_the_dense_sum(monkeypatch, dtype, tol, vshape):
    # v with a broadcast batch or head, or more keys than p reads (a causal chunk's prefix)
    monkeypatch.setattr(support, "GATHER_SHARE", float("inf"))
    p = sparse_p((2, 3, 4, 40), 0.1, dtype=dtype)
    p[0, 1] = 0.0  # a head whose rows read nothing
    p[1, 2, 3] = 0.0
    v = torch.randn(vshape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    assert support.gathers(p, True)
    got = support.product(p, v, True)
    assert got.dtype == dtype and got.shape == (2, 3, 4, 5)
    np.testing.assert_allclose(got.double().numpy(), numpy_pv(p, v), rtol=0, atol=tol)  # ≤ 40 terms
    assert torch.equal(got[0, 1], torch.zeros(4, 5, dtype=dtype))


def test_an_empty_p_gives_zeros(monkeypatch):
    p = torch.zeros(1, 2, 1, 100, dtype=torch.float64)
    v = torch.randn(1, 2, 100, 4, dtype=torch.float64)
    assert support.gathers(p, True)
    assert torch.equal(support.product(p, v, True), torch.zeros(1, 2, 1, 4, dtype=torch.float64))


def test_the_gather_is_chosen_for_decoding_sized_supports_only():
    S = 4096
    budget = support.GATHER_SHARE * 4 * 8 * S  # nonzeros allowed for B = 4, H_kv = 8
    decode = torch.zeros(4, 8, 1, S, dtype=torch.float64)
    decode.view(-1)[: int(budget)] = 0.5  # at the budget

    assert 0 < int(torch.count_nonzero(decode)) <= budget and support.gathers(decode, True)
    assert not support.gathers(decode, False)  # the softmax: no zeros to skip
    decode.view(-1)[int(budget)] = 0.5  # one over
    assert not support.gathers(decode, True)
    dense = sparse_p((4, 8, 1, S), 2 * support.GATHER_SHARE)
    assert not support.gathers(dense, True)
    # a chunk of 256 query rows per head at 1 % nonzeros: a GEMM, the dense product stays
    assert not support.gathers(sparse_p((1, 4, 256, 2048), 0.01), True)
    # more rows per head than GATHER_SHARE·S: over the budget without a count, even if P were empty
    assert not support.gathers(torch.zeros(1, 1, int(support.GATHER_SHARE * 2048) + 1, 2048), True)
    v = torch.randn(4, 8, S, 3, dtype=torch.float64)
    np.testing.assert_allclose(support.product(dense, v, True).numpy(), numpy_pv(dense, v), rtol=0, atol=1e-10)


def test_skipped_counts_keys_and_pages_no_row_reads():
    p = torch.zeros(2, 1, 3, 40)
    p[0, 0, 1, 5] = 0.3  # page 0 of batch 0
    p[0, 0, 2, 6] = 0.7  # the same page
    p[1, 0, 0, 39] = 1.0  # the last, partial page (keys 32..39) of batch 1
    keys, pages = support.skipped(p, page=16)
    live = (p.numpy() != 0).any(-2)  # (2, 1, 40)
    assert keys == pytest.approx(1 - live.mean())  # 3 of 80 keys are read
    padded = np.pad(live, ((0, 0), (0, 0), (0, 8))).reshape(2, 1, 3, 16).any(-1)
    assert pages == pytest.approx(1 - padded.mean()) and pages == pytest.approx(4 / 6)
