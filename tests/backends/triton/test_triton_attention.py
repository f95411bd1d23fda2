"""The Triton backend of softk.attention (softk._backends.triton.attention, in the
interpreter on the CPU: tests/conftest.py sets TRITON_INTERPRET=1) against
the NumPy float64 oracle at small sizes: forward and gradients of q, k, v and
α, every map, boolean and float masks, causal, GQA, L != S, lengths 1, 2, 63,
65, fully masked rows, a 1e4 offset in q·k, half precision.

Every buffer the launcher allocates (out, m, λ, dq, dk, dv, δ, the dα rows)
is NaN-filled first, so an element a kernel fails to write cannot pass.
Tiles of 16×16 (besides the default 64×64) put several query and key blocks,
the block skipping and the causal block bounds into play at these lengths.
Maps × causal: the default run covers each, the slow tier both for every
map (tests/matrix.py).  Skipped where the kernels are not built."""

import numpy as np
import pytest
import torch

import softk

tri = pytest.importorskip("softk._backends.triton.attention")

from softk._backends import dispatch  # noqa: E402
from softk.threshold.attention_maps import SPARSEMAX_ID  # noqa: E402

from ... import matrix  # noqa: E402
from ...oracle import attention as ora  # noqa: E402
from ...attention.test_attention import MAPS, alpha_of, bool_mask, one_thread, run  # noqa: E402,F401

F32 = torch.float32


@pytest.fixture(autouse=True)
def nan_filled(monkeypatch):
    monkeypatch.setattr(tri, "_empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype,
                                                                               device=device))


@pytest.fixture
def tiles(monkeypatch):
    """16×16 tiles (the default is 64×64: the same code, larger constants)."""
    monkeypatch.setattr(tri, "BLOCK_M", 16)
    monkeypatch.setattr(tri, "BLOCK_N", 16)


def close32(a, b, tol=2e-5):
    np.testing.assert_allclose(np.asarray(a.detach(), np.float64), b, atol=tol, rtol=tol)


def leaves(B=1, H=4, Hkv=2, L=13, S=21, E=8, Ev=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64).to(F32).requires_grad_()
            for s in ((B, H, L, E), (B, Hkv, S, E), (B, Hkv, S, Ev))]


def check_grads(out, q, k, v, a, mask, causal, name, a_np, scale=None, tol=1e-4, dead=()):
    """q, k, v (and a tensor α) gradients against the oracle's."""
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=F32)
    ts = [q, k, v] + ([a] if isinstance(a, torch.Tensor) else [])
    got = torch.autograd.grad(out, ts, dout)
    np_args = [t.detach().double().numpy() for t in (q, k, v)]
    m_np = None if mask is None else mask.double().numpy() if mask.dtype != torch.bool else mask.numpy()
    for g, want in zip(got, ora.grads(*np_args, dout.double().numpy(), m_np, causal, scale, name, a_np)):
        close32(g, want, tol)
    if isinstance(a, torch.Tensor):
        close32(got[3], ora.dalpha(*np_args, dout.double().numpy(), a_np, m_np, causal, scale), 1e-3)
    for r in dead:
        assert (got[0][:, :, r] == 0).all()


@pytest.mark.parametrize("name,alpha,causal", matrix.product(MAPS, [False, True]))
def test_triton_backend_matches_oracle(name, alpha, causal, tiles):
    L, S = 20, 37
    q, k, v = leaves(L=L, S=S)
    mask = bool_mask(L, S, dead_rows=(4, 17))
    a, a_np = alpha_of(alpha)
    if isinstance(a, torch.Tensor):
        a = a.to(F32).requires_grad_()
    out = run("triton", q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, map=name, alpha=a)
    ref, _ = ora.attention(*(t.detach().double().numpy() for t in (q, k, v)), mask.numpy(), causal, None, name, a_np)
    close32(out, ref)
    assert (out[:, :, [4, 17]] == 0).all()  # fully masked rows: 0, not NaN
    check_grads(out, q, k, v, a, mask, causal, name, a_np, dead=(4, 17))


