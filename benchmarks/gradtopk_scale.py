"""GradTopK at scale: soft_topk(method="grad") forward + backward, float32.

Run:  python benchmarks/gradtopk_scale.py [--n 4096] [--k 256] [--batch 8] [--threads 2] [--repeats 3]
Prints the best wall time of `repeats` runs (after one warm-up) and the
accuracy figures Σp − k and whether everything is finite.
"""

import argparse
import time

import torch

import softk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, args.n, generator=gen) * 3
    g = torch.randn(args.batch, args.n, generator=gen)

    def step():
        xr = x.clone().requires_grad_()
        t0 = time.perf_counter()
        p = softk.soft_topk(xr, args.k, method="grad")
        t1 = time.perf_counter()
        p.backward(g)
        t2 = time.perf_counter()
        return p.detach(), xr.grad, t1 - t0, t2 - t1

    step()  # warm-up
    runs = [step() for _ in range(args.repeats)]
    p, grad, fwd, bwd = min(runs, key=lambda r: r[2] + r[3])
    print(
        f"gradtopk n={args.n} k={args.k} batch={args.batch} float32 threads={args.threads}: "
        f"forward {fwd:.3f} s, backward {bwd:.3f} s, total {fwd + bwd:.3f} s"
    )
    print(
        f"max |sum p - k| = {(p.double().sum(-1) - args.k).abs().max().item():.2e}, "
        f"finite p: {bool(torch.isfinite(p).all())}, finite grad: {bool(torch.isfinite(grad).all())}"
    )


if __name__ == "__main__":
    main()
