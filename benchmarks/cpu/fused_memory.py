"""Peak extra CPU memory of a loss's forward+backward: unfused (full N×V logits) vs fused_linear_loss.

Run:  python benchmarks/cpu/fused_memory.py [--n 4096] [--h 256] [--v 65536] [--loss sparsemax] [--threads 1]

Each variant runs in a fresh Python process (so one variant's freed memory
cannot hide another's peak).  There the inputs X (N, H), W (V, H), b (V,)
and the targets are built and touched first; then the kernel's peak-RSS
counter is reset (``echo 5 > /proc/self/clear_refs``, Linux) and the
forward+backward runs once.  "Peak extra" is VmHWM after the step minus
VmRSS before it: every byte torch's CPU allocator took for logits, loss
temporaries and gradients (Python-level tracers such as tracemalloc do not
see torch's allocations; RSS does).  Linux only.

    unfused: loss(X @ W.T + b, t).backward()
    fused:   softk.losses.fused_linear_loss(X, W, t, loss, b).backward()

The script also checks that both give the same loss and gradients (float32
rounding) on the same inputs, reporting the largest differences.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def child(args) -> None:
    import torch

    import softk
    from softk import losses as L
    from softk._cli.harness import PeakRSS

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, args.h, generator=g).requires_grad_()
    w = (torch.randn(args.v, args.h, generator=g) / args.h**0.5).requires_grad_()
    b = torch.zeros(args.v).requires_grad_()
    t = torch.randint(0, args.v, (args.n,), generator=g)
    fns = {"sparsemax": L.sparsemax_loss, "entmax15": L.entmax15_loss, "softmax": L.softmax_loss,
           "cross_entropy": lambda z, t: L.cross_entropy(z, t)}
    def step(x, w, b, t):
        if args.variant == "unfused":
            return fns[args.loss](x @ w.T + b, t)
        return softk.losses.fused_linear_loss(x, w, t, args.loss, b, chunk_size=args.chunk)

    # Warm-up on a tiny problem: libraries and kernels load (and their pages
    # count in RSS) before the measurement starts.
    xs, ws, bs = (a.detach()[:8, :].clone().requires_grad_() for a in (x, w, b[:, None]))
    step(xs, ws, bs[:, 0], t[:8] % 8).backward()
    del xs, ws, bs
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        out = step(x, w, b, t)
        out.backward()
        secs = time.perf_counter() - t0
    peak = mem.extra
    torch.save({"loss": out.detach(), "gx": x.grad, "gw": w.grad, "gb": b.grad}, args.save)
    print(json.dumps({"variant": args.variant, "peak_extra_bytes": peak, "seconds": secs, "loss": float(out)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--h", type=int, default=256)
    ap.add_argument("--v", type=int, default=65536)
    ap.add_argument("--loss", default="sparsemax", choices=["sparsemax", "entmax15", "softmax", "cross_entropy"])
    ap.add_argument("--chunk", type=int, default=None, help="rows per chunk (default: auto)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        child(args)
        return
    import tempfile

    import torch

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("unfused", "fused"):
            cmd = [sys.executable, __file__, "--variant", variant, "--save", f"{tmp}/{variant}.pt"]
            for k in ("n", "h", "v", "loss", "threads"):
                cmd += [f"--{k}", str(getattr(args, k))]
            if args.chunk:
                cmd += ["--chunk", str(args.chunk)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results[variant] = json.loads(out.strip().splitlines()[-1])
        a, b = torch.load(f"{tmp}/unfused.pt"), torch.load(f"{tmp}/fused.pt")
    mib = 2**20
    print(f"N={args.n} H={args.h} V={args.v} float32 loss={args.loss} threads={args.threads}")
    for v in ("unfused", "fused"):
        r = results[v]
        print(f"  {v:8s} peak extra {r['peak_extra_bytes'] / mib:9.1f} MiB   time {r['seconds']:6.2f} s   loss {r['loss']:.6f}")
    ratio = results["fused"]["peak_extra_bytes"] / results["unfused"]["peak_extra_bytes"]
    print(f"  fused / unfused peak extra memory: {ratio:.4f}")
    for key in ("loss", "gx", "gw", "gb"):
        d = (a[key] - b[key]).abs().max().item()
        scale = a[key].abs().max().item()
        print(f"  max |unfused - fused| {key}: {d:.3g} (max |value| {scale:.3g})")


if __name__ == "__main__":
    main()
