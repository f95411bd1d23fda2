"""Sparse attention: softk.attention.scaled_dot_product_attention against torch's SDPA, FlexAttention and AdaSplash.

GPU (the default where CUDA is available):

    python benchmarks/gpu/attention.py [--lengths 1024 4096 16384] [--dims 64 128] [--batch 1] [--heads 16]
        [--maps softmax sparsemax entmax15] [--modes fwd fwdbwd] [--causal no yes] [--sharpness 1.0]
        [--locality 0.0] [--window 64] [--no-adasplash] [--json OUT.json]

Each case (L = S, E, causal, mode) in bfloat16 times torch's SDPA with the
flash and the memory-efficient backends (softmax), torch's FlexAttention
(softmax, compiled, the causal mask as a block mask), softk with each map on
the backend "auto" resolves for CUDA tensors (the fused Triton kernels of
``softk._backends.triton.attention`` when built, else the blockwise route, named in
the table), and AdaSplash (``adasplash.adasplash(q, k, v, alpha,
is_causal)``: α = 1.5 for entmax15, 2 for sparsemax) in a child process, so
that a fault there cannot take this process's CUDA context.  Times are
Triton's ``do_bench`` (p20/p50/p80, L2 flushed), memory is
``torch.cuda.max_memory_allocated`` above what the inputs hold.  Block
sparsity is that of softk's weights: the fraction of 64×64 (query, key)
tiles that the causal mask leaves visible whose weights are all exactly 0
(what a kernel that skips such tiles can save).  q and k are standard
normal times ``--sharpness`` (larger: sharper scores, sparser weights),
plus ``--locality`` times a positional vector shared by q and k that varies
over ``--window`` tokens (local attention: block-sparse weights; with
``--sharpness 0.5 --locality 1`` about 80 % of the tiles of sparsemax and
entmax15 are empty at L = 1024, against 0 % for the default random inputs).

CPU (``--cpu``): the memory-efficient route against the reference route
(scores materialised) and torch's SDPA (math), float32, B = 1, H = 4,
E = 64, each measurement in a fresh process: the median time of ``--reps``
runs and the peak extra resident memory of one run (VmHWM, reset through
/proc/self/clear_refs; Linux).

    python benchmarks/gpu/attention.py --cpu [--lengths 512 2048 4096] [--reps 3] [--threads 1] [--json OUT.json]

``--smoke`` runs the GPU table's code on the CPU at a tiny size (no flash,
no AdaSplash, wall-clock timer): a check that the script runs, not a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ALPHA = {"sparsemax": 2.0, "entmax15": 1.5}


# ----------------------------------------------------------------- inputs
def make_inputs(B, H, L, E, dtype, device, sharpness=1.0, seed=0, grad=False, locality=0.0, window=64):
    """Standard normal q, k, v; q and k times ``sharpness``, plus ``locality`` times a
    shared positional vector that varies smoothly over ``window`` tokens (so that
    nearby tokens score higher: local, block-sparse attention)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, E, generator=g, device=device, dtype=torch.float32) for _ in range(3))
    q, k = q * sharpness, k * sharpness
    if locality:
        u = torch.randn(1, E, L + 2 * window, generator=g, device=device)
        for _ in range(2):  # a triangular low-pass filter of width ~window
            u = torch.nn.functional.avg_pool1d(u, window, stride=1)
        u = u[0, :, :L].T
        u = u / u.norm(dim=-1, keepdim=True) * E**0.5
        q, k = q + locality * u, k + locality * u
    return [t.to(dtype).requires_grad_(grad) for t in (q, k, v)]


def step(fn, q, k, v, mode):
    """One forward (no_grad) or forward+backward of ``fn(q, k, v)``."""
    import torch

    if mode == "fwd":
        with torch.no_grad():
            fn(q, k, v)
    else:
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))


