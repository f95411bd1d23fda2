"""softk.nn.ScaledDotProductAttention (a learnable α per head) and
torch.compile(fullgraph=True) of a small model using softk's attention."""

import pytest
import torch

import softk
from softk.attention import scaled_dot_product_attention as sdpa
from softk.nn import ScaledDotProductAttention

from .test_attention import one_thread  # noqa: F401


def test_module_is_the_function():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g) for _ in range(3))
    for args in (("softmax",), ("sparsemax",), ("entmax15",), ("entmax", 1.7)):
        torch.testing.assert_close(ScaledDotProductAttention(*args)(q, k, v, is_causal=True),
                                   sdpa(q, k, v, is_causal=True, map=args[0], alpha=(args[1:] or (None,))[0]))


def test_learnable_alpha_per_head():
    torch.manual_seed(0)
    attn = ScaledDotProductAttention("entmax", alpha=[1.2, 1.5, 1.9], num_heads=3, learnable=True)
    torch.testing.assert_close(attn.alpha, torch.tensor([1.2, 1.5, 1.9]))
    q = torch.randn(2, 3, 6, 4, requires_grad=True)
    out = attn(q, q, q)
    torch.testing.assert_close(out, sdpa(q, q, q, map="entmax", alpha=torch.tensor([1.2, 1.5, 1.9])))
    (out * torch.randn_like(out)).sum().backward()
    assert attn.alpha_raw.grad is not None and (attn.alpha_raw.grad != 0).all()
    # a large step either way keeps every α inside (1, 2] (α = 1 + 2⁻²⁰ + (1 − 2⁻²⁰)·sigmoid(ρ)), and the call runs
    for step, end in ((-1e4, 1 + 2**-20), (1e4, 2.0)):
        with torch.no_grad():
            attn.alpha_raw.fill_(step)
        torch.testing.assert_close(attn.alpha, torch.full((3,), end))
        assert torch.isfinite(attn(q, q, q)).all()
    assert "learnable=True" in repr(attn)


def test_learnable_alpha_just_above_the_bound_and_its_repr():
    # α = 1.000001 lies above 1 + 2⁻²⁰ but rounded to float32 before the
    # check it was the bound itself, and refused; the repr rounded to 4
    # digits printed α = 1.0000015 as 1.0 (softmax)
    attn = ScaledDotProductAttention("entmax", alpha=[1.000001, 1.0000015], num_heads=2, learnable=True)
    torch.testing.assert_close(attn.alpha.double(), torch.tensor([1.000001, 1.0000015], dtype=torch.float64),
                               rtol=0, atol=2.4e-7)  # two float32 ulps at 1
    assert "alpha=[1.000001, 1.000002]" in repr(attn)


@pytest.mark.parametrize("kwargs,match", [
    (dict(map="sparsemax", num_heads=2, learnable=True), "map must be 'entmax'"),
    (dict(map="entmax", learnable=True), "num_heads must be an int"),
    (dict(map="entmax", alpha=1.0, num_heads=2, learnable=True), "alpha must lie strictly between 1.00000095"),
    (dict(map="entmax", alpha=2.0, num_heads=2, learnable=True), "alpha must lie strictly between 1.00000095"),
    (dict(map="entmax", alpha=float("nan"), num_heads=2, learnable=True), "alpha must lie strictly between"),
    (dict(map="entmax", alpha=3.5), r"alpha must lie in \(1, 3\]"),  # float64 takes the most
    (dict(map="entmax", alpha=[1.5, 1.5, 1.5], num_heads=2, learnable=True), "one per head"),
    (dict(map="entmax", alpha=0.9), "alpha must be a finite float > 1"),
    (dict(map="hardmax"), "map must be one of"),
    (dict(map="softmax", alpha=1.5), "alpha is only used"),
])
def test_module_checks_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScaledDotProductAttention(**kwargs)


class TinyBlock(torch.nn.Module):
    """One self-attention layer with a learned α per head."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.attn = ScaledDotProductAttention("entmax", num_heads=2, learnable=True)

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 4).permute(2, 0, 3, 1, 4)
        return self.attn(q, k, v, is_causal=True).square().mean()


@pytest.mark.parametrize("backend", ["auto", pytest.param("torch", marks=pytest.mark.slow)])
def test_compile_fullgraph(backend):
    torch.manual_seed(0)
    model, x = TinyBlock(), torch.randn(2, 10, 8)
    # no on-disk caches: an artifact compiled against an earlier version of the op would be reused
    no_cache = torch._inductor.config.patch(fx_graph_cache=False, autotune_local_cache=False)
    with no_cache, torch._functorch.config.patch(enable_autograd_cache=False), softk.use_backend(backend):
        eager = model(x)
        want = torch.autograd.grad(eager, list(model.parameters()))
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        out = compiled(x)
        got = torch.autograd.grad(out, list(model.parameters()))
    torch.testing.assert_close(out, eager, atol=1e-5, rtol=1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_an_alpha_only_float64_takes_is_taken_at_construction():
    # the construction check ran on float32 zeros, so α in (2, 3], which
    # float64 attention takes, was refused for every dtype
    from ..oracle import attention as oracle

    g0 = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g0, dtype=torch.float64) for n in (4, 6, 6))
    got = ScaledDotProductAttention("entmax", alpha=2.5)(q, k, v)
    want, _ = oracle.attention(q.numpy(), k.numpy(), v.numpy(), name="entmax", alpha=2.5)
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match=r"alpha must lie in \(1, 2\] with float32"):
        ScaledDotProductAttention("entmax", alpha=2.5)(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match=r"alpha must lie in \(1, 3\]"):
        ScaledDotProductAttention("entmax", alpha=3.5)
