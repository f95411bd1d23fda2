"""The work the Triton attention kernels issue, counted in Triton's
interpreter (``softk._backends.triton.work``): tensor-core FLOPs against
FlashAttention-2's textbook count, and element-wise operations per score
against softk's own softmax route, forward and forward + backward.

    TRITON_INTERPRET=1 python benchmarks/cpu/attention_work.py [--length 512] [--dim 64] [--json out.json]

FlashAttention-2 issues 4·L·S·E dot FLOPs per head forward (q·kᵀ and p·V)
and 10·L·S·E backward (q·kᵀ again, dO·Vᵀ, dV, dQ, dK): 14·L·S·E in all; a
causal run counts the pairs of its 64 × 64 tiles on or below the diagonal.
The backward is counted with dq added up by atomics (the route torch's
default, non-deterministic mode takes) and, in parentheses, with its own
deterministic sweep.
Inputs (B = 1, 2 heads, seed 0):

* ``random``: q, k, v standard normal, scale 1/√E;
* ``band``: q and k also carry a strong positional code (random Fourier
  features of a Gaussian of width 8 positions), so each query's support
  lies among its nearby keys and most 64 × 64 tiles are exactly zero; the
  share of dead tiles is reported.

The counts are exact and the same on every machine; they are not times.
"""

from __future__ import annotations

import argparse
import json
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from softk._backends.triton import attention as ta  # noqa: E402
from softk._backends.triton.work import count  # noqa: E402

MAPS = [("softmax", 0, 1.5), ("sparsemax", 1, 2.0), ("entmax15", 2, 1.5), ("entmax a=1.3", 3, 1.3)]
HEADS = 2


def inputs(kind: str, L: int, E: int, seed: int = 0):
    """(q, k, v, dout), float32, (1, HEADS, L, E)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(1, HEADS, L, E, generator=g) for _ in range(4))
    if kind == "band":
        # random Fourier features: code(i)·code(j) ≈ exp(−(i − j)² / 2w²), w = 8
        w = torch.randn(E // 2, generator=g) / 8.0
        b = torch.rand(E // 2, generator=g) * 2 * math.pi
        pos = torch.arange(L, dtype=torch.float32)[:, None]
        code = torch.cat([torch.cos(pos * w + b), torch.sin(pos * w + b)], 1) * math.sqrt(2.0 / E)
        strength = 6.0 * E ** 0.25  # scale·strength² = 36
        q = 0.3 * q + strength * code
        k = 0.3 * k + strength * code
    return q, k, v, do


def fa2_pairs(L: int, S: int, causal: bool, tile: int = 64) -> int:
    """Query-key pairs FlashAttention-2 computes: L·S, or those of the tiles on or below a causal diagonal."""
    if not causal:
        return L * S
    return sum(min(S, (qb + 1) * tile) for qb in range(-(-L // tile))) * tile if L % tile == 0 else L * S


def measure(kind: str, L: int, E: int, causal: bool) -> dict:
    q, k, v, do = inputs(kind, L, E)
    scale = 1.0 / math.sqrt(E)
    pairs = HEADS * fa2_pairs(L, L, causal)
    fa2_fwd, fa2_all = 4 * pairs * E, 14 * pairs * E
    scores = HEADS * L * L
    res = {"kind": kind, "L": L, "E": E, "causal": causal}
    base = None
    for label, fam, a in MAPS:
        alpha = torch.full((HEADS,), a)
        kw = dict(scale=scale, causal=causal, mask=None, fam=fam, alpha=alpha)
        with count() as fw:
            out, m, lam, tiles = ta.attention_forward(q, k, v, return_tiles=True, **kw)
        stats: dict = {}
        bws = {}
        for det in (False, True):  # dq by the dk/dv kernel's atomics (torch's default), or by its own sweep
            with count() as bws[det]:  # the backward reads the forward's tile mask, as op "attention" passes it
                ta.attention_backward(q, k, v, out, do, m, lam, need_dalpha=False, stats=stats,
                                      tiles=tiles if fam else None, deterministic=det, **kw)
        bw = bws[False]
        cell = {"fwd_dot": fw.dot_flops / fa2_fwd, "all_dot": (fw.dot_flops + bw.dot_flops) / fa2_all,
                "all_dot_deterministic": (fw.dot_flops + bws[True].dot_flops) / fa2_all,
                "fwd_alu_per_score": fw.alu / scores, "all_alu_per_score": (fw.alu + bw.alu) / scores,
                "fwd_reduce_per_score": fw.reduce / scores}
        if fam:
            live = stats["live"].float()
            cell["dead_tiles"] = 1.0 - live.mean().item() if not causal else None
        if base is None:
            base = cell
        cell["fwd_alu_x_softmax"] = cell["fwd_alu_per_score"] / base["fwd_alu_per_score"]
        cell["all_alu_x_softmax"] = cell["all_alu_per_score"] / base["all_alu_per_score"]
        res[label] = cell
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--kinds", nargs="+", default=["random", "band"])
    p.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    p.add_argument("--json")
    a = p.parse_args()
    causals = {"no": [False], "yes": [True], "both": [False, True]}[a.causal]
    rows = [measure(kind, a.length, a.dim, c) for kind in a.kinds for c in causals]
    print(f"L = S = {a.length}, E = {a.dim}, {HEADS} heads: dot FLOPs × FA2's (forward, fwd+bwd); "
          "element-wise ops per score (forward, fwd+bwd) and × softk softmax's forward")
    print("| input | causal | map | fwd dot | fwd+bwd dot (deterministic) | fwd ops/score | fwd+bwd ops/score "
          "| fwd ops × softmax | dead tiles |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for label, _, _ in MAPS:
            c = r[label]
            dead = "" if c.get("dead_tiles") is None else f"{c['dead_tiles']:.0%}"
            print(f"| {r['kind']} | {'yes' if r['causal'] else 'no'} | {label} | {c['fwd_dot']:.2f}× | "
                  f"{c['all_dot']:.2f}× ({c['all_dot_deterministic']:.2f}×) | {c['fwd_alu_per_score']:.1f} | {c['all_alu_per_score']:.1f} | "
                  f"{c['fwd_alu_x_softmax']:.2f}× | {dead} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
