"""The Triton attention backward's one sweep over the key blocks
(softk._backends.triton.attention_bwd, in the interpreter on the CPU) and
the live-tile flags a caller may hand it (``tiles`` of
:func:`softk._backends.triton.attention.attention_backward`).

* dq, dk, dv and dα of every map against the float64 oracle, causal or
  not, float32 and bfloat16, with a boolean mask (two fully masked rows)
  or none, with a soft cap or none, GQA, 16×16 tiles (several query and key
  blocks); values shared by v's rows (dP with a large common offset) in
  float16 and bfloat16, at the tolerance of the other half-precision
  gradient tests;
* flags built from the float64 oracle's p give the same gradients, bit for
  bit, as the flags the dq kernel finds itself, and as ``skip=False``; a
  wrong-sized tensor is refused;
* the dot products the backward issues (:mod:`softk._backends.triton.work`):
  4 per live tile in each kernel, none on a tile the flags call dead; with
  ``deterministic=False`` (dq by the dk/dv kernel's atomics) 2 in the dq
  kernel and 5 in the dk/dv kernel.

Each gradient test runs both routes of dq: its own sweep
(``deterministic=True``) and the atomics.

Every buffer the launcher allocates is NaN-filled first, so an element a
kernel fails to write cannot pass."""

import numpy as np
import pytest
import torch

tri = pytest.importorskip("softk._backends.triton.attention")

from softk._backends.triton.work import count  # noqa: E402

from ... import matrix  # noqa: E402
from ...oracle import attention as ora  # noqa: E402
from ...attention.test_attention import bool_mask, one_thread  # noqa: E402,F401
from ...attention.test_grad import HALF_TOL  # noqa: E402
from .test_triton_attention import close32  # noqa: E402
from .test_triton_attention_softcap import reference as capped_reference  # noqa: E402

F32 = torch.float32
NAMES = {0: "softmax", 1: "sparsemax", 2: "entmax15", 3: "entmax"}
ALPHAS = [1.3, 1.7]  # one per query head (fam 3)
TOL = dict(HALF_TOL)


@pytest.fixture(autouse=True)
def nan_filled(monkeypatch):
    monkeypatch.setattr(tri, "_empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype,
                                                                               device=device))


def _alpha(fam):
    return torch.tensor(ALPHAS, dtype=F32) if fam == 3 else None


def kernels(q, k, v, dout, fam, causal=False, mask=None, softcap=0.0, block=None, **kw):
    """(dq, dk, dv, dα or None) from the Triton forward and backward."""
    scale = q.shape[-1] ** -0.5
    a = _alpha(fam)
    out, m, lam = tri.attention_forward(q, k, v, scale=scale, causal=causal, mask=mask, fam=fam, alpha=a,
                                        softcap=softcap, block_m=block, block_n=block)
    return tri.attention_backward(q, k, v, out, dout, m, lam, scale=scale, causal=causal, mask=mask, fam=fam,
                                  alpha=a, need_dalpha=fam == 3, softcap=softcap, block_m=block, block_n=block, **kw)


def oracle(q, k, v, dout, fam, causal=False, mask=None, softcap=0.0):
    """The same gradients in float64, from the rounded inputs."""
    name, a_np = NAMES[fam], (np.array(ALPHAS) if fam == 3 else None)
    scale = q.shape[-1] ** -0.5
    mask = None if mask is None else mask[0, 0]
    if softcap:
        _, grads, da = capped_reference(q, k, v, softcap, mask, causal, name, a_np, scale, dout.double())
        return (*grads, da)
    args = [t.double().numpy() for t in (q, k, v)]
    m_np = None if mask is None else mask.numpy()
    grads = ora.grads(*args, dout.double().numpy(), m_np, causal, scale, name, a_np)
    da = ora.dalpha(*args, dout.double().numpy(), a_np, m_np, causal, scale) if fam == 3 else None
    return (*grads, da)


def close(got, want, dtype, tol32=1e-4):
    if dtype == F32:
        close32(got, want, tol32)
        return
    err = np.abs(got.double().numpy() - want).max() / np.abs(want).max()
    assert err <= TOL[dtype], err


