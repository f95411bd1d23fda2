"""`softk plot`: PNG figures of the maps (matplotlib, Agg backend, no display)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import UsageError, plain

TOPK_X = [3.0, 2.4, 1.6, 1.0, 0.0]  # the fixed vector of figure 3
TOPK_K = 2


def register(sub):
    p = sub.add_parser("plot", help="write PNG figures of the maps", description=plain(__doc__))
    p.add_argument("--out", default="softk-figures", metavar="DIR",
                   help="output folder, created if missing (default ./softk-figures)")
    p.set_defaults(run=run)


def _two_class(plt, softk):
    t = torch.linspace(-3, 3, 601, dtype=torch.float64)
    x = torch.stack([t, torch.zeros_like(t)], -1)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, fn in [("softmax", softk.softmax), ("sparsemax", softk.sparsemax), ("entmax15", softk.entmax15)]:
        ax.plot(t, fn(x)[:, 0], label=name)
    ax.set(xlabel="t (scores [t, 0])", ylabel="p₁", title="Two classes: p₁([t, 0])")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def _simplex(plt, softk):
    g = torch.linspace(-2.5, 2.5, 61, dtype=torch.float64)
    a, b = torch.meshgrid(g, g, indexing="ij")
    z = torch.stack([a.ravel(), b.ravel(), torch.zeros(a.numel(), dtype=torch.float64)], -1)
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3) / 2]])
    maps = [("softmax", softk.softmax), ("sparsemax", softk.sparsemax), ("entmax15", softk.entmax15)]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    for ax, (name, fn) in zip(axes, maps):
        p = fn(z).numpy()
        xy = p @ corners
        nnz = (p > 0).sum(1)
        sc = ax.scatter(xy[:, 0], xy[:, 1], c=nnz, cmap="viridis", vmin=1, vmax=3, s=6)
        ax.plot(*np.vstack([corners, corners[:1]]).T, color="k", lw=0.8)
        # room inside the axes for the corner labels, so that "class 3" stays clear of the title
        ax.set(title=name, xticks=[], yticks=[], aspect="equal", xlim=(-0.15, 1.15), ylim=(-0.14, 1.0))
        for c, lab in zip(corners, ["class 1", "class 2", "class 3"]):
            ax.annotate(lab, c, textcoords="offset points", xytext=(0, -12 if c[1] == 0 else 4), ha="center")
    fig.colorbar(sc, ax=axes, label="support size", ticks=[1, 2, 3], shrink=0.8)
    fig.suptitle("Where a grid of scores (z₁, z₂, 0), z ∈ [−2.5, 2.5]², lands on the simplex")
    return fig


def _topk_tau(plt, softk):
    x = torch.tensor(TOPK_X, dtype=torch.float64)
    # Below τ ≈ 1/40, 1 − p rounds to 0 in float64 and the "weighted" scheme's
    # wrong 1.5/0.5 limit snaps to 1/1 by rounding alone: stop before that.
    taus = np.logspace(1, -1.5, 120)
    methods = list(softk._maps.soft_topk.METHODS)
    cols = 4
    rows = -(-len(methods) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.0 * rows), squeeze=False, sharey=True)
    for ax, m in zip(axes.ravel(), methods):
        p = np.stack([softk.soft_topk(x, TOPK_K, tau=float(t), method=m).numpy() for t in taus])
        for i in range(len(TOPK_X)):
            ax.plot(taus, p[:, i], label=f"x={TOPK_X[i]:g}")
        ax.set(xscale="log", title=f'soft_topk "{m}", k={TOPK_K}', xlabel="τ (shrinking →)", ylabel="p")
        ax.invert_xaxis()
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(methods):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("As τ → 0 each method should reach the hard top-k multi-hot")
    fig.tight_layout()
    return fig


def _temperature(plt, softk):
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.25
    for j, (lab, scale) in enumerate([("x / 10", 0.1), ("x", 1.0), ("10 x", 10.0)]):
        ax.bar(np.arange(4) + (j - 1) * width, softk.softmax(x * scale).numpy(), width, label=f"softmax({lab})")
    ax.set(xticks=range(4), xticklabels=[f"x={v:g}" for v in x.tolist()], ylabel="p",
           title="Temperature: softmax of x/10, x and 10x")
    ax.legend()
    return fig


FIGURES = [
    ("two_class.png", _two_class),
    ("simplex.png", _simplex),
    ("topk_tau.png", _topk_tau),
    ("temperature.png", _temperature),
]


def make_figures(out: Path, progress=True) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import softk

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = "" if exc.filename in (None, str(out)) else f" at {exc.filename}"
        raise UsageError(f"--out {out}: cannot create that folder{where}: {exc.strerror or exc}") from None
    written, start = [], time.monotonic()
    for i, (name, fn) in enumerate(FIGURES, 1):
        fig = fn(plt, softk)
        path = out / name
        try:
            fig.savefig(path, dpi=110, bbox_inches="tight")
        except OSError as exc:
            if progress and time.monotonic() - start > 1.0:
                print(file=sys.stderr)  # end the progress bar: the error is its own line
            raise UsageError(f"--out {out}: cannot write {name}: {exc.strerror or exc}") from None
        finally:
            plt.close(fig)
        written.append(path)
        if progress and time.monotonic() - start > 1.0:
            bar = "#" * i + "." * (len(FIGURES) - i)
            print(f"\r[{bar}] {i}/{len(FIGURES)} {name}", end="", file=sys.stderr, flush=True)
    if progress and time.monotonic() - start > 1.0:
        print(file=sys.stderr)
    return written


def run(args) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("plotting needs matplotlib: pip install 'softk[plot]'") from None
    if not args.out:
        raise UsageError("--out must name a folder, got an empty string")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    for path in make_figures(out):
        print(path)
    return 0
