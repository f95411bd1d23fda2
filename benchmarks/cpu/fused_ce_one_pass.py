"""The fused linear cross-entropy with its one-pass rows and gradient (the
logits overwritten with G) against the autograd pass it replaced, and
against the three matmuls alone.

    python benchmarks/cpu/fused_ce_one_pass.py [--threads 1] [--reps 3]

N = 4096, H = 256, V = 65,536, float32, 10 % of the rows ignored, forward
and backward; the two variants interleaved in one process, median of the
repetitions (both variants leave the ignored rows out of the matmuls; the
matmuls alone run on every row).  Nothing asserts on time.
"""

import argparse
import statistics
import time

import torch

from softk.losses import fused_linear_loss
from softk.losses._registry import LOSSES


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    N, H, V = 4096, 256, 65536
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(N, H, generator=g) * 0.5).requires_grad_()
    w = (torch.randn(V, H, generator=g) * 0.05).requires_grad_()
    y = torch.randint(0, V, (N,), generator=g)
    y[torch.rand(N, generator=g) < 0.1] = -100
    one_pass = LOSSES["cross_entropy"]
    times = {"one pass": [], "autograd": [], "matmuls": []}
    for _ in range(args.reps):
        for name in times:
            x.grad = w.grad = None
            t0 = time.perf_counter()
            if name == "matmuls":
                with torch.no_grad():
                    z = x @ w.t()
                    z @ w
                    z.t() @ x
            else:
                LOSSES["cross_entropy"] = one_pass if name == "one pass" else one_pass._replace(in_place=None)
                fused_linear_loss(x, w, y).backward()
            times[name].append(time.perf_counter() - t0)
    LOSSES["cross_entropy"] = one_pass
    for name, ts in times.items():
        print(f"{name}: {statistics.median(ts):.2f} s")


if __name__ == "__main__":
    main()
