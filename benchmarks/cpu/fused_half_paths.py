"""fused_linear_loss in half precision: the time of evaluation, of a frozen head and of training.

Run:  PYTHONPATH=<tree>/src python benchmarks/cpu/fused_half_paths.py [LABEL] [--n 1024] [--h 512] [--v 16384]
          [--dtype bfloat16|float16] [--rounds 5]

Three calls of ``softk.losses.fused_linear_loss(X, W, t)`` (cross-entropy) on
X (N, H) and W (V, H) in ``--dtype``, one thread:

    eval:   under torch.no_grad()
    frozen: X requires grad, W does not (a frozen head); forward + backward
    train:  X and W require grad; forward + backward

Each is called once untimed, then ``--rounds`` times; the minimum is printed,
in ms, after LABEL (to tell two source trees apart when they are run in
turn with PYTHONPATH).
"""

from __future__ import annotations

import argparse
import time

import torch

from softk.losses import fused_linear_loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("label", nargs="?", default="")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--h", type=int, default=512)
    ap.add_argument("--v", type=int, default=16384)
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, args.h, generator=g).to(dtype)
    w = (torch.randn(args.v, args.h, generator=g) / args.h**0.5).to(dtype)
    t = torch.randint(0, args.v, (args.n,), generator=g)

    def evaluate():
        with torch.no_grad():
            fused_linear_loss(x, w, t)

    def frozen():
        fused_linear_loss(x.clone().requires_grad_(), w, t).backward()

    def train():
        fused_linear_loss(x.clone().requires_grad_(), w.clone().requires_grad_(), t).backward()

    best = {}
    for name, fn in (("eval", evaluate), ("frozen", frozen), ("train", train)):
        fn()
        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[name] = min(times) * 1e3
    print(args.label, " ".join(f"{k} {v:.1f} ms" for k, v in best.items()))


if __name__ == "__main__":
    main()