@pytest.mark.parametrize("L,S", [(1, 1), (2, 2), pytest.param(63, 65, marks=pytest.mark.slow),
                                 pytest.param(65, 63, marks=pytest.mark.slow)])
def test_triton_backend_lengths_and_float_mask(L, S, tiles):
    q, k, v = leaves(H=2, Hkv=1, L=L, S=S, E=4, Ev=3, seed=L)
    fmask = torch.randn(L, S, generator=torch.Generator().manual_seed(1))
    fmask[0, : max(S // 2, 1)] = float("-inf")
    for i, name in enumerate(("softmax", "sparsemax", "entmax15")):
        mask = fmask if i != 1 else torch.isfinite(fmask)  # the float mask, and a boolean one
        causal = i == 2
        out = run("triton", q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, map=name)
        m_np = mask.numpy() if mask.dtype == torch.bool else mask.double().numpy()
        ref, _ = ora.attention(*(t.detach().double().numpy() for t in (q, k, v)), m_np, causal, None, name)
        close32(out, ref)
        check_grads(out, q, k, v, None, mask, causal, name, None)


@pytest.mark.parametrize("name,alpha", [("softmax", None), ("sparsemax", None), ("entmax15", None),
                                        ("entmax", "heads")])
def test_triton_backend_far_from_origin(name, alpha, tiles):
    """A 1e4 offset in q·k (one coordinate of every query and key is 100).
    The other coordinates are multiples of 1/8, so q·k is exact in float32
    and the oracle sees the same scores: what is left is the kernels' own
    rounding.  Shifting by the raw max before the scale is exact; scaling
    first (1/√8 here) rounds s ≈ 3.5e3 to 2.4e-4 and fails this tolerance."""
    g = torch.Generator().manual_seed(5)
    L, S = 19, 40
    q = (torch.randint(-16, 17, (1, 4, L, 8), generator=g) / 8.0)
    k = (torch.randint(-16, 17, (1, 2, S, 8), generator=g) / 8.0)
    v = torch.randn(1, 2, S, 4, generator=g)
    q[..., 0], k[..., 0] = 100.0, 100.0
    q, k, v = (t.to(F32).requires_grad_() for t in (q, k, v))
    a, a_np = alpha_of(alpha)
    if isinstance(a, torch.Tensor):
        a = a.to(F32).requires_grad_()
    mask = bool_mask(L, S, dead_rows=(2,))
    for causal in (name in ("sparsemax", "entmax"),):
        out = run("triton", q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, map=name, alpha=a)
        ref, _ = ora.attention(*(t.detach().double().numpy() for t in (q, k, v)), mask.numpy(), causal, None, name,
                               a_np)
        close32(out, ref, 2e-5)
        check_grads(out, q, k, v, a, mask, causal, name, a_np, tol=2e-4, dead=(2,))


def test_triton_backend_scale_not_positive(tiles):
    """scale ≤ 0: the max of q·k is not the row max of s; the kernels scale first there."""
    q, k, v = leaves(L=18, S=20)
    mask = bool_mask(18, 20)
    for scale, name in ((-0.5, "sparsemax"), (0.0, "entmax15")):
        out = run("triton", q, k, v, attn_mask=mask, scale=scale, enable_gqa=True, map=name)
        ref, _ = ora.attention(*(t.detach().double().numpy() for t in (q, k, v)), mask.numpy(), False, scale, name)
        close32(out, ref)
        check_grads(out, q, k, v, None, mask, False, name, None, scale=scale, dead=(3,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_backend_half_precision(dtype):
    q, k, v = (t.detach().to(dtype) for t in leaves(L=40, S=70))
    out = run("triton", q, k, v, is_causal=True, enable_gqa=True, map="entmax15")
    assert out.dtype == dtype
    ref, _ = ora.attention(*(t.double().numpy() for t in (q, k, v)), None, True, None, "entmax15")
    # p is rounded to the input dtype for the p·V product (as on the GPU); out once more
    eps = torch.finfo(dtype).eps
    np.testing.assert_allclose(out.double().numpy(), ref, atol=4 * eps, rtol=4 * eps)


def test_triton_backend_reaches_the_kernels_on_cpu(monkeypatch):
    """The public function under softk.use_backend("triton") runs CPU tensors on
    the Triton backend (the interpreter), and "auto" on the CPU does not."""
    calls = []
    fwd = tri.attention_forward
    monkeypatch.setattr(tri, "attention_forward", lambda *a, **kw: calls.append(1) or fwd(*a, **kw))
    q, k, v = (t.detach() for t in leaves(L=5, S=6))
    with softk.use_backend("triton"):
        assert dispatch.pick("attention", q, SPARSEMAX_ID).backend == "triton"
        out = softk.attention.scaled_dot_product_attention(q, k, v, enable_gqa=True, map="sparsemax")
    assert calls == [1]
    ref, _ = ora.attention(*(t.double().numpy() for t in (q, k, v)), None, False, None, "sparsemax")
    close32(out, ref)
    with softk.use_backend("auto"):
        assert dispatch.pick("attention", q, SPARSEMAX_ID).backend == "native"  # the blockwise kernel


@pytest.mark.parametrize("alpha", [2.0, 1.05])
def test_triton_alpha_range_ends(alpha):
    # The ends of softk.attention.checks.ALPHA_RANGE for float32 on the Triton
    # backend: a row whose second key sits at p = 0.01
    # and the gradients of random rows, α included, against the oracle.
    from ...attention.test_grad import ENDS, test_alpha_at_the_ends_of_its_range, \
        test_alpha_end_with_an_entry_at_the_support_edge
    test_alpha_end_with_an_entry_at_the_support_edge("triton", alpha)
    if alpha == 2.0:
        test_alpha_at_the_ends_of_its_range("triton", *ENDS[0])


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1.5e-3), (torch.bfloat16, 2.5e-2)])  # test_grad.HALF_TOL
def test_triton_half_precision_grads_with_keys_sharing_an_offset(name, dtype, tol):
    # the CPU backends' test on the Triton backend: δ recomputed in float32 for a
    # half-precision out, and dq from centred keys (ds is rounded to the keys'
    # dtype for the product there)
    from ...attention.test_grad import test_half_precision_grads_with_keys_sharing_an_offset as case
    case("triton", name, dtype, tol)


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_entmax15_on_near_equal_scores_sums_to_one(offset):
    # a support of every key (near-equal scores, as at initialisation) wider
    # than the gather's buffer: the search over key blocks took the closed
    # form from −2 below the max, whose discriminant cancels there, as exact,
    # and Σp (the output against v = 1) was off by 7e-3 at 8192 keys.  Its
    # rounding through Σp is about (Σu/2)·4 ulps of λ, under 2e-6 here
    S = 4096
    g = torch.Generator().manual_seed(0)
    s = (offset + torch.randn(S, generator=g, dtype=torch.float64) * 1e-3).float()
    q = torch.zeros(1, 1, 2, 16)
    q[..., 0] = 1.0
    q[0, 0, 1, 0] = 0.5  # a second row: the same scores halved
    k = torch.zeros(1, 1, S, 16)
    k[0, 0, :, 0] = s
    v = torch.zeros(1, 1, S, 16)
    v[0, 0, :, 0] = 1.0
    v[0, 0, :, 1] = torch.randn(S, generator=g)
    out = run("triton", q, k, v, map="entmax15", scale=1.0)
    for i, c in enumerate((1.0, 0.5)):
        p = ora.weights((c * s.double()).numpy().reshape(1, 1, 1, S), "entmax15")[0, 0, 0]
        np.testing.assert_allclose(out[0, 0, i, 0].item(), 1.0, rtol=0, atol=16 * float(np.finfo(np.float32).eps))
        np.testing.assert_allclose(out[0, 0, i, 1].item(), p @ v[0, 0, :, 1].double().numpy(), rtol=0, atol=1e-6)
