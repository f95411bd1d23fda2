"""The fused sparsemax loss on a GPU: backward products on the live vocabulary tiles against the dense ones.

Run (CUDA GPU, repository root)::

    PYTHONPATH=src python benchmarks/gpu/fused_live_tiles.py --json fused_live_tiles.json
    PYTHONPATH=src python benchmarks/gpu/fused_live_tiles.py --dry-run    # the CPU, tiny: the script's code

A dry run interprets the tile kernels on the CPU (``TRITON_INTERPRET=1``) at
N × H × V = 64 × 32 × 300, with the loss itself on the torch backend; its
times say nothing about a GPU.

For a sparse loss the gradient G = p − y of a chunk of logits is exactly zero
outside the union of the rows' supports and targets.
``softk.losses.fused_linear_loss`` under the "triton" backend on CUDA runs
∇X = G W, ∇W += Gᵀ X and ∇b += Σ G on the tiles of 64 classes where G is
not all zero (softk._backends.triton.live_tiles); under "auto" the dense
cuBLAS products run.  This script times forward + backward
(``triton.testing.do_bench``, median) of both routes, under the same
"triton" backend so that only the products differ, at N × H × V (default
4096 × 4096 × 128256, a Llama-3 output layer) in bfloat16, on three kinds
of hidden states:

* ``trained``: each hidden state is its target's weight row times 200 plus
  noise (0.05), W's entries N(0, 0.05²), targets uniform over V: the
  sparsemax support is a class or two, as in a trained model (the setting of
  benchmarks/cpu/fused_sparse_losses.py, whose generator is inline there);
* ``zipf``: the same with targets drawn from a Zipf law (exponent 1.1) over
  a random permutation of the classes, as token frequencies are (the
  permutation spreads the frequent classes over the tiles: no help from
  their order);
* ``random``: standard normal hidden states (early training; the logits are
  N(0, H·0.0025)): wide supports, most tiles live.

Each row reports the mean sparsemax support, the mean share of live tiles
per chunk (what the kernels run), both times and their ratio; the crossover
line interpolates, over the rows of one shape, the live-tile share at which
the tiles' time equals the dense products'.  Before timing, the two routes'
loss and gradients (x, W) are compared on the device (relative to the
largest entry; bfloat16 rounding of ∇X and of the dense route's per-chunk
Gᵀ X bounds their difference): a mismatch is reported and makes the exit
status 1.  Nothing asserts on time.  ``--budget-s`` bounds the run; the
JSON is rewritten after each row.
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

SHAPES = ["4096x4096x128256"]
DRY_SHAPES = ["64x32x300"]
SETTINGS = ("trained", "zipf", "random")
# the routes' difference, relative to the largest entry of each result: a
# few bfloat16 roundings (2⁻⁸ each) of the largest entries; a skipped live
# tile is off by whole terms
MISMATCH = 2.0 ** -5


def hidden_states(setting: str, n: int, h: int, v: int, device, dtype, seed: int = 0):
    """(x (N, H), W (V, H), targets (N,)) for ``setting`` (module docstring), in ``dtype``."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(v, h, generator=g, device=device) * 0.05
    if setting == "zipf":
        weights = 1.0 / torch.arange(1, v + 1, device=device, dtype=torch.float64) ** 1.1
        rank = torch.multinomial(weights, n, replacement=True, generator=g)
        y = torch.randperm(v, generator=g, device=device)[rank]
    else:
        y = torch.randint(0, v, (n,), generator=g, device=device)
    if setting == "random":
        x = torch.randn(n, h, generator=g, device=device)
    else:
        x = w[y] * 200.0 + torch.randn(n, h, generator=g, device=device) * 0.05
    return x.to(dtype), w.to(dtype), y


