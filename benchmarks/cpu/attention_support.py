"""P·V over the support against the dense product, on the CPU: where the
gather of :mod:`softk._backends.blockwise.support` wins.

    python benchmarks/cpu/attention_support.py [--threads 1] [--reps 5] [--json out.json]

P (B, H, R, S) holds random weights at a given share of nonzeros, V is
(B, H, S, 64), float32.  Each cell is the median over repetitions of the
gather's time over the dense matmul's in the same repetition (the two are
interleaved).  Shapes: decoding (R = 1 query per head, B = 4, H = 8,
S = 4096 and 32768) and chunks of 128–256 queries per head (a GEMM).
Benchmarks are not tests: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import torch

from softk._backends.blockwise import support

SHAPES = [(4, 8, 1, 4096), (4, 8, 1, 32768), (1, 4, 256, 2048), (1, 4, 128, 8192)]
SHARES = [0.001, 0.01, 0.03, 0.05, 0.2]


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cell(shape, share, reps, monkey):
    g = torch.Generator().manual_seed(0)
    v = torch.randn(*shape[:2], shape[3], 64, generator=g)
    p = torch.rand(shape, generator=g)
    p = torch.where(torch.rand(shape, generator=g) < share, p, 0.0)
    dense = lambda: p @ v  # noqa: E731

    def gather():
        monkey(float("inf"))
        try:
            return support.product(p, v, True)
        finally:
            monkey(None)

    dense(), gather()
    ratios, base = [], []
    for _ in range(reps):
        td, tg = _time(dense), _time(gather)
        ratios.append(tg / td)
        base.append(td)
    return statistics.median(base) * 1e3, statistics.median(ratios)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    default = support.GATHER_SHARE

    def monkey(value):
        support.GATHER_SHARE = default if value is None else value

    rows = []
    for shape in SHAPES:
        for share in SHARES:
            ms, ratio = _cell(shape, share, args.reps, monkey)
            rows.append({"shape": list(shape), "share": share, "dense_ms": ms, "gather_over_dense": ratio,
                         "chosen": "gather" if share * shape[2] <= default else "dense"})
            print(json.dumps(rows[-1]), flush=True)
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.machine(), "threads": args.threads,
            "torch": torch.__version__, "gather_share": default}
    print(f"\n{meta['date']}, {meta['machine']}, {args.threads} thread(s), torch {meta['torch']}\n")
    print("| B, H, R, S | nonzeros of P | dense ms | gather / dense | chosen |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| {', '.join(map(str, r['shape']))} | {r['share']:.1%} | {r['dense_ms']:.2f} | "
              f"{r['gather_over_dense']:.2f} | {r['chosen']} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
