"""Narrow rows on the native backend: router and small-vocabulary widths.

The forward of ``softk.sparsemax``, ``softk.entmax15``,
``softk.entmax(x, alpha=1.3)`` and ``softk.soft_topk(x, 2)`` (method "exp")
under ``softk.use_backend("native")``, and of
``torch.softmax``, on x = ``torch.randn(ROWS, N)`` float32 with ROWS·N =
2^20 (``--elements``), one thread, for each width N in ``--widths``; the
providers are called in turn, round after round, and each one's minimum
over the rounds is reported, in ms and as a multiple of ``torch.softmax``'s.
With ``--backward``, forward + backward instead (autograd, an incoming
gradient drawn once).

    PYTHONPATH=src python benchmarks/cpu/native_narrow.py [--widths 8 16 32 64 128 256] [--backward] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch
from native_entmax_alpha import native_minima  # this directory is the script's, so on sys.path

import softk


MAPS = {
    "torch.softmax": lambda x: torch.softmax(x, -1),
    "sparsemax": softk.sparsemax,
    "entmax15": softk.entmax15,
    "entmax alpha=1.3": lambda x: softk.entmax(x, alpha=1.3),
    "soft_topk exp k=2": lambda x: softk.soft_topk(x, 2),
}


def providers(x: torch.Tensor, backward: bool) -> dict:
    if not backward:
        return {name: (lambda f=f: f(x)) for name, f in MAPS.items()}
    g = torch.randn_like(x)

    def fwd_bwd(f):
        leaf = x.detach().requires_grad_()
        f(leaf).backward(g)

    return {name: (lambda f=f: fwd_bwd(f)) for name, f in MAPS.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    ap.add_argument("--elements", type=int, default=2**20, help="rows × width of each input")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--backward", action="store_true", help="time forward + backward")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the results here")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    results = []
    print(("forward + backward" if args.backward else "forward") + f", {torch.get_num_threads()} thread(s)")
    print(f"{'rows × n':>12} " + " ".join(f"{name:>24}" for name in MAPS))
    for n in args.widths:
        x = torch.randn(args.elements // n, n)
        ms = native_minima(providers(x, args.backward), args.rounds, warmup=3)
        base = ms["torch.softmax"]
        cells = " ".join(f"{t:>13.3f} ms ({t / base:4.2f}x)" for t in ms.values())
        print(f"{x.shape[0]:>7} × {n:<4}{cells}", flush=True)
        results.append({"shape": list(x.shape), "min_ms": ms, "over_softmax": {k: t / base for k, t in ms.items()}})
    if args.json:
        out = {"pass": "fwd+bwd" if args.backward else "fwd", "dtype": "float32", "threads": args.threads,
               "rounds": args.rounds, "torch": torch.__version__, "rows": results}
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
