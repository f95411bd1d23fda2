"""The CPU attention's whole-row path, two of its choices timed in one process.

1. α-entmax's backward forms a chunk's p either by mapping its rows again
   with the native row kernel or from the forward's (m, t) by the closed
   form (a log1p and an exp per score): both on one chunk of scores.
2. The chunk of queries (``rows.CHUNK`` scores, at least
   ``rows.CHUNK_QUERIES`` queries): each setting of ``--settings``
   in turn, ``--runs`` times, each map's forward over SDPA's forward timed
   right before it, the minimum over ``--calls`` calls; the minimum over the
   runs is printed per setting.

    python benchmarks/cpu/attention_chunks.py [--lengths 2048 8192] [--settings 1048576,128 524288,64]

B = 1, H = 4, E = 64, float32, N(0, 1) inputs, one thread.  Benchmarks are
not tests: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from softk._backends.blockwise import rows
from softk.attention import scaled_dot_product_attention as softk_sdpa
from softk.threshold.families import entmax_family

MAPS = (("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}))


def _best(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def probs_of_a_chunk(calls: int = 20) -> None:
    g = torch.Generator().manual_seed(0)
    s = torch.randn(4, 512, 2048, generator=g)  # 4 heads × 512 queries × 2048 keys
    am1 = torch.tensor(0.3)
    fams = [(entmax_family(1.3), slice(None))]
    p = rows._map(fams, s)
    m, t = rows._shifted_threshold(s, p, am1)
    mapped = _best(lambda: rows._map(fams, s), calls)
    closed = _best(lambda: rows._entmax_probs(s.clone(), m, t, am1), calls)
    copy = _best(lambda: s.clone(), calls)
    print(f"alpha = 1.3, 4 x 512 x 2048 scores: the row kernel {mapped:.2f} ms, "
          f"the closed form {closed:.2f} ms (of which the copy of s {copy:.2f} ms)")


def forward_chunks(L: int, settings, runs: int, calls: int) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, L, 64, generator=g) for _ in range(3))
    best: dict = {}
    for _ in range(runs):
        for chunk, queries in settings:
            rows.CHUNK, rows.CHUNK_QUERIES = chunk, queries
            ratios = []
            for name, kw in MAPS:
                sdpa = _best(lambda: F.scaled_dot_product_attention(q, k, v), calls)
                ratios.append(_best(lambda: softk_sdpa(q, k, v, map=name, **kw), calls) / sdpa)
            old = best.get((chunk, queries), ratios)
            best[chunk, queries] = [min(a, b) for a, b in zip(old, ratios)]
    for (chunk, queries), ratios in best.items():
        cells = ", ".join(f"{name} {r:.2f}" for (name, kw), r in zip(MAPS, ratios))
        print(f"L = S = {L}, {chunk} scores / {queries} queries: forward over SDPA {cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--settings", nargs="+", default=["1048576,128", "524288,64"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    probs_of_a_chunk()
    settings = [tuple(int(x) for x in s.split(",")) for s in args.settings]
    for L in args.lengths:
        forward_chunks(L, settings, args.runs, args.calls)


if __name__ == "__main__":
    main()
