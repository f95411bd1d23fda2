"""The edges that once gave silent wrong answers, on the device: α-entmax
near α = 1 in every dtype, soft top-k where (x − r)/τ overflows float32,
and attention with α near 1 (out, dq, dk, dv and dα) and on peaked rows.

Run (CUDA GPU, repository root)::

    PYTHONPATH=src:. python benchmarks/gpu/edges.py --json edges.json
    TRITON_INTERPRET=1 PYTHONPATH=src:. python benchmarks/gpu/edges.py --device cpu --quick   # a dry run

The rows and tolerances are the tests' (``tests/precision/edge_cases.py``,
``tests/attention/test_alpha_near_one.py``): the maps against the mpmath
oracle on the rounded rows, attention against softk's reference backend in
float64 on the CPU (softk.entmax on whole rows, itself tested against the
oracle).  Exit 1 when a case fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (ROOT, os.path.join(ROOT, "src")):
    if path not in sys.path:
        sys.path.insert(0, path)


def backend_for(device):
    """The device's kernels: "auto" on a GPU; Triton in its interpreter on the CPU (the dry run)."""
    return "triton" if device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" else "auto"


def map_cases(device, quick):
    import numpy as np
    import torch

    import softk
    from tests.precision.edge_cases import (METHODS, NEAR_ONE, OVERFLOW_ROWS, entmax_reference, near_one_rows,
                                            overflow_reference, tolerance)

    dtypes = (torch.float32, torch.bfloat16) if quick else (torch.float32, torch.float16, torch.bfloat16)
    for dtype in dtypes:
        for alpha in (NEAR_ONE[:2] if quick else NEAR_ONE):
            for x, tau in near_one_rows(dtype)[: 3 if quick else None]:
                with softk.use_backend(backend_for(device)):
                    p = softk.entmax(x.to(device), alpha=alpha, tau=tau).cpu()
                ref = entmax_reference(x, alpha, tau)
                err = np.abs(p.double().numpy() - ref)
                yield {"case": f"entmax a={alpha} {str(dtype)[6:]} {tuple(x.shape)} tau={tau}", "err": float(err.max()),
                       "ok": bool((err <= tolerance(dtype, ref)).all() and torch.isfinite(p).all())}
    for i, (row, k, tau, exact) in enumerate(OVERFLOW_ROWS):
        for method in ([METHODS[i % len(METHODS)]] if quick else METHODS):  # quick: each row once, each method in turn
            x = torch.tensor([row], device=device, requires_grad=True)
            with softk.use_backend(backend_for(device)):
                p = softk.soft_topk(x, k, tau=tau, method=method)
                (g,) = torch.autograd.grad(p, x, torch.ones_like(p))
            err = float(np.abs(p.detach().cpu().double().numpy()[0] - overflow_reference(row, k, tau, method, exact)).max())
            yield {"case": f"soft_topk {method} k={k} tau={tau} {row}", "err": err,
                   "ok": err <= 1e-6 and bool(torch.isfinite(g).all())}


def attention_cases(device, quick):
    import torch

    import softk  # noqa: F401
    from softk.attention import scaled_dot_product_attention as sdpa

    def run(q, k, v, g, alphas, dtype, dev, **kw):
        leaves = [t.to(dev, dtype).requires_grad_(True) for t in (q, k, v)]
        a = torch.tensor(alphas, dtype=dtype, device=dev, requires_grad=True)
        with softk.use_backend("torch" if dtype == torch.float64 else backend_for(dev)):
            out = sdpa(*leaves, map="entmax", alpha=a, **kw)
            grads = torch.autograd.grad(out, leaves + [a], g.to(dev, dtype))
        return [t.detach().cpu().double() for t in [out, *grads]]

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen) for n in (12, 30, 30))
    g = torch.randn(1, 2, 12, 16, generator=gen)
    for alpha in ((1.00001, 1.01) if quick else (1.00001, 1.0001, 1.001, 1.01, 1.5, 2.0)):
        got = run(q, k, v, g, [alpha, min(alpha + 0.2, 2.0)], torch.float32, device)
        want = run(q, k, v, g, [alpha, min(alpha + 0.2, 2.0)], torch.float64, "cpu")
        errs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, want)]
        yield {"case": f"attention a={alpha}", "err": errs, "ok": max(errs[:4]) <= 1e-5 and errs[4] <= 2e-4}
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 2, 3, 64, generator=gen) * 3, torch.randn(2, 1, 17, 64, generator=gen) * 3, \
        torch.randn(2, 1, 17, 64, generator=gen)
    g = torch.randn(2, 2, 3, 64, generator=gen)
    kw = dict(scale=-0.7, enable_gqa=True)
    got = run(q, k, v, g, [1.2, 1.05], torch.float32, device, **kw)[4]
    want = run(q, k, v, g, [1.2, 1.05], torch.float64, "cpu", **kw)[4]
    err = float(((got - want).abs() / want.abs().clamp(min=1e-12)).max())
    yield {"case": "attention dα, peaked rows", "err": err, "ok": err <= 1e-4}
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    da = run(q, k, v, torch.randn(1, 2, 5, 8), [1.01, 1.5], torch.float32, device)[4]
    yield {"case": "attention dα, one key per row", "err": float(da.abs().max()), "ok": bool((da == 0).all())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="a few cases (the dry run)")
    ap.add_argument("--json", help="write the cases here")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rows = []
    for group in (map_cases, attention_cases):
        for row in group(args.device, args.quick):
            rows.append(row)
            print(("ok   " if row["ok"] else "FAIL ") + row["case"], row["err"], flush=True)
    summary = {"pass": sum(r["ok"] for r in rows), "fail": sum(not r["ok"] for r in rows),
               "seconds": round(time.monotonic() - t0, 1)}
    print("summary:", summary)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"summary": summary, "cases": rows}, fh, indent=1)
    return 1 if summary["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
