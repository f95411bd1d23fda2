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
:mod:`softk._experiments.objectives`) is scored, and the (λ, threshold) pair
with the best micro-F1 and, separately, the pair with the best paper macro-F1
are kept (ties: the larger λ, then the first threshold of the grid).  The model
is refitted on the whole training file with each chosen λ and evaluated on the
test file with its chosen threshold.

CV scoring (``cv_score``), both computed from the same held-out predictions:

* ``"per-fold"`` (the default, the authors' code, ``train_multilabel_classifier_lbfgs.py``
  of Unbabel/sparsemax): F1 on each held-out fold, averaged over the five folds.
  A fold with no true positive has an undefined F1 (0/0 in 2PR/(P+R)); as in
  that code (``np.mean`` then ``np.nan_to_num``) the average is then undefined
  and the setting scores 0.
* ``"pooled"``: F1 of all held-out predictions pooled over the folds
  (Forman & Scholz 2010 argue for it under heavy class imbalance).

Fold sizes (``fold_sizes``): ``"ceil"`` (the authors') — blocks of ⌈n/5⌉ rows,
the last one shorter (79, 79, 79, 79, 75 on emotions' 391 rows); ``"even"`` —
``np.array_split`` (79, 78, 78, 78, 78).

Folds (``scheme``): ``"contiguous"`` — the blocks in file order, unshuffled
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
CV_SCORES = ("per-fold", "pooled")
# ``softk experiment multilabel --quick``: a smoke test of every loss, not the protocol: the first
# ``n_train`` training rows, one λ instead of ten (CV then chooses the threshold only), the contiguous folds only
QUICK: dict = {"n_train": 200, "lambdas": (1e-1,), "schemes": ("contiguous",)}
FOLD_SIZES = ("ceil", "even")


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


def fold_blocks(n: int, sizes: str = "ceil") -> list:
    """Index blocks [start, stop) of the five folds over n rows, in order.

    ``"ceil"``: ⌈n/5⌉ rows each, the last one what is left (the authors'
    ``partition_size = ceil(n / 5)``); ``"even"``: ``np.array_split``.

    >>> [len(b) for b in fold_blocks(391)], [len(b) for b in fold_blocks(391, "even")]
    ([79, 79, 79, 79, 75], [79, 78, 78, 78, 78])
    """
    if sizes == "even":
        return np.array_split(np.arange(n), N_FOLDS)
    if sizes != "ceil":
        raise ValueError(f"fold_sizes must be one of {list(FOLD_SIZES)}, got {sizes!r}")
    size = -(-n // N_FOLDS)
    blocks = [np.arange(start, min(start + size, n)) for start in range(0, n, max(size, 1))]
    if len(blocks) != N_FOLDS:
        raise ValueError(f"{n} rows do not make {N_FOLDS} folds of ceil(n/{N_FOLDS}) rows; use fold_sizes='even'")
    return blocks


def folds(n: int, scheme: str, seed: int, sizes: str = "ceil") -> list:
    """Held-out index arrays of the five folds."""
    order = np.arange(n)
    if scheme == "shuffled":
        order = np.random.default_rng(seed).permutation(n)
    elif scheme != "contiguous":
        raise ValueError(f"folds must be one of {list(FOLD_SCHEMES)}, got {scheme!r}")
    return [order[b] for b in fold_blocks(n, sizes)]


def per_fold_f1(score, Y, pred, held) -> float:
    """Mean over the folds of ``score`` on each fold; 0 if a fold has no true positive.

    With no true positive, 2PR/(P+R) is 0/0 for micro- and the paper's
    macro-F1 alike; the authors' mean is then NaN and ``nan_to_num`` makes it 0.
    """
    values = []
    for out in held:
        if not (Y[out] & pred[out]).any():
            return 0.0
        values.append(score(Y[out], pred[out]))
    return float(np.mean(values))


def _scores(loss, Y, Z, grid, held, cv_scores):
    Yb = np.asarray(Y, bool)
    out = {s: ([], []) for s in cv_scores}
    for t in grid:
        p = predict(loss, Z, t)
        for s in cv_scores:
            if s == "pooled":
                mi, ma = micro_f1(Yb, p), macro_f1(Yb, p)
            else:
                mi, ma = per_fold_f1(micro_f1, Yb, p, held), per_fold_f1(macro_f1, Yb, p, held)
            out[s][0].append(mi)
            out[s][1].append(ma)
    return out


def cross_validate(X, Y, loss, scheme="contiguous", seed=0, progress=None, lambdas=LAMBDAS,
                   cv_scores=CV_SCORES, fold_sizes="ceil"):
    """CV tables and the grid: ``({score: (micro, macro)}, grid)``.

    micro and macro have shape (len(lambdas), len(grid)); every CV scoring in
    ``cv_scores`` is computed from the same held-out predictions.
    """
    grid = threshold_grid(loss, Y.shape[1], int(Y.sum(1).max()))
    held = folds(len(X), scheme, seed, fold_sizes)
    tables = {s: (np.zeros((len(lambdas), len(grid))), np.zeros((len(lambdas), len(grid)))) for s in cv_scores}
    for i, lam in enumerate(lambdas):
        Z = np.zeros(Y.shape)
        for out in held:
            train = np.setdiff1d(np.arange(len(X)), out)
            W, b = fit(X[train], Y[train], loss, lam)
            Z[out] = X[out] @ W + b
        for s, (mi, ma) in _scores(loss, Y, Z, grid, held, cv_scores).items():
            tables[s][0][i], tables[s][1][i] = mi, ma
        if progress:
            best = ", ".join(f"{s} {max(tables[s][0][i]):.3f}/{max(tables[s][1][i]):.3f}" for s in cv_scores)
            progress(f"{loss} {scheme} λ={lam:.0e}: CV micro/macro-F1 {best}")
    return tables, grid


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
                  lambdas=LAMBDAS, cv_scores=CV_SCORES, fold_sizes="ceil"):
    """One loss under one fold scheme: ``{cv_score: result dict of the JSON output}``."""
    start = time.perf_counter()
    tables, grid = cross_validate(X_train, Y_train, loss, scheme, seed, progress, lambdas, cv_scores, fold_sizes)
    cv_seconds = time.perf_counter() - start
    models = {}

    def model(i):  # refits shared between the scorings that chose the same λ
        if i not in models:
            models[i] = fit(X_train, Y_train, loss, lambdas[i])
        return models[i]

    def test_pred(i, j):
        W, b = model(i)
        return predict(loss, X_test @ W + b, grid[j])

    results = {}
    for s in cv_scores:
        micro, macro = tables[s]
        (im, jm), (ia, ja) = _best(micro), _best(macro)
        pm, pa = test_pred(im, jm), test_pred(ia, ja)
        out = {
            "micro_f1": micro_f1(Y_test, pm),
            "macro_f1": macro_f1(Y_test, pa),
            "macro_f1_per_label_mean": macro_f1_per_label_mean(Y_test, pa),
            "lambda_micro": lambdas[im],
            "lambda_macro": lambdas[ia],
            "cv_micro_f1": float(micro[im, jm]),
            "cv_macro_f1": float(macro[ia, ja]),
        }
        out.update(_threshold_fields(loss, grid[jm], "micro"))
        out.update(_threshold_fields(loss, grid[ja], "macro"))
        results[s] = out
    seconds = time.perf_counter() - start
    for out in results.values():
        out["train_seconds"] = seconds  # CV (shared by the scorings) + the refits
        out["cv_seconds"] = cv_seconds
    return results


def _check_choice(values, allowed, name):
    values = list(values)
    bad = [v for v in values if v not in allowed]
    if bad or not values or len(set(values)) != len(values):
        raise ValueError(f"{name} must be a non-empty list of distinct values drawn from {list(allowed)}, got {values}")
    return values


def run_multilabel(data, losses=LOSSES, schemes=FOLD_SCHEMES, seed=0, progress=None, lambdas=LAMBDAS,
                   cv_scores=CV_SCORES, fold_sizes="ceil") -> dict:
    """Run the protocol on a loaded :class:`~softk._experiments.data.MultilabelData`.

    Returns ``{"dataset": name, "data": {sizes}, "runs": [...]}`` with one run
    ``{"folds", "cv_score", "fold_sizes", "seed", "results": {loss: {...}}}``
    per (fold scheme, CV scoring), schemes outermost; the first run is the
    headline and is repeated as ``"folds"``, ``"cv_score"`` and ``"results"``.
    ``lambdas`` replaces the paper's grid (for quick runs; sorted decreasing
    for the tie-break "larger λ first").
    """
    losses = _check_choice(losses, LOSSES, "losses")
    schemes = _check_choice(schemes, FOLD_SCHEMES, "schemes")
    cv_scores = _check_choice(cv_scores, CV_SCORES, "cv_scores")
    if fold_sizes not in FOLD_SIZES:
        raise ValueError(f"fold_sizes must be one of {list(FOLD_SIZES)}, got {fold_sizes!r}")
    lambdas = tuple(float(l) for l in lambdas)
    if not lambdas or any(not (l > 0 and np.isfinite(l)) for l in lambdas):
        raise ValueError(f"lambdas must be a non-empty list of finite numbers > 0, got {list(lambdas)}")
    lambdas = tuple(sorted(set(lambdas), reverse=True))
    fold_blocks(len(data.X_train), fold_sizes)  # fail early on too few rows
    with single_threaded():  # tiny problems: thread pools only cost (see threads.py)
        return _run(data, losses, schemes, seed, progress, lambdas, cv_scores, fold_sizes)


def _run(data, losses, schemes, seed, progress, lambdas, cv_scores, fold_sizes):
    Xtr, Xte = standardise(data.X_train, data.X_test)
    report = {
        "dataset": data.name,
        "data": {
            "n_train": int(len(Xtr)), "n_test": int(len(Xte)), "n_features": int(Xtr.shape[1]),
            "n_labels": int(data.Y_train.shape[1]),
            "dropped_unlabelled_train": data.dropped_train, "dropped_unlabelled_test": data.dropped_test,
            "mean_labels_per_row_train": float(data.Y_train.sum(1).mean()),
            "fold_rows": [len(b) for b in fold_blocks(len(Xtr), fold_sizes)],
        },
        "runs": [],
    }
    for scheme in schemes:
        per_score = {s: {} for s in cv_scores}
        for loss in losses:
            say = (lambda msg: progress(f"[{data.name}] {msg}")) if progress else None
            res = evaluate_loss(Xtr, data.Y_train, Xte, data.Y_test, loss, scheme, seed, say, lambdas,
                                cv_scores, fold_sizes)
            for s in cv_scores:
                per_score[s][loss] = res[s]
        for s in cv_scores:
            report["runs"].append({"folds": scheme, "cv_score": s, "fold_sizes": fold_sizes,
                                   "seed": seed if scheme == "shuffled" else None, "results": per_score[s]})
    head = report["runs"][0]
    report.update(folds=head["folds"], cv_score=head["cv_score"], results=head["results"])
    return report


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
