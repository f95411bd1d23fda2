"""The fused linear loss's backward on the gradient's live columns (the sparse
losses: G = 0 outside the supports and targets) equals the dense products'."""

import pytest
import torch

import softk._ops.fused_linear as FL
from softk.losses import fused_linear_loss


@pytest.mark.parametrize("loss, kw", [("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}),
                                      ("topk_softmax_ce", {"k": 3}), ("sparsemax", {"softcap": 100.0})])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_live_columns_give_the_dense_gradients(monkeypatch, loss, kw, reduction):
    g = torch.Generator().manual_seed(0)
    V, H, N = 300, 16, 40
    w = torch.randn(V, H, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (N,), generator=g)
    x = w[y] * 3 + torch.randn(N, H, generator=g, dtype=torch.float64) * 0.3  # small supports
    y[5] = -100  # an ignored row
    b = torch.randn(V, generator=g, dtype=torch.float64) * 0.1
    grads, used = [], []
    real = FL.live_products

    def spy(gs, *args):
        used.append(gs.shape[1])
        return real(gs, *args)

    monkeypatch.setattr(FL, "live_products", spy)
    for share in (0.0, 1.0):
        monkeypatch.setattr(FL, "SPARSE_MAX_SHARE", {"cpu": share})
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        out = fused_linear_loss(leaves[0], leaves[1], y, loss, leaves[2], reduction=reduction, chunk_size=16, **kw)
        grads.append(torch.autograd.grad(out, leaves, torch.ones_like(out)))
    assert used and max(used) < V  # the columns ran, on fewer than V classes
    for a, b_ in zip(*grads):
        torch.testing.assert_close(a, b_, rtol=1e-12, atol=1e-12)


def test_smoothing_keeps_the_dense_products(monkeypatch):
    # label smoothing gives every class a gradient: no columns to skip
    used = []
    monkeypatch.setattr(FL, "live_products", lambda *a: used.append(1))
    x, w = torch.randn(8, 4, dtype=torch.float64, requires_grad=True), torch.randn(20, 4, dtype=torch.float64)
    fused_linear_loss(x, w, torch.randint(0, 20, (8,)), "sparsemax", label_smoothing=0.1).backward()
    assert not used
