"""softk.attention.scaled_dot_product_attention, forward: every backend against the
NumPy float64 oracle (tests/oracle_attention.py), every map, masks, causal,
GQA, L != S, the lengths around a block, ties, far from the origin, fully
masked rows; map="softmax" against torch's SDPA."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import softk
from softk._backends.blockwise import blocks, forward as blockwise, fused, rows, support
from softk._backends import dispatch, kernels
from softk.threshold.attention_maps import SPARSEMAX_ID
from softk.threshold.families import KERNEL_IDS
from softk.attention import checks, op, scaled_dot_product_attention as sdpa

from ..oracle import attention as ora

F64 = torch.float64
MAPS = [("softmax", None), ("sparsemax", None), ("entmax15", None), ("entmax", 1.3), ("entmax", "heads")]
HEAD_ALPHAS = [1.2, 1.5, 2.0, 1.05]  # one per head (H = 4 below), inside the float32 range [1.05, 2]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small tensors: one intra-op thread (two threads on a loaded machine cost ms per op)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# the tests' names of the attention routes: the reference (no kernel) and the kernels of op "attention"
KERNELS = {"reference": None, "blockwise": kernels.get("attention", "native"), "triton": kernels.get("attention", "triton")}


def run(backend, q, k, v, **kw):
    """The public function's arguments, on one named route (:data:`KERNELS`)."""
    call = checks.check_call(q, k, v, kw.pop("attn_mask", None), 0.0, kw.pop("is_causal", False),
                             kw.pop("scale", None), kw.pop("enable_gqa", False), kw.pop("map", "entmax15"),
                             kw.pop("alpha", None))
    assert not kw
    return op.attention(call, KERNELS[backend])


@pytest.fixture(params=["reference", "blockwise", "blockwise_rows", "blockwise_small", "blockwise_gather",
                        "blockwise_live", "blockwise_nonzeros"])
def backend(request, monkeypatch):
    """The CPU backends.  "blockwise" at these sizes runs on whole score rows
    (:mod:`softk._backends.blockwise.rows`); "blockwise_rows" runs them in
    chunks of 3 queries; "blockwise_small" runs the λ search over key blocks
    (what rows longer than ``rows.ROWS_MAX`` take at many heads) with chunks of 5 queries,
    blocks of 16 keys and at most 3 candidates per row, so that several
    chunks and blocks, the candidate merge and the whole-row fallback for
    wide supports all run at these sizes.  "blockwise_gather" forms P·V from
    the support on every call of a sparse map (:mod:`softk._backends.blockwise.support`,
    which otherwise takes it only for decoding-sized supports).  "blockwise_live"
    runs every product of a sparse map, forward and backward, over the live
    keys of groups of 2 query rows (:class:`softk._backends.blockwise.support.Live`,
    which otherwise takes them only for supports far narrower than S, and
    only where the CPU kernels of "blockwise_nonzeros" are not built), in
    chunks of 3 queries; the softmax keeps the whole score rows there (the
    fused kernel off).  "blockwise_nonzeros" runs them over each row's
    nonzeros (:mod:`softk._backends.native.products`, which otherwise takes
    them for rows of at most an eighth of S), in chunks of 3 queries."""
    if request.param == "blockwise_nonzeros":
        monkeypatch.setattr(support, "ROW_SHARE", float("inf"))
        monkeypatch.setattr(rows, "CHUNK", 1)
        monkeypatch.setattr(rows, "CHUNK_QUERIES", 3)
    if request.param == "blockwise_live":
        monkeypatch.setattr(support, "ROW_SHARE", -1.0)
        monkeypatch.setattr(support, "GROUP", 2)
        monkeypatch.setattr(support, "LIVE_SHARE", float("inf"))
        monkeypatch.setattr(support, "LIVE_SHARE_BACKWARD", float("inf"))
        monkeypatch.setattr(rows, "CHUNK", 1)
        monkeypatch.setattr(rows, "CHUNK_QUERIES", 3)
        monkeypatch.setattr(fused, "ENABLED", False)
    if request.param == "blockwise_gather":
        monkeypatch.setattr(support, "GATHER_SHARE", float("inf"))
    if request.param == "blockwise_rows":
        monkeypatch.setattr(rows, "CHUNK", 1)
        monkeypatch.setattr(rows, "CHUNK_QUERIES", 3)
    if request.param == "blockwise_small":
        monkeypatch.setattr(rows, "ROWS_MAX", 0)
        monkeypatch.setattr(rows, "ROW_SCORES", 0)
        monkeypatch.setattr(blockwise, "BLOCK", 16)
        monkeypatch.setattr(blockwise, "CAP", 3)
        monkeypatch.setattr(blocks, "ROWS", 1)
        monkeypatch.setattr(blocks, "MIN_QUERIES", 5)
    return request.param.split("_")[0]


