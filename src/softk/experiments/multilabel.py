r"""The multi-label protocol of Martins & Astudillo (2016, §4.1), run with softk.

Model: linear scores z = W x + b, trained by minimising

.. math:: \frac1N \sum_i L(W x_i + b;\ y_i) + \frac{\lambda}{2}\|W\|_F^2

(the bias is not regularised) with full-batch L-BFGS —
``scipy.optimize.fmin_l_bfgs_b(m=10, factr=100, pgtol=1e-8, maxiter=100)``,
starting from W = 0, b = 0.  Features are standardised with the mean and
standard deviation of the whole training file (a constant feature is left at
0); the same transform is applied to the test file.

Model selection, per loss, on the training file only: for each
λ ∈ {1, 1e-1, …, 1e-9}, 5-fold cross-validation produces held-out scores for
every training row; every prediction rule parameter (see
:mod:`softk.experiments.objectives`) is scored on the pooled held-out
predictions; the (λ, threshold) pair with the best micro-F1 and, separately,
the pair with the best paper macro-F1 are kept (ties: the larger λ, then the
first threshold of the grid).  The model is refitted on the whole training file
with each chosen λ and evaluated on the test file with its chosen threshold.

Folds: ``"contiguous"`` — five contiguous, unshuffled blocks of the file order
(what the paper did); ``"shuffled"`` — the same after a seeded permutation of
the rows.  The distinction matters on scene, whose training file is sorted by
label, so contiguous folds each hold out roughly one class.

Reference: A. F. T. Martins and R. F. Astudillo, "From Softmax to Sparsemax: A
Sparse Model of Attention and Multi-Label Classification", ICML 2016.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from .metrics import macro_f1, macro_f1_per_label_mean, micro_f1
from .objectives import LOSS_FUNCTIONS, LOSSES, predict, threshold_grid
from .threads import single_threaded

LAMBDAS = tuple(10.0 ** -i for i in range(10))  # 1, 1e-1, ..., 1e-9
N_FOLDS = 5
LBFGS = dict(m=10, factr=100.0, pgtol=1e-8, maxiter=100)
FOLD_SCHEMES = ("contiguous", "shuffled")


def standardise(X_train: np.ndarray, X_test: np.ndarray):
    """Both matrices standardised with the training mean and std (std 0 → 1)."""
    mean = X_train.mean(0)
    std = X_train.std(0)
    std = np.where(std > 0, std, 1.0)
    return (X_train - mean) / std, (X_test - mean) / std


def fit(X: np.ndarray, Y: np.ndarray, loss: str, lam: float):
    """L-BFGS fit of the linear model; returns (W of shape (D, K), b of shape (K,))."""
    from scipy.optimize import fmin_l_bfgs_b

    n, d = X.shape
    k = Y.shape[1]
    loss_fn = LOSS_FUNCTIONS[loss]
    y = torch.from_numpy(Y.astype(np.float64))

    def objective(theta):
        W = theta[: d * k].reshape(d, k)
        b = theta[d * k:]
        z = torch.from_numpy(X @ W + b)
        with torch.no_grad():
            total, G = loss_fn(z, y)
        G = G.numpy()
        value = float(total) / n + 0.5 * lam * float(np.dot(theta[: d * k], theta[: d * k]))
        grad = np.concatenate([(X.T @ G / n + lam * W).ravel(), G.sum(0) / n])
        return value, grad

    theta, _, _ = fmin_l_bfgs_b(objective, np.zeros(d * k + k), **LBFGS)
    return theta[: d * k].reshape(d, k), theta[d * k:]


def folds(n: int, scheme: str, seed: int) -> list:
    """Held-out index arrays of the five folds."""
    order = np.arange(n)
    if scheme == "shuffled":
        order = np.random.default_rng(seed).permutation(n)
    elif scheme != "contiguous":
        raise ValueError(f"folds must be one of {list(FOLD_SCHEMES)}, got {scheme!r}")
    return np.array_split(order, N_FOLDS)


def _scores(loss, Y, Z, grid):
    pred = [predict(loss, Z, t) for t in grid]
    return [micro_f1(Y, p) for p in pred], [macro_f1(Y, p) for p in pred]


def cross_validate(X, Y, loss, scheme="contiguous", seed=0, progress=None, lambdas=LAMBDAS):
    """CV micro- and macro-F1 tables of shape (len(lambdas), len(grid)), and the grid."""
    grid = threshold_grid(loss, Y.shape[1], int(Y.sum(1).max()))
    held = folds(len(X), scheme, seed)
    micro = np.zeros((len(lambdas), len(grid)))
    macro = np.zeros_like(micro)
    for i, lam in enumerate(lambdas):
        Z = np.zeros(Y.shape)
        for j, out in enumerate(held):
            train = np.setdiff1d(np.arange(len(X)), out)
            W, b = fit(X[train], Y[train], loss, lam)
            Z[out] = X[out] @ W + b
        micro[i], macro[i] = _scores(loss, Y, Z, grid)
        if progress:
            progress(f"{loss} {scheme} λ={lam:.0e}: CV micro-F1 {micro[i].max():.3f}, macro-F1 {macro[i].max():.3f}")
    return micro, macro, grid


def _best(table):
    # argmax over the flattened table picks the first maximum: larger λ first
    # (LAMBDAS is decreasing), then the grid's order.
    i, j = np.unravel_index(int(np.argmax(table)), table.shape)
    return int(i), int(j)


def _threshold_fields(loss, value, suffix):
    if loss == "soft_topk":
        k, t = value
        return {f"threshold_{suffix}": float(t), f"topk_k_{suffix}": int(k)}
    return {f"threshold_{suffix}": float(value)}


def evaluate_loss(X_train, Y_train, X_test, Y_test, loss, scheme="contiguous", seed=0, progress=None,
                  lambdas=LAMBDAS):
    """One loss under one fold scheme: the result dict of the JSON output."""
    start = time.perf_counter()
    micro, macro, grid = cross_validate(X_train, Y_train, loss, scheme, seed, progress, lambdas)
    im, jm = _best(micro)
    ia, ja = _best(macro)
    models = {i: fit(X_train, Y_train, loss, lambdas[i]) for i in {im, ia}}
    seconds = time.perf_counter() - start

    def test_pred(i, j):
        W, b = models[i]
        return predict(loss, X_test @ W + b, grid[j])

    pm, pa = test_pred(im, jm), test_pred(ia, ja)
    out = {
        "micro_f1": micro_f1(Y_test, pm),
        "macro_f1": macro_f1(Y_test, pa),
        "macro_f1_per_label_mean": macro_f1_per_label_mean(Y_test, pa),
        "lambda_micro": lambdas[im],
        "lambda_macro": lambdas[ia],
        "cv_micro_f1": float(micro[im, jm]),
        "cv_macro_f1": float(macro[ia, ja]),
        "train_seconds": seconds,
    }
    out.update(_threshold_fields(loss, grid[jm], "micro"))
    out.update(_threshold_fields(loss, grid[ja], "macro"))
    return out


def run_multilabel(data, losses=LOSSES, schemes=FOLD_SCHEMES, seed=0, progress=None, lambdas=LAMBDAS) -> dict:
    """Run the protocol on a loaded :class:`~softk.experiments.data.MultilabelData`.

    Returns ``{"dataset": name, "results": {loss: {...}}}`` for the first fold
    scheme (the headline), plus ``{"<scheme>_folds": {"seed": s, "results": ...}}``
    for each further scheme, and a ``"data"`` block with the sizes.  ``lambdas``
    replaces the paper's grid (for quick runs; it must be decreasing for the
    tie-break "larger λ first").
    """
    bad = [l for l in losses if l not in LOSSES]
    if bad or not losses:
        raise ValueError(f"losses must be a non-empty list drawn from {list(LOSSES)}, got {list(losses)}")
    bad = [s for s in schemes if s not in FOLD_SCHEMES]
    if bad or not schemes:
        raise ValueError(f"schemes must be a non-empty list drawn from {list(FOLD_SCHEMES)}, got {list(schemes)}")
    lambdas = tuple(float(l) for l in lambdas)
    if not lambdas or any(not (l > 0 and np.isfinite(l)) for l in lambdas):
        raise ValueError(f"lambdas must be a non-empty list of finite numbers > 0, got {list(lambdas)}")
    lambdas = tuple(sorted(set(lambdas), reverse=True))
    with single_threaded():  # tiny problems: thread pools only cost (see threads.py)
        return _run(data, losses, schemes, seed, progress, lambdas)


def _run(data, losses, schemes, seed, progress, lambdas):
    Xtr, Xte = standardise(data.X_train, data.X_test)
    report = {
        "dataset": data.name,
        "data": {
            "n_train": int(len(Xtr)), "n_test": int(len(Xte)), "n_features": int(Xtr.shape[1]),
            "n_labels": int(data.Y_train.shape[1]),
            "dropped_unlabelled_train": data.dropped_train, "dropped_unlabelled_test": data.dropped_test,
            "mean_labels_per_row_train": float(data.Y_train.sum(1).mean()),
        },
    }
    for s, scheme in enumerate(schemes):
        results = {}
        for loss in losses:
            say = (lambda msg: progress(f"[{data.name}] {msg}")) if progress else None
            results[loss] = evaluate_loss(Xtr, data.Y_train, Xte, data.Y_test, loss, scheme, seed, say, lambdas)
        if s == 0:
            report["folds"] = scheme
            report["results"] = results
        else:
            report[f"{scheme}_folds"] = {"seed": seed, "results": results}
    return report


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
