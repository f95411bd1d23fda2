"""Every GPU measurement in one run: correctness first, then speed, memory and the training step.

Run on a machine with a CUDA GPU, from the repository root::

    python benchmarks/gpu/run_all.py --out OUT_DIR [--budget-s 440] [--wheels .whl]
    python benchmarks/gpu/run_all.py --dry-run --out /tmp/dry     # the same flow on the CPU, tiny sizes

Stages, in order, each a child process with its share of ``--budget-s``
(a stage that overruns is killed and the next one starts):

==================  ====================================================================
correctness         ``gpu_correctness.py``: every map's kernels against the float64
                    bisection reference (ties, masks, offsets, τ, α), and the peers'
                    known failures
attention_check     ``attention_check.py``: the fused attention forward, backward and
                    dα against the NumPy float64 oracle
edges               ``edges.py``: α-entmax near α = 1 in every dtype, soft top-k where
                    (x − r)/τ overflows, attention with α near 1 and on peaked rows
tune                ``tune.py``: the threshold kernels under every tile / warp /
                    rows-per-program configuration, against ``torch.softmax``
speed               ``gpu.py``: the maps and losses against ``torch.softmax``,
                    ``F.cross_entropy``, the entmax package, AdaSplash and Liger, with
                    peak memory
fused_linear        ``fused_linear.py``: the fused linear losses against torch,
                    ``F.linear_cross_entropy``, Liger and Cut Cross-Entropy at
                    GPT-2's, Llama 3's and Gemma 2's output layers, then by chunk
                    size; time, peak memory and its multiple of the bf16 dW
e2e                 ``e2e_step.py``: one GPT-2-small training step with each loss,
                    and the loss's own forward and backward time within it
attention           ``attention.py``: attention against SDPA (flash, efficient),
                    FlexAttention and AdaSplash at L = 4096, random inputs, with
                    block sparsity and peak memory
attention_sparse    ``attention.py`` on local inputs (q, k sharing a positional code:
                    most 64 × 64 tiles exactly zero) at L = 4096 and 16384, where
                    the zeros must pay
host                ``host_overhead.py``: the host's time to issue one call of
                    each map and loss (torch's and softk's) on a tiny input,
                    forward and forward + backward: what do_bench times on top
                    of a kernel shorter than it
moe                 ``moe_router.py``: an OLMoE-shaped mixture-of-experts layer with
                    its router swapped (sparsemax, 1.5-entmax, a target count):
                    time and the experts run
==================  ====================================================================

``--stage-budget NAME=SECONDS`` gives a stage its own time; the stages
without one share what is left of ``--budget-s``.  ``--wheels DIR`` installs the peers' wheels found there (``pip download
--no-deps entmax adasplash liger-kernel cut-cross-entropy``) into a private folder first, with
no network.  The output folder gets three files: ``run_all.json`` (the
device, versions, date, and every stage's exit status, time and JSON),
``summary.md`` (the tables) and ``log.txt`` (every stage's output); the JSON
and the summary are rewritten after each stage, so a run cut short keeps
what it measured.  ``--dry-run`` runs every stage on the CPU at tiny sizes
(the Triton stages in Triton's interpreter, sped up by
``tests/interpreter_speed.py``): each kernel, variant and branch of a stage
at least once rather than in every combination, each timed once, which is
what ``tests/benchmarks/test_run_all.py`` does.  Exit status: 1 when a
correctness stage found a failure, else 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The speed table's cases (gpu_cases keys): the widest bf16 shape, the narrow fp32 ones, every router width, both loss shapes.
SPEED_CASES = r"^(wide/[^/]+/(8192x32768/bfloat16|32768x1024|65536x128)|router/|loss/)"
# name, script, share of the budget, arguments on a GPU, arguments for --dry-run; "{json}" is the stage's JSON path.
STAGES = [
    ("correctness", "gpu_correctness.py", 0.26,
     ["--no-peers", "--widths", "5", "300", "1000", "3000", "8192", "70001", "--dtypes", "float32", "bfloat16", "--json", "{json}"],
     ["--device", "cpu", "--quick", "--no-peers", "--families", "sparsemax", "--widths", "5", "--dtypes", "float32", "--warm-jobs", "0",
      "--json", "{json}"]),
    ("attention_check", "attention_check.py", 0.08, ["--json", "{json}"],
     ["--device", "cpu", "--quick", "--dtypes", "float32", "--jobs", "0", "--json", "{json}"]),
    ("edges", "edges.py", 0.10, ["--json", "{json}"], ["--device", "cpu", "--quick", "--json", "{json}"]),
    ("tune", "tune.py", 0.12, ["--json", "{json}"], ["--device", "cpu", "--quick", "--jobs", "0", "--json", "{json}"]),
    ("speed", "gpu.py", 0.30, ["--only", SPEED_CASES, "--warm-timeout-s", "40", "--json", "{json}", "--markdown", "{md}"],
     ["--device", "cpu", "--only", "^wide/sparsemax/65536x128", "--max-rows", "4", "--min-reps", "1", "--warm-jobs", "0", "--impls", "torch,softk",
      "--json", "{json}", "--markdown", "{md}"]),
    # three output layers × seven providers, then the chunk sweep: about 90 s on an H200 at the default budget
    ("fused_linear", "fused_linear.py", 0.25, ["--json", "{json}"], ["--device", "cpu", "--quick", "--json", "{json}"]),
    # the dry run: a few tokens in the GPU run's precision (the interpreted loss kernels cost per row)
    ("e2e", "e2e_step.py", 0.08, ["--device", "cuda", "--size", "gpt2", "--steps", "3", "--warmup", "1", "--json", "{json}", "--md", "{md}"],
     ["--device", "cpu", "--size", "tiny", "--batch", "1", "--seq", "4", "--precision", "amp-bf16",
      "--steps", "1", "--warmup", "0", "--memory", "none", "--json", "{json}", "--md", "{md}"]),
    # the dry run: one 64 × 64 tile (the block sparsity's), both modes and masks, the softmax and the threshold kernel
    ("attention", "attention.py", 0.12, ["--lengths", "4096", "--dims", "64", "128", "--causal", "no", "yes", "--json", "{json}"],
     ["--smoke", "--lengths", "64", "--maps", "softmax", "sparsemax", "--modes", "fwd", "fwdbwd",
      "--causal", "no", "yes", "--json", "{json}"]),
    ("attention_sparse", "attention.py", 0.06,
     ["--lengths", "4096", "16384", "--dims", "64", "--causal", "no", "yes", "--sharpness", "0.5", "--locality", "1",
      "--maps", "softmax", "sparsemax", "entmax15", "--json", "{json}"],
     ["--smoke", "--lengths", "64", "--maps", "softmax", "sparsemax", "--modes", "fwd", "fwdbwd", "--causal", "no", "yes",
      "--sharpness", "0.5", "--locality", "1", "--json", "{json}"]),
    ("host", "host_overhead.py", 0.03, ["--profile", "--json", "{json}", "--md", "{md}"],
     ["--device", "cpu", "--calls", "5", "--repeats", "1", "--profile", "--json", "{json}", "--md", "{md}"]),
    ("moe", "moe_router.py", 0.04, ["--device", "cuda", "--size", "olmoe", "--json", "{json}", "--md", "{md}"],
     ["--device", "cpu", "--size", "tiny", "--steps", "1", "--warmup", "0", "--json", "{json}", "--md", "{md}"]),
]
# Stages whose own option bounds their time; the others are bounded only by the kill.
BUDGET_FLAG = {"correctness": "--budget-s", "attention_check": "--budget-s", "tune": "--budget-s", "speed": "--budget-s",
               "attention": "--budget-s", "attention_sparse": "--budget-s", "fused_linear": "--budget-s"}
CORRECTNESS = ("correctness", "attention_check", "edges")


def install_wheels(folder: str, log) -> str | None:
    """pip-install every wheel in ``folder`` into a private directory (no index, no deps); that directory."""
    wheels = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".whl"))
    if not wheels:
        return None
    target = tempfile.mkdtemp(prefix="softk-peers-")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", target, *wheels]
    res = subprocess.run(cmd, capture_output=True, text=True)
    log(f"$ pip install {' '.join(os.path.basename(w) for w in wheels)} -> exit {res.returncode}\n{res.stderr[-2000:]}")
    return target if res.returncode == 0 else None


def meta_info(dry_run: bool) -> dict:
    """``gpu.meta_info`` (device, torch, triton, date) with the time, Python, the commit and the peers' versions."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from gpu import meta_info as device_info

    versions = {}
    for name in ("transformers", "entmax", "adasplash", "liger_kernel", "cut_cross_entropy"):
        try:
            mod = __import__(name)
            versions[name] = getattr(mod, "__version__", "installed")
        except Exception:  # noqa: BLE001 - a missing peer is a row, not a crash
            versions[name] = None
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {**device_info("cpu" if dry_run else "cuda"), "python": sys.version.split()[0], "softk_commit": rev.stdout.strip() or None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **versions}


