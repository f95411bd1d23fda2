"""The fused linear loss on a GPU: softk against torch and Liger, by chunk size.

Run (CUDA GPU, repository root)::

    PYTHONPATH=src python benchmarks/gpu/fused_linear.py --json fused_linear.json
    python benchmarks/gpu/fused_linear.py --device cpu --quick       # a dry run

For each shape of ``SHAPES`` (hidden states N × H, a vocabulary of V, in
bfloat16, random class targets with 10 % of rows ignored) it times forward
+ backward (``triton.testing.do_bench``, median) and the peak extra memory
(``torch.cuda.max_memory_allocated`` above the inputs) of:

* ``torch``: ``F.cross_entropy(x @ w.T, t)``, the logits materialised;
* ``torch-linear-ce``: ``F.linear_cross_entropy`` where this torch has it;
* ``liger``: Liger-Kernel's fused linear cross-entropy, where installed;
* ``softk-<loss>[-c<rows>]``: ``softk.losses.fused_linear_loss`` with the
  loss cross_entropy, sparsemax or entmax15, at the automatic chunk size
  and at fixed ones.

Times are reported with their ratio to ``torch`` at the same shape.
``--budget-s`` bounds the run; the JSON is rewritten after each row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if os.path.join(ROOT, "src") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "src"))

# name: (N, H, V)
SHAPES = {"gpt2": (8192, 768, 50257), "llama3": (4096, 4096, 128256)}
QUICK = {"tiny": (16, 16, 100)}
CHUNKS = (None, 256, 1024, 4096)
# --quick: the automatic chunk and a fixed one that splits the tiny batch in two
QUICK_CHUNKS = (None, 8)
LOSSES = ("cross_entropy", "sparsemax", "entmax15")


def impls(quick: bool, losses=LOSSES):
    import torch
    import torch.nn.functional as F

    import softk

    out = {"torch": lambda x, w, t: F.cross_entropy(x @ w.t(), t)}
    if hasattr(F, "linear_cross_entropy"):
        out["torch-linear-ce"] = lambda x, w, t: F.linear_cross_entropy(x, w, t, ignore_index=-100)
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        out["liger"] = lambda x, w, t: liger_fused_linear_cross_entropy(x, w, t)
    except Exception:  # noqa: BLE001 - not installed: no row
        pass
    for loss in losses:
        for c in (QUICK_CHUNKS if quick else CHUNKS):
            name = f"softk-{loss}" + ("" if c is None else f"-c{c}")
            out[name] = (lambda loss, c: lambda x, w, t: softk.losses.fused_linear_loss(x, w, t, loss, chunk_size=c))(loss, c)
    del torch
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--losses", nargs="+", choices=LOSSES, default=list(LOSSES))
    ap.add_argument("--budget-s", type=float, default=90.0)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("fused_linear.py: no CUDA device here; use --device cpu for a dry run", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    t0, rows = time.monotonic(), []
    from gpu import meta_info

    meta = dict(meta_info(args.device), dtype=str(dtype))

    def write():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)

    for shape, (n, h, v) in (QUICK if args.quick else SHAPES).items():
        g = torch.Generator(device=args.device).manual_seed(0)
        x = (torch.randn(n, h, generator=g, device=args.device) / 2).to(dtype).requires_grad_()
        w = (torch.randn(v, h, generator=g, device=args.device) / h**0.5).to(dtype).requires_grad_()
        t = torch.randint(0, v, (n,), generator=g, device=args.device)
        t[torch.rand(n, generator=g, device=args.device) < 0.1] = -100
        base = None
        for name, fn in impls(args.quick, args.losses).items():
            row = {"shape": shape, "N": n, "H": h, "V": v, "impl": name}
            if time.monotonic() - t0 > args.budget_s:
                rows.append(dict(row, status="skipped: time budget"))
                continue

            def step():
                fn(x, w, t).backward()

            try:
                step()  # compile, warm
                if cuda:
                    from triton.testing import do_bench

                    torch.cuda.synchronize()
                    before = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    step()
                    torch.cuda.synchronize()
                    row["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
                    row["ms"] = do_bench(step, warmup=25, rep=150, grad_to_none=[x, w], return_mode="median")
                else:
                    t1 = time.perf_counter()
                    step()
                    row["ms"] = 1e3 * (time.perf_counter() - t1)
                if name == "torch":
                    base = row["ms"]
                row["x_torch"] = row["ms"] / base if base else None
                row["loss"] = float(fn(x, w, t).detach().float())
            except Exception as exc:  # noqa: BLE001 - a row that says why
                row["status"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            x.grad = w.grad = None
            rows.append(row)
            print(json.dumps(row), flush=True)
            write()
        x = w = t = None
        if cuda:
            torch.cuda.empty_cache()
    write()
    print(f"fused_linear: {len(rows)} rows in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
