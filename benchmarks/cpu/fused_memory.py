"""Peak extra CPU memory of a loss's forward+backward: unfused (full N×V logits) vs fused_linear_loss, torch and CCE.

Run:  python benchmarks/cpu/fused_memory.py [--n 4096] [--h 256] [--v 65536] [--loss sparsemax] [--threads 1]
          [--dtype float32|bfloat16] [--variants unfused fused torch cce] [--json out.json]

Each variant runs in a fresh Python process (so one variant's freed memory
cannot hide another's peak).  There the inputs X (N, H), W (V, H), b (V,)
and the targets are built in ``--dtype`` and touched first; then the
kernel's peak-RSS counter is reset (``echo 5 > /proc/self/clear_refs``,
Linux) and the forward+backward runs once.  "Peak extra" is VmHWM after the
step minus VmRSS before it: every byte torch's CPU allocator took for
logits, loss temporaries and gradients (Python-level tracers such as
tracemalloc do not see torch's allocations; RSS does).  Linux only.

    unfused: softk's loss on the logits: loss(X @ W.T + b, t).backward()
    fused:   softk.losses.fused_linear_loss(X, W, t, loss, b).backward()
    torch:   F.cross_entropy(X @ W.T + b, t).backward(), in the inputs' dtype
    cce:     Apple's Cut Cross-Entropy, linear_cross_entropy(X, W, t,
             impl="torch_compile") (its Triton kernels need CUDA; it takes
             no bias, and b is zero here, so the loss is the same)

"torch" and "cce" are cross-entropy whatever ``--loss`` says; the default
variants are unfused, fused, torch, and cce where ``cut_cross_entropy``
imports.  The gradients dX, dW (and db) are part of every peak, so the dW
in the inputs' dtype (V × H × bytes per element) is a floor; each row gives
its peak as a multiple of it, and the bf16 dW (V × H × 2 bytes) is printed
as well.  The script also checks that variants computing the same loss give
the same loss and gradients (reporting the largest differences): each
against the first variant run that computes its loss (fused against
unfused; cce against torch, or everything against unfused for
``--loss cross_entropy``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time

CE_ONLY = ("torch", "cce")  # variants that compute cross-entropy whatever --loss is
VARIANTS = ("unfused", "fused", *CE_ONLY)


def child(args) -> None:
    import torch
    import torch.nn.functional as F

    import softk
    from softk import losses as L
    from softk._cli.harness import PeakRSS

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, args.h, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(args.v, args.h, generator=g) / args.h**0.5).to(dtype).requires_grad_()
    b = torch.zeros(args.v, dtype=dtype).requires_grad_()
    t = torch.randint(0, args.v, (args.n,), generator=g)
    fns = {"sparsemax": L.sparsemax_loss, "entmax15": L.entmax15_loss, "softmax": L.softmax_loss, "ts2": L.ts2_loss,
           "cross_entropy": lambda z, t: L.cross_entropy(z, t)}
    if args.variant == "cce":
        from cut_cross_entropy import linear_cross_entropy

    def step(x, w, b, t):
        if args.variant == "unfused":
            return fns[args.loss](x @ w.T + b, t)
        if args.variant == "torch":
            return F.cross_entropy(x @ w.T + b, t)
        if args.variant == "cce":
            return linear_cross_entropy(x, w, t, impl="torch_compile")
        return softk.losses.fused_linear_loss(x, w, t, args.loss, b, chunk_size=args.chunk)

    # Warm-up on a tiny problem: libraries and kernels load (and their pages
    # count in RSS), and torch.compile compiles CCE's graph with dynamic
    # shapes, before the measurement starts.  Rows and classes differ (8 and
    # 16): equal sizes would be traced as one symbol, and the real call, whose
    # N and V differ, would compile again inside the measurement.
    xs, ws, bs = (a.detach()[:rows, :].clone().requires_grad_() for a, rows in ((x, 8), (w, 16), (b[:, None], 16)))
    step(xs, ws, bs[:, 0], t[:8] % 16).backward()
    del xs, ws, bs
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        out = step(x, w, b, t)
        out.backward()
        secs = time.perf_counter() - t0
    peak = mem.extra
    torch.save({"loss": out.detach().float(), "gx": x.grad.float(), "gw": w.grad.float(),
                "gb": None if b.grad is None else b.grad.float()}, args.save)
    print(json.dumps({"variant": args.variant, "peak_extra_bytes": peak, "seconds": secs, "loss": float(out)}))


def main(argv=None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--h", type=int, default=256)
    ap.add_argument("--v", type=int, default=65536)
    ap.add_argument("--loss", default="sparsemax", choices=["sparsemax", "entmax15", "softmax", "cross_entropy", "ts2"])
    ap.add_argument("--chunk", type=int, default=None, help="rows per chunk (default: auto)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the inputs' dtype")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=None,
                    help="default: unfused fused torch, and cce where cut_cross_entropy imports")
    ap.add_argument("--json", metavar="PATH", help="write the rows and the gradient checks here")
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.variant:
        child(args)
        return None
    import tempfile

    import torch

    variants = args.variants or [v for v in VARIANTS if v != "cce" or importlib.util.find_spec("cut_cross_entropy")]
    mib = 2**20
    itemsize = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    dw, dw_bf16 = args.v * args.h * itemsize, args.v * args.h * 2
    results, grads = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            cmd = [sys.executable, __file__, "--variant", variant, "--save", f"{tmp}/{variant}.pt"]
            for k in ("n", "h", "v", "loss", "threads", "dtype"):
                cmd += [f"--{k}", str(getattr(args, k))]
            if args.chunk:
                cmd += ["--chunk", str(args.chunk)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:  # one variant that fails (a peer that breaks on this torch) is a row saying why
                tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
                results[variant] = {"variant": variant, "error": f"exit {res.returncode}: {tail[:300]}"}
                continue
            r = json.loads(res.stdout.strip().splitlines()[-1])
            r["loss_fn"] = "cross_entropy" if variant in CE_ONLY else args.loss
            r["x_dw"] = r["peak_extra_bytes"] / dw
            results[variant] = r
            grads[variant] = torch.load(f"{tmp}/{variant}.pt")
    print(f"N={args.n} H={args.h} V={args.v} {args.dtype} loss={args.loss} threads={args.threads}")
    print(f"  dW in {args.dtype}: {dw / mib:.1f} MiB; bf16 dW (V×H×2 bytes): {dw_bf16 / mib:.1f} MiB")
    for v, r in results.items():
        if "error" in r:
            print(f"  {v:8s} {r['error']}")
            continue
        print(f"  {v:8s} peak extra {r['peak_extra_bytes'] / mib:9.1f} MiB ({r['x_dw']:5.2f} × dW)   "
              f"time {r['seconds']:6.2f} s   {r['loss_fn']} {r['loss']:.6f}")
    ok = [v for v in results if "error" not in results[v]]
    if "fused" in ok and "unfused" in ok:
        print(f"  fused / unfused peak extra memory: {results['fused']['peak_extra_bytes'] / results['unfused']['peak_extra_bytes']:.4f}")
    checks, first = [], {}
    for other in grads:
        ref = first.setdefault(results[other]["loss_fn"], other)
        if ref == other:
            continue
        for key in ("loss", "gx", "gw", "gb"):
            a, b = grads[ref][key], grads[other][key]
            if a is None or b is None:  # cce takes no bias
                continue
            d, scale = (a - b).abs().max().item(), a.abs().max().item()
            checks.append({"ref": ref, "variant": other, "tensor": key, "max_abs_diff": d, "max_abs": scale})
            print(f"  max |{ref} - {other}| {key}: {d:.3g} (max |value| {scale:.3g})")
    report = {"benchmark": "fused_memory", "N": args.n, "H": args.h, "V": args.v, "dtype": args.dtype, "loss": args.loss,
              "threads": args.threads, "chunk": args.chunk, "dw_bytes": dw, "dw_bf16_bytes": dw_bf16,
              "torch": torch.__version__, "rows": list(results.values()), "checks": checks}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
