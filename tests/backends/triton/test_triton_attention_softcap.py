"""The soft cap on the Triton backend of softk.attention (in the interpreter on
the CPU): s = c·tanh(scale·q·kᵀ / c) + mask, forward and gradients of q, k,
v and a learned α, against the NumPy float64 oracle run on the capped
scores, for every map, causal or not, boolean (with fully masked rows),
float and no masks, GQA, L ≠ S; the kernels' tanh and the cap's slope
against float64; and the dispatch, which now runs a capped call on the
Triton kernels.  Maps × causal × caps: the default run covers each of
them, the slow tier every combination (tests/matrix.py).

The oracle is given the capped scores as its queries and the identity as
its keys (scale 1), so that its q·kᵀ is exactly those scores; its dq is
then ∂L/∂(capped scores), which the chain rule through the cap
(1 − tanh², scale, then q and k) takes to dq and dk here in float64."""

import numpy as np
import pytest
import torch

tri = pytest.importorskip("softk._backends.triton.attention")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from softk.attention import checks, op  # noqa: E402
from softk._backends import kernels  # noqa: E402
from softk._backends.triton.attention_tiles import _cap_slope, _tanh  # noqa: E402

from ... import matrix  # noqa: E402
from ...oracle import attention as ora  # noqa: E402
from ...attention.test_attention import MAPS, alpha_of, bool_mask  # noqa: E402
from .test_triton_attention import close32, leaves  # noqa: E402

F32 = torch.float32
CAPS = [0.5, 5.0, 50.0]  # most products saturate, some do, almost none does


