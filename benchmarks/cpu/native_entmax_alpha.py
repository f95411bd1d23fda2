"""α-entmax on the native backend against entmax15, sparsemax and torch.softmax.

The forward of ``softk.entmax(x, alpha=A)`` (default A = 1.3), ``softk.entmax15``
and ``softk.sparsemax`` under ``softk.use_backend("native")``, and
``torch.softmax``, on x = ``torch.randn(ROWS, N)`` float32, one thread; the
providers are called in turn, round after round, and each one's minimum over
the rounds is reported, with α-entmax's time as a multiple of entmax15's.

    PYTHONPATH=src python benchmarks/cpu/native_entmax_alpha.py [--rounds 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import softk


def native_minima(providers: dict, rounds: int, warmup: int = 5) -> dict:
    """Each provider's minimum time in ms under the native backend, the
    providers called in turn, round after round, after ``warmup`` untimed
    calls each (the first call may compile the kernels)."""
    best = {name: float("inf") for name in providers}
    with softk.use_backend("native"):
        for fn in providers.values():
            for _ in range(warmup):
                fn()
        for _ in range(rounds):
            for name, fn in providers.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
    return {name: t * 1e3 for name, t in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--alpha", type=float, default=1.3)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the results here")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x = torch.randn(args.rows, args.n)
    alpha = args.alpha
    providers = {
        f"entmax alpha={alpha}": lambda: softk.entmax(x, alpha=alpha),
        "entmax15": lambda: softk.entmax15(x),
        "sparsemax": lambda: softk.sparsemax(x),
        "torch.softmax": lambda: torch.softmax(x, -1),
    }
    ms = native_minima(providers, args.rounds)
    ratio = ms[f"entmax alpha={alpha}"] / ms["entmax15"]
    for name, t in ms.items():
        print(f"{name:>20}: {t:.3f} ms")
    print(f"{'ratio':>20}: {ratio:.2f}x entmax15")
    if args.json:
        out = {"shape": [args.rows, args.n], "dtype": "float32", "threads": args.threads, "rounds": args.rounds,
               "alpha": alpha, "min_ms": ms, "ratio_alpha_over_entmax15": ratio,
               "torch": torch.__version__}
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
