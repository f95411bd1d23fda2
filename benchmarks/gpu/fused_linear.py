"""The fused linear loss on a GPU: softk against torch, Liger-Kernel and Cut Cross-Entropy, by chunk size.

Run (CUDA GPU, repository root)::

    PYTHONPATH=src python benchmarks/gpu/fused_linear.py --json fused_linear.json
    PYTHONPATH=src python benchmarks/gpu/fused_linear.py --shapes gemma2-9b --no-chunks
    python benchmarks/gpu/fused_linear.py --device cpu --quick       # a dry run

For each output layer of ``SHAPES`` (hidden states N × H, a vocabulary of
V, in bfloat16, no bias, random class targets with 10 % of rows ignored;
Gemma 2's final-logit soft cap 30 where the model has one) it times forward
+ backward with CUDA events (``--reps`` calls after two warm-up calls, the
median) and measures the peak extra memory: ``torch.cuda.max_memory_allocated``
during one call minus the memory allocated once the inputs exist (no
gradients yet), so dX and dW themselves are in it and 1 × dW is the floor.
Each row also gives the size of the bf16 dW (V × H × 2 bytes) and the peak
as a multiple of it.  Rows, in this order at each shape:

* ``torch``: ``F.cross_entropy(x @ w.T, t)``, the logits materialised in
  bf16 (soft-capped as ``c·tanh(z/c)`` first where the shape has a cap);
* ``torch-linear-ce``: ``F.linear_cross_entropy`` where this torch has it
  (it takes no soft cap);
* ``liger``: Liger-Kernel's ``liger_fused_linear_cross_entropy``;
* ``cce``: Apple's Cut Cross-Entropy, ``cut_cross_entropy.linear_cross_entropy``
  with its defaults (``impl="cce"``, gradient filter "high"); on the CPU,
  where its Triton kernels cannot run, ``impl="torch_compile"``;
* ``softk-<loss>``: ``softk.losses.fused_linear_loss`` with the loss
  cross_entropy, sparsemax or entmax15 at the automatic chunk size.

A peer that is not installed, or a provider without the soft cap, is a row
whose ``status`` says so, not a crash.  After every shape's rows come the
fixed chunk sizes (``softk-<loss>-c<rows>``; ``--no-chunks`` leaves them
out), so a run cut short by ``--budget-s`` loses the sweep first.  Times are
reported with their ratio to ``torch`` at the same shape; the JSON is
rewritten after each row.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if os.path.join(ROOT, "src") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "src"))


class Head(NamedTuple):
    n: int  # tokens
    h: int  # hidden size
    v: int  # vocabulary
    softcap: float | None  # the model's final-logit soft cap


SHAPES = {
    "gpt2": Head(8192, 768, 50257, None),
    "llama3": Head(4096, 4096, 128256, None),
    "gemma2-2b": Head(4096, 2304, 256000, 30.0),
    "gemma2-9b": Head(4096, 3584, 256000, 30.0),
}
# gemma2-9b only on request: its rows would take the sweep's time at the stage's default budget
DEFAULT_SHAPES = ("gpt2", "llama3", "gemma2-2b")
# --quick: one shape without and one with the soft cap, so the dry run takes both paths of every provider
QUICK = {"tiny": Head(16, 16, 100, None), "tiny-softcap": Head(16, 16, 100, 30.0)}
CHUNKS = (256, 1024, 4096)
# --quick: a fixed chunk that splits the tiny batch in two
QUICK_CHUNKS = (8,)
LOSSES = ("cross_entropy", "sparsemax", "entmax15")
MIB = 2**20


class Provider(NamedTuple):
    fn: object  # (x, w, t, softcap) -> scalar loss, or None when it cannot run here
    why: str | None  # why fn is None
    nocap: str | None  # None if it takes the soft cap, else why not
    note: str | None = None


NO_CAP = "takes no soft cap"


def _torch_unfused(x, w, t, cap):
    import torch
    import torch.nn.functional as F

    z = x @ w.t()
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    return F.cross_entropy(z, t)


def peers(device: str) -> dict[str, Provider]:
    """The providers other than softk, in row order; one that cannot run here carries the reason."""
    import torch.nn.functional as F

    out = {"torch": Provider(_torch_unfused, None, None)}
    if hasattr(F, "linear_cross_entropy"):
        out["torch-linear-ce"] = Provider(lambda x, w, t, cap: F.linear_cross_entropy(x, w, t, ignore_index=-100), None, NO_CAP)
    else:
        out["torch-linear-ce"] = Provider(None, "not in this torch", NO_CAP)
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy as liger

        # Liger's capped kernel calls .to() on the cap, a Triton scalar once
        # compiled but a Python float in the interpreter a CPU dry run uses
        nocap = None if device == "cuda" else "Liger's soft cap needs compiled Triton (the interpreter passes it as a float)"
        out["liger"] = Provider(lambda x, w, t, cap: liger(x, w, t, ignore_index=-100, softcap=cap), None, nocap)
    except Exception as exc:  # noqa: BLE001 - a peer that does not import is a row saying why
        out["liger"] = Provider(None, f"not installed: {type(exc).__name__}: {exc}"[:200], None)
    try:
        from cut_cross_entropy import linear_cross_entropy as cce

        # CCE's own kernels are Triton for CUDA (libdevice calls that Triton's
        # interpreter lacks); its torch.compile route is the one a CPU runs
        impl = "cce" if device == "cuda" else "torch_compile"
        out["cce"] = Provider(lambda x, w, t, cap: cce(x, w, t, ignore_index=-100, softcap=cap, impl=impl), None, None, f"impl={impl}")
    except Exception as exc:  # noqa: BLE001
        out["cce"] = Provider(None, f"not installed: {type(exc).__name__}: {exc}"[:200], None)
    return out


def softk_provider(loss: str, chunk):
    import softk

    def fn(x, w, t, cap):
        return softk.losses.fused_linear_loss(x, w, t, loss, chunk_size=chunk, softcap=cap)

    return Provider(fn, None, None)


def plan(shapes: dict, losses, chunks, device: str):
    """[(shape name, row name, Provider)]: every shape's main rows first, then the fixed chunk sizes."""
    base = peers(device)
    rows = []
    for shape in shapes:
        rows += [(shape, name, p) for name, p in base.items()]
        rows += [(shape, f"softk-{loss}", softk_provider(loss, None)) for loss in losses]
    for shape in shapes:
        rows += [(shape, f"softk-{loss}-c{c}", softk_provider(loss, c)) for loss in losses for c in chunks]
    return rows


