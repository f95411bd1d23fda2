"""The tables of the Performance page (``<!-- figures: TABLE -->``), one per
topic, every cell a figure of one recorded run.  Row labels are written from
the same values that pick the rows."""

from __future__ import annotations

from .model import Figure, Source, Table
from .sources import CPU_ATTENTION, CPU_OVERHEAD, GPU_ATTENTION, GPU_FUSED_LINEAR, GPU_MAPS, GPU_STEP


def _shape(text: str) -> str:
    return text.replace("x", "×")


def _pair(source: Source, where: dict, key: str = "pass", modes=("fwd", "fwd+bwd"), **kw) -> tuple[Figure, ...]:
    """The forward and the forward + backward figure of one case, shown "a / b"."""
    return tuple(Figure(source, {**where, key: mode}, **kw) for mode in modes)


# ------------------------------------------------------------------ CPU: a call of a map or a loss
CPU_SHAPES = ("4x10", "64x64", "256x1024", "2048x32000")


def _time(shape: str) -> dict:
    # the torch op's own time: µs, or ms where it runs to hundreds of thousands of µs
    return {"column": "us", "unit": "µs", "decimals": 1} if shape != "2048x32000" else \
        {"column": "us", "unit": "ms", "decimals": 1, "scale": 1e-3}


def _cpu_calls(kind: str, reference: str, impls: dict[str, str]) -> Table:
    rows = tuple((_shape(s), _pair(CPU_OVERHEAD, {"kind": kind, "shape": s, "impl": reference}, **_time(s)),
                  *(_pair(CPU_OVERHEAD, {"kind": kind, "shape": s, "impl": i}) for i in impls))
                 for s in CPU_SHAPES)
    return Table(CPU_OVERHEAD, ("rows × width", f"`{reference}`", *impls.values()), rows)


# ------------------------------------------------------------------ CPU: attention and decoding
ATTENTION_MAPS = {"softmax": "softmax", "sparsemax": "sparsemax", "entmax15": "entmax15",
                  "entmax_a1.3": "entmax, α = 1.3"}
DECODE_KEYS = (4096, 16384, 32768, 131072)


def _cpu_attention() -> Table:
    cases = [(f"1, 4, {n}, {n}", {"L": n, "causal": causal, "pass": p})
             for n in (2048, 8192) for causal in (False, True) for p in ("fwd", "fwd+bwd")]
    cases += [(f"4, 8, 1, {s}", {"L": 1, "S": s, "causal": False, "pass": "fwd"}) for s in DECODE_KEYS]
    rows = tuple((label, "yes" if case["causal"] else "no", case["pass"],
                  Figure(CPU_ATTENTION, {**case, "impl": "sdpa"}, column="ms", unit="ms", decimals=1),
                  *(Figure(CPU_ATTENTION, {**case, "impl": m}) for m in ATTENTION_MAPS))
                 for label, case in cases)
    return Table(CPU_ATTENTION, ("B, H, L, S", "causal", "pass", "SDPA", *ATTENTION_MAPS.values()), rows)


def _cpu_decoding_reads() -> Table:
    sparse = {m: label for m, label in ATTENTION_MAPS.items() if m != "softmax"}
    rows = tuple((f"4, 8, 1, {s}", *(tuple(Figure(CPU_ATTENTION, {"L": 1, "S": s, "impl": m}, column=c, unit="%",
                                                  decimals=3, scale=100) for c in ("read_keys", "read_pages"))
                                     for m in sparse))
                 for s in DECODE_KEYS)
    return Table(CPU_ATTENTION, ("B, H, L, S", *sparse.values()), rows)


# ------------------------------------------------------------------ GPU: maps
GPU_OPS = {"softmax": "`softk.softmax`", "sparsemax": "sparsemax", "entmax15": "entmax15",
           "entmax_a1.3": "entmax, α = 1.3", "soft_topk_exp_k64": "soft top-k exp", "soft_topk_sigmoid_k64": "sigmoid",
           "soft_topk_laplace_k64": "laplace", "soft_topk_sparse_k64": "sparse"}


def _gpu_maps() -> Table:
    def torch_ms(case):
        return _pair(GPU_MAPS, {**case, "op": "softmax", "impl": "torch"}, key="mode", column="p50", unit="ms",
                     decimals=3)

    def ratios(case, op, impl="softk"):
        return _pair(GPU_MAPS, {**case, "op": op, "impl": impl}, key="mode")

    rows = []
    for shape, dtype in (("8192x32768", "bfloat16"), ("32768x1024", "float32"), ("65536x128", "float32")):
        case = {"shape": shape, "dtype": dtype}
        rows.append((f"{_shape(shape)} {dtype}", torch_ms(case), *(ratios(case, op) for op in GPU_OPS),
                     ratios(case, "sparsemax", "entmax")))
    router = {"shape": "2097152x16", "dtype": "bfloat16"}
    measured = {"sparsemax": ratios(router, "sparsemax"), "soft_topk_exp_k64": ratios(router, "soft_topk_exp_k2")}
    rows.append(("2097152×16 bfloat16, a router (soft top-k at k = 2)", torch_ms(router),
                 *(measured.get(op) for op in GPU_OPS), None))
    return Table(GPU_MAPS, ("rows × width", "`torch.softmax`", *GPU_OPS.values(), "entmax package sparsemax"),
                 tuple(rows))