def support_and_share(x, w, y, chunk: int, block_v: int):
    """The mean sparsemax support per row and the mean share of live tiles
    of ``block_v`` classes per chunk of ``chunk`` rows (the union of the
    chunk's supports and targets, cut into tiles)."""
    import torch

    import softk

    v = w.shape[0]
    n_tiles = -(-v // block_v)
    support, shares = 0.0, []
    with torch.no_grad():
        for s in range(0, x.shape[0], chunk):
            p = softk.sparsemax((x[s:s + chunk] @ w.t()).float())
            support += float((p > 0).sum())
            live = (p > 0).any(0)
            live[y[s:s + chunk]] = True
            pad = -v % block_v
            live = torch.nn.functional.pad(live, (0, pad)).view(n_tiles, block_v).any(1)
            shares.append(float(live.float().mean()))
            del p
    return support / x.shape[0], sum(shares) / len(shares)


def crossover(rows):
    """The live-tile share at which tiles/dense crosses 1, interpolated
    linearly between the timed rows of one shape sorted by share; a
    sentence where the ratio does not cross 1 in the measured range."""
    pts = sorted((r["live_tile_share"], r["tiles_over_dense"]) for r in rows if r.get("tiles_over_dense"))
    if not pts:
        return "no timed rows"
    for (s0, r0), (s1, r1) in zip(pts, pts[1:]):
        if (r0 - 1) * (r1 - 1) <= 0 and r0 != r1:
            return f"{s0 + (1 - r0) * (s1 - s0) / (r1 - r0):.3f}"
    if all(r < 1 for _, r in pts):
        return f"none: the tiles are faster up to a share of {pts[-1][0]:.3f}"
    if all(r > 1 for _, r in pts):
        return f"none: the dense products are faster down to a share of {pts[0][0]:.3f}"
    return "not monotone"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dry-run", action="store_true",
                    help="on the CPU under TRITON_INTERPRET=1 at a tiny shape: the script's code, no timing worth reading")
    ap.add_argument("--shapes", nargs="+", help="NxHxV (default 4096x4096x128256; 64x32x300 with --dry-run)")
    ap.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    # a smaller chunk than the automatic one (1024 rows at the default shape)
    # has a smaller union of supports: a second live-tile share per setting
    ap.add_argument("--chunks", nargs="+", type=int, default=[0, 256],
                    help="rows per chunk, 0 for the automatic chunk size (default: 0 256)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--budget-s", type=float, default=400.0)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.device = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
    import torch

    import softk
    import softk._ops.fused_linear as FL
    from softk._backends import dispatch, kernels
    from softk._backends.triton import live_tiles as LT
    from softk.losses import fused_linear_loss
    from softk.losses.chunking import auto_chunk_size

    if args.device == "cuda" and not torch.cuda.is_available():
        print("fused_live_tiles.py: no CUDA device here; use --dry-run for the CPU", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    dtype = getattr(torch, args.dtype)
    shapes = args.shapes or (DRY_SHAPES if args.dry_run else SHAPES)
    from gpu import meta_info

    meta = dict(meta_info(args.device), dtype=str(dtype), block_v=LT.BLOCK_V, block_c=LT.BLOCK_C, block_h=LT.BLOCK_H,
                interpreted=os.environ.get("TRITON_INTERPRET", "0") == "1")
    t0, rows, bad = time.monotonic(), [], 0
    real_route = FL.live_tiles_kernel
    # Both routes are the pass over chunks of rows (its dense products against
    # its live-tile kernels): half weights would otherwise walk the vocabulary
    # on the dense route (softk.losses.fused_linear.WALK_DTYPES).
    import softk.losses.fused_linear as fused_module

    fused_module.WALK_DTYPES = ()
    tiles_kernel = kernels.get("live_tiles", "triton")
    # "dense" means the dense products on every device: the CPU's live
    # columns (a dry run's "dense" route otherwise) are switched off
    FL.SPARSE_MAX_SHARE = {}
    # the loss itself on the Triton kernels on a GPU; a dry run's on the
    # torch backend (the interpreted kernels would take minutes there)
    loss_backend = "torch" if args.dry_run else "triton"

    def write():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows, "crossover": crossovers}, f, indent=1)

    def timed(fn, x, w):
        fn()  # compile, warm
        if cuda:
            from triton.testing import do_bench

            return do_bench(fn, warmup=10, rep=100, grad_to_none=[x, w], return_mode="median")
        t1 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t1)

    crossovers = {}
    print("| N×H×V | hidden states | chunk | mean support | live tiles | dense ms | tiles ms | tiles / dense | "
          "max rel. diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in shapes:
        n, h, v = map(int, shape.split("x"))
        shape_rows = []
        for setting in args.settings:
            x, w, y = hidden_states(setting, n, h, v, args.device, dtype)
            for c in args.chunks:
                chunk = c or auto_chunk_size(n, h, v, args.device)
                row = {"shape": shape, "N": n, "H": h, "V": v, "setting": setting, "chunk": chunk}
                if time.monotonic() - t0 > args.budget_s:
                    rows.append(dict(row, status="skipped: time budget"))
                    continue
                try:
                    row["mean_support"], row["live_tile_share"] = support_and_share(x, w, y, chunk, LT.BLOCK_V)
                    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
                    results = {}
                    with softk.use_backend(loss_backend):
                        if cuda:
                            # the route that "triton" picks on CUDA by itself
                            row["route_selected"] = getattr(dispatch.pick("live_tiles", xs), "backend", None)
                        for route, on in (("dense", False), ("tiles", True)):
                            FL.live_tiles_kernel = (lambda on: lambda x: tiles_kernel if on else None)(on)

                            def step():
                                fused_linear_loss(xs, ws, y, "sparsemax", chunk_size=chunk).backward()

                            xs.grad = ws.grad = None
                            loss = fused_linear_loss(xs, ws, y, "sparsemax", chunk_size=chunk)
                            loss.backward()
                            results[route] = (loss.detach().float(), xs.grad.float(), ws.grad.float())
                            xs.grad = ws.grad = None
                            row[f"{route}_ms"] = timed(step, xs, ws)
                    FL.live_tiles_kernel = real_route
                    diffs = [float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)
                             for a, b in zip(results["tiles"], results["dense"])]
                    row["max_rel_diff"] = dict(zip(("loss", "x", "weight"), diffs))
                    row["match"] = max(diffs) <= MISMATCH
                    bad += not row["match"]
                    row["tiles_over_dense"] = row["tiles_ms"] / row["dense_ms"]
                    del results
                except Exception as exc:  # noqa: BLE001 - a row that says why
                    FL.live_tiles_kernel = real_route
                    row["status"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                rows.append(row)
                shape_rows.append(row)
                if "status" in row:
                    print(f"| {shape} | {setting} | {chunk} | | | | | | {row['status']} |", flush=True)
                else:
                    print(f"| {shape} | {setting} | {chunk} | {row['mean_support']:.1f} | {row['live_tile_share']:.3f} | "
                          f"{row['dense_ms']:.2f} | {row['tiles_ms']:.2f} | {row['tiles_over_dense']:.2f} | "
                          f"{max(row['max_rel_diff'].values()):.1e}{'' if row['match'] else ' MISMATCH'} |", flush=True)
                write()
            x = w = y = None
            if cuda:
                torch.cuda.empty_cache()
        crossovers[shape] = crossover(shape_rows)
        print(f"\n{shape}: crossover (live-tile share where tiles = dense): {crossovers[shape]}\n", flush=True)
    write()
    print(f"fused_live_tiles: {len(rows)} rows in {time.monotonic() - t0:.0f} s; "
          f"{bad} mismatch(es) between the routes", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