# A dry run starts each stage through this: Triton's interpreter sweeps its
# language again on every call of a jitted helper inside a kernel, and
# tests/interpreter_speed.py makes that once per launch (the same results),
# then the script runs as if started alone (its folder first on sys.path).
DRY_BOOT = ("import os, runpy, sys; from tests import interpreter_speed; interpreter_speed.install(); "
            "sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(sys.argv[0])); "
            "runpy.run_path(sys.argv[0], run_name='__main__')")


def run_stage(name, script, argv, timeout_s, env, log, dry_run=False) -> dict:
    t0 = time.monotonic()
    cmd = [sys.executable, *(["-c", DRY_BOOT] if dry_run else []), os.path.join(HERE, script), *argv]
    log(f"\n===== {name}: {' '.join([os.path.join(HERE, script), *argv])} (up to {timeout_s:.0f} s)")
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        rc, out = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as exc:
        rc = "killed: time budget"
        out = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "") + (exc.stderr or "")
    log(out)
    seconds = time.monotonic() - t0
    log(f"===== {name}: exit {rc} in {seconds:.0f} s")
    return {"argv": argv, "exit": rc, "seconds": round(seconds, 1), "output_tail": out[-3000:]}


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def summary(meta, stages) -> str:
    """The Markdown report: one section per stage."""
    lines = [f"# GPU run: {meta['device']}", "",
             f"torch {meta['torch']}, triton {meta['triton']}, Python {meta['python']}, softk {meta['softk_commit']}, "
             f"{meta['date']}; peers: entmax {meta['entmax']}, adasplash {meta['adasplash']}, liger_kernel {meta['liger_kernel']}, "
             f"cut_cross_entropy {meta.get('cut_cross_entropy')}", ""]
    for name, st in stages.items():
        lines += [f"## {name} (exit {st['exit']}, {st['seconds']:.0f} s)", ""]
        res = st.get("result")
        if name in CORRECTNESS and res:
            lines.append(f"summary: {res.get('summary')}")
            bad = [c for c in res.get("cases", []) if c.get("verdict") not in ("pass", "ambiguous", "skipped")]
            lines += [f"- {json.dumps(c)[:400]}" for c in bad[:30]]
            for p in (res.get("peers") or [])[:40]:
                lines.append(f"- peer {json.dumps(p)[:300]}")
        elif name == "tune" and res:
            lines += ["| shape | kernel | default config | ms | × torch | best config | ms | × torch |", "|---|---|---|---:|---:|---|---:|---:|"]
            lines += [f"| {b['shape']} | {b['kernel']} | {b['default_config']} | {b['default_ms']:.4f} | {b['default_x_torch']:.2f} | "
                      f"{b['best_config']} | {b['best_ms']:.4f} | {b['best_x_torch']:.2f} |" for b in res.get("best", [])]
        elif name == "fused_linear" and res:
            lines += ["| shape | impl | ms fwd+bwd | × torch | peak extra MiB | × bf16 dW | loss |", "|---|---|---:|---:|---:|---:|---:|"]
            for r in res["rows"]:
                if "ms" not in r:
                    lines.append(f"| {r['shape']} | {r['impl']} | {r.get('status')} | | | | |")
                    continue
                ratio, x_dw = r.get("x_torch"), r.get("x_dw")
                lines.append(f"| {r['shape']} | {r['impl']} | {r['ms']:.2f} | {'' if ratio is None else f'{ratio:.2f}'} | "
                             f"{r.get('peak_extra_mib', float('nan')):.0f} | {'' if x_dw is None else f'{x_dw:.2f}'} | "
                             f"{r.get('loss', float('nan')):.4f} |")
            dws = {r["shape"]: r["dw_bf16_mib"] for r in res["rows"] if "dw_bf16_mib" in r}
            if dws:
                lines += ["", "bf16 dW (V × H × 2 bytes): " + ", ".join(f"{k} {v:.0f} MiB" for k, v in dws.items())]
        elif name in ("attention", "attention_sparse") and res:
            lines += ["| L | E | causal | mode | impl | ms p50 | × sdpa-flash | peak MiB | block sparsity |", "|---:|---:|---|---|---|---:|---:|---:|---:|"]
            flash = {(r["L"], r["E"], r["causal"], r["mode"]): r.get("p50") for r in res["rows"] if r["impl"] == "sdpa-flash"}
            for r in res["rows"]:
                if "p50" not in r:
                    lines.append(f"| {r['L']} | {r['E']} | {r['causal']} | {r['mode']} | {r['impl']} | {r.get('error')} | | | |")
                    continue
                base = flash.get((r["L"], r["E"], r["causal"], r["mode"]))
                sp = r.get("block_sparsity")
                lines.append(f"| {r['L']} | {r['E']} | {r['causal']} | {r['mode']} | {r['impl']} | {r['p50']:.3f} | "
                             f"{r['p50'] / base if base else float('nan'):.2f} | {r.get('peak_mib', float('nan')):.0f} | {'' if sp is None else f'{sp:.1%}'} |")
        elif st.get("markdown"):
            lines.append(st["markdown"])
        elif not res:
            lines += ["```", st["output_tail"][-1500:], "```"]
        lines.append("")
    return "\n".join(lines)


