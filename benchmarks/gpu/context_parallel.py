"""Context-parallel attention, forward + backward: tokens per second and peak memory per rank.

Run:  python benchmarks/gpu/context_parallel.py --world 2 --tokens 2048 --threads 1     # CPU, 2 gloo ranks
      torchrun --nproc-per-node 8 benchmarks/gpu/context_parallel.py --device cuda --tokens 131072
      ... --json out.json --md out.md

One causal self-attention layer's q, k, v (B = 1, ``--heads`` heads of
``--dim``, bf16 on CUDA, float32 on the CPU) for a sequence of ``--tokens``
tokens, sharded over the ranks in torch's head–tail layout (the one its
``context_parallel`` uses for causal masks).  Variants:

    torch_sdpa           torch's context_parallel with F.scaled_dot_product_attention (softmax; its ring)
    softk_<map>_<how>    softk.distributed.context_parallel_attention, map softmax / sparsemax / entmax15,
                         strategy allgather / ring
    one_device_<map>     (with --one-device) softk.scaled_dot_product_attention on the whole sequence,
                         each rank alone: the time that the group divides (one_device_sdpa: torch's SDPA)

Each step is forward + backward of the sum of the output times a fixed
random tensor; ``--warmup`` untimed steps, then ``--steps`` rounds running
every variant once, the order rotating, a barrier around each; the median
per variant is reported as tokens/s of the whole group (``--tokens`` /
time) with the peak memory of the step per rank (CUDA's allocator; not
measured on the CPU).  Rank 0 writes the results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

MAPS = ("softmax", "sparsemax", "entmax15")
STRATEGIES = ("allgather", "ring")
VARIANTS = ("torch_sdpa",) + tuple(f"softk_{m}_{s}" for m in MAPS for s in STRATEGIES)
ONE_DEVICE = ("one_device_sdpa",) + tuple(f"one_device_{m}" for m in MAPS)  # the whole sequence on each rank, no collective


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--world", type=int, default=2, help="CPU only: gloo ranks to spawn (CUDA: torchrun's)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS + ONE_DEVICE, default=list(VARIANTS))
    ap.add_argument("--one-device", action="store_true", help="add the one_device_<map> rows")
    ap.add_argument("--json")
    ap.add_argument("--md")
    return ap.parse_args(argv)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _step(name, q, k, v, grad, mesh, pos_buf):
    import softk.attention as sa
    import softk.distributed as sd

    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if name == "torch_sdpa":
        from torch.distributed.tensor.experimental import context_parallel

        # torch's context shards whole-sequence buffers itself: hand it the full tensors
        full = [t.detach().clone() for t in (q, k, v)]
        with context_parallel(mesh, buffers=full + [pos_buf.clone()], buffer_seq_dims=[2, 2, 2, 1]):
            qs, ks, vs = (t.detach().clone().requires_grad_() for t in full)  # the context restores full on exit
            out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            (out * grad[..., :out.shape[2], :]).sum().backward()
        return
    if name == "one_device_sdpa":
        out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        (out * grad).sum().backward()
        return
    if name.startswith("one_device_"):
        out = sa.scaled_dot_product_attention(qs, ks, vs, is_causal=True, map=name[len("one_device_"):])
        (out * grad).sum().backward()
        return
    _, m, how = name.split("_")
    out = sd.context_parallel_attention(qs, ks, vs, is_causal=True, map=m, strategy=how, layout="head_tail",
                                        group=mesh.get_group())
    (out * grad).sum().backward()


def worker(rank, world, args, init):
    device = torch.device("cuda", rank % max(torch.cuda.device_count(), 1)) if args.device == "cuda" else \
        torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        torch.set_num_threads(args.threads)
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    from softk.distributed.cp_plan import positions

    mesh = init_device_mesh(device.type, (world,))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (1, args.heads, args.tokens, args.dim)
    q, k, v, grad = (torch.randn(shape, generator=g).to(device, dtype) for _ in range(4))
    mine = positions("head_tail", [args.tokens // world] * world, rank, device)
    local = [t[:, :, mine].contiguous() for t in (q, k, v)]
    grad_local = grad[:, :, mine].contiguous()
    pos_buf = torch.arange(args.tokens, device=device).unsqueeze(0)
    times = {n: [] for n in args.variants}
    peaks = {n: 0 for n in args.variants}

    def one(name):
        if name == "torch_sdpa":
            _step(name, q, k, v, grad_local, mesh, pos_buf)
        elif name.startswith("one_device_"):
            _step(name, q, k, v, grad, mesh, pos_buf)
        else:
            _step(name, *local, grad_local, mesh, pos_buf)

    errors = {}
    for name in args.variants:
        try:
            for _ in range(args.warmup):
                one(name)
        except Exception as exc:  # a variant this torch cannot run (torch's CP on the CPU) is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    names = [n for n in args.variants if n not in errors]
    for r in range(args.steps):
        for name in names[r % len(names):] + names[:r % len(names)] if names else []:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            one(name)
            _sync(device)
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
            if device.type == "cuda":
                peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated() - base)
    if rank == 0:
        rows = []
        for name in args.variants:
            if name in errors:
                rows.append({"variant": name, "error": errors[name]})
                continue
            med = statistics.median(times[name])
            rows.append({"variant": name, "ms": med * 1e3, "tokens_per_s": args.tokens / med,
                         "peak_mib_per_rank": peaks[name] / 2**20 if device.type == "cuda" else None})
        meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
                or platform.machine(), "world": world, "tokens": args.tokens, "heads": args.heads, "dim": args.dim,
                "dtype": str(dtype), "threads": args.threads if device.type == "cpu" else None,
                "torch": torch.__version__, "date": datetime.date.today().isoformat(), "steps": args.steps}
        report(rows, meta, args)
    dist.destroy_process_group()


def report(rows, meta, args):
    lines = [f"context-parallel causal attention, {meta['world']} ranks, {meta['tokens']} tokens, "
             f"{meta['heads']} heads × {meta['dim']}, {meta['dtype']}, {meta['device']}, torch {meta['torch']}, "
             f"{meta['date']}", "", "| variant | ms (fwd+bwd) | tokens/s | peak MiB per rank |", "|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['variant']} | not run: {row['error']} | | |")
        else:
            peak = "—" if row["peak_mib_per_rank"] is None else f"{row['peak_mib_per_rank']:.0f}"
            lines.append(f"| {row['variant']} | {row['ms']:.1f} | {row['tokens_per_s']:.0f} | {peak} |")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write("\n".join(lines) + "\n")


def main(argv=None):
    args = parse(argv)
    if args.one_device:
        args.variants = list(args.variants) + [n for n in ONE_DEVICE if n not in args.variants]
    if args.tokens % (2 * args.world if args.device == "cpu" else 2) != 0:
        sys.exit(f"context_parallel.py: error: --tokens must be a multiple of 2·world (the head-tail layout), "
                 f"got {args.tokens}")
    if args.device == "cuda":
        worker(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), args, None)
        return
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    init = os.path.join(tempfile.mkdtemp(), "pg")
    mp.spawn(worker, args=(args.world, args, init), nprocs=args.world)


if __name__ == "__main__":
    main()