def alpha_of(alpha, h=4):
    if alpha == "heads":
        return torch.tensor(HEAD_ALPHAS[:h], dtype=F64), np.array(HEAD_ALPHAS[:h])
    return alpha, alpha


def inputs(B=2, H=4, Hkv=2, L=37, S=53, E=8, Ev=5, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, E, generator=g, dtype=dtype), torch.randn(B, Hkv, S, E, generator=g, dtype=dtype),
            torch.randn(B, Hkv, S, Ev, generator=g, dtype=dtype))


def bool_mask(L, S, seed=1, dead_rows=(3,)):
    m = torch.rand(L, S, generator=torch.Generator().manual_seed(seed)) > 0.3
    for r in dead_rows:
        if r < L:
            m[r] = False  # a query with no key: output 0
    return m


_CACHE = {}


def oracle_out(key, *args):
    """ora.attention(*args)[0], computed once per key (the backends share it)."""
    if key not in _CACHE:
        _CACHE[key] = ora.attention(*args)[0]
    return _CACHE[key]


def close(a, b, atol=1e-10, rtol=1e-9):
    np.testing.assert_allclose(np.asarray(a, np.float64), b, atol=atol, rtol=rtol)


# ----------------------------------------------------------- against the oracle
@pytest.mark.parametrize("name,alpha", MAPS)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_oracle(backend, name, alpha, causal):
    q, k, v = inputs()
    mask = bool_mask(37, 53)
    a, a_np = alpha_of(alpha)
    out = run(backend, q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, map=name, alpha=a)
    ref = oracle_out(("main", name, alpha, causal), q.numpy(), k.numpy(), v.numpy(), mask.numpy(), causal, None,
                     name, a_np)
    close(out, ref)
    assert (out[:, :, 3] == 0).all()  # the fully masked query


@pytest.mark.parametrize("name,alpha", MAPS)
def test_float_mask_and_scale(backend, name, alpha):
    q, k, v = inputs(L=20, S=24, Hkv=4)
    g = torch.Generator().manual_seed(5)
    fmask = torch.randn(2, 1, 20, 24, generator=g, dtype=F64)  # broadcast over heads
    fmask[1, 0, 7] = float("-inf")  # a fully masked row in one batch entry only
    fmask[0, 0, :, 2] = float("-inf")
    a, a_np = alpha_of(alpha)
    out = run(backend, q, k, v, attn_mask=fmask, scale=0.7, map=name, alpha=a)
    close(out, oracle_out(("fmask", name, alpha), q.numpy(), k.numpy(), v.numpy(), fmask.numpy(), False, 0.7,
                          name, a_np))
    assert (out[1, :, 7] == 0).all()


@pytest.mark.parametrize("L,S", [(1, 1), (2, 2), (1, 300), (63, 64), (65, 63), (64, 64), (300, 65)])
@pytest.mark.parametrize("name", ["softmax", "entmax15"])
def test_lengths(backend, L, S, name):
    q, k, v = inputs(B=1, H=2, Hkv=1, L=L, S=S, E=4, Ev=3, seed=L + S)
    for causal in (False, True):
        out = run(backend, q, k, v, is_causal=causal, enable_gqa=True, map=name)
        close(out, oracle_out(("len", L, S, name, causal), q.numpy(), k.numpy(), v.numpy(), None, causal, None, name))


@pytest.mark.parametrize("name,alpha", MAPS)
def test_ties_and_offset(backend, name, alpha):
    # q = 0: every score ties, uniform weights over the keys taking part.
    q, k, v = inputs(B=1, L=9, S=40)
    a, a_np = alpha_of(alpha)
    out = run(backend, torch.zeros_like(q), k, v, is_causal=True, enable_gqa=True, map=name, alpha=a)
    close(out, oracle_out(("tie0", name, alpha), np.zeros(q.shape), k.numpy(), v.numpy(), None, True, None, name, a_np))
    # duplicated keys: ties at the top of each row
    k2 = torch.cat([k[:, :, :20], k[:, :, :20]], 2)
    out = run(backend, q, k2, v, enable_gqa=True, map=name, alpha=a)
    close(out, oracle_out(("tie1", name, alpha), q.numpy(), k2.numpy(), v.numpy(), None, False, None, name, a_np))
    # a 1e4 offset in q·k: one coordinate of every query and key is 100
    q3, k3 = q.clone(), k.clone()
    q3[..., 0], k3[..., 0] = 100.0, 100.0
    out = run(backend, q3, k3, v, scale=1.0, enable_gqa=True, map=name, alpha=a)
    close(out, oracle_out(("offset", name, alpha), q3.numpy(), k3.numpy(), v.numpy(), None, False, 1.0, name, a_np),
          atol=1e-8)


