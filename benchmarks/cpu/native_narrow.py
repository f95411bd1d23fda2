"""Narrow rows on the native backend: router and small-vocabulary widths.

The forward of ``softk.sparsemax``, ``softk.entmax15`` and
``softk.entmax(x, alpha=1.3)`` under ``softk.use_backend("native")``, and of
``torch.softmax``, on x = ``torch.randn(ROWS, N)`` float32 with ROWS·N =
2^20 (``--elements``), one thread, for each width N in ``--widths``; the
providers are called in turn, round after round, and each one's minimum
over the rounds is reported, in ms and as a multiple of ``torch.softmax``'s.

    PYTHONPATH=src python benchmarks/cpu/native_narrow.py [--widths 8 16 32 64 128 256] [--rounds 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import softk


def providers(x: torch.Tensor) -> dict:
    return {
        "torch.softmax": lambda: torch.softmax(x, -1),
        "sparsemax": lambda: softk.sparsemax(x),
        "entmax15": lambda: softk.entmax15(x),
        "entmax alpha=1.3": lambda: softk.entmax(x, alpha=1.3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    ap.add_argument("--elements", type=int, default=2**20, help="rows × width of each input")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the results here")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    results = []
    print(f"{'rows × n':>12} " + " ".join(f"{name:>24}" for name in providers(torch.zeros(1))))
    for n in args.widths:
        x = torch.randn(args.elements // n, n)
        calls = providers(x)
        best = {name: float("inf") for name in calls}
        with softk.use_backend("native"):
            for fn in calls.values():  # warm up: the first call may compile the kernels
                for _ in range(3):
                    fn()
            for _ in range(args.rounds):
                for name, fn in calls.items():
                    t0 = time.perf_counter()
                    fn()
                    best[name] = min(best[name], time.perf_counter() - t0)
        ms = {name: t * 1e3 for name, t in best.items()}
        base = ms["torch.softmax"]
        cells = " ".join(f"{t:>13.3f} ms ({t / base:4.2f}x)" for t in ms.values())
        print(f"{x.shape[0]:>7} × {n:<4}{cells}", flush=True)
        results.append({"shape": list(x.shape), "min_ms": ms, "over_softmax": {k: t / base for k, t in ms.items()}})
    if args.json:
        out = {"dtype": "float32", "threads": args.threads, "rounds": args.rounds, "torch": torch.__version__,
               "rows": results}
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