# ------------------------------------------------------------------ GPU: losses
FUSED = {"torch": "torch: the logits, then `F.cross_entropy`", "liger": "Liger's fused linear cross-entropy",
         "softk-cross_entropy": "softk cross-entropy", "softk-cross_entropy-c4096": "the same, 4096 rows per chunk",
         "softk-sparsemax": "softk sparsemax", "softk-sparsemax-c4096": "the same, 4096 rows per chunk",
         "softk-entmax15": "softk entmax15", "softk-entmax15-c4096": "the same, 4096 rows per chunk"}


def _gpu_fused_linear() -> Table:
    def cells(impl, shape):
        where = {"impl": impl, "shape": shape}
        return (Figure(GPU_FUSED_LINEAR, where, column="ms", unit="ms", decimals=1),
                Figure(GPU_FUSED_LINEAR, where, column="x_torch"),
                Figure(GPU_FUSED_LINEAR, where, column="peak_extra_mib", unit="MiB", decimals=0))

    header = ("loss", "GPT-2 shape", "× torch", "peak extra memory", "Llama-3 shape", "× torch", "peak extra memory")
    return Table(GPU_FUSED_LINEAR, header,
                 tuple((label, *cells(impl, "gpt2"), *cells(impl, "llama3")) for impl, label in FUSED.items()))


STEP = {"own": "the model's own cross-entropy", "softk_ce": '`apply_softk(model, "cross_entropy")`',
        "sparsemax": '`apply_softk(model, "sparsemax")`', "entmax15": '`apply_softk(model, "entmax15")`'}


def _gpu_step() -> Table:
    def cells(variant):
        where = {"variant": variant}
        return (Figure(GPU_STEP, where, column="ms", unit="ms", decimals=1), Figure(GPU_STEP, where, column="x_own"),
                Figure(GPU_STEP, where, column="peak_mib", unit="MiB", decimals=0),
                Figure(GPU_STEP, where, column="mem_x_own"))

    return Table(GPU_STEP, ("loss", "step", "× own", "peak extra memory", "× own"),
                 tuple((label, *cells(v)) for v, label in STEP.items()))


# ------------------------------------------------------------------ GPU: attention
ATTENTION_IMPLS = {"sdpa-flash": "SDPA, flash", "sdpa-efficient": "SDPA, memory-efficient",
                   "softk-softmax (triton)": "softk softmax", "softk-sparsemax (triton)": "softk sparsemax",
                   "softk-entmax15 (triton)": "softk entmax15", "adasplash-sparsemax": "AdaSplash sparsemax",
                   "adasplash-entmax15": "AdaSplash entmax15"}


def _gpu_attention() -> Table:
    def cells(impl):
        case = {"impl": impl, "L": 4096, "E": 64, "causal": False}
        out = []
        for mode in ("fwd", "fwdbwd"):
            out += [Figure(GPU_ATTENTION, {**case, "mode": mode}, column="p50", unit="ms", decimals=2),
                    Figure(GPU_ATTENTION, {**case, "mode": mode}, column="x_flash")]
        return (*out, Figure(GPU_ATTENTION, {**case, "mode": "fwdbwd"}, column="peak_mib", unit="MiB", decimals=1))

    header = ("implementation", "forward", "× flash", "forward + backward", "× flash", "peak memory, fwd + bwd")
    return Table(GPU_ATTENTION, header, tuple((label, *cells(i)) for i, label in ATTENTION_IMPLS.items()))


TABLES: dict[str, Table] = {
    "cpu-maps": _cpu_calls("map", "torch.softmax", {"softk.softmax": "`softk.softmax`",
                                                    "softk.sparsemax": "`softk.sparsemax`",
                                                    "softk.entmax15": "`softk.entmax15`",
                                                    "entmax.sparsemax": "entmax package sparsemax",
                                                    "entmax.entmax15": "entmax package entmax15"}),
    "cpu-losses": _cpu_calls("loss", "F.cross_entropy", {"softk.cross_entropy": "`softk.losses.cross_entropy`",
                                                         "sparsemax_loss": "sparsemax loss",
                                                         "entmax15_loss": "entmax15 loss",
                                                         "softmax_loss": "softmax loss"}),
    "cpu-attention": _cpu_attention(),
    "cpu-decoding-reads": _cpu_decoding_reads(),
    "gpu-maps": _gpu_maps(),
    "gpu-fused-linear": _gpu_fused_linear(),
    "gpu-step": _gpu_step(),
    "gpu-attention": _gpu_attention(),
}