def inputs(head: Head, dtype, device: str):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    x = (torch.randn(head.n, head.h, generator=g, device=device) / 2).to(dtype).requires_grad_()
    w = (torch.randn(head.v, head.h, generator=g, device=device) / head.h**0.5).to(dtype).requires_grad_()
    t = torch.randint(0, head.v, (head.n,), generator=g, device=device)
    t[torch.rand(head.n, generator=g, device=device) < 0.1] = -100
    return x, w, t


def measure(fn, x, w, t, cap, cuda: bool, reps: int) -> dict:
    """loss, peak extra MiB (CUDA) and the median ms of ``reps`` forward + backward calls."""
    import torch

    def step():
        loss = fn(x, w, t, cap)
        loss.backward()
        return loss

    out = {}
    step()  # compile, autotune, warm
    x.grad = w.grad = None
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    loss = step()
    if cuda:
        torch.cuda.synchronize()
        out["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - before) / MIB
    out["loss"] = float(loss.detach().float())
    times = []
    if cuda:
        events = []
        for _ in range(reps):  # queued back to back as in training; one synchronisation at the end
            x.grad = w.grad = None
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            events.append((a, b))
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in events]
    else:
        for _ in range(reps):
            x.grad = w.grad = None
            t0 = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - t0))
    x.grad = w.grad = None
    out["ms"] = statistics.median(times)
    out["ms_reps"] = [round(v, 4) for v in times]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the dry run)")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(DEFAULT_SHAPES))
    ap.add_argument("--losses", nargs="+", choices=LOSSES, default=list(LOSSES))
    ap.add_argument("--no-chunks", action="store_true", help="leave out the fixed chunk sizes")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per row (default 10 on CUDA, 1 on the CPU)")
    ap.add_argument("--budget-s", type=float, default=110.0, help="no row starts after this many seconds")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("fused_linear.py: no CUDA device here; use --device cpu for a dry run", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    reps = args.reps or (10 if cuda else 1)
    dtype = torch.bfloat16 if cuda else torch.float32
    shapes = QUICK if args.quick else {s: SHAPES[s] for s in args.shapes}
    chunks = () if args.no_chunks else (QUICK_CHUNKS if args.quick else CHUNKS)
    t0, rows = time.monotonic(), []
    from gpu import meta_info

    meta = dict(meta_info(args.device), dtype=str(dtype), reps=reps,
                timing="CUDA events, median" if cuda else "perf_counter, median")
    for dist in ("liger-kernel", "cut-cross-entropy"):
        try:
            meta[dist] = importlib.metadata.version(dist)
        except Exception:  # noqa: BLE001 - not installed: the rows say so
            meta[dist] = None

    def write():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)

    base, current, tensors = {}, None, None
    for shape, name, p in plan(shapes, args.losses, chunks, args.device):
        head = shapes[shape]
        row = {"shape": shape, "N": head.n, "H": head.h, "V": head.v, "softcap": head.softcap, "impl": name,
               "dw_bf16_mib": head.v * head.h * 2 / MIB}
        if p.note:
            row["note"] = p.note
        if p.fn is None:
            row["status"] = f"skipped: {p.why}"
        elif head.softcap is not None and p.nocap:
            row["status"] = f"skipped: {p.nocap}"
        elif time.monotonic() - t0 > args.budget_s:
            row["status"] = "skipped: time budget"
        else:
            if current != shape:  # one shape's tensors at a time
                tensors = None
                if cuda:
                    torch.cuda.empty_cache()
                tensors, current = inputs(head, dtype, args.device), shape
            x, w, t = tensors
            try:
                row.update(measure(p.fn, x, w, t, head.softcap, cuda, reps))
                if name == "torch":
                    base[shape] = row["ms"]
                row["x_torch"] = row["ms"] / base[shape] if shape in base else None
                if "peak_extra_mib" in row:
                    row["x_dw"] = row["peak_extra_mib"] / row["dw_bf16_mib"]
            except Exception as exc:  # noqa: BLE001 - a row that says why
                row["status"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                x.grad = w.grad = None
        rows.append(row)
        print(json.dumps(row), flush=True)
        write()
    write()
    print(f"fused_linear: {len(rows)} rows in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