@pytest.fixture(autouse=True)
def setting(monkeypatch):
    """One intra-op thread, and the launcher's buffers NaN-filled (an element a
    kernel fails to write cannot pass), as in test_triton_attention."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(tri, "_empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype,
                                                                               device=device))
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tiles(monkeypatch):
    """16×16 tiles (the default is 64×64)."""
    monkeypatch.setattr(tri, "BLOCK_M", 16)
    monkeypatch.setattr(tri, "BLOCK_N", 16)


def run(q, k, v, softcap, mask=None, causal=False, name="entmax15", alpha=None, scale=None):
    call = checks.check_call(q, k, v, mask, 0.0, causal, scale, True, name, alpha, softcap)
    return op.attention(call, kernels.get("attention", "triton"))


def capped_scores(q, k, c, scale):
    """(c·tanh(x), 1 − tanh²(x)) in float64, x = scale·q·kᵀ / c, one key head per query head."""
    q64 = q.detach().double()
    k64 = k.detach().double().repeat_interleave(q.shape[1] // k.shape[1], 1)
    t = torch.tanh(scale * (q64 @ k64.transpose(-1, -2)) / c)
    return c * t, 1 - t * t


def reference(q, k, v, c, mask, causal, name, a_np, scale, dout):
    """(out, [dq, dk, dv], dα or None) in float64 from the oracle on the capped scores."""
    H, Hkv, S = q.shape[1], k.shape[1], k.shape[2]
    G = H // Hkv
    s, slope = capped_scores(q, k, c, scale)
    eye = np.broadcast_to(np.eye(S), (q.shape[0], H, S, S))
    ve = v.detach().double().repeat_interleave(G, 1).numpy()
    m_np = None if mask is None else mask.numpy() if mask.dtype == torch.bool else mask.double().numpy()
    args = (s.numpy(), eye, ve)
    out, _ = ora.attention(*args, m_np, causal, 1.0, name, a_np)
    ds, _, dve = ora.grads(*args, dout.double().numpy(), m_np, causal, 1.0, name, a_np)
    dsr = torch.from_numpy(ds) * slope * scale  # ∂L/∂(q·kᵀ) through the cap
    q64 = q.detach().double()
    k64 = k.detach().double().repeat_interleave(G, 1)
    B = q.shape[0]
    dq = dsr @ k64
    dk = (dsr.transpose(-1, -2) @ q64).reshape(B, Hkv, G, S, -1).sum(2)
    dv = torch.from_numpy(dve).reshape(B, Hkv, G, S, -1).sum(2)
    da = None
    if isinstance(a_np, np.ndarray):
        da = ora.dalpha(*args, dout.double().numpy(), a_np, m_np, causal, 1.0)
    return out, [dq.numpy(), dk.numpy(), dv.numpy()], da


def check(q, k, v, c, mask=None, causal=False, name="entmax15", alpha=None, scale=None, dead=(), tol=1e-4):
    a, a_np = alpha_of(alpha)
    if isinstance(a, torch.Tensor):
        a = a.to(F32).requires_grad_()
    out = run(q, k, v, c, mask, causal, name, a, scale)
    sc = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=F32)
    ref, grads, da = reference(q, k, v, c, mask, causal, name, a_np, sc, dout)
    close32(out, ref)
    ts = [q, k, v] + ([a] if isinstance(a, torch.Tensor) else [])
    got = torch.autograd.grad(out, ts, dout)
    for g, want in zip(got, grads):
        close32(g, want, tol)
    if da is not None:
        close32(got[3], da, 1e-3)
    for r in dead:  # fully masked rows: an output of 0 and no gradient
        assert (out[:, :, r] == 0).all() and (got[0][:, :, r] == 0).all()
    return out


@pytest.mark.parametrize("name,alpha,causal,softcap", matrix.product(MAPS, [False, True], CAPS))
def test_softcap_matches_the_oracle(name, alpha, causal, softcap, tiles):
    # GQA (4 query heads on 2 key heads), L ≠ S, 16×16 tiles (several blocks
    # each way), a boolean mask with two fully masked rows; the products of
    # these inputs reach ±6, beyond every cap but the last
    L, S = 20, 37
    q, k, v = leaves(L=L, S=S, seed=7)
    with torch.no_grad():
        q.mul_(2.0)
    check(q, k, v, softcap, bool_mask(L, S, dead_rows=(4, 17)), causal, name, alpha, dead=(4, 17))


@pytest.mark.parametrize("name,alpha,kind", [("softmax", None, "float"), ("sparsemax", None, "none"),
                                             ("entmax15", None, "float"), ("entmax", "heads", "none")])
def test_softcap_with_a_float_mask_or_none(name, alpha, kind, tiles):
    # the two other mask kinds of the capped kernels (no mask; an additive
    # float mask with −inf entries, added after the cap)
    L, S = 18, 29
    q, k, v = leaves(L=L, S=S, seed=11)
    mask = None
    if kind == "float":
        mask = torch.randn(L, S, generator=torch.Generator().manual_seed(2))
        mask[0, : S // 2] = float("-inf")
    check(q, k, v, 1.5, mask, name == "entmax15", name, alpha)


def test_softcap_with_scale_not_positive(tiles):
    q, k, v = leaves(L=18, S=20)
    mask = bool_mask(18, 20)
    check(q, k, v, 0.8, mask, False, "sparsemax", None, scale=-0.5, dead=(3,))
    check(q, k, v, 0.8, mask, True, "entmax15", None, scale=0.0, dead=(3,))


def test_softcap_default_tiles():
    # the launcher's 64×64 tiles (one block each way at these lengths)
    q, k, v = leaves(L=9, S=70, seed=4)
    check(q, k, v, 2.0, None, False, "entmax", 1.3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_softcap_half_precision(dtype):
    q, k, v = (t.detach().to(dtype) for t in leaves(L=40, S=70))
    out = run(q, k, v, 1.0, None, True, "entmax15")
    assert out.dtype == dtype
    s, _ = capped_scores(q, k, 1.0, 1 / np.sqrt(q.shape[-1]))
    eye = np.broadcast_to(np.eye(70), (1, 4, 70, 70))
    ref, _ = ora.attention(s.numpy(), eye, v.double().repeat_interleave(2, 1).numpy(), None, True, 1.0, "entmax15")
    eps = torch.finfo(dtype).eps  # p rounded to the input dtype for p·V, out once more
    np.testing.assert_allclose(out.double().numpy(), ref, atol=4 * eps, rtol=4 * eps)


def test_capped_calls_run_the_triton_kernels(monkeypatch):
    """A capped call on the "triton" backend runs the fused kernels, forward
    and backward, with its cap (it used to fall back to the blockwise
    kernels), and gives the capped result."""
    calls = []
    fwd, bwd = tri.attention_forward, tri.attention_backward
    monkeypatch.setattr(tri, "attention_forward", lambda *a, **kw: calls.append(("fwd", kw["softcap"])) or
                        fwd(*a, **kw))
    monkeypatch.setattr(tri, "attention_backward", lambda *a, **kw: calls.append(("bwd", kw["softcap"])) or
                        bwd(*a, **kw))
    from softk._backends.blockwise import backward as bb, forward as bf

    def refuse(*a, **kw):
        raise AssertionError("the blockwise kernels ran")
    monkeypatch.setattr(bf, "attention_forward", refuse)
    monkeypatch.setattr(bb, "attention_backward", refuse)
    q, k, v = leaves(L=5, S=6)
    out = check(q, k, v, 0.3, None, False, "sparsemax")
    assert calls == [("fwd", 0.3), ("bwd", 0.3)]
    # and the cap matters here: uncapped, the result differs
    assert (out - run(q, k, v, None, name="sparsemax")).abs().max() > 1e-2


@triton.jit
def _tanh_kernel(X, T, D, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n, other=0.0)
    tl.store(T + i, _tanh(x), mask=i < n)
    tl.store(D + i, _cap_slope(x, 1.0, 1.0), mask=i < n)


def test_tanh_and_the_cap_slope_to_float32_rounding():
    # both sides of the switch at |x| = 0.625, tiny arguments (tanh x = x),
    # and the saturated range where tanh rounds to ±1 but the slope keeps
    # its relative precision; the inputs are float32 numbers, so float64
    # gives the exact values
    x = torch.cat([torch.logspace(-30, 2, 200), torch.linspace(0.6, 0.65, 40), torch.tensor([0.625, 0.0])]).to(F32)
    x = torch.cat([x, -x])
    t, d = torch.empty_like(x), torch.empty_like(x)
    _tanh_kernel[(1,)](x, t, d, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    want = torch.tanh(x.double())
    assert ((t.double() - want).abs() <= 2 * torch.finfo(F32).eps * want.abs()).all()
    assert (t[x == 0] == 0).all() and (t.abs() <= 1).all()
    slope = 1 / torch.cosh(x.double()) ** 2
    normal = slope > 1e-30  # (e^{−2|x|} a normal float32)
    np.testing.assert_allclose(d[normal].double().numpy(), slope[normal].numpy(), rtol=4 * torch.finfo(F32).eps,
                               atol=0)
    assert ((d[~normal] >= 0) & (d[~normal] < 1e-30)).all()