# ----------------------------------------------------------------- GPU side
def cuda_measure(fn, q, k, v, mode):
    """(p20, p50, p80 ms, peak MiB above the inputs)."""
    import torch
    from triton.testing import do_bench

    grads = [q, k, v] if mode == "fwdbwd" else None
    ms = do_bench(lambda: step(fn, q, k, v, mode), warmup=25, rep=100, quantiles=[0.2, 0.5, 0.8], grad_to_none=grads)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(fn, q, k, v, mode)
    torch.cuda.synchronize()
    return (*ms, (torch.cuda.max_memory_allocated() - base) / 2**20)


def wall_measure(fn, q, k, v, mode, reps=1):
    """The same tuple from the wall clock (smoke runs on the CPU, which check the code and time
    nothing: one run by default; no memory)."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        step(fn, q, k, v, mode)
        times.append(1e3 * (time.perf_counter() - t))
    times.sort()
    return times[0], statistics.median(times), times[-1], float("nan")


def block_sparsity(q, k, v, name, causal, tile=64):
    """Fraction of the visible tile×tile (query, key) tiles in which every weight of map ``name`` is 0.

    The weights come from the dense scores and the map itself (softk's reference
    backend), a query tile at a time, not from a kernel's saved row statistics,
    whose conventions differ by kernel."""
    import torch

    import softk
    from softk.attention import reference

    rows = {"softmax": lambda s: torch.softmax(s, -1), "sparsemax": softk.sparsemax, "entmax15": softk.entmax15}[name]
    g = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(g, 1)
    L, S = q.shape[2], k.shape[2]
    zero = visible = 0
    with torch.no_grad():
        for i0 in range(0, L, tile):
            s = reference.scores(q[:, :, i0:i0 + tile].float(), k, None, q.shape[-1] ** -0.5, False)
            if causal:  # query i sees keys j <= i
                i = torch.arange(i0, i0 + s.shape[2], device=q.device)[:, None]
                s = s.masked_fill(torch.arange(S, device=q.device) > i, float("-inf"))
            hit = torch.nn.functional.pad(rows(s) > 0, (0, -S % tile)).unflatten(-1, (-1, tile)).any(-1).any(-2)
            seen = torch.arange(0, S, tile, device=q.device) <= (i0 + s.shape[2] - 1 if causal else S)
            zero += int((~hit & seen).sum())
            visible += int(seen.sum()) * hit.shape[0] * hit.shape[1]
    return zero / max(visible, 1)


def _kernel_name(q, name):
    """The kernel of op "attention" that runs map ``name`` on q ("reference": none)."""
    from softk._backends import dispatch
    from softk.threshold import attention_maps

    return getattr(dispatch.pick("attention", q, attention_maps.family_id(name, None, False)), "backend", "reference")


def _softk(name):
    import softk.attention as sa

    return lambda q, k, v, causal: sa.scaled_dot_product_attention(q, k, v, is_causal=causal, map=name)


def _sdpa(backend):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH}[backend]

    def fn(q, k, v, causal):
        with sdpa_kernel(kind):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def _flex():
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    masks = {}

    def fn(q, k, v, causal):
        block = None
        if causal:
            key = (q.shape[-2], k.shape[-2], q.device)
            if key not in masks:
                masks[key] = create_block_mask(lambda b, h, i, j: j <= i, None, None, q.shape[-2], k.shape[-2],
                                               device=q.device)
            block = masks[key]
        return compiled(q, k, v, block_mask=block)

    return fn


def adasplash_child(args) -> None:
    """Child process: time AdaSplash on the shared inputs, print one JSON line."""
    import torch
    from adasplash import adasplash

    q, k, v = make_inputs(args.batch, args.heads, args.L, args.E, torch.bfloat16, "cuda", args.sharpness,
                          grad=args.mode == "fwdbwd", locality=args.locality, window=args.window)
    fn = lambda q, k, v: adasplash(q, k, v, alpha=args.alpha, is_causal=args.is_causal)  # noqa: E731
    print(json.dumps(dict(zip(("p20", "p50", "p80", "peak_mib"), cuda_measure(fn, q, k, v, args.mode)))))


def adasplash_row(a, L, E, causal, mode, name):
    cmd = [sys.executable, os.path.abspath(__file__), "--child-adasplash", "--L", str(L), "--E", str(E),
           "--batch", str(a.batch), "--heads", str(a.heads), "--mode", mode, "--alpha", str(ALPHA[name]),
           "--sharpness", str(a.sharpness), "--locality", str(a.locality), "--window", str(a.window)] + (
               ["--is-causal"] if causal else [])
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=min(900.0, max(60.0, a.deadline - time.monotonic() + 60)))
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        return {"error": lines[-1][:120] if lines else f"exit {res.returncode}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def gpu_table(a, flush=lambda rows: None) -> list:
    """Every case's rows; cases not started within ``--budget-s`` say so; ``flush(rows)`` after each case."""
    import torch


    device, dtype = ("cpu", torch.float32) if a.smoke else ("cuda", torch.bfloat16)
    measure = wall_measure if a.smoke else cuda_measure
    rows = []
    a.deadline = time.monotonic() + a.budget_s
    for L in a.lengths:
        for E in a.dims:
            for causal in a.causal:
                for mode in a.modes:
                    if time.monotonic() > a.deadline:
                        rows.append(dict(L=L, E=E, causal=causal, mode=mode, impl="all", error="skipped: time budget"))
                        continue
                    q, k, v = make_inputs(a.batch, a.heads, L, E, dtype, device, a.sharpness, grad=mode == "fwdbwd",
                                          locality=a.locality, window=a.window)
                    case = dict(L=L, E=E, causal=causal, mode=mode)
                    impls = [(f"sdpa-{b}", _sdpa(b), None) for b in (("math",) if a.smoke else ("flash", "efficient"))]
                    impls += [] if a.smoke else [("flex-softmax", _flex(), None)]
                    impls += [(f"softk-{m} ({_kernel_name(q, m)})", _softk(m), m) for m in a.maps]
                    for label, fn, name in impls:
                        row = dict(case, impl=label)
                        try:
                            row.update(zip(("p20", "p50", "p80", "peak_mib"),
                                           measure(lambda q, k, v: fn(q, k, v, causal), q, k, v, mode)))
                            if name is not None:
                                row["block_sparsity"] = block_sparsity(q.detach(), k.detach(), v.detach(), name,
                                                                       causal)
                        except Exception as exc:  # a row that says why, never a crash
                            row["error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
                        rows.append(row)
                        report(row)
                    for name in ([] if a.smoke or not a.adasplash else [m for m in a.maps if m in ALPHA]):
                        row = dict(case, impl=f"adasplash-{name}", **adasplash_row(a, L, E, causal, mode, name))
                        rows.append(row)
                        report(row)
                    flush(rows)
                    del q, k, v
                    if device == "cuda":
                        torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------- CPU side
def cpu_child(args) -> None:
    """Child process: one (impl, map, L, mode) on the CPU; prints one JSON line."""
    import torch

    from softk._cli.harness import PeakRSS
    from softk._backends import kernels
    from softk.attention import checks, op

    torch.set_num_threads(args.threads)

    def call(q, k, v):
        if args.impl == "sdpa":
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.is_causal)
        kernel = None if args.impl == "reference" else kernels.get("attention", "native")  # the blockwise kernel
        return op.attention(checks.check_call(q, k, v, None, 0.0, args.is_causal, None, False, args.map, None),
                            kernel)

    step(call, *make_inputs(1, 4, 70, args.E, torch.float32, "cpu", grad=True), args.mode)  # warm up
    q, k, v = make_inputs(1, 4, args.L, args.E, torch.float32, "cpu", grad=args.mode == "fwdbwd")
    with PeakRSS() as mem:
        step(call, q, k, v, args.mode)
    peak = mem.extra
    times = []
    for _ in range(args.reps):
        for t in (q, k, v):
            t.grad = None
        t0 = time.perf_counter()
        step(call, q, k, v, args.mode)
        times.append(1e3 * (time.perf_counter() - t0))
    print(json.dumps({"p50": statistics.median(times), "p20": min(times), "p80": max(times), "peak_mib": peak / 2**20}))


