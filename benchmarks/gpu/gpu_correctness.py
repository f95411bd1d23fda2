"""Adversarial GPU correctness check of softk's kernels, and the peers' known failures.

Run (CUDA GPU, repository root)::

    PYTHONPATH=src python benchmarks/gpu/gpu_correctness.py --json correctness.json
    python benchmarks/gpu/gpu_correctness.py --quick          # widths 5 and 1000 only

Grid: 8 families (softmax, sparsemax, entmax15, entmax α=1.3, and soft_topk
k=3 exp/sigmoid/laplace/sparse) × 6 widths (5 … 262,144) × fp32/bf16/fp16 ×
5 kinds of rows (exact ties, −inf masks with a fully masked row, scale 1e-3,
scale 1e3, a ±1e4 outlier) = 720 cases.  Each case runs forward and backward
on the GPU and compares with the float64 bisection reference of
``gpu_reference`` computed on the GPU from the same (already rounded) input.

Tolerances (eps_io: the dtype's machine epsilon, 2^-23 / 2^-7 / 2^-10;
eps32 = 2^-23; R = max(1, max |finite x|); n the width):

* forward: max |p − p_ref| ≤ tol_f = eps_io + 8·eps32·(R + log2 n), and
  |Σp − Σp_ref| ≤ k·eps_io + D·8·eps32·(R + log2 n) with D = Σ f′ at p_ref
  (an error δλ in the threshold moves Σp by D·δλ: the support size for
  sparsemax, ≤ √n for entmax15);
* backward (g ~ N(0,1) in the dtype): max |dx − dx_ref| ≤ eps_io·(max|dx_ref|
  + max|g|) + 32·eps32·(R + log2 n)·max|g|, where dx_ref is the exact
  vector–Jacobian product at the kernel's own output p or at p_ref (either
  passes: a backward may use the stored, rounded p);
* a case whose backward matches neither but has an entry within tol_f of a
  kink of f′ (the support boundary; saturation for exp/sparse) is counted as
  "ambiguous", not failed: the gradient is not defined there.

Peers (entmax, AdaSplash, Liger) and softk itself also run four checks each
(a fully masked row, a bf16 row with a 1e4 entry, a 262,144-wide row, a bf16
backward) in child processes, one per (impl, op), all at once: a
device-side assert kills the CUDA context of its process.  Before the grid,
``--warm-jobs`` processes compile softk's kernels into Triton's on-disk cache
(one variant per family, dtype and block size: a few hundred compiles).

Exit status: 0 when every softk case passes (ambiguous counts as passed), 1
when one fails or is not reached within ``--budget-s``, 2 without CUDA.
``--json`` is rewritten after each (dtype, family), so a run that is killed
keeps what it checked.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import gpu_reference as ref  # noqa: E402
from gpu_isolate import run_items, run_parallel, short_error, worker_loop  # noqa: E402
from gpu_peers import IMPLS, load  # noqa: E402

FAMILY_NAMES = list(ref.FAMILIES)
WIDTHS = [5, 64, 1000, 8192, 70001, 262144]
QUICK_WIDTHS = [5, 1000]
KINDS = ["ties", "masked", "scale_1e-3", "scale_1e3", "outlier_1e4"]
DTYPES = ["float32", "bfloat16", "float16"]
EPS32 = 2.0**-23
EPS_IO = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
# Peer checks: (name, dtype, width, kind, backward?).  The masked check goes last: it may kill the context.
PEER_CHECKS = [("bwd_bf16", "bfloat16", 1000, "scale_1", True), ("wide_262144", "float32", 262144, "scale_1", False),
               ("outlier_bf16", "bfloat16", 1000, "outlier_1e4", False), ("masked_fp32", "float32", 1000, "masked", False)]  # fmt: skip
PEER_OPS = {"softk": ("sparsemax", "entmax15", "entmax_a1.3"), "entmax": ("sparsemax", "entmax15", "entmax_a1.3"),
            "adasplash": ("sparsemax", "entmax15", "entmax_a1.3"), "liger": ("sparsemax",)}  # fmt: skip


def softk_fn(family: str):
    import softk

    if family in ("exp", "sigmoid", "laplace", "sparse"):
        return lambda x: softk.soft_topk(x, ref.FAMILIES[family][2], method=family)
    return {"softmax": softk.softmax, "sparsemax": softk.sparsemax, "entmax15": softk.entmax15, "entmax_a1.3": lambda x: softk.entmax(x, 1.3)}[family]


def rows_for(width: int) -> int:
    """More rows for narrow widths (so several rows share a program), at least 4."""
    return max(4, min(64, 2**17 // width))


def make_input(kind: str, width: int, dtype: str, device: str, seed: int = 0):
    """rows_for(width) × width rows of ``kind``, generated in float32 and rounded once to ``dtype``."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    rows = rows_for(width)
    x = torch.randn(rows, width, generator=gen, device=device)
    if kind == "ties":  # exact in every dtype; row 0 constant, row 1 a two-way tie at the top
        x = torch.randint(-3, 4, (rows, width), generator=gen, device=device).float() / 2
        x[0] = 0.5
        x[1, 0] = x[1, -1] = x[1].max() + 1
    elif kind == "masked":  # half masked; row 0 fully, row 1 one finite entry, row 2 three, row 3 four
        x = torch.where(torch.rand(rows, width, generator=gen, device=device) < 0.5, -torch.inf, x)
        x[0] = -torch.inf
        for r, m in ((1, 1), (2, 3), (3, 4)):
            x[r, m:] = -torch.inf
            x[r, :m] = torch.randn(min(m, width), generator=gen, device=device)
    elif kind.startswith("scale_"):
        x = x * float(kind.split("_")[1])
    elif kind == "outlier_1e4":  # one entry 1e4 per row (−1e4 on row 1)
        col = torch.randint(0, width, (rows,), generator=gen, device=device)
        x[torch.arange(rows, device=device), col] = 1e4
        x[1, col[1]] = -1e4
    return x.to(getattr(torch, dtype))


