"""One mixture-of-experts layer, forward + backward, with its router swapped: time and the experts run.

Run:  python benchmarks/gpu/moe_router.py --threads 1                  # CPU, the "small" layer
      python benchmarks/gpu/moe_router.py --device cuda --size olmoe    # OLMoE-1B-7B's layer, bf16
      python benchmarks/gpu/moe_router.py --json out.json --md out.md

The layer is transformers' ``OlmoeSparseMoeBlock`` built from a config
(nothing is downloaded), its experts run by ``--experts`` (transformers'
experts implementations: ``eager``, ``grouped_mm``, ``batched_mm``), on
random hidden states, the loss the sum of squares of its output.  Variants,
all on the same layer and input (``softk.integrations.hf_moe``):

    own              the layer's own router (softmax, top-k)
    control          apply_softk_router(layer, "topk_softmax"): the same routing through softk
    sparsemax        sparsemax, at most k experts per token
    sparsemax_half   sparsemax, at most k, the controller holding a mean of k/2
    entmax15_half    1.5-entmax, at most k, mean k/2
    sparsemax_dense  sparsemax_half with skip_zeros=False: zero weights computed and multiplied by 0

Before timing, the variants with a target run ``--settle`` training-mode
forwards so that the controller's τ reaches its target; τ is then fixed
(evaluation mode is not used: the timed steps keep the training-mode
forward, whose controller step is one scalar update).  Time: ``--warmup``
untimed steps per variant, then ``--steps`` rounds each running every
variant once, the order rotating; the median per variant is reported, with
the live (token, expert) pairs per token and the experts' FLOPs per token
actually run (live pairs × the FLOPs of one expert on one token).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

from e2e_step import check_variants_and_device, sync  # the same CLI and clock as the training-step benchmark

SIZES = {
    "tiny": dict(hidden=32, intermediate=64, experts=8, top_k=2, tokens=64),
    "small": dict(hidden=512, intermediate=512, experts=16, top_k=4, tokens=2048),
    "olmoe": dict(hidden=2048, intermediate=1024, experts=64, top_k=8, tokens=8192),
}
# name: (router, options); "half" is replaced by top_k / 2
VARIANTS = {
    "own": None,
    "control": ("topk_softmax", {}),
    "sparsemax": ("sparsemax", {}),
    "sparsemax_half": ("sparsemax", {"target": "half", "rate": 0.3}),
    "entmax15_half": ("entmax15", {"target": "half", "rate": 0.3}),
    "sparsemax_dense": ("sparsemax", {"target": "half", "rate": 0.3, "skip_zeros": False}),
}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--size", default=None, choices=list(SIZES), help="default: small on cpu, olmoe on cuda")
    ap.add_argument("--tokens", type=int, default=None, help="override the size's token count")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: float32 on cpu, bf16 on cuda")
    ap.add_argument("--experts", default=None, choices=["eager", "grouped_mm", "batched_mm"],
                    help="transformers' experts implementation (default: eager on cpu, grouped_mm on cuda)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {list(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=7, help="timed rounds (each runs every variant once)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    ap.add_argument("--settle", type=int, default=60, help="training-mode forwards that settle a target's τ")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    ap.add_argument("--md", default=None, help="write the Markdown table here")
    args = ap.parse_args(argv)
    args.size = args.size or ("olmoe" if args.device == "cuda" else "small")
    args.dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    args.experts = args.experts or ("grouped_mm" if args.device == "cuda" else "eager")
    args.shape = dict(SIZES[args.size], **({"tokens": args.tokens} if args.tokens else {}))
    check_variants_and_device(ap, args, VARIANTS)
    return args


def build(args):
    """A seeded OLMoE layer (one per variant, the same weights) and its input."""
    import transformers
    from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock

    s = args.shape
    cfg = transformers.OlmoeConfig(hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                                   num_experts=s["experts"], num_experts_per_tok=s["top_k"])
    cfg._experts_implementation = args.experts
    torch.manual_seed(0)
    layer = OlmoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02)
        layer.gate.weight.normal_(0, 1 / s["hidden"] ** 0.5)  # logits of unit scale
    x = torch.randn(1, s["tokens"], s["hidden"], generator=torch.Generator().manual_seed(1))
    return layer.to(args.device, args.dtype).train(), x.to(args.device, args.dtype)


def variant_layer(args, name):
    from softk.integrations.hf_moe import apply_softk_router

    layer, x = build(args)
    if VARIANTS[name] is not None:
        router, options = VARIANTS[name]
        options = {k: (args.shape["top_k"] / 2 if v == "half" else v) for k, v in options.items()}
        apply_softk_router(layer, router, **options)
        if "target" in options:
            with torch.no_grad():
                for _ in range(args.settle):
                    layer(x)
    return layer, x


def step(layer, x):
    layer.zero_grad(set_to_none=True)
    out = layer(x)
    (out.float() ** 2).sum().backward()


def live_pairs_per_token(layer, x, args):
    """The (token, expert) pairs of one forward with a weight ≠ 0, per token."""
    layer.eval()  # no controller step
    with torch.no_grad():
        _, weights, _ = layer.gate(x.reshape(-1, x.shape[-1]))
    layer.train()
    return float((weights != 0).sum()) / weights.shape[0]


def main(argv=None) -> int:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    s = args.shape
    per_pair = 2 * s["hidden"] * 2 * s["intermediate"] + 2 * s["intermediate"] * s["hidden"]
    layers = {name: variant_layer(args, name) for name in args.variant_list}
    for name, (layer, x) in layers.items():
        for _ in range(args.warmup):
            step(layer, x)
    times: dict[str, list[float]] = {name: [] for name in layers}
    names = list(layers)
    for r in range(args.steps):
        for name in names[r % len(names):] + names[: r % len(names)]:
            layer, x = layers[name]
            sync(args)
            t0 = time.perf_counter()
            step(layer, x)
            sync(args)
            times[name].append(time.perf_counter() - t0)
    rows = []
    own = statistics.median(times[names[0]])
    for name in names:
        layer, x = layers[name]
        live = live_pairs_per_token(layer, x, args)
        ms = statistics.median(times[name]) * 1e3
        rows.append({"variant": name, "ms": ms, "x_first": ms / (own * 1e3), "live_per_token": live,
                     "expert_mflops_per_token": live * per_pair / 1e6,
                     "tau": float(getattr(layer.gate, "softk_tau", float("nan")))})
    meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "threads": torch.get_num_threads(), "dtype": str(args.dtype),
            "experts": args.experts, "shape": s, "steps": args.steps, "argv": sys.argv[1:]}
    head = (f"| variant | ms, fwd+bwd | × {names[0]} | live experts / token | expert MFLOPs / token (fwd) |\n"
            "|---|---:|---:|---:|---:|\n")
    table = head + "".join(f"| {r['variant']} | {r['ms']:.1f} | {r['x_first']:.2f} | {r['live_per_token']:.2f} | "
                           f"{r['expert_mflops_per_token']:.2f} |\n" for r in rows)
    print(table, end="")
    if args.md:
        with open(args.md, "w") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
