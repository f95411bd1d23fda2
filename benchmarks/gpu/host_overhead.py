"""The host's time to issue one call: what a small map costs before the GPU sees it.

Run (CUDA GPU, repository root)::

    PYTHONPATH=src python benchmarks/gpu/host_overhead.py --json host.json --md host.md
    PYTHONPATH=src python benchmarks/gpu/host_overhead.py --device cpu   # the same flow on the CPU

``do_bench`` times a call between two CUDA events; when the host takes longer
to issue a call than the GPU takes to run it (and the L2 flush before it),
the GPU waits between the events and the wait is timed too.  Router rows
(2²⁵ entries, 0.06–0.1 ms for ``torch.softmax`` on an H200) are in that
range, so this script measures the host side alone: each op of
``gpu_peers`` (torch's and softk's) on a tiny input (``--rows`` × ``--cols``,
float32), ``--calls`` calls in a row with no synchronisation between them,
then one; the wall time over the calls is the host's time per call, as long
as each call's kernels are shorter than it (they are, on 8 × 64 entries).
Forward (no_grad) and forward + backward, median of ``--repeats``.
``--device cpu --stub-kernels`` times the same calls on the Triton route with
every launch a no-op: softk's own host path, on a machine without a GPU.
``--profile`` adds torch.profiler's table of forward + backward at the
shapes of ``PROFILED`` (the speed table's narrow rows, where do_bench's
times are furthest above the kernels').
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# (impl, op) pairs: torch's baselines, then softk's maps and losses
OPS = [("torch", "softmax"), ("softk", "softmax"), ("softk", "sparsemax"), ("softk", "entmax15"), ("softk", "entmax_a1.3"),
       ("softk", "soft_topk_exp_k2"), ("torch", "cross_entropy"), ("softk", "cross_entropy"), ("softk", "sparsemax_loss")]
MODES = ("fwd", "fwd+bwd")


def per_call_us(call, sync, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the wall time of ``calls`` back-to-back calls, per call, in µs."""
    for _ in range(5):
        call()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


class _NoLaunch:
    """A Triton kernel whose launch does nothing: ``kernel[grid](...)``."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def stub_triton_kernels() -> int:
    """Put a :class:`_NoLaunch` in place of every Triton kernel the map and
    loss launchers call, so that a CPU run (``TRITON_INTERPRET=1``, backend
    "triton") times softk's own host path to the launch; how many."""
    from softk._backends.triton import function, loss, softmax

    done = 0
    for mod in (function, softmax, loss):
        for name in dir(mod):
            if name.endswith("_kernel") and hasattr(getattr(mod, name), "run"):
                setattr(mod, name, _NoLaunch())
                done += 1
    return done


def measure(device: str, rows: int, cols: int, calls: int, repeats: int) -> list[dict]:
    import torch

    from gpu_peers import load

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cpu":  # torch's threads would wait on each other over 8 × 64 entries
        torch.set_num_threads(1)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, cols, generator=gen, device=device)
    g = torch.randn(rows, cols, generator=gen, device=device)
    target = torch.randint(0, cols, (rows,), generator=gen, device=device)
    out = []
    for impl, op in OPS:
        fns, detail, _ = load(impl)
        fn = None if fns is None else fns.get(op)
        if fn is None:
            out.append({"impl": impl, "op": op, "status": detail if fns is None else "not served"})
            continue
        is_loss = op.endswith("loss") or op == "cross_entropy"
        xg = x.detach().requires_grad_(True)
        for mode in MODES:
            if mode == "fwd":
                def call(fn=fn, is_loss=is_loss):
                    with torch.no_grad():
                        return fn(x, target) if is_loss else fn(x)
            elif is_loss:
                def call(fn=fn):
                    xg.grad = None
                    fn(xg, target).backward()
            else:
                def call(fn=fn):
                    xg.grad = None
                    fn(xg).backward(g)
            out.append({"impl": impl, "op": op, "mode": mode, "us": round(per_call_us(call, sync, calls, repeats), 2)})
    return out