def tolerances(dtype: str, x, k: int, dsum: float) -> tuple[float, float, float]:
    """(tol_f, tol_sum, backward slack) as stated in the module docstring; ``dsum`` = max over rows of Σ f′(p_ref)."""
    import torch

    fin = x[torch.isfinite(x)]
    r = max(1.0, float(fin.abs().max()) if fin.numel() else 1.0)
    slack = EPS32 * (r + math.log2(max(2, x.shape[-1])))
    return EPS_IO[dtype] + 8 * slack, k * EPS_IO[dtype] + dsum * 8 * slack, 32 * slack


def compare(family: str, dtype: str, x, p, dx, g) -> dict:
    """The verdict of one case from the kernel's (p, dx) on input x with upstream g; dx may be None."""
    import torch

    k = ref.FAMILIES[family][2]
    p_ref, lam, z = ref.solve(x, family)
    dsum = float(ref.derivative(family, p_ref).sum(-1).max())
    tol_f, tol_sum, slack_b = tolerances(dtype, x, k, dsum)
    pd = p.to(torch.float64)
    out = {"tol_f": tol_f, "tol_sum": tol_sum}
    finite = bool(torch.isfinite(pd).all())
    out["err_f"] = float((pd - p_ref).abs().max()) if finite else math.inf
    out["err_sum"] = float((pd.sum(-1) - p_ref.sum(-1)).abs().max()) if finite else math.inf
    fwd_ok = finite and out["err_f"] <= tol_f and out["err_sum"] <= tol_sum
    bwd_ok, ambiguous = True, False
    if dx is not None:
        gmax = float(g.abs().max())
        errs = []
        for pp in (pd, p_ref):
            dref = ref.vjp(family, pp, g)
            tol_b = EPS_IO[dtype] * (float(dref.abs().max()) + gmax) + slack_b * gmax
            dxd = dx.to(torch.float64)
            errs.append((float((dxd - dref).abs().max()) if bool(torch.isfinite(dxd).all()) else math.inf, tol_b))
        out["err_b"], out["tol_b"] = min(errs)
        bwd_ok = any(e <= t for e, t in errs)
        if not bwd_ok:
            ambiguous = bool(ref.near_kink(family, z, lam, tol_f).any())
    out["verdict"] = "pass" if fwd_ok and bwd_ok else ("ambiguous" if fwd_ok and ambiguous else "fail")
    if not fwd_ok:
        out["why"] = "forward"
    elif not bwd_ok:
        out["why"] = "backward at a kink" if ambiguous else "backward"
    return out