def test_one_dominant_key_and_single_key_rows(backend):
    q, k, v = inputs(B=1, H=2, Hkv=2, L=6, S=50)
    k = k.clone()
    k[..., 7, :] = 50 * q[..., 0:1, :].mean(2)  # far above the rest for most queries
    for name in ("softmax", "sparsemax", "entmax15"):
        out = run(backend, q, k, v, is_causal=True, map=name)  # query 0 sees key 0 only: p = 1
        close(out, oracle_out(("dominant", name), q.numpy(), k.numpy(), v.numpy(), None, True, None, name))
        close(out[..., 0, :], v[..., 0, :].numpy())


def test_nan_stays_in_its_row(backend):
    q, k, v = inputs(B=1, H=2, Hkv=2, L=5, S=30)
    q = q.clone()
    q[0, 1, 2, 0] = float("nan")
    for name in ("softmax", "entmax15"):
        out = run(backend, q, k, v, map=name)
        assert torch.isnan(out[0, 1, 2]).all()
        assert torch.isfinite(out[0, 0]).all() and torch.isfinite(out[0, 1, [0, 1, 3, 4]]).all()


# ---------------------------------------------------------- against torch's SDPA
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 2e-6)])
def test_softmax_is_torch_sdpa(backend, dtype, tol):
    q, k, v = inputs(dtype=dtype)
    mask = bool_mask(37, 53, dead_rows=())
    fmask = torch.randn(37, 53, dtype=dtype)
    for kw in (dict(), dict(is_causal=True), dict(attn_mask=mask), dict(attn_mask=fmask, scale=0.3)):
        ours = run(backend, q, k, v, map="softmax", enable_gqa=True, **kw)
        torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw),
                                   atol=tol, rtol=tol)
    # a mask and is_causal together: the two combined (torch takes only one of them on some paths)
    ours = run(backend, q, k, v, map="softmax", enable_gqa=True, attn_mask=mask, is_causal=True)
    both = mask & torch.ones(37, 53, dtype=torch.bool).tril()
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, enable_gqa=True, attn_mask=both),
                               atol=tol, rtol=tol)


def test_shapes_follow_torch():
    g = torch.Generator().manual_seed(0)
    cases = [((5, 8), (6, 8), (6, 3)),  # 2-D: no head dimension
             ((2, 3, 4, 5, 8), (2, 3, 4, 6, 8), (2, 3, 4, 6, 3)),  # two batch dimensions
             ((2, 4, 5, 8), (1, 4, 6, 8), (1, 4, 6, 3)),  # batch broadcast
             ((2, 4, 5, 8), (2, 1, 6, 8), (2, 1, 6, 3)),  # one key head for every query head
             ((4, 5, 8), (4, 6, 8), (4, 6, 3))]  # 3-D
    for qs, ks, vs in cases:
        q, k, v = (torch.randn(s, generator=g, dtype=F64) for s in (qs, ks, vs))
        want = F.scaled_dot_product_attention(q, k, v)
        got = sdpa(q, k, v, map="softmax")
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


def test_empty_inputs():
    q, k, v = torch.randn(1, 2, 0, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 3)
    assert sdpa(q, k, v).shape == (1, 2, 0, 3)
    q = torch.randn(1, 2, 3, 4, requires_grad=True)
    out = sdpa(q, k[:, :, :0], v[:, :, :0])  # no key at all: every row is fully masked
    assert out.shape == (1, 2, 3, 3) and (out == 0).all()
    out.sum().backward()
    assert (q.grad == 0).all()


# ------------------------------------------------------------- backends and dtypes
def test_attention_kernel_follows_the_setting(monkeypatch):
    x = torch.zeros(1, 1, 2, 2)

    def picked(t, fam=SPARSEMAX_ID):
        kernel = dispatch.pick("attention", t, fam)
        return None if kernel is None else kernel.backend

    with softk.use_backend("torch"):
        assert picked(x) is None  # the reference: the scores materialised
    with softk.use_backend("auto"):
        assert picked(x) == "native"  # the blockwise kernel
        assert picked(x, max(KERNEL_IDS.values()) + 1) is None  # a map no kernel has the row maths of
    monkeypatch.setattr(kernels, "triton_attention_ready", lambda: True)
    with softk.use_backend("triton"):  # tests/conftest.py sets TRITON_INTERPRET=1
        assert picked(x) == "triton"
        assert picked(x.double()) == "native"  # the kernels compute in float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
def test_half_precision_accumulates_in_float32(backend, dtype, name):
    q, k, v = inputs(B=1, L=16, S=70, dtype=dtype)
    out = run(backend, q, k, v, is_causal=True, enable_gqa=True, map=name)
    assert out.dtype == dtype
    ref = oracle_out(("half", dtype, name), *(t.double().numpy() for t in (q, k, v)), None, True, None, name)
    # scores rounded from half inputs, output rounded to half: a few ulps of half
    eps = torch.finfo(dtype).eps
    np.testing.assert_allclose(out.double().numpy(), ref, atol=8 * eps, rtol=8 * eps)
