"""The recorded results files the documentation quotes, how each is read as
tidy rows, and the command that wrote it.  Only what a file does not record
is written here: the command, and that the CPU machine is a shared 2-core VM;
dates and versions are the file's own."""

from __future__ import annotations

from typing import Any, Callable

from .model import Recorded, Source

CPU = "a shared 2-core x86-64 VM"


def _overhead(data) -> Recorded:
    # a case's ratio is the median over rounds of softk's time over the torch op's in
    # the same round: it is read as recorded, not recomputed from the median times
    rows = [{**c, "ratio": c.get("ratio_to_torch.softmax", c.get("ratio_to_F.cross_entropy"))} for c in data["cases"]]
    return Recorded(rows, data["date"], f"{CPU}, torch {data['torch']}, {data['threads']} thread")


def _cpu_attention(data) -> Recorded:
    rows, meta = [], data["meta"]
    for r in data["rows"]:
        b, h, l, s, e = r["shape"]
        case = {"B": b, "H": h, "L": l, "S": s, "E": e, "causal": r["causal"], "pass": r["pass"]}
        rows.append({**case, "impl": "sdpa", "ms": r["torch_ms"], "ratio": 1.0})
        for m in ("softmax", "sparsemax", "entmax15", "entmax_a1.3"):
            row = {**case, "impl": m, "ratio": r[m]}
            if "skipped" in r:  # decoding: the shares of keys, and of 16-key pages, whose values P·V reads
                row["read_keys"], row["read_pages"] = (1.0 - share for share in r["skipped"][m])
            rows.append(row)
    return Recorded(rows, meta["date"], f"{CPU}, torch {meta['torch']}, {meta['threads']} thread")


def _gpu(stage: str, rows_of: Callable[[Any], list[dict]]) -> Callable[[Any], Recorded]:
    def read(data) -> Recorded:
        meta = data["meta"]
        setup = f"one {meta['device']}, torch {meta['torch']}, Triton {meta['triton']}"
        return Recorded(rows_of(data["stages"][stage]["result"]), meta["date"][:10], setup)
    return read


def _gpu_maps(result) -> list[dict]:
    return [r for r in result if r["status"] == "ok"]  # the rest were not reached within the budget


def _gpu_attention(result) -> list[dict]:
    rows = result["rows"]
    p50 = {(r["L"], r["E"], r["causal"], r["mode"], r["impl"]): r["p50"] for r in rows}
    out = []
    for r in rows:
        case = (r["L"], r["E"], r["causal"], r["mode"])
        extra = {"x_flash": r["p50"] / p50[(*case, "sdpa-flash")]}
        peer = (*case, "adasplash-" + r["impl"].removeprefix("softk-").removesuffix(" (triton)"))
        if r["impl"].startswith("softk-") and peer in p50:
            extra["adasplash_over"] = p50[peer] / r["p50"]  # AdaSplash's time over softk's, same map and case
        out.append({**r, **extra})
    return out


def _gpu_step(result) -> list[dict]:
    own = result["variants"]["own"]
    return [{"variant": name, "ms": v["median_s"] * 1e3, "x_own": v["median_s"] / own["median_s"],
             "peak_mib": v["peak_extra_bytes"] / 2**20, "mem_x_own": v["peak_extra_bytes"] / own["peak_extra_bytes"]}
            for name, v in result["variants"].items()]


CPU_OVERHEAD = Source(
    "overhead_1thread_2026-11-29.json", "9273e86487a7c12f61d02f02cdc1d0aa9ed576dd1bd427de40ce6be79f779c65",
    "python benchmarks/cpu/overhead.py --threads 1 --json benchmarks/results/overhead_1thread_2026-11-29.json",
    _overhead)
CPU_ATTENTION = Source(
    "attention_cpu_1thread_2026-11-30.json", "a737d9fa6fcc770ca3c370c91bacbe5ee5bf313c7ccc24664c1e79e0af1112d1",
    "python benchmarks/cpu/attention.py --threads 1 --reps 3 --decode 4096 16384 32768 131072 "
    "--json benchmarks/results/attention_cpu_1thread_2026-11-30.json",
    _cpu_attention)

# the latest GPU run of the fused linear losses, the training step and attention; each of its stages is a script of benchmarks/gpu/
GPU_RUN = ("python3 benchmarks/gpu/run_all.py --out $OUT --budget-s 500 --wheels .whl "
           "--only correctness attention_check edges speed fused_linear e2e attention")
GPU_FILE, GPU_SHA = "gpu_h200_run3_2026-11-27.json", "79d21932161bba3a3c857fda56ff1f2f8d77f14ced0e417203be65ea12248602"
# the maps' table: the latest run whose speed stage reached every shape of the table (sparsemax and entmax15
# searching rows of up to 8192 entries in registers)
GPU_MAPS_RUN = ("python3 benchmarks/gpu/run_all.py --out $OUT --budget-s 215 --wheels .whl --only correctness speed "
                "--stage-budget correctness=45")
GPU_MAPS_FILE, GPU_MAPS_SHA = "gpu_h200_run8_2026-11-30.json", "b4d2eb335d11d4258d13ac77e5111e258923aec402e9e76de853febbbac8887b"
GPU_MAPS = Source(GPU_MAPS_FILE, GPU_MAPS_SHA, GPU_MAPS_RUN + "  # stage: gpu.py", _gpu("speed", _gpu_maps))
GPU_FUSED_LINEAR = Source(GPU_FILE, GPU_SHA, GPU_RUN + "  # stage: fused_linear.py",
                          _gpu("fused_linear", lambda result: result["rows"]))
GPU_STEP = Source(GPU_FILE, GPU_SHA, GPU_RUN + "  # stage: e2e_step.py", _gpu("e2e", _gpu_step))
GPU_ATTENTION = Source(GPU_FILE, GPU_SHA, GPU_RUN + "  # stage: attention.py", _gpu("attention", _gpu_attention))

SOURCES = {"cpu-overhead": CPU_OVERHEAD, "cpu-attention": CPU_ATTENTION, "gpu-maps": GPU_MAPS,
           "gpu-fused-linear": GPU_FUSED_LINEAR, "gpu-step": GPU_STEP, "gpu-attention": GPU_ATTENTION}
