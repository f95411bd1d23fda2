"""Attention on the device against the float64 oracle: forward, backward and dα.

Run (CUDA GPU, repository root)::

    PYTHONPATH=src:. python benchmarks/gpu/attention_check.py --json attention_check.json
    TRITON_INTERPRET=1 PYTHONPATH=src:. python benchmarks/gpu/attention_check.py --device cpu --quick   # a dry run

Each case draws q, k, v (standard normal, rounded to the case's dtype) and
an upstream gradient, runs ``softk.scaled_dot_product_attention`` on the
backend "auto" resolves for the device (the fused Triton kernels on a GPU),
and compares the output and dq, dk, dv (and dα for α-entmax with one α per
head) with ``tests/oracle/attention.py``, NumPy in float64 from the same
rounded inputs.  The grid covers every map, causal and not, GQA, lengths 1,
63/65 and 257/300 (partial tiles), a fully masked query row, and a 1e4
offset shared by every key.  ``--quick`` (the dry run) takes each of those
once at 1/1 and 17/19 rather than every combination.

Tolerances are those of the interpreter tests (``tests/backends/triton``):
max |got − ref| ≤ tol · max(1, max |ref|) with tol = 2e-4 in float32,
1.5e-3 in float16 and 2.5e-2 in bfloat16, and 1e-3 on dα (a central
difference of the oracle's forward, in float32).  Exit 1 when a case fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (ROOT, os.path.join(ROOT, "src")):
    if path not in sys.path:
        sys.path.insert(0, path)

TOL = {"float32": 2e-4, "float16": 1.5e-3, "bfloat16": 2.5e-2}
DALPHA_TOL = 1e-3
# (L, S) query and key lengths: one key, partial tiles on both sides, more than one tile.
LENGTHS = [(1, 1), (63, 65), (257, 300)]
QUICK_LENGTHS = [(1, 1), (17, 19)]
MAPS = ["softmax", "sparsemax", "entmax15", "entmax"]


def cases(quick: bool, dtypes=None):
    """(map, dtype, (L, S), causal, gqa, kind) for every case of the grid."""
    lengths = QUICK_LENGTHS if quick else LENGTHS
    dtypes = dtypes or (["float32", "bfloat16"] if quick else ["float32", "float16", "bfloat16"])
    if quick:  # each map, (causal, GQA) pair, length and kind once: every path, not every combination
        pairs = list(itertools.product((False, True), (False, True)))
        for dtype in dtypes:
            for i in range(max(len(MAPS), len(pairs))):  # every map and every pair, however many of each
                causal, gqa = pairs[i % len(pairs)]
                yield MAPS[i % len(MAPS)], dtype, lengths[-1], causal, gqa, "normal"
            yield MAPS[0], dtype, lengths[0], False, False, "normal"
            yield MAPS[1], dtype, lengths[-1], False, False, "masked_row"
            yield MAPS[2], dtype, lengths[-1], True, False, "offset"
        return
    # the map varies fastest, so that a run cut short has checked every map
    for dtype, ls, causal, gqa, name in itertools.product(dtypes, lengths, (False, True), (False, True), MAPS):
        yield name, dtype, ls, causal, gqa, "normal"
    for dtype, name in itertools.product(dtypes, MAPS):
        yield name, dtype, lengths[-1], False, False, "masked_row"
        yield name, dtype, lengths[-1], True, False, "offset"


def run_case(name, dtype, ls, causal, gqa, kind, device, seed=0):
    import numpy as np
    import torch

    import softk
    from softk._backends import dispatch
    from softk.threshold.attention_maps import family_id
    from tests.oracle import attention as oracle

    g = torch.Generator().manual_seed(seed)
    (L, S), E, H = ls, 64, 4
    hkv = 2 if gqa else H
    dt = getattr(torch, dtype)
    q = torch.randn(1, H, L, E, generator=g)
    k = torch.randn(1, hkv, S, E, generator=g)
    v = torch.randn(1, hkv, S, E, generator=g)
    mask = None
    if kind == "offset":  # a shared offset on every key: shift-before-scale must cancel it
        k = k + 1e4 / E**0.5 * torch.ones(E) / E**0.5
    if kind == "masked_row":  # query row 0 sees no key: output and gradients 0
        mask = torch.ones(L, S, dtype=torch.bool)
        mask[0] = False
    q, k, v = (t.to(dt) for t in (q, k, v))
    dout = torch.randn(1, H, L, E, generator=g).to(dt)
    alpha = torch.tensor([1.3, 1.5, 1.7, 1.9]) if name == "entmax" else None
    qd, kd, vd = (t.to(device).clone().requires_grad_() for t in (q, k, v))
    ad = alpha.to(device).clone().requires_grad_() if alpha is not None else None
    out = softk.scaled_dot_product_attention(qd, kd, vd, attn_mask=None if mask is None else mask.to(device),
                                             is_causal=causal, enable_gqa=gqa, map=name, alpha=ad)
    out.backward(dout.to(device))
    np64 = [t.double().numpy() for t in (q, k, v, dout)]
    a_np = None if alpha is None else alpha.double().numpy()
    m_np = None if mask is None else mask.numpy()
    ref, _ = oracle.attention(*np64[:3], m_np, causal, None, name, a_np)
    refs = {"out": ref}
    refs.update(zip(("dq", "dk", "dv"), oracle.grads(*np64, m_np, causal, None, name, a_np)))
    got = {"out": out, "dq": qd.grad, "dk": kd.grad, "dv": vd.grad}
    tol = TOL[dtype]
    errs = {}
    for key, want in refs.items():
        have = got[key].detach().double().cpu().numpy()
        errs[key] = float(np.max(np.abs(have - want)) / max(1.0, float(np.max(np.abs(want))))) if want.size else 0.0
    ok = all(e <= tol for e in errs.values()) and all(bool(torch.isfinite(t).all()) for t in got.values())
    if ad is not None and L <= 64:  # dα: central differences of the oracle's forward (2 per head)
        want = oracle.dalpha(*np64, a_np, m_np, causal, None)
        errs["dalpha"] = float(np.max(np.abs(ad.grad.double().cpu().numpy() - want)) / max(1.0, float(np.max(np.abs(want)))))
        ok = ok and errs["dalpha"] <= max(DALPHA_TOL, tol)
    return {"map": name, "dtype": dtype, "L": L, "S": S, "causal": causal, "gqa": gqa, "kind": kind,
            "backend": getattr(dispatch.pick("attention", qd, family_id(name, None, False)), "backend", "reference"), "tol": tol, "err": errs, "verdict": "pass" if ok else "fail"}


def _run_safe(c, device):
    """One case as a row; an exception becomes a row that says why."""
    try:
        return run_case(*c, device=device)
    except Exception as exc:  # noqa: BLE001 - a row that says why, never a crash
        return dict(zip(("map", "dtype", "LS", "causal", "gqa", "kind"), c), verdict="error", why=f"{type(exc).__name__}: {str(exc)[:200]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true",
                    help="seven cases per dtype at two short lengths (each map, causal and GQA pair, kind), "
                         "float32 and bfloat16")
    ap.add_argument("--dtypes", nargs="+", choices=sorted(TOL), help="input dtypes (default: all three; --quick float32 and bfloat16)")
    ap.add_argument("--budget-s", type=float, default=120.0, help="cases not started by then are 'skipped'")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1),
                    help="processes that run cases at once (each compiles its own kernel variants; 0: in this process)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("attention_check.py: no CUDA device here; use --device cpu with TRITON_INTERPRET=1 for a dry run", file=sys.stderr)
        return 2
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        os.environ["SOFTK_BACKEND"] = "triton"  # the interpreter runs the device's kernels on the CPU
    t0 = time.monotonic()
    grid = list(cases(args.quick, args.dtypes))
    keys = ("map", "dtype", "LS", "causal", "gqa", "kind")
    rows = [dict(zip(keys, c), verdict="skipped") for c in grid]  # overwritten as cases finish
    if args.jobs > 0:
        import concurrent.futures as cf
        import multiprocessing as mp

        pool = cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn"))
        futs = {pool.submit(_run_safe, c, args.device): i for i, c in enumerate(grid)}
        try:
            for fut in cf.as_completed(futs, timeout=args.budget_s):
                rows[futs[fut]] = fut.result()
        except cf.TimeoutError:  # cases not finished stay "skipped"
            pass
        pool.shutdown(wait=False, cancel_futures=True)
    else:
        for i, c in enumerate(grid):
            if time.monotonic() - t0 > args.budget_s:
                break
            rows[i] = _run_safe(c, args.device)
    for r in rows:
        if r["verdict"] not in ("pass", "skipped"):
            print(f"{r['verdict'].upper():7s} {r}", flush=True)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("pass", "fail", "error", "skipped")}
    from gpu import meta_info

    meta = meta_info(args.device)
    print(f"attention: {counts['pass']} of {len(rows)} passed, {counts['fail']} failed, {counts['error']} errors, "
          f"{counts['skipped']} not reached ({time.monotonic() - t0:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "summary": counts, "cases": rows}, f, indent=1)
    return 0 if counts["pass"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
