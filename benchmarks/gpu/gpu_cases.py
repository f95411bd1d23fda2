"""The case list of ``benchmarks/gpu/gpu.py``: which op, at which shape and dtype, against whom.

A :class:`Case` is one (op, shape, dtype); every implementation that serves
the op (``gpu_peers.IMPLS``) is timed on it, forward and forward+backward.
The groups:

* ``wide``: the target table (8192×32768 bf16/fp32, 512×262144 bf16,
  32768×1024 fp32, 65536×128 fp32), for softmax, sparsemax, entmax15,
  entmax α=1.3 and soft_topk k=64 (exp, sigmoid, laplace, sparse);
* ``router``: widths 16–512, bf16, 2^25 entries, for MoE-router shaped ops;
* ``loss``: the Fenchel–Young losses against ``F.cross_entropy`` with
  class-index targets, 8192×32768 and 2048×131072 bf16.

Each group has a baseline (``BASELINE``) timed on the same shape, dtype and
mode in the same run; every other time is reported as a ratio to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MODES = ("fwd", "fwd+bwd")

# (op of the baseline, impl of the baseline) per group.
BASELINE = {"wide": ("softmax", "torch"), "router": ("softmax", "torch"), "loss": ("cross_entropy", "torch")}

WIDE_SHAPES = [
    (8192, 32768, "bfloat16"),
    (8192, 32768, "float32"),
    (512, 262144, "bfloat16"),
    (32768, 1024, "float32"),
    (65536, 128, "float32"),
]
WIDE_OPS = [
    "softmax",
    "sparsemax",
    "entmax15",
    "entmax_a1.3",
    "soft_topk_exp_k64",
    "soft_topk_sigmoid_k64",
    "soft_topk_laplace_k64",
    "soft_topk_sparse_k64",
]
ROUTER_WIDTHS = [16, 64, 128, 256, 512]
ROUTER_ENTRIES = 2**25
ROUTER_OPS = ["softmax", "sparsemax", "entmax15", "soft_topk_exp_k2", "route_top2"]
LOSS_SHAPES = [(8192, 32768, "bfloat16"), (2048, 131072, "bfloat16")]
LOSS_OPS = ["cross_entropy", "sparsemax_loss", "entmax15_loss", "softmax_loss"]

# --quick: one shape per group, enough to see that everything runs.
QUICK_WIDE = [(8192, 32768, "bfloat16")]
QUICK_ROUTER = [64]
QUICK_LOSS = [(8192, 32768, "bfloat16")]


@dataclass(frozen=True)
class Case:
    """One op at one shape and dtype; ``rows × cols``, reduced along the last dim."""

    group: str
    op: str
    rows: int
    cols: int
    dtype: str

    @property
    def shape(self) -> str:
        return f"{self.rows}x{self.cols}"

    @property
    def key(self) -> str:
        """Unique name, matched by ``--only REGEX``: ``group/op/ROWSxCOLS/dtype``."""
        return f"{self.group}/{self.op}/{self.shape}/{self.dtype}"

    @property
    def is_loss(self) -> bool:
        return self.group == "loss"

    @property
    def is_baseline(self) -> bool:
        return self.op == BASELINE[self.group][0]


def build_cases(quick: bool = False, only: str | None = None) -> list[Case]:
    """Every case, baselines first within each shape (a ratio needs its baseline).

    ``only`` is a regular expression searched in :attr:`Case.key`; the
    baseline of a selected shape is always kept so that ratios exist.
    """
    wide = QUICK_WIDE if quick else WIDE_SHAPES
    widths = QUICK_ROUTER if quick else ROUTER_WIDTHS
    losses = QUICK_LOSS if quick else LOSS_SHAPES
    cases = [Case("wide", op, r, c, dt) for r, c, dt in wide for op in WIDE_OPS]
    cases += [Case("router", op, ROUTER_ENTRIES // w, w, "bfloat16") for w in widths for op in ROUTER_OPS]
    cases += [Case("loss", op, r, c, dt) for r, c, dt in losses for op in LOSS_OPS]
    if only:
        pat = re.compile(only)
        chosen = [c for c in cases if pat.search(c.key)]
        shapes = {(c.group, c.shape, c.dtype) for c in chosen}
        cases = [c for c in cases if c in chosen or (c.is_baseline and (c.group, c.shape, c.dtype) in shapes)]
    return cases


def element_size(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]


def ideal_bytes(case: Case, mode: str) -> int:
    """Bytes an ideal kernel reads and writes; GB/s = this / p50.

    Maps: forward reads x and writes p (2 passes of rows×cols elements);
    forward+backward adds reading p and the incoming gradient and writing dx
    (5 in all).  Losses: forward reads x once (the targets and the scalar are
    negligible); forward+backward reads x and writes dx (2), as a fused
    kernel that writes the gradient during the forward does.  The same count
    is used for every implementation of an op, so GB/s is a rescaled time.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    passes = (1 if mode == "fwd" else 2) if case.is_loss else (2 if mode == "fwd" else 5)
    return passes * case.rows * case.cols * element_size(case.dtype)
