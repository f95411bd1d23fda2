"""One training step of a GPT-2-shaped model with its loss swapped: time and peak memory.

Run:  python benchmarks/gpu/e2e_step.py                       # CPU, the "small" size
      python benchmarks/gpu/e2e_step.py --device cuda --size gpt2   # GPT-2 small, 50257 tokens
      python benchmarks/gpu/e2e_step.py --json out.json --md out.md

The model is transformers' ``GPT2LMHeadModel`` built from a config (nothing
is downloaded; dropout off), trained with AdamW on random token ids with
``labels = input_ids``.  A step is forward + backward + ``optimizer.step()``.
Variants, all on the same model and batch:

    own        the model's own loss (transformers' ForCausalLMLoss: full logits, cross-entropy)
    softk_ce   apply_softk(model, "cross_entropy"): softk's fused linear cross-entropy
    sparsemax  apply_softk(model, "sparsemax"): fused sparsemax loss
    entmax15   apply_softk(model, "entmax15"): fused 1.5-entmax loss

Time: every variant first runs ``--warmup`` steps; then ``--steps`` rounds
each run every variant once, the order rotating from round to round (so a
slow spell of a shared machine hits every variant alike); the median per
variant is reported.  Peak memory: on CUDA, ``torch.cuda.max_memory_allocated()``
during a step minus the memory allocated before it (parameters, optimiser
state), the largest over the timed steps.  On the CPU, each variant runs
once more in a fresh process with ``MALLOC_MMAP_THRESHOLD_=65536`` (so freed
memory goes back to the OS at once and RSS follows live memory) after one
warm-up step: the peak RSS of one step (VmHWM, reset via
``/proc/self/clear_refs``) minus the RSS before it.  Linux only; elsewhere
the CPU memory column is empty.

The loss's own share of a timed step: a forward pre-hook on the LM head
marks where the loss begins (the hidden states reach the head, or the
placeholder head the fused losses put there), the model's return marks its
end, and a gradient hook on the head's input marks where the loss's backward
has produced dX (its dW is computed in the same autograd node, before that
hook runs); the backward starts at ``loss.backward()``.  On CUDA the marks are
CUDA events (GPU time between the points on the stream), on the CPU
``perf_counter``.  The loss columns are the medians of those spans, beside
the step's; "host issue" is the time until the step's work is queued (before
the final synchronisation): close to the step time, the step is bounded by
the host issuing kernels rather than by the GPU (an implicit synchronisation
inside the step counts the GPU's time there too).

Before training, the own and softk_ce losses at the initial weights are
printed side by side: they must agree to rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

VARIANTS = {"own": None, "softk_ce": "cross_entropy", "sparsemax": "sparsemax", "entmax15": "entmax15"}
# GPT-2 small is n_embd 768, 12 layers, 12 heads, 50257 tokens; the others are
# scaled down for a CPU ("small") and for smoke tests ("tiny").
SIZES = {
    "tiny": dict(n_embd=64, n_layer=2, n_head=2, vocab=2048, batch=2, seq=32),
    "small": dict(n_embd=256, n_layer=4, n_head=4, vocab=16384, batch=4, seq=256),
    "gpt2": dict(n_embd=768, n_layer=12, n_head=12, vocab=50257, batch=8, seq=1024),
}
MIB = 2**20


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--size", default=None, choices=list(SIZES), help="default: small on cpu, gpt2 on cuda")
    for name in ("vocab", "batch", "seq", "layers"):
        ap.add_argument(f"--{name}", type=int, default=None, help="override the size's value")
    ap.add_argument("--precision", default=None, choices=["fp32", "bf16", "amp-bf16"],
                    help="parameters in fp32 or bf16, or fp32 with bf16 autocast (default: fp32 on cpu, amp-bf16 on cuda)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {list(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=5, help="timed rounds (each runs every variant once)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--memory", default="auto", choices=["auto", "none"], help="none: skip the memory measurement")
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    ap.add_argument("--md", default=None, help="write the Markdown table here")
    ap.add_argument("--child-memory", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.size = args.size or ("gpt2" if args.device == "cuda" else "small")
    args.precision = args.precision or ("amp-bf16" if args.device == "cuda" else "fp32")
    shape = dict(SIZES[args.size])
    for name, key in (("vocab", "vocab"), ("batch", "batch"), ("seq", "seq"), ("layers", "n_layer")):
        if getattr(args, name) is not None:
            shape[key] = getattr(args, name)
    args.shape = shape
    check_variants_and_device(ap, args, VARIANTS)
    return args


def check_variants_and_device(ap, args, known) -> None:
    """``args.variant_list`` from the comma-separated ``--variants``, each one of ``known``;
    an argparse error for an unknown or empty list, or for ``--device cuda`` without a GPU."""
    args.variant_list = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variant_list if v not in known]
    if unknown or not args.variant_list:
        ap.error(f"--variants: unknown {unknown}, expected some of {list(known)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")


def build(args):
    """Model, optimiser and batch, seeded: the same for every variant and every process."""
    import transformers

    transformers.logging.set_verbosity_error()
    s = args.shape
    cfg = transformers.GPT2Config(
        vocab_size=s["vocab"], n_positions=s["seq"], n_embd=s["n_embd"], n_layer=s["n_layer"], n_head=s["n_head"],
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    model = transformers.GPT2LMHeadModel(cfg).to(args.device, dtype=dtype).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=g).to(args.device)
    return model, opt, ids


def use(model, variant):
    from softk.integrations.transformers import apply_softk, remove_softk

    remove_softk(model)
    if VARIANTS[variant] is not None:
        apply_softk(model, loss=VARIANTS[variant])


class LossProbe:
    """Marks around the loss in a step: forward from the LM head's call to the model's return,
    backward from ``loss.backward()`` to the gradient of the head's input (see the module's doc)."""

    def __init__(self, model, device):
        self.cuda = device == "cuda"
        self.marks = None  # a dict while armed, None otherwise
        self.handle = model.get_output_embeddings().register_forward_pre_hook(self._head_called)

    def _mark(self, name):
        if self.marks is None:
            return
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[name] = ev
        else:
            self.marks[name] = time.perf_counter()

    def _head_called(self, module, inputs):
        if self.marks is None:
            return
        self._mark("fwd0")
        hidden = inputs[0]
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: self._mark("bwd1"))

    def arm(self):
        self.marks = {}

    def spans(self):
        """(forward seconds, backward seconds) of the last armed step; disarms.  Call after synchronising."""
        m, self.marks = self.marks, None
        if not m or len(m) < 4:
            return None, None
        if self.cuda:
            return m["fwd0"].elapsed_time(m["fwd1"]) / 1e3, m["bwd0"].elapsed_time(m["bwd1"]) / 1e3
        return m["fwd1"] - m["fwd0"], m["bwd1"] - m["bwd0"]


def loss_of(model, ids, args, probe=None):
    with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "amp-bf16"):
        loss = model(input_ids=ids, labels=ids).loss
    if probe is not None:
        probe._mark("fwd1")
    return loss


def step(model, opt, ids, args, probe=None):
    loss = loss_of(model, ids, args, probe)
    if probe is not None:
        probe._mark("bwd0")
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def sync(args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def measured_step(model, opt, ids, args, probe=None):
    """{seconds, issue_s, loss, peak (extra bytes or None), loss_fwd_s, loss_bwd_s} of one step."""
    cuda = args.device == "cuda"
    sync(args)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    if probe is not None:
        probe.arm()
    t0 = time.perf_counter()
    loss = step(model, opt, ids, args, probe)
    issued = time.perf_counter() - t0
    sync(args)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    fwd, bwd = probe.spans() if probe is not None else (None, None)
    return {"seconds": seconds, "issue_s": issued, "loss": float(loss), "peak": peak, "loss_fwd_s": fwd, "loss_bwd_s": bwd}


def child_memory(args):
    """In a fresh process: one warm-up step, then the peak RSS of one step (bytes)."""
    from softk._cli.harness import PeakRSS

    model, opt, ids = build(args)
    use(model, args.child_memory)
    step(model, opt, ids, args)
    with PeakRSS() as mem:
        step(model, opt, ids, args)
    print(json.dumps({"peak_extra_bytes": mem.extra}))


def cpu_memory(args, variant):
    if not os.access("/proc/self/clear_refs", os.W_OK):
        return None
    cmd = [sys.executable, os.path.abspath(__file__), "--child-memory", variant, "--device", "cpu", "--size", args.size,
           "--precision", args.precision, "--vocab", str(args.shape["vocab"]), "--batch", str(args.shape["batch"]),
           "--seq", str(args.shape["seq"]), "--layers", str(args.shape["n_layer"])]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_extra_bytes"]


def run(args):
    model, opt, ids = build(args)
    check = {}
    with torch.no_grad():  # the same weights: the own and fused cross-entropy must agree
        for v in ("own", "softk_ce"):
            use(model, v)
            check[v] = float(loss_of(model, ids, args))
    names = args.variant_list
    for v in names:
        use(model, v)
        for _ in range(args.warmup):
            step(model, opt, ids, args)
    probe = LossProbe(model, args.device)
    times = {v: [] for v in names}
    spans = {v: {"issue_s": [], "loss_fwd_s": [], "loss_bwd_s": []} for v in names}
    losses, peaks = {}, {v: None for v in names}
    for r in range(args.steps):
        for v in names[r % len(names):] + names[: r % len(names)]:
            use(model, v)
            m = measured_step(model, opt, ids, args, probe)
            times[v].append(m["seconds"])
            losses[v] = m["loss"]
            for key in spans[v]:
                spans[v][key].append(m[key])
            if m["peak"] is not None:
                peaks[v] = max(m["peak"], peaks[v] or 0)
    probe.handle.remove()
    if args.device == "cpu" and args.memory == "auto":
        peaks = {v: cpu_memory(args, v) for v in names}
    return report(args, check, times, losses, peaks, spans)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def report(args, check, times, losses, peaks, spans=None):
    import transformers

    device = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.processor() or platform.machine()} CPU"
    results = {
        v: {"median_s": statistics.median(t), "step_s": t, "peak_extra_bytes": peaks[v], "last_loss": losses.get(v)}
        for v, t in times.items()
    }
    for v, sp in (spans or {}).items():
        r = results[v]
        r.update({k: _median(xs) for k, xs in sp.items()})
        r.update({f"{k}_steps": xs for k, xs in sp.items()})
        per_step = [f + b for f, b in zip(sp["loss_fwd_s"], sp["loss_bwd_s"]) if f is not None and b is not None]
        r["loss_s"] = _median(per_step)  # the median of each step's forward + backward
        r["loss_share"] = r["loss_s"] / r["median_s"] if r["loss_s"] is not None else None
    return {
        "benchmark": "e2e_step",
        "device": device,
        "threads": torch.get_num_threads() if args.device == "cpu" else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "size": args.size,
        "shape": args.shape,
        "precision": args.precision,
        "steps": args.steps,
        "warmup": args.warmup,
        "initial_loss_check": check,
        "variants": results,
    }


def markdown(res):
    s = res["shape"]
    own = res["variants"].get("own")
    lines = [
        f"GPT-2-shaped step ({res['size']}: {s['n_layer']} layers, width {s['n_embd']}, vocab {s['vocab']}, "
        f"batch {s['batch']} × {s['seq']} tokens, {res['precision']}) on {res['device']}, "
        f"torch {res['torch']}, transformers {res['transformers']}; median of {res['steps']} steps",
        "",
        "| loss | step time (ms) | × own | loss fwd (ms) | loss bwd (ms) | loss share of step | host issue (ms) "
        "| peak extra memory (MiB) | × own |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def ms(x, digits=1):
        return "–" if x is None else f"{1e3 * x:.{digits}f}"

    for v, r in res["variants"].items():
        t_ratio = f"{r['median_s'] / own['median_s']:.2f}" if own else "–"
        mem = r["peak_extra_bytes"]
        m_ratio = f"{mem / own['peak_extra_bytes']:.2f}" if own and mem and own["peak_extra_bytes"] else "–"
        mem_s = f"{mem / MIB:.1f}" if mem is not None else "–"
        share = r.get("loss_share")
        lines.append(f"| {v} | {ms(r['median_s'])} | {t_ratio} | {ms(r.get('loss_fwd_s'), 2)} | {ms(r.get('loss_bwd_s'), 2)} | "
                     f"{'–' if share is None else f'{share:.1%}'} | {ms(r.get('issue_s'))} | {mem_s} | {m_ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child_memory:
        child_memory(args)
        return None
    res = run(args)
    check = res["initial_loss_check"]
    print(f"initial loss: own {check['own']:.6f}, softk_ce {check['softk_ce']:.6f}")
    table = markdown(res)
    print(table)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(table)
    return res


if __name__ == "__main__":
    main()