def run_case(family: str, kind: str, width: int, dtype: str, device: str = "cuda", fn=None) -> dict:
    """Forward + backward of softk (or ``fn``) on one case, compared with the reference."""
    import torch

    fn = fn or softk_fn(family)
    x = make_input(kind, width, dtype, device)
    g = torch.randn(x.shape, generator=torch.Generator(device=device).manual_seed(7), device=device).to(x.dtype)
    res = {"family": family, "kind": kind, "width": width, "rows": x.shape[0], "dtype": dtype}
    try:
        xg = x.detach().requires_grad_(True)
        p = fn(xg)
        p.backward(g)
        res.update(compare(family, dtype, x, p.detach(), xg.grad, g))
    except Exception as e:  # noqa: BLE001 - a failure is a result
        res.update(verdict="fail", why=f"error: {short_error(e)}")
    return res


def peer_check(impl: str, op: str, check: str, device: str = "cuda", registry=None) -> dict:
    """One of :data:`PEER_CHECKS` for ``impl``'s ``op``: verdict, errors, or why it could not run."""
    fns, detail, version = load(impl, registry)
    res = {"impl": impl, "op": op, "check": check, "version": version}
    if fns is None or op not in fns:
        return {**res, "verdict": "skip", "why": detail if fns is None else "not available"}
    _, dtype, width, kind, backward = next(c for c in PEER_CHECKS if c[0] == check)
    if backward:
        return {**res, **{k: v for k, v in run_case(op, kind, width, dtype, device, fns[op]).items() if k not in res}}
    import torch

    x = make_input(kind, width, dtype, device).contiguous()
    try:
        with torch.no_grad():
            p = fns[op](x)
        torch.cuda.synchronize() if device.startswith("cuda") else None
        res.update(compare(op, dtype, x, p, None, None))
        if not bool(torch.isfinite(p).all()):
            res["why"] = "NaN/inf in the output"
    except Exception as e:  # noqa: BLE001 - a peer's refusal is the finding
        res.update(verdict="fail", why=f"error: {short_error(e)}")
    return res


def warm_one(item: str, device: str = "cuda") -> dict:
    """Compile softk's kernels for ``family|width|dtype``: forward and backward on two rows."""
    import torch

    family, width, dtype = item.split("|")
    x = torch.randn(2, int(width), device=device).to(getattr(torch, dtype)).requires_grad_(True)
    softk_fn(family)(x).backward(torch.ones_like(x))
    return {"compiled": item}


def _worker(args) -> int:
    if args.warm:
        worker_loop(args.worker_items, args.worker_out, lambda item: warm_one(item, args.device))
        return 0

    def handle(item):
        impl, op, check = item.split("|")
        out = peer_check(impl, op, check, args.device)
        return {"result": out, "context_lost": "CUDA error" in out.get("why", "") or "device-side" in out.get("why", "")}

    worker_loop(args.worker_items, args.worker_out, handle)
    return 0


def run_peers(timeout_s: float, device: str = "cuda") -> list[dict]:
    """Every peer check: one child process per (impl, op), all at once, each restarted after a crash."""
    from concurrent.futures import ThreadPoolExecutor

    def one(impl, op):
        items = [f"{impl}|{op}|{c[0]}" for c in PEER_CHECKS]
        fns, detail, _ = load(impl)
        if fns is None:
            return [{"impl": impl, "op": op, "check": it.split("|")[2], "verdict": "skip", "why": detail} for it in items]
        got = run_items([sys.executable, os.path.abspath(__file__), "--device", device, "--impls", impl], items, timeout_s)
        return [got[it].get("result") or {"impl": impl, "op": op, "check": it.split("|")[2], "verdict": "fail", "why": got[it].get("status")} for it in items]

    pairs = [(impl, op) for impl, ops in PEER_OPS.items() for op in ops]
    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
        results = [r for rs in pool.map(lambda pair: one(*pair), pairs) for r in rs]
    for r in results:
        print(f"  {r['impl']:9s} {r['op']:12s} {r['check']:13s} {r['verdict']:9s} {r.get('why', '')}", flush=True)
    return results


def summarize(cases: list[dict]) -> dict:
    """Counts of pass / ambiguous / fail, overall and per dtype and family."""
    out = {"total": len(cases)}
    for v in ("pass", "ambiguous", "fail", "skipped"):
        out[v] = sum(c["verdict"] == v for c in cases)
    for key in ("dtype", "family"):
        out[f"fail_by_{key}"] = {}
        for c in cases:
            if c["verdict"] == "fail":
                out[f"fail_by_{key}"][c[key]] = out[f"fail_by_{key}"].get(c[key], 0) + 1
    return out


