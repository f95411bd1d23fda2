"""Tile, warp and rows-per-program sweep of the Triton threshold kernels.

Run (CUDA GPU, repository root)::

    PYTHONPATH=src python benchmarks/gpu/tune.py --json tune.json
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/gpu/tune.py --device cpu --quick   # a dry run

For each shape of ``SHAPES`` (the widths of BENCHMARKS.md's GPU targets) it
times the lean forward (sparsemax, entmax15, α-entmax at α = 1.7, soft
top-k exp at k = 2) under every launch setting of ``lean_configs`` — rows
per program and warps, and from ``LEAN_GROUP_MIN`` entries the search on a
buffer of the row's candidates or on the whole row, or above ``LEAN_MAX``
the loop's block and warps — and the backward kernel
(sparsemax) of ``softk._backends.triton.function`` under every configuration
of ``configs`` — on chip or looped, the block, the warps and the rows per
program — and so the fused loss kernel (softmax and sparsemax, class-index
targets, from ``LOSS_MIN_N`` entries), with ``triton.testing.do_bench``
(median, L2 flushed), next to ``torch.softmax`` forward and backward at the
same shape (``F.cross_entropy`` forward + backward for the loss).
The configuration the launcher picks today is marked ``default``; the
report gives, per (shape, kernel), the fastest configuration and both as
multiples of torch.

Every configuration is compiled first in ``--jobs`` processes at once (the
on-disk cache keeps the binaries), so the timed process does not compile
serially.  ``--budget-s`` bounds the run; the JSON is rewritten after each
shape.
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

# name: (rows, width, dtype)
SHAPES = {
    "router16": (2**25 // 16, 16, "bfloat16"),
    "router64": (2**25 // 64, 64, "bfloat16"),
    "router128": (2**25 // 128, 128, "bfloat16"),
    "router256": (2**25 // 256, 256, "bfloat16"),
    "router512": (2**25 // 512, 512, "bfloat16"),
    "w128": (65536, 128, "float32"),
    "w1024": (32768, 1024, "float32"),
    "w4096": (8192, 4096, "float32"),
    "w8192": (16384, 8192, "float32"),
    "w32768": (8192, 32768, "bfloat16"),
}
# --quick: on chip in tiles of rows, on chip a row alone, looped (forward and backward); a program's worth of rows each
QUICK = {"router64": (16, 64, "float32"), "w1024": (2, 1024, "float32"), "w16384": (1, 16384, "float32")}
KERNELS = [("fwd", "sparsemax"), ("fwd", "entmax15"), ("fwd", "entmax"), ("fwd", "exp"), ("bwd", "sparsemax"),
           ("loss", "softmax"), ("loss", "sparsemax")]
# the fused loss (class-index targets, the gradient written) on the widths a vocabulary has
LOSS_MIN_N = 1024
# the k of each forward: the smooth top-k at a router's k; the α of α-entmax (one that searches a buffer of candidates)
K = {"exp": 2.0}
ALPHA = {"entmax": 1.7}
# the lean forwards that may search a buffer of candidates rather than the row (from LEAN_GROUP_MIN entries)
COMPACTING = ("sparsemax", "entmax15", "entmax")


def kernels_for(n: int):
    """The (kind, family) pairs swept at width ``n``."""
    return [(kind, fam) for kind, fam in KERNELS if kind != "loss" or n >= LOSS_MIN_N]


def lean_configs(n: int, fam_name: str = "sparsemax"):
    """(rows per program, warps, candidates' buffer) to try at width ``n`` for
    the lean forward: tiles of 256–2048 entries (or the row alone, when
    wider), 4–32 entries per thread, and for the simplex maps from
    ``LEAN_GROUP_MIN`` entries the search on the candidates' buffer or on the
    whole row; above ``LEAN_MAX`` (block, warps, buffer): blocks of
    1024–4096, 4–16 entries per thread, the search on the buffer or in
    sweeps of the row (the simplex maps)."""
    from softk._backends.triton.function import LEAN_GROUP_MIN, LEAN_MAX, ROWS_MAX

    blk = max(16, 1 << (n - 1).bit_length())
    if n > LEAN_MAX:
        both = (True, False) if fam_name in COMPACTING else (True,)
        out = [(b, b // (32 * e), c) for b in (1024, 2048, 4096) for e in (4, 8, 16) for c in both]
    else:
        both = (True, False) if blk >= LEAN_GROUP_MIN and fam_name in COMPACTING else (False,)
        out = [(t // blk, t // (32 * e), c) for t in sorted({256, 512, 1024, 2048, blk}) for e in (4, 8, 16, 32) for c in both
               if t >= blk and t // blk <= ROWS_MAX]
    return [c for c in dict.fromkeys(out) if 1 <= c[1] <= 16]


def configs(n: int, kind: str = "fwd"):
    """(onchip, block, warps, rows) to try at width ``n``: on chip, tiles of
    512–2048 entries for narrow rows and a row alone from 1024 up; looped,
    blocks of 512–2048 (the backward also 4096); 4–32 entries per thread."""
    out = []
    blk = max(16, 1 << (n - 1).bit_length())
    if n <= 8192:
        if blk < 1024:
            out += [(True, blk, t // (32 * e), t // blk) for t in (512, 1024, 2048) for e in (4, 8, 16) if t >= blk]
        else:
            out += [(True, blk, blk // (32 * e), 1) for e in (8, 16, 32) if 1 <= blk // (32 * e) <= 32]
    if n >= 2048:
        blocks = (512, 1024, 2048, 4096) if kind == "bwd" else (512, 1024, 2048)
        out += [(False, b, b // (32 * e), 1) for b in blocks for e in (4, 8, 16) if b < n and 1 <= b // (32 * e) <= 32]
    return [c for c in dict.fromkeys(out) if c[2] >= 1]


def _launch(kind, fam_name, x, g, cfg):
    """One launch of a kernel under a forced configuration (None: the launcher's own)."""
    import torch

    from softk._backends.triton import function as fn
    from softk.threshold.families import KERNEL_IDS

    from softk._backends.triton import loss

    fam = KERNEL_IDS[fam_name]
    saved, saved_lean, saved_loss = fn._config, fn._lean_config, loss._config
    saved_compact, saved_wide = fn._lean_compacts, fn._lean_wide_compacts
    if cfg is not None:
        fn._config = loss._config = lambda n, onchip, block, rows=None, backward=False: cfg
        if _lean(fn, x.shape[-1], kind, fam_name):
            fn._lean_config = lambda n, fam: cfg[:2]
            fn._lean_compacts = lambda fam, alpha: cfg[2]
            fn._lean_wide_compacts = lambda fam: cfg[2]
    try:
        if kind == "fwd":
            return fn.forward_rows(x, fam, K.get(fam_name, 1.0), 1.0, ALPHA.get(fam_name, 1.5))
        if kind == "loss":  # g: the class indices, one per row
            scale = torch.full((1,), 1.0 / x.shape[0], device=x.device)
            return loss.fenchel_young_fused_rows(x, g, scale, fam, 1.0, 1.0, 1.5)
        return fn.backward_rows(x, g, fam, 1.0, 1.5)
    finally:
        fn._config, fn._lean_config, loss._config = saved, saved_lean, saved_loss
        fn._lean_compacts, fn._lean_wide_compacts = saved_compact, saved_wide


def _lean(fn, n, kind, fam_name):
    """Whether this kernel at width ``n`` is a lean forward (else the general kernel)."""
    return kind == "fwd" and fn.takes_lean(fn.FAMILY_IDS[fam_name], n, ALPHA.get(fam_name, 1.5))


def _default(fn, n, kind, fam_name):
    """The configuration the launcher picks today."""
    if _lean(fn, n, kind, fam_name):
        fam = fn.FAMILY_IDS[fam_name]
        return (*fn._lean_config(n, fam), fn.lean_searches_buffer(n, fam, ALPHA.get(fam_name, 1.5)))
    return fn._config(n, None, None, backward=kind == "bwd")


def _tried(fn, n, kind, fam_name):
    return lean_configs(n, fam_name) if _lean(fn, n, kind, fam_name) else configs(n, kind)


def _inputs(rows, n, dtype, device):
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, n, generator=gen, device=device).to(getattr(torch, dtype))
    return x, torch.randn(rows, n, generator=gen, device=device).to(x.dtype)


def _targets(rows, n, device):
    import torch

    return torch.randint(0, n, (rows,), generator=torch.Generator(device=device).manual_seed(1), device=device)


def _compile_one(item):
    """Child process: compile one (shape, kernel, config) on a small batch of rows of the same width."""
    name, kind, fam, cfg, device, shapes = item
    rows, n, dtype = shapes[name]
    x, g = _inputs(min(rows, 32), n, dtype, device)
    if kind == "loss":
        _launch("loss", fam, x, _targets(x.shape[0], n, device), tuple(cfg) if cfg else None)
        return True
    p = _launch("fwd", fam, x, None, tuple(cfg) if cfg else None)
    if kind == "bwd":
        _launch("bwd", fam, p, g, tuple(cfg) if cfg else None)
    return True


def _timer(device):
    if device == "cuda":
        from triton.testing import do_bench

        return lambda f: do_bench(f, warmup=10, rep=40, return_mode="median")

    def wall(f):
        t0 = time.perf_counter()
        f()
        return 1e3 * (time.perf_counter() - t0)

    return wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="three tiny shapes (a dry run)")
    ap.add_argument("--only", nargs="+", help="shape names from SHAPES")
    ap.add_argument("--kernels", nargs="+", choices=sorted({k for k, _ in KERNELS}), help="these kinds of kernel only (default: all)")
    ap.add_argument("--jobs", type=int, default=min(14, os.cpu_count() or 1), help="compiling processes (0: compile in the timed process)")
    ap.add_argument("--budget-s", type=float, default=120.0)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("tune.py: no CUDA device here; use --device cpu with TRITON_INTERPRET=1 for a dry run", file=sys.stderr)
        return 2
    from softk._backends.triton import function as fn

    t0 = time.monotonic()
    shapes = QUICK if args.quick else {k: v for k, v in SHAPES.items() if not args.only or k in args.only}
    plan = []  # (shape, kind, fam, cfg or None for the default)
    for name, (rows, n, dtype) in shapes.items():
        for kind, fam in kernels_for(n):
            if args.kernels and kind not in args.kernels:
                continue
            default = _default(fn, n, kind, fam)
            tried = [c for c in _tried(fn, n, kind, fam) if c != default]
            if args.quick:  # two of them: the widest blocks, the fewest steps for the interpreter
                tried = tried[-2:]
            plan += [(name, kind, fam, cfg) for cfg in [None] + tried]
    if args.jobs > 0:
        import concurrent.futures as cf
        import multiprocessing as mp

        items = [(s, k, f, c, args.device, shapes) for s, k, f, c in plan]
        done = 0
        pool = cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn"))
        futs = [pool.submit(_compile_one, it) for it in items]
        try:
            for fut in cf.as_completed(futs, timeout=max(10.0, 0.5 * args.budget_s)):
                done += fut.exception() is None
        except cf.TimeoutError:  # what is left compiles in the timed pass
            pass
        pool.shutdown(wait=False, cancel_futures=True)
        print(f"compiled {done} of {len(items)} in {args.jobs} processes ({time.monotonic() - t0:.0f} s)", flush=True)
    timer = _timer(args.device)
    from gpu import meta_info

    meta = meta_info(args.device)
    rows_out = []

    def write():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows_out, "best": best(rows_out), "compiled": compiled_kernels()}, f, indent=1)

    for name, (rows, n, dtype) in shapes.items():
        x, g = _inputs(rows, n, dtype, args.device)
        ref = {"fwd": timer(lambda: torch.softmax(x, -1))}
        y = torch.softmax(x, -1)
        ref["bwd"] = timer(lambda: torch._softmax_backward_data(g, y, -1, x.dtype))
        tg = _targets(rows, n, args.device)
        xl = x.detach().requires_grad_(True)
        # the loss kernel against F.cross_entropy forward + backward (it writes the gradient in its one call)
        ref["loss"] = timer(lambda: torch.nn.functional.cross_entropy(xl, tg).backward())
        p = {fam: fn.forward_rows(x, fn.FAMILY_IDS[fam], 1.0, 1.0, 1.5) for fam in ("sparsemax", "entmax15")}
        for s, kind, fam, cfg in plan:
            if s != name:
                continue
            if time.monotonic() - t0 > args.budget_s:
                rows_out.append({"shape": name, "kernel": f"{kind}-{fam}", "config": cfg, "status": "skipped: time budget"})
                continue
            default = _default(fn, n, kind, fam)
            row = {"shape": name, "rows": rows, "n": n, "dtype": dtype, "kernel": f"{kind}-{fam}",
                   "config": list(cfg or default), "default": cfg is None, "torch_ms": ref[kind]}
            try:
                if kind == "fwd":
                    call = lambda: _launch(kind, fam, x, None, cfg)  # noqa: E731
                elif kind == "loss":
                    call = lambda: _launch(kind, fam, x, tg, cfg)  # noqa: E731
                else:
                    call = lambda: _launch(kind, fam, p[fam], g, cfg)  # noqa: E731
                row["ms"] = timer(call)
                row["x_torch"] = row["ms"] / ref[kind]
            except Exception as exc:  # noqa: BLE001 - a row that says why
                row["status"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            rows_out.append(row)
        write()
        x = g = p = xl = tg = None  # free the shape before the next one
        if args.device == "cuda":
            torch.cuda.empty_cache()
    write()
    for b in best(rows_out):
        print(f"{b['shape']:10s} {b['kernel']:15s} default {b['default_config']} {b['default_ms']:.4f} ms ({b['default_x_torch']:.2f}x torch)"
              f"  best {b['best_config']} {b['best_ms']:.4f} ms ({b['best_x_torch']:.2f}x)", flush=True)
    for c in compiled_kernels():
        print(f"{c['kernel']:22s} warps {c['num_warps']} regs {c['n_regs']} spills {c['n_spills']} {c['constexprs']}", flush=True)
    print(f"tune: {len(rows_out)} rows in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


def compiled_kernels() -> list[dict]:
    """The lean forwards' compiled variants in this process: warps, registers
    per thread and spills (what bounds the rows in flight on an SM), and
    their constexprs; empty under the interpreter, which compiles nothing."""
    from softk._backends.triton import function as fn

    out = []
    for name in ("lean_fwd_kernel", "lean_topk_fwd_kernel", "lean_wide_fwd_kernel"):
        kernel = getattr(fn, name)
        for caches in getattr(kernel, "device_caches", {}).values():
            for key, ck in (caches[0] if isinstance(caches, tuple) else {}).items():
                row = {"kernel": name, "num_warps": getattr(getattr(ck, "metadata", None), "num_warps", None),
                       "n_regs": getattr(ck, "n_regs", None), "n_spills": getattr(ck, "n_spills", None)}
                try:  # the constexprs by name (ASTSource.constants: {(index,): value})
                    names = ck.src.fn.arg_names
                    row["constexprs"] = {names[i[0]]: v for i, v in ck.src.constants.items() if names[i[0]].isupper()}
                except Exception:  # noqa: BLE001 - another Triton's layout: its key as text
                    row["constexprs"] = str(key)[:300]
                out.append(row)
    return out


def best(rows):
    """Per (shape, kernel): the default configuration's time and the fastest one's."""
    out = []
    keyed = {}
    for r in rows:
        if "ms" in r:
            keyed.setdefault((r["shape"], r["kernel"]), []).append(r)
    for (shape, kernel), rs in keyed.items():
        d = next((r for r in rs if r["default"]), None)
        b = min(rs, key=lambda r: r["ms"])
        if d is None:
            continue
        out.append({"shape": shape, "kernel": kernel, "default_config": d["config"], "default_ms": d["ms"], "default_x_torch": d["x_torch"],
                    "best_config": b["config"], "best_ms": b["ms"], "best_x_torch": b["x_torch"]})
    return out


if __name__ == "__main__":
    sys.exit(main())