def cpu_table(a) -> list:
    rows = []
    for L in a.lengths:
        for mode in a.modes:
            for causal in a.causal:
                for impl, name in [("sdpa", "softmax")] + [(i, m) for m in a.maps for i in ("reference", "blockwise")]:
                    cmd = [sys.executable, os.path.abspath(__file__), "--child-cpu", "--impl", impl, "--map", name,
                           "--L", str(L), "--E", "64", "--mode", mode, "--reps", str(a.reps),
                           "--threads", str(a.threads)] + (["--is-causal"] if causal else [])
                    res = subprocess.run(cmd, capture_output=True, text=True)
                    row = dict(L=L, E=64, causal=causal, mode=mode, impl=f"{impl}-{name}")
                    if res.returncode == 0:
                        row.update(json.loads(res.stdout.strip().splitlines()[-1]))
                    else:
                        row["error"] = (res.stderr.strip().splitlines() or ["?"])[-1][:120]
                    rows.append(row)
                    report(row)
    return rows


# ----------------------------------------------------------------- report
def report(row) -> None:
    if "error" in row:
        print(f"| {row['L']} | {row['E']} | {row['causal']} | {row['mode']} | {row['impl']} | {row['error']} |",
              flush=True)
        return
    sp = row.get("block_sparsity")
    print(f"| {row['L']} | {row['E']} | {row['causal']} | {row['mode']} | {row['impl']} | {row['p50']:.3f} "
          f"({row['p20']:.3f}-{row['p80']:.3f}) | {row['peak_mib']:.1f} | {'' if sp is None else f'{sp:.1%}'} |",
          flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="the CPU table (memory-efficient route vs reference vs SDPA)")
    p.add_argument("--smoke", action="store_true", help="the GPU table's code on the CPU at a tiny size")
    p.add_argument("--lengths", type=int, nargs="+")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--maps", nargs="+", default=["softmax", "sparsemax", "entmax15"])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--causal", nargs="+", default=["no", "yes"], choices=["no", "yes"])
    p.add_argument("--sharpness", type=float, default=1.0)
    p.add_argument("--locality", type=float, default=0.0)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--no-adasplash", dest="adasplash", action="store_false")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", metavar="OUT", help="rewritten after each case")
    p.add_argument("--budget-s", type=float, default=float("inf"), help="GPU table: cases not started by then are skipped")
    # child processes
    p.add_argument("--child-adasplash", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-cpu", action="store_true", help=argparse.SUPPRESS)
    for flag, kind in (("--L", int), ("--E", int), ("--alpha", float)):
        p.add_argument(flag, type=kind, help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    p.add_argument("--map", help=argparse.SUPPRESS)
    p.add_argument("--is-causal", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
    if a.child_adasplash:
        return adasplash_child(a) or 0
    if a.child_cpu:
        return cpu_child(a) or 0
    a.causal = [c == "yes" for c in a.causal]
    if a.smoke:
        a.lengths, a.dims, a.batch, a.heads = a.lengths or [128], [16], 1, 2
    print("| L | E | causal | mode | impl | ms p50 (p20-p80) | peak MiB | block sparsity |")
    print("|---:|---:|---|---|---|---|---:|---:|")
    if a.cpu:
        a.lengths = a.lengths or [512, 2048, 4096]
        rows = cpu_table(a)
    else:
        import torch

        if not (a.smoke or torch.cuda.is_available()):
            p.error("no CUDA device: use --cpu for the CPU table (or --smoke to check the script)")
        a.lengths = a.lengths or [1024, 4096, 16384]
        rows = gpu_table(a, lambda rows: write(a.json, rows))
    write(a.json, rows)
    return 0


def write(path, rows) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump({"argv": sys.argv[1:], "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
