"""GradTopK at scale: soft_topk(method="grad") forward + backward, float32,
by each algorithm (softk._ops.gradtopk.ALGORITHM: the sequential scan, the tree of
log-space polynomial products, the automatic choice), next to soft_topk "exp".

Run:
  python benchmarks/cpu/gradtopk_scale.py [--n 4096] [--k 256] [--batch 8] [--threads 1] [--repeats 3]
  python benchmarks/cpu/gradtopk_scale.py --compare   # scan, tree, auto and "exp" at 8x4096 k=256 and 256x1024 k=32
  python benchmarks/cpu/gradtopk_scale.py --sweep     # scan vs tree across shapes and k (the CPU crossover)
  python benchmarks/cpu/gradtopk_scale.py --ops       # ATen ops per forward + backward by algorithm (a GPU launch-count proxy)
Prints the best wall time of `repeats` runs (after one warm-up), Σp − k and
whether everything is finite.
"""

import argparse
import time

import torch

import softk
from softk._ops import gradtopk

COMPARE_SHAPES = [(8, 4096, 256), (256, 1024, 32)]
SWEEP = [(8, 4096), (64, 1024), (256, 256), (512, 64), (1024, 16)]
SWEEP_K = [2, 8, 16, 32, 64, 128, 256]


def timed(batch: int, n: int, k: int, method: str, algorithm: str, repeats: int, dtype=torch.float32):
    """Best (forward, backward) seconds of soft_topk on a (batch, n) input, and
    the last run's p and gradient."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(batch, n, generator=gen) * 3).to(dtype)
    g = torch.randn(batch, n, generator=gen).to(dtype)
    saved, gradtopk.ALGORITHM = gradtopk.ALGORITHM, algorithm
    try:
        best = None
        for _ in range(repeats + 1):  # the first run is a warm-up
            xr = x.clone().requires_grad_()
            t0 = time.perf_counter()
            p = softk.soft_topk(xr, k, method=method)
            t1 = time.perf_counter()
            p.backward(g)
            t2 = time.perf_counter()
            if best is None or (t2 - t0) < sum(best[:2]):
                best = (t1 - t0, t2 - t1)
        return best[0], best[1], p.detach(), xr.grad
    finally:
        gradtopk.ALGORITHM = saved


def report(batch, n, k, algorithm, args, exp_total=None):
    fwd, bwd, p, grad = timed(batch, n, k, "grad", algorithm, args.repeats)
    ratio = f", {(fwd + bwd) / exp_total:.0f}x exp" if exp_total else ""
    print(
        f"grad/{algorithm:<4} {batch}x{n} k={k} float32 threads={args.threads}: forward {fwd:.4f} s, "
        f"backward {bwd:.4f} s, total {fwd + bwd:.4f} s{ratio}; "
        f"max |sum p - k| = {(p.double().sum(-1) - k).abs().max().item():.1e}, "
        f"finite: {bool(torch.isfinite(p).all() and torch.isfinite(grad).all())}",
        flush=True,
    )
    return fwd + bwd


# Ops that only make views or allocate: no kernel launch on a GPU.
_NO_KERNEL = {
    "aten::" + name
    for name in "view unflatten select slice unfold as_strided expand squeeze unsqueeze t transpose detach "
    "lift_fresh alias reshape movedim permute unbind empty empty_like empty_strided resolve_conj resolve_neg "
    "_unsafe_view".split()
}


def count_ops(batch: int, n: int, k: int, algorithm: str) -> int:
    """ATen ops (composite ones counted with their parts) in one forward +
    backward, with the tree's products unblocked as on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    from softk._backends.gradtopk import tree as gradtopk_tree

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(batch, n, generator=gen) * 3).requires_grad_()
    saved = gradtopk.ALGORITHM, gradtopk_tree._CPU_BLOCK
    gradtopk.ALGORITHM, gradtopk_tree._CPU_BLOCK = algorithm, 1 << 62
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            softk.soft_topk(x, k, method="grad").backward(torch.ones(batch, n))
    finally:
        gradtopk.ALGORITHM, gradtopk_tree._CPU_BLOCK = saved
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::") and e.key not in _NO_KERNEL)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--algorithm", choices=["auto", "scan", "tree"], default="auto")
    ap.add_argument("--compare", action="store_true", help="scan, tree, auto and exp at the two issue shapes")
    ap.add_argument("--sweep", action="store_true", help="scan vs tree over shapes and k")
    ap.add_argument("--ops", action="store_true", help="ATen ops per forward + backward at the two issue shapes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.ops:
        for batch, n, k in COMPARE_SHAPES:
            for algorithm in ("scan", "tree"):
                print(f"{algorithm} {batch}x{n} k={k}: {count_ops(batch, n, k, algorithm)} ATen ops per forward + backward")
        return
    if args.sweep:
        for batch, n in SWEEP:
            for k in SWEEP_K:
                if k < n and batch * n * k <= 8 * 4096 * 256:
                    scan = sum(timed(batch, n, k, "grad", "scan", args.repeats)[:2])
                    tree = sum(timed(batch, n, k, "grad", "tree", args.repeats)[:2])
                    pick = gradtopk.algorithm(batch, n, k, torch.device("cpu"))
                    print(f"{batch}x{n} k={k}: scan {scan:.4f} s, tree {tree:.4f} s, "
                          f"tree/scan {tree / scan:.2f}, auto picks {pick}", flush=True)
        return
    shapes = COMPARE_SHAPES if args.compare else [(args.batch, args.n, args.k)]
    for batch, n, k in shapes:
        exp_fwd, exp_bwd, _, _ = timed(batch, n, k, "exp", "auto", max(args.repeats, 10))
        exp_total = exp_fwd + exp_bwd
        print(f"exp       {batch}x{n} k={k} float32 threads={args.threads}: forward {exp_fwd:.5f} s, "
              f"backward {exp_bwd:.5f} s, total {exp_total:.5f} s", flush=True)
        for algorithm in (["scan", "tree", "auto"] if args.compare else [args.algorithm]):
            report(batch, n, k, algorithm, args, exp_total)


if __name__ == "__main__":
    main()
