"""The fused attention kernels build for sm_90 (ptxas included), in a
process where TRITON_INTERPRET is unset: the interpreter accepts code that
the compiler rejects (see gpu_build)."""

import pytest

from . import gpu_build

_COMPILE = r"""
from softk._backends.triton.attention import BLOCK_M, BLOCK_N, MAXIT, NEWTON_CAP, SLOTS, _pad, _warps
from softk._backends.triton.attention_bwd import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel
from softk._backends.triton.attention_kernels import attn_fwd_kernel

def strides(*names):
    return {n + s: "i32" for n in names for s in ("b", "h", "m", "d")}

# every family, with the three mask kinds and both causal settings taking
# turns, at E = Ev = 64 and 128 (padded from 80) and the dtypes in turn;
# the backward with and without dα for entmax α, dq by its own sweep and by
# the dk/dv kernel's atomics in turn; then every family with a soft cap, on
# the mask kinds a capped call runs (3 none, 4 boolean, 2 float)
dtypes = ("*bf16", "*fp16", "*fp32")
masks = ("*u8", "*u8", "*fp32", "", "*u8")  # (none: the q pointer, typed as the mask slot's)
ints = {n: "i32" for n in ("H", "GROUP", "L", "S", "E", "EV", "NKB")}
built = 0

def build_all(fam, e, ty, kind, causal, softcap, stats, atomic):
    global built
    mty = masks[kind] or ty
    ptrs = dict(Q=ty, K=ty, V=ty, MASK=mty, ALPHA="*fp32", M="*fp32", LAM="*fp32", TILES="*i8")
    base = dict(ints, scale="fp32", softcap="fp32", alpha_f="fp32")
    sq = {"sq" + c: "i32" for c in "bhmd"} | {"sk" + c: "i32" for c in "bhnd"} | {"sv" + c: "i32" for c in "bhnd"} \
        | {"sm" + c: "i32" for c in ("b", "h", "m", "n")}
    cs = dict(FAM=fam, MASK_KIND=kind, CAUSAL=causal, SOFTCAP=softcap, BM=BLOCK_M, BN=BLOCK_N, EP=_pad(e),
              EVP=_pad(e))
    w = _warps(e)
    build(attn_fwd_kernel, dict(ptrs, OUT=ty, LIVE="*i8", SZ="*fp32", SI="*i32", STATS="*i32", **sq, **base),
          dict(cs, SKIP=True, WITH_STATS=stats, NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, C=SLOTS), w)
    for need in ((False, True) if fam == 3 else (False,)):
        so = {"so" + c: "i32" for c in "bhmd"} | {"sd" + c: "i32" for c in "bhmd"}
        build(attn_bwd_dq_kernel, dict(ptrs, OUT=ty, DO=ty, DQ=ty, DELTA="*fp32", DAROW="*fp32", **sq, **so, **base),
              dict(cs, SKIP=True, NEED_DALPHA=need, OUT_F32=ty == "*fp32", DQ_HERE=not atomic), w)
        built += 1
    sd = {"sd" + c: "i32" for c in "bhmd"}
    b2 = dict(base, HKV="i32", NQB="i32")
    build(attn_bwd_dkdv_kernel, dict(ptrs, DO=ty, DELTA="*fp32", DK=ty, DV=ty, DQACC="*fp32", **sq, **sd, **b2),
          dict(cs, ATOMIC_DQ=atomic), w)
    built += 2

for fam in range(4):
    for i, e in enumerate((64, 80)):
        build_all(fam, e, dtypes[(fam + i) % 3], (fam + i) % 3, bool((fam + i) % 2), False, i == 1, i == 0)
for fam in range(4):
    build_all(fam, 64, dtypes[fam % 3], (3, 4, 2, 4)[fam], bool(fam % 2), True, False, fam % 2 == 0)
assert built == 39, built
print("OK")
"""


@pytest.mark.gpu_build
def test_attention_kernels_compile_for_a_gpu():
    # about a minute with an empty Triton cache on an idle 2-core machine
    gpu_build.compile_for_gpu(_COMPILE)
