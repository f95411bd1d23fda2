"""softk.integrations.megatron: Megatron-LM's CE-target signature on 2 gloo ranks, without Megatron.

target(logits[s, b, V/tp], labels[s, b], tp_group) -> loss[s, b], against the
single-process softk loss (reduction "none") on the full logits, values and
gradients in float64.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from softk.integrations.megatron import SUPPORTED_LOSSES, megatron_loss

from ..distributed.dist_harness import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")

D = torch.float64
CASES = [("cross_entropy", {}), ("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.4}),
         ("topk_softmax_ce", {"k": 3}), ("soft_topk", {"k": 2, "method": "sparse"}), ("ts2", {"suppression": 0.5})]


def _single(loss, z, t, kw):
    from softk import losses as L

    x, r = z.reshape(-1, z.shape[-1]), dict(reduction="none")
    y = t.reshape(-1, *t.shape[2:])
    out = {
        "cross_entropy": lambda: L.cross_entropy(x, y, **r),
        "softmax": lambda: L.softmax_loss(x, y, **r),
        "sparsemax": lambda: L.sparsemax_loss(x, y, **r),
        "entmax15": lambda: L.entmax15_loss(x, y, **r),
        "entmax": lambda: L.entmax_loss(x, y, kw.get("alpha"), **r),
        "topk_softmax_ce": lambda: L.topk_softmax_cross_entropy(x, y, kw.get("k"), **r),
        "soft_topk": lambda: L.soft_topk_loss(x, y, kw.get("k"), kw.get("method"), **r),
        "ts2": lambda: L.ts2_loss(x, y, suppression=kw.get("suppression"), **r),
    }[loss]()
    return out.reshape(z.shape[:2])


def _ranks(rank, world):
    import torch.distributed as dist

    s, b, v = 4, 3, 11
    lo, hi = (0, 6) if rank == 0 else (6, 11)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(s, b, v, dtype=D, generator=g) * 2
    t = torch.randint(0, v, (s, b), generator=g)
    t[1, 2] = -100  # a masked token
    z[2, 0, 4:8] = -float("inf")  # a masked stretch across the slice boundary
    for loss, kw in CASES:
        target_fn = megatron_loss(loss, **kw)
        if loss == "soft_topk":
            lab = torch.zeros(s, b, v, dtype=D)
            lab.scatter_(-1, torch.rand(s, b, v, generator=g).argsort(-1)[..., :2], 1.0)
            zz = z.clone()
            zz[2, 0] = 0.1 * torch.arange(v, dtype=D)
            mine = lab[..., lo:hi]
        else:
            lab, zz, mine = t, z, t
        zf = zz.clone().requires_grad_()
        ref = _single(loss, zf, lab, kw)
        zl = zz[..., lo:hi].clone().requires_grad_()
        got = target_fn(zl, mine, dist.group.WORLD)
        assert got.shape == (s, b), (loss, got.shape)
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10, msg=lambda m: f"{loss}: {m}")
        w = torch.linspace(0.5, 1.5, s * b, dtype=D).reshape(s, b)
        (gf,) = torch.autograd.grad((ref * w).sum(), zf)
        (gl,) = torch.autograd.grad((got * w).sum(), zl)
        torch.testing.assert_close(gl, gf[..., lo:hi], rtol=1e-10, atol=1e-10, msg=lambda m: f"{loss} grad: {m}")


@pytest.mark.slow
def test_megatron_target_on_two_ranks(tmp_path):
    run(2, _ranks, tmp_path)


def test_signature_and_names():
    for loss in SUPPORTED_LOSSES:
        f = megatron_loss(loss, **({"alpha": 1.5} if loss == "entmax" else {}))
        assert list(inspect.signature(f).parameters) == ["logits", "labels", "tp_group"]
    with pytest.raises(ValueError, match="loss must be one of"):
        megatron_loss("sparsmax")


def test_soft_topk_method_defaults_to_exp_and_its_refusal_names_the_fix():
    """"exp", the single-device default, needs every entry for k > 1: refused at construction, naming the method
    that vocabulary slices take."""
    assert inspect.signature(megatron_loss).parameters["method"].default == "exp"
    with pytest.raises(ValueError, match='not available vocab-parallel; pass method="sparse"'):
        megatron_loss("soft_topk", k=2)
    megatron_loss("soft_topk", k=2, method="sparse")
    megatron_loss("soft_topk")  # k = 1: the softmax
