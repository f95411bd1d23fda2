"""The fused sparsemax loss's backward on the gradient's live columns against
the dense products, forward and backward, on hidden states with small and
large supports.

    python benchmarks/cpu/fused_sparse_columns.py [--threads 1] [--reps 5]

N = 1024 rows, H = 256, V = 32,768, float32.  The hidden states are the
target's weight row times a scale plus noise: a large scale gives supports
of one class (a trained model's shape), no scale and more noise wider ones.
The two settings (``SPARSE_MAX_SHARE`` 0: always dense; 1: always the live
columns) are interleaved, median of the repetitions.  Nothing asserts on
time.
"""

import argparse
import statistics
import time

import torch

import softk
import softk._ops.fused_linear as FL
from softk.losses import fused_linear_loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    N, H, V = 1024, 256, 32768
    g = torch.Generator().manual_seed(0)
    W = torch.randn(V, H, generator=g) * 0.05
    y = torch.randint(0, V, (N,), generator=g)
    print("| mean support | union of supports / V | dense products (s) | live columns (s) |")
    print("|---:|---:|---:|---:|")
    for scale, noise in [(200.0, 0.05), (0.0, 2.0), (0.0, 0.5), (0.0, 0.05)]:
        x = (W[y] * scale + torch.randn(N, H, generator=g) * noise).requires_grad_()
        with torch.no_grad():
            p = softk.sparsemax(x @ W.t())
        times = {0.0: [], 1.0: []}
        for _ in range(args.reps):
            for share in times:
                FL.SPARSE_MAX_SHARE = {"cpu": share}
                w = W.clone().requires_grad_()
                t0 = time.perf_counter()
                fused_linear_loss(x, w, y, "sparsemax").backward()
                times[share].append(time.perf_counter() - t0)
        print(f"| {(p > 0).sum(-1).float().mean():.1f} | {(p > 0).any(0).float().mean():.3f} | "
              f"{statistics.median(times[0.0]):.3f} | {statistics.median(times[1.0]):.3f} |")


if __name__ == "__main__":
    main()