def stage_budget(chosen, i: int, left: float, fixed: dict) -> float:
    """Seconds for stage ``chosen[i]`` with ``left`` seconds of the run to go:
    its own from ``fixed`` (``--stage-budget``), else its share of what the
    stages after it with their own time leave (at least 20 s)."""
    name, _, frac = chosen[i][:3]
    if name in fixed:
        return fixed[name]
    left -= sum(fixed.get(s[0], 0.0) for s in chosen[i + 1:])
    rest = sum(s[2] for s in chosen[i:] if s[0] not in fixed)
    return max(20.0, left * frac / rest)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for run_all.json, summary.md and log.txt")
    ap.add_argument("--budget-s", type=float, default=440.0, help="the whole run (default 440 s); each stage gets its share")
    ap.add_argument("--wheels", metavar="DIR", help="install the peers' wheels in DIR first (no network)")
    ap.add_argument("--only", nargs="+", choices=[s[0] for s in STAGES], help="run these stages only")
    ap.add_argument("--stage-budget", nargs="+", default=[], metavar="NAME=SECONDS",
                    help="a stage's own time instead of its share of what is left (the others share the rest)")
    ap.add_argument("--dry-run", action="store_true", help="every stage on the CPU at tiny sizes (Triton in its interpreter)")
    args = ap.parse_args(argv)
    fixed = {}
    for item in args.stage_budget:
        name, _, secs = item.partition("=")
        if name not in [s[0] for s in STAGES] or not secs.replace(".", "", 1).isdigit():
            ap.error(f"--stage-budget takes NAME=SECONDS with NAME a stage, got {item!r}")
        fixed[name] = float(secs)
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "log.txt")
    open(log_path, "w").close()

    def log(text):
        print(text, flush=True)
        with open(log_path, "a") as f:
            f.write(text + "\n")

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [os.path.join(ROOT, "src"), ROOT]
    if args.wheels and os.path.isdir(args.wheels):
        site = install_wheels(args.wheels, log)
        if site:
            paths.insert(0, site)
            sys.path.insert(0, site)
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    if args.dry_run:
        env.update(TRITON_INTERPRET="1", SOFTK_BACKEND="triton")
    else:
        import torch

        if not torch.cuda.is_available():
            print("run_all.py: no CUDA device here; --dry-run runs the flow on the CPU", file=sys.stderr)
            return 2
    meta = meta_info(args.dry_run)
    log(json.dumps(meta))
    chosen = [s for s in STAGES if not args.only or s[0] in args.only]
    stages, work = {}, tempfile.mkdtemp(prefix="softk-run-all-")
    t_end = time.monotonic() + args.budget_s
    for i, (name, script, frac, gpu_argv, dry_argv) in enumerate(chosen):
        budget = 600.0 if args.dry_run else stage_budget(chosen, i, t_end - time.monotonic(), fixed)
        paths_ = {"json": os.path.join(work, f"{name}.json"), "md": os.path.join(work, f"{name}.md")}
        argv_ = [a.format(**paths_) for a in (dry_argv if args.dry_run else gpu_argv)]
        if name in BUDGET_FLAG:  # the stage stops starting work at 85 % of its share; the kill comes after it all
            argv_ += [BUDGET_FLAG[name], f"{0.85 * budget:.0f}"]
        st = run_stage(name, script, argv_, budget + 30.0, env, log, args.dry_run)
        st["result"] = _load(paths_["json"])
        if os.path.exists(paths_["md"]):
            with open(paths_["md"]) as f:
                st["markdown"] = f.read()
        stages[name] = st
        with open(os.path.join(args.out, "run_all.json"), "w") as f:
            json.dump({"meta": meta, "budget_s": args.budget_s, "stages": stages}, f, indent=1, default=str)
        with open(os.path.join(args.out, "summary.md"), "w") as f:
            f.write(summary(meta, stages))
    failed = [n for n in CORRECTNESS if n in stages and stages[n]["exit"] != 0]
    log(f"run_all: {len(stages)} stages, {args.budget_s - (t_end - time.monotonic()):.0f} s"
        + (f"; correctness not clean in {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