def inputs(B=1, H=2, Hkv=1, L=20, S=37, E=8, Ev=4, seed=0, dtype=F32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)
               for s in ((B, H, L, E), (B, Hkv, S, E), (B, Hkv, S, Ev)))
    dout = torch.randn(B, H, L, Ev, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v, dout


FAMS = [0, 1, 2, 3]


@pytest.mark.parametrize("fam,causal,dtype,masked,softcap,deterministic",
                         matrix.product(FAMS, [False, True], [F32, torch.bfloat16], [True, False], [0.0, 2.0],
                                        [True, False]))
def test_one_sweep_matches_the_oracle(fam, causal, dtype, masked, softcap, deterministic):
    # GQA (2 query heads on 1 key head), L ≠ S, 16×16 tiles: 2 query and 3
    # key blocks; a boolean mask with two fully masked rows (zero gradients)
    L, S = 20, 37
    q, k, v, dout = inputs(L=L, S=S, seed=fam, dtype=dtype)
    with torch.no_grad():
        q.mul_(2.0)  # products beyond the cap
    mask = bool_mask(L, S, dead_rows=(4, 17)).expand(1, 2, L, S) if masked else None
    got = kernels(q, k, v, dout, fam, causal, mask, softcap, block=16, deterministic=deterministic)
    want = oracle(q, k, v, dout, fam, causal, mask, softcap)
    for g, w in zip(got[:3], want[:3]):
        close(g, w, dtype)
    if fam == 3:
        close(got[3], want[3], dtype, 1e-3)
    else:
        assert got[3] is None
    if masked:
        assert (got[0][:, :, [4, 17]] == 0).all()


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_values_sharing_an_offset(fam, dtype, deterministic):
    # v with a large component shared by every key: dP_j = dO·v_j carries an
    # offset dO·c that dP − δ cancels.  The sweep subtracts δ̂ = dO·out (out
    # rounded to the half dtype) before the product with the keys and
    # corrects by (δ − δ̂)·Σ d k at the end, so the half-precision rounding of
    # the products' operands is of size |dP − δ̂|, not |dP|.  Keys with an
    # offset of their own as well (dq is formed from centred keys).
    g = torch.Generator().manual_seed(11)
    B, H, L, S, E, Ev = 1, 2, 33, 65, 16, 8
    q = torch.randn(B, H, L, E, generator=g, dtype=torch.float64)
    k = torch.randn(B, 1, S, E, generator=g, dtype=torch.float64)
    v = torch.randn(B, 1, S, Ev, generator=g, dtype=torch.float64)
    v += 40 * torch.randn(Ev, generator=g, dtype=torch.float64)
    k[..., 0] += 10
    dout = torch.randn(B, H, L, Ev, generator=g, dtype=torch.float64)
    q, k, v, dout = (t.to(dtype) for t in (q, k, v, dout))
    got = kernels(q, k, v, dout, fam, block=16, deterministic=deterministic)
    want = oracle(q, k, v, dout, fam)
    for which, gg, w in zip(["dq", "dk", "dv", "dα"], got, want):
        if w is not None:
            err = np.abs(gg.double().numpy() - w).max() / np.abs(w).max()
            assert err <= TOL[dtype], (which, err)


def flags_of(p, block=64):
    """int8 flags of the kernels' layout from p (B, H, L, S): entry
    (b·H + h)·nqb·nkb + qb·nkb + kb is 1 where p > 0 somewhere in the tile."""
    B, H, L, S = p.shape
    nqb, nkb = -(-L // block), -(-S // block)
    padded = np.zeros((B, H, nqb * block, nkb * block))
    padded[:, :, :L, :S] = p
    live = (padded.reshape(B, H, nqb, block, nkb, block) > 0).any(axis=(3, 5))
    return torch.from_numpy(live.reshape(-1).astype(np.int8))


def block_diagonal(L, S, block=64):
    """A keep-mask where query block i sees key block i only: the other tiles are dead."""
    return (torch.arange(L)[:, None] // block) == (torch.arange(S)[None, :] // block)


@pytest.mark.parametrize("fam,causal", [(1, False), (2, True), (3, False)])
def test_flags_from_the_oracle_give_the_same_gradients(fam, causal):
    L, S = 128, 150
    q, k, v, dout = inputs(L=L, S=S, E=16, Ev=8, seed=3)
    mask = block_diagonal(L, S)
    mask[:, 128:] = True  # the third key block live for every query block
    mask = mask.expand(1, 2, L, S)
    _, p = ora.attention(*(t.double().numpy() for t in (q, k, v)), mask[0, 0].numpy(), causal, None, NAMES[fam],
                         np.array(ALPHAS) if fam == 3 else None)
    flags = flags_of(p)
    assert 0 < int(flags.sum()) < flags.numel()
    st_own, st_given = {}, {}
    own = kernels(q, k, v, dout, fam, causal, mask, stats=st_own)
    given = kernels(q, k, v, dout, fam, causal, mask, stats=st_given, tiles=flags)
    every = kernels(q, k, v, dout, fam, causal, mask, skip=False, tiles=flags)
    for a, b, c in zip(own, given, every):
        assert (a is b is c is None) or (torch.equal(a, b) and torch.equal(a, c))
    assert torch.equal(st_given["live"].reshape(-1), flags)
    # the dq kernel's own flags are the oracle's (and none past the causal diagonal is read)
    if not causal:
        assert torch.equal(st_own["live"].reshape(-1), flags)


def test_wrong_sized_tiles_are_refused():
    q, k, v, dout = inputs(L=20, S=37)
    with pytest.raises(ValueError, match="tiles"):
        kernels(q, k, v, dout, 1, tiles=torch.ones(2 * 1 * 1 + 1, dtype=torch.int8))
    with pytest.raises(ValueError, match="tiles"):  # 2 heads × 2 × 3 blocks of 16
        kernels(q, k, v, dout, 2, block=16, tiles=torch.ones(2 * 2 * 2, dtype=torch.int8))


def dot_flops(*args, **kw):
    with count() as w:
        kernels(*args, **kw)
    return w


def test_dot_flops_per_live_tile():
    # L = S = 128, E = Ev = 64, 2 heads, 64×64 tiles: 2·2·2 = 8 tile pairs.
    # The dq kernel: q·kᵀ, dO·vᵀ and the two products with the keys; the dk/dv
    # kernel: k·qᵀ, pᵀ·dO, v·dOᵀ and dsᵀ·q; each 2·64·64·64 FLOPs.
    B, H, L, S, E, blk = 1, 2, 128, 128, 64, 64
    per_dot = 2 * blk * blk * E
    q, k, v, dout = inputs(B=B, H=H, Hkv=H, L=L, S=S, E=E, Ev=E, seed=5)
    scale = E ** -0.5
    out, m, lam = tri.attention_forward(q, k, v, scale=scale, causal=False, mask=None, fam=1, alpha=None)
    nt = B * H * (L // blk) * (S // blk)

    def bwd(**kw):
        with count() as w:
            tri.attention_backward(q, k, v, out, dout, m, lam, scale=scale, causal=False, fam=1, alpha=None,
                                   need_dalpha=False, **kw)
        return w.dot_flops

    assert bwd(mask=None, tiles=torch.ones(nt, dtype=torch.int8), deterministic=False) == nt * (2 + 5) * per_dot
    assert bwd(mask=None, tiles=torch.ones(nt, dtype=torch.int8), deterministic=True) == nt * (4 + 4) * per_dot
    # half the tiles dead (query block i sees key block i only): their p is
    # exactly 0, and flags that say so spare them every product; without
    # flags the dq kernel still forms their q·kᵀ to find that out
    mask = block_diagonal(L, S).expand(B, H, L, S)
    out, m, lam = tri.attention_forward(q, k, v, scale=scale, causal=False, mask=mask, fam=1, alpha=None)
    _, p = ora.attention(*(t.double().numpy() for t in (q, k, v)), mask[0, 0].numpy(), False, scale, "sparsemax")
    flags = flags_of(p)
    dead = nt - int(flags.sum())
    assert dead == nt // 2
    assert bwd(mask=mask, tiles=flags, deterministic=True) == (nt - dead) * (4 + 4) * per_dot
    assert bwd(mask=mask, deterministic=True) == (nt - dead) * (4 + 4) * per_dot + dead * per_dot
    assert bwd(mask=mask, tiles=flags, deterministic=False) == (nt - dead) * (2 + 5) * per_dot


_COMPILE_READING = r"""
from softk._backends.triton.attention import BLOCK_M, BLOCK_N, _pad, _warps
from softk._backends.triton.attention_bwd import attn_bwd_dq_kernel

# the dq kernel that reads the caller's flags, SKIP = 2 (the build test of
# every kernel builds the one that finds them, SKIP = 1): the sparse maps,
# each dtype, a boolean, float or no mask, causal or not, capped or not, dα
# for entmax α
built = 0
for fam, ty, kind, causal, cap in ((1, "*bf16", 1, False, False), (2, "*fp16", 2, True, False),
                                   (3, "*fp32", 4, False, True), (1, "*fp32", 3, True, True)):
    sig = {n: ty for n in ("Q", "K", "V", "OUT", "DO", "DQ")}
    sig |= dict(MASK={1: "*u8", 4: "*u8", 2: "*fp32"}.get(kind, ty), ALPHA="*fp32", M="*fp32", LAM="*fp32",
                DELTA="*fp32", DAROW="*fp32", TILES="*i8")
    sig |= {p + c: "i32" for p, cs in (("sq", "bhmd"), ("sk", "bhnd"), ("sv", "bhnd"), ("sm", "bhmn"), ("so", "bhmd"),
                                        ("sd", "bhmd")) for c in cs}
    sig |= {n: "i32" for n in ("H", "GROUP", "L", "S", "E", "EV", "NKB")} | dict(scale="fp32", softcap="fp32",
                                                                                  alpha_f="fp32")
    cs = dict(FAM=fam, MASK_KIND=kind, CAUSAL=causal, SOFTCAP=cap, SKIP=2, NEED_DALPHA=fam == 3, BM=BLOCK_M,
              BN=BLOCK_N, EP=_pad(64), EVP=_pad(64), OUT_F32=ty == "*fp32", DQ_HERE=fam != 2)
    build(attn_bwd_dq_kernel, sig, cs, _warps(64))
    built += 1
assert built == 4, built
print("OK")
"""


@pytest.mark.gpu_build
def test_the_reading_dq_kernel_compiles_for_a_gpu():
    from . import gpu_build
    gpu_build.compile_for_gpu(_COMPILE_READING)