# (impl, op, rows, cols, dtype) profiled forward + backward: where the time of a
# call whose do_bench time is far above its kernels' goes
PROFILED = [("softk", "sparsemax", 65536, 128, "float32"), ("softk", "softmax", 65536, 128, "float32"),
            ("torch", "softmax", 65536, 128, "float32"), ("softk", "sparsemax", 2**21, 16, "bfloat16")]


def profile(device: str, scale: int = 1) -> str:
    """torch.profiler's table (self device time first) of 10 forward + backward
    calls of each :data:`PROFILED` case, rows divided by ``scale``."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from gpu_peers import load

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    out = []
    for impl, op, rows, cols, dtype in PROFILED:
        fn = load(impl)[0][op]
        x = torch.randn(max(1, rows // scale), cols, device=device).to(getattr(torch, dtype)).requires_grad_(True)
        g = torch.randn_like(x)
        for _ in range(3):
            fn(x).backward(g)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch_profile(activities=acts) as prof:
            for _ in range(10):
                x.grad = None
                fn(x).backward(g)
            if device == "cuda":
                torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 10 * 1e3
        sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
        out.append(f"### {impl} {op} {x.shape[0]}x{cols} {dtype}, forward + backward, 10 calls "
                   f"({wall:.3f} ms a call under the profiler)\n\n```\n{prof.key_averages().table(sort_by=sort, row_limit=14)}\n```\n")
    return "\n".join(out)


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"Host time per call ({meta['shape']}, float32, {meta['device']}), µs, median of {meta['repeats']} runs of "
             f"{meta['calls']} calls:", "", "| impl | op | fwd | fwd+bwd |", "|---|---|---:|---:|"]
    cells: dict = {}
    for r in rows:
        cells.setdefault((r["impl"], r["op"]), {})[r.get("mode")] = r.get("us", r.get("status"))
    for (impl, op), c in cells.items():
        lines.append(f"| {impl} | {op} | {c.get('fwd', c.get(None, ''))} | {c.get('fwd+bwd', '')} |")
    return "\n".join(lines) + "\n"


def call_options(description: str) -> argparse.ArgumentParser:
    """The options of a host-time script: the device, the tiny input's shape,
    the calls in a row and the repeats (more are added by the caller)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    return ap


def main(argv=None) -> int:
    ap = call_options(__doc__.split("\n")[0])
    ap.add_argument("--profile", action="store_true", help="also profile forward + backward at the shapes of PROFILED")
    ap.add_argument("--stub-kernels", action="store_true",
                    help="on the CPU: the Triton route with every launch a no-op (softk's own host path; sets "
                         "TRITON_INTERPRET=1 and SOFTK_BACKEND=triton)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--md", metavar="PATH")
    args = ap.parse_args(argv)
    if args.stub_kernels:
        if args.device != "cpu":
            ap.error("--stub-kernels runs on the CPU (--device cpu)")
        os.environ.update(TRITON_INTERPRET="1", SOFTK_BACKEND="triton")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("host_overhead.py: no CUDA device here; --device cpu runs the flow on the CPU", file=sys.stderr)
        return 2
    from gpu import meta_info

    meta = {**meta_info(args.device), "shape": f"{args.rows}x{args.cols}", "calls": args.calls, "repeats": args.repeats}
    if args.stub_kernels:
        meta["device"] += f", Triton route, {stub_triton_kernels()} kernels stubbed"
    rows = measure(args.device, args.rows, args.cols, args.calls, args.repeats)
    md = markdown(rows, meta)
    if args.profile:
        md += "\n" + profile(args.device, 1 if args.device == "cuda" else 4096)
    return report(md, meta, rows, args)


def report(md: str, meta: dict, rows: list[dict], args) -> int:
    """Print the Markdown, and write it and the JSON where ``--md`` and ``--json`` say; exit status 0."""
    print(md, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
