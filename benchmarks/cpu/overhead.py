"""What a call costs at every size: softk's maps and losses against torch's own ops.

    python benchmarks/cpu/overhead.py [--threads 1] [--rounds 15] [--json out.json] > table.md
    python benchmarks/cpu/overhead.py --cold-only

For each shape (4x10, 64x64, 256x1024, 2048x32000) and pass (forward,
forward+backward) it times softk.sparsemax / entmax15 / softmax against
torch.softmax and the entmax package, and the losses (sparsemax_loss,
entmax15_loss, softmax_loss, softk.cross_entropy) against
F.cross_entropy.  Implementations are *interleaved*: every round times each
of them once (a batch of calls long enough to be read with perf_counter), so
drift on a shared machine hits all alike; a ratio is the median over rounds
of the per-round ratio.  The cold start is measured in fresh subprocesses:
``import softk`` plus the first call on a CPU tensor, beyond ``import torch``,
after one warm-up process (so that bytecode caches and the compiled kernels
exist; the one-time kernel build is timed separately), and whether that call
imported torch._dynamo or triton.  Benchmarks are not tests: nothing asserts
on time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import softk

SHAPES = ((4, 10), (64, 64), (256, 1024), (2048, 32000))
TARGET_S = 0.02  # seconds per timed batch


def _maps():
    impls = {
        "torch.softmax": lambda x: torch.softmax(x, -1),
        "softk.softmax": softk.softmax,
        "softk.sparsemax": softk.sparsemax,
        "softk.entmax15": softk.entmax15,
    }
    try:
        import entmax

        impls["entmax.sparsemax"] = entmax.sparsemax
        impls["entmax.entmax15"] = entmax.entmax15
    except ImportError:  # pragma: no cover
        pass
    return impls


def _losses():
    L = softk.losses
    return {
        "F.cross_entropy": F.cross_entropy,
        "softk.cross_entropy": softk.losses.cross_entropy,
        "sparsemax_loss": L.sparsemax_loss,
        "entmax15_loss": L.entmax15_loss,
        "softmax_loss": L.softmax_loss,
    }


def _call(kind, fn, x, t, backward):
    if backward:
        x.grad = None
        out = fn(x) if kind == "map" else fn(x, t)
        (out.sum() if kind == "map" else out).backward()
    else:  # x does not require grad: no graph is built (no no_grad block, whose cost would be timed too)
        fn(x) if kind == "map" else fn(x, t)


def _batch_size(kind, fn, x, t, backward):
    _call(kind, fn, x, t, backward)  # warm-up (and the kernels' first call)
    n, elapsed = 1, 0.0
    while elapsed < TARGET_S / 4:
        n *= 2
        t0 = time.perf_counter()
        for _ in range(n):
            _call(kind, fn, x, t, backward)
        elapsed = time.perf_counter() - t0
    return max(1, int(n * TARGET_S / max(elapsed, 1e-9)))


def time_case(kind, impls, shape, backward, rounds):
    """{impl: [µs per call, one per round]}, implementations interleaved."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).requires_grad_(backward)
    t = torch.randint(0, shape[1], (shape[0],), generator=g)
    sizes = {name: _batch_size(kind, fn, x, t, backward) for name, fn in impls.items()}
    times = {name: [] for name in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            n = sizes[name]
            t0 = time.perf_counter()
            for _ in range(n):
                _call(kind, fn, x, t, backward)
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    return times


def _ratio(times, a, b):
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


_COLD = r"""
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import softk
t2 = time.perf_counter()
softk.sparsemax(torch.randn(4, 10))
t3 = time.perf_counter()
print((t2 - t1) * 1e3, (t3 - t2) * 1e3, "torch._dynamo" in sys.modules, "triton" in sys.modules)
"""


def cold_start(repeats=7):
    """Median ms of ``import softk`` and of the first CPU call, in fresh processes."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("SOFTK_BACKEND", None)
    build = subprocess.run(
        [sys.executable, "-c", "import time, softk._backends.native.build as b; t = time.perf_counter(); "
         "b.library(); print((time.perf_counter() - t) * 1e3)"], env=env, capture_output=True, text=True)
    runs = []
    for i in range(repeats + 1):
        out = subprocess.run([sys.executable, "-c", _COLD], env=env, capture_output=True, text=True, check=True)
        if i:  # the first process writes the bytecode caches
            runs.append(out.stdout.split())
    imp = statistics.median(float(r[0]) for r in runs)
    first = statistics.median(float(r[1]) for r in runs)
    return {
        "import_ms": imp, "first_call_ms": first, "total_ms": imp + first,
        "kernel_load_ms": float(build.stdout.strip() or "nan"),
        "imports_dynamo": any(r[2] == "True" for r in runs), "imports_triton": any(r[3] == "True" for r in runs),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cold-only", action="store_true")
    ap.add_argument("--shapes", default=None, help="e.g. 4x10,256x1024 (default: all four)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    result = {"date": datetime.date.today().isoformat(), "machine": platform.platform(),
              "processor": platform.processor() or platform.machine(), "threads": args.threads,
              "torch": torch.__version__, "softk": softk.__version__, "cases": []}
    if not args.cold_only:
        for kind, impls, base in (("map", _maps(), "torch.softmax"), ("loss", _losses(), "F.cross_entropy")):
            for shape in shapes:
                for backward in (False, True):
                    times = time_case(kind, impls, shape, backward, args.rounds)
                    for name in impls:
                        result["cases"].append({
                            "kind": kind, "shape": "x".join(map(str, shape)),
                            "pass": "fwd+bwd" if backward else "fwd", "impl": name,
                            "us": statistics.median(times[name]), f"ratio_to_{base}": _ratio(times, name, base),
                        })
                    print(f"done {kind} {shape} {'fwd+bwd' if backward else 'fwd'}", file=sys.stderr)
    result["cold"] = cold_start()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    print(markdown(result))


def markdown(result) -> str:
    lines = [f"{result['date']}, {result['processor']}, {result['threads']} thread(s), torch {result['torch']}", ""]
    if result["cases"]:
        lines += ["| kind | shape | pass | impl | µs/call (median) | × torch baseline |", "|---|---|---|---|---:|---:|"]
        for c in result["cases"]:
            ratio = next(v for k, v in c.items() if k.startswith("ratio_to_"))
            lines.append(f"| {c['kind']} | {c['shape']} | {c['pass']} | {c['impl']} | {c['us']:.1f} | {ratio:.2f} |")
    cold = result["cold"]
    lines += ["", f"Cold start (median of fresh processes, bytecode cached): import softk {cold['import_ms']:.1f} ms "
              f"+ first CPU call {cold['first_call_ms']:.1f} ms = {cold['total_ms']:.1f} ms beyond import torch; "
              f"loading the cached kernels {cold['kernel_load_ms']:.1f} ms; imports torch._dynamo: "
              f"{cold['imports_dynamo']}, triton: {cold['imports_triton']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