def strict(obj):
    """``obj`` with non-finite floats as the strings "inf"/"nan" (strict JSON has no Infinity)."""
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [strict(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Adversarial GPU correctness check of softk (see the module docstring).")
    ap.add_argument("--quick", action="store_true", help="widths 5 and 1000 only")
    ap.add_argument("--families", default=",".join(FAMILY_NAMES), help="comma-separated families (default: all 8)")
    ap.add_argument("--widths", type=int, nargs="+", help=f"row widths (default {WIDTHS}; --quick {QUICK_WIDTHS})")
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=DTYPES, help="input dtypes (default: all 3)")
    ap.add_argument("--json", metavar="PATH", help="write every case, the peer checks and the summary as JSON")
    ap.add_argument("--no-peers", action="store_true", help="skip the peers' failure checks")
    ap.add_argument("--budget-s", type=float, default=540.0, help="the whole run, warm-up and peers included (default 540); cases not reached are 'skipped'")
    ap.add_argument("--peer-timeout-s", type=float, default=150.0, help="time for each (peer, op)'s child processes, all run at once (default 150)")
    ap.add_argument("--warm-jobs", type=int, default=min(12, os.cpu_count() or 1),
                    help="processes that compile softk's kernels before the grid (0: none; default min(12, CPUs))")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the flow on softk's CPU path (with --quick)")
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impls", help=argparse.SUPPRESS)
    ap.add_argument("--worker-items", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import softk  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "src"))
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_correctness.py: no CUDA device here (torch.cuda.is_available() is False); this check needs a GPU", file=sys.stderr)
        return 2
    if args.worker_items:
        return _worker(args)
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    peer_reserve = 0.0 if args.no_peers else min(args.peer_timeout_s, 0.3 * args.budget_s)
    widths = args.widths or (QUICK_WIDTHS if args.quick else WIDTHS)
    families = args.families.split(",")
    meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (dry run)", "torch": torch.__version__,
            "triton": _triton_version(), "date": datetime.date.today().isoformat()}  # fmt: skip

    def write(cases, peers):
        if args.json:
            with open(args.json, "w") as f:
                json.dump(strict({"meta": meta, "summary": summarize(cases), "cases": cases, "peers": peers}), f, indent=1)
                f.write("\n")

    if args.warm_jobs > 0:
        items = [f"{f}|{w}|{d}" for d in args.dtypes for f in families for w in widths]
        got = run_parallel([sys.executable, os.path.abspath(__file__), "--device", args.device, "--warm"], items, args.warm_jobs, 0.4 * args.budget_s)
        print(f"warm-up: {sum('status' not in v for v in got.values())} of {len(items)} compiled ({time.monotonic() - t0:.0f} s)", flush=True)
    cases = []
    for dtype in args.dtypes:
        for family in families:
            for width in widths:
                for kind in KINDS:
                    if time.monotonic() > deadline - peer_reserve:
                        cases.append({"family": family, "kind": kind, "width": width, "dtype": dtype, "verdict": "skipped", "why": "time budget"})
                        continue
                    r = run_case(family, kind, width, dtype, args.device)
                    cases.append(r)
                    if r["verdict"] != "pass":
                        print(f"{r['verdict'].upper():9s} {family} {kind} w={width} {dtype}: {r.get('why')} "
                              f"err_f={r.get('err_f')} tol_f={r.get('tol_f')} err_b={r.get('err_b')} tol_b={r.get('tol_b')}", flush=True)  # fmt: skip
            write(cases, [])
            print(f"{dtype} {family}: done ({time.monotonic() - t0:.0f} s)", flush=True)
    summary = summarize(cases)
    print(f"softk: {summary['pass']} of {summary['total']} passed, {summary['ambiguous']} ambiguous (at a kink), "
          f"{summary['fail']} failed, {summary['skipped']} not reached", flush=True)  # fmt: skip
    peers = [] if args.no_peers else run_peers(max(5.0, min(args.peer_timeout_s, deadline - time.monotonic())), args.device)
    write(cases, peers)
    print(f"{time.monotonic() - t0:.0f} s", flush=True)
    return 0 if summary["fail"] == 0 and summary["skipped"] == 0 else 1


def _triton_version():
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
