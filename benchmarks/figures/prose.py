"""The figures the pages quote in their sentences (``<!-- figure: KEY -->``):
mostly ranges, each over the cells of a table that it sums up."""

from __future__ import annotations

from .model import Figure
from .sources import CPU_ATTENTION, CPU_OVERHEAD, GPU_ATTENTION, GPU_FUSED_LINEAR, GPU_MAPS, GPU_STEP

SPARSE = ("sparsemax", "entmax15")
SOFTK_MAPS = ("softk.softmax", "softk.sparsemax", "softk.entmax15")
SPARSE_LOSSES = ("sparsemax_loss", "entmax15_loss", "softmax_loss")
WIDE_CPU = ("256x1024", "2048x32000")
FULL_ROWS = {"L": (2048, 8192), "pass": ("fwd", "fwd+bwd")}
DECODE = {"L": 1, "pass": "fwd"}
SOFTK_SPARSE_ATTENTION = ("softk-sparsemax (triton)", "softk-entmax15 (triton)")
STEP_LOSSES = ("softk_ce", "sparsemax", "entmax15")


def _cpu(kind: str, shape, impl, pass_: str = "fwd", **kw) -> Figure:
    return Figure(CPU_OVERHEAD, {"kind": kind, "shape": shape, "pass": pass_, "impl": impl}, **kw)


def _gpu_map(op, shape, mode: str, impl: str = "softk", **kw) -> Figure:
    return Figure(GPU_MAPS, {"op": op, "impl": impl, "shape": shape, "mode": mode}, **kw)


FIGURES: dict[str, Figure] = {
    # CPU, compiled kernels: softk's time over the torch op's in the same round
    "cpu.maps.sparsemax_fwd_wide": _cpu("map", WIDE_CPU, "softk.sparsemax", many=True),
    "cpu.maps.softmax_fwd_wide": _cpu("map", WIDE_CPU, "softk.softmax", many=True),
    "cpu.maps.small_fwd": _cpu("map", "4x10", SOFTK_MAPS, many=True),
    "cpu.maps.small_fwd_us": _cpu("map", "4x10", SOFTK_MAPS, column="us", unit="µs", decimals=1, many=True),
    "cpu.maps.small_fwd_entmax_package_us": _cpu("map", "4x10", ("entmax.sparsemax", "entmax.entmax15"),
                                                 column="us", unit="µs", decimals=1, many=True),
    "cpu.maps.small_fwdbwd": _cpu("map", ("4x10", "64x64"), SOFTK_MAPS, "fwd+bwd", many=True),
    "cpu.losses.wide": _cpu("loss", "2048x32000", SPARSE_LOSSES, "fwd+bwd", many=True),
    "cpu.losses.small": _cpu("loss", ("4x10", "64x64"), SPARSE_LOSSES, "fwd+bwd", many=True),
    # CPU attention: softk's time over SDPA's in the same repetition
    "cpu.attention.full_rows": Figure(CPU_ATTENTION, {**FULL_ROWS, "impl": SPARSE}, many=True),
    "cpu.attention.full_rows_softmax": Figure(CPU_ATTENTION, {**FULL_ROWS, "impl": "softmax"}, many=True),
    "cpu.attention.full_rows_alpha": Figure(CPU_ATTENTION, {**FULL_ROWS, "impl": "entmax_a1.3"}, many=True),
    "cpu.attention.decode": Figure(CPU_ATTENTION, {**DECODE, "impl": SPARSE}, many=True),
    "cpu.attention.decode_read_keys": Figure(CPU_ATTENTION, {**DECODE, "impl": SPARSE}, column="read_keys",
                                             unit="%", decimals=2, scale=100, many=True, show="max"),
    # GPU, Triton kernels: softk's time over torch.softmax's in the same run
    "gpu.maps.sparse_fwd_wide": _gpu_map(SPARSE, "8192x32768", "fwd", many=True),
    "gpu.maps.sparse_fwdbwd_wide": _gpu_map(SPARSE, "8192x32768", "fwd+bwd", many=True),
    "gpu.maps.softmax_fwd_wide": _gpu_map("softmax", "8192x32768", "fwd"),
    "gpu.maps.softmax_fwdbwd_wide": _gpu_map("softmax", "8192x32768", "fwd+bwd"),
    "gpu.maps.sparsemax_fwd_narrow": _gpu_map("sparsemax", ("32768x1024", "65536x128"), "fwd", many=True),
    "gpu.maps.entmax_package_sparsemax_fwd": _gpu_map("sparsemax", ("8192x32768", "32768x1024", "65536x128"),
                                                      "fwd", impl="entmax", many=True),
    # GPU losses: a GPT-2-small training step against the model's own loss, and the fused linear loss
    "gpu.step.time": Figure(GPU_STEP, {"variant": STEP_LOSSES}, column="x_own", many=True),
    "gpu.step.memory": Figure(GPU_STEP, {"variant": STEP_LOSSES}, column="mem_x_own", many=True),
    "gpu.fused_linear.gpt2_sparse_memory": Figure(GPU_FUSED_LINEAR, {"shape": "gpt2",
                                                                     "impl": ("softk-sparsemax", "softk-entmax15")},
                                                  column="peak_extra_mib", unit="MiB", decimals=0, many=True),
    "gpu.fused_linear.gpt2_torch_memory": Figure(GPU_FUSED_LINEAR, {"shape": "gpt2", "impl": "torch"},
                                                 column="peak_extra_mib", unit="MiB", decimals=0),
    # GPU attention at L = 4096: softk's time over SDPA's flash backend's, and AdaSplash's over softk's
    "gpu.attention.vs_flash_fwdbwd": Figure(GPU_ATTENTION, {"mode": "fwdbwd", "impl": SOFTK_SPARSE_ATTENTION},
                                            column="x_flash", decimals=1, many=True),
    "gpu.attention.adasplash_over": Figure(GPU_ATTENTION, {"impl": SOFTK_SPARSE_ATTENTION}, column="adasplash_over",
                                           decimals=1, many=True),
}
