"""The work the Triton attention kernels issue, counted in the interpreter
(:mod:`softk._backends.triton.work`): exact and machine-independent, so the
sweeps of the design are pinned here, against FlashAttention-2's textbook
count (4·L·S·E dot FLOPs per head forward, 14·L·S·E forward and backward)
and softk's own softmax route (element-wise operations per score).

L = S = 512, E = 64, 2 heads, random q, k, v (every 64 × 64 tile holds some
row's support) and a band (q, k with a strong positional code: most tiles
exactly zero), causal and not; the inputs are those of
benchmarks/cpu/attention_work.py, whose table BENCHMARKS.md gives.

* forward dot FLOPs: sparsemax 1.5× FA2's (q·kᵀ in the max sweep, then q·kᵀ
  and p·V), entmax15 2.0× (a second q·kᵀ sweep gathers its candidates);
* forward element-wise operations per score ≤ 3× softmax's, not causal;
* forward + backward dot FLOPs ≤ 1.6× FA2's with dq added up by atomics
  (seven products per live tile in the backward); with the deterministic dq
  sweep (eight) sparsemax ≤ 1.6× and entmax15 ≤ 1.75× (its three forward
  sweeps: 24·L·S·E against FA2's 14);
* on the band (≥ 60 % of the tiles dead), forward + backward ≤ 0.8× FA2's:
  the p·V sweep and every backward product run on the live tiles only.
"""

import math
import pathlib
import sys

import pytest
import torch

tri = pytest.importorskip("softk._backends.triton.attention")

from softk._backends.triton.work import count  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parents[3] / "benchmarks" / "cpu"))
import attention_work as aw  # noqa: E402

pytestmark = pytest.mark.slow
L, E, H = 512, 64, aw.HEADS


def _work(kind, fam, alpha, causal):
    q, k, v, do = aw.inputs(kind, L, E)
    kw = dict(scale=1 / math.sqrt(E), causal=causal, mask=None, fam=fam, alpha=torch.full((H,), alpha))
    with count() as fw:
        out, m, lam, tiles = tri.attention_forward(q, k, v, return_tiles=True, **kw)
    stats: dict = {}
    bw = {}
    for det in (False, True):
        with count() as bw[det]:
            tri.attention_backward(q, k, v, out, do, m, lam, need_dalpha=False, stats=stats,
                                   tiles=tiles if fam else None, deterministic=det, **kw)
    return fw, bw, stats


@pytest.fixture(scope="module")
def softmax():
    return {c: _work("random", 0, 1.5, c) for c in (False, True)}


def _fa2(causal):
    return H * aw.fa2_pairs(L, L, causal) * E  # × 4 forward, × 14 forward and backward


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fam,alpha,fwd,limit_all", [(1, 2.0, 1.5, 1.6), (2, 1.5, 2.0, 1.75)])
def test_random_inputs(softmax, causal, fam, alpha, fwd, limit_all):
    fw, bw, stats = _work("random", fam, alpha, causal)
    assert fw.dot_flops == fwd * 4 * _fa2(causal)  # the sweeps, every tile live
    assert fw.dot_flops + bw[False].dot_flops <= 1.6 * 14 * _fa2(causal)
    assert fw.dot_flops + bw[True].dot_flops <= limit_all * 14 * _fa2(causal)
    if not causal:
        assert fw.alu <= 3.0 * softmax[causal][0].alu
    assert fw.alu <= 3.5 * softmax[causal][0].alu


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fam,alpha", [(1, 2.0), (2, 1.5)])
def test_dead_tiles_pay(causal, fam, alpha):
    fw, bw, stats = _work("band", fam, alpha, causal)
    live = stats["live"]
    if not causal:
        assert 1.0 - live.float().mean().item() >= 0.6  # the input is what the limit is about
    for det in (False, True):
        assert fw.dot_flops + bw[det].dot_flops <= 0.9 * 14 * _fa2(causal)
        if not causal:
            assert fw.dot_flops + bw[det].dot_flops <= 0.8 * 14 * _fa2(causal)
