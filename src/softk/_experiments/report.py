"""Markdown tables of :func:`~softk._experiments.multilabel.run_multilabel` results."""

from __future__ import annotations


def _threshold(res: dict, which: str) -> str:
    t = res[f"threshold_{which}"]
    k = res.get(f"topk_k_{which}")
    return f"k̂={k}, t={t:g}" if k is not None else f"{t:.3g}"


def results_table(results: dict) -> str:
    """One row per loss: test F1 (×100), the chosen λ and rule parameter, CV F1, time."""
    lines = [
        "| loss | micro-F1 | macro-F1 (paper) | macro-F1 (per-label mean) | λ (micro) | rule (micro) "
        "| λ (macro) | rule (macro) | CV micro / macro | time (s), CV + refits |",
        "|---|---:|---:|---:|---:|---|---:|---|---:|---:|",
    ]
    for loss, r in results.items():
        lines.append(
            f"| {loss} | {100 * r['micro_f1']:.2f} | {100 * r['macro_f1']:.2f} "
            f"| {100 * r['macro_f1_per_label_mean']:.2f} | {r['lambda_micro']:.0e} | {_threshold(r, 'micro')} "
            f"| {r['lambda_macro']:.0e} | {_threshold(r, 'macro')} "
            f"| {100 * r['cv_micro_f1']:.2f} / {100 * r['cv_macro_f1']:.2f} | {r['train_seconds']:.1f} |"
        )
    return "\n".join(lines)


def run_title(run: dict, headline: bool) -> str:
    """'Folds: contiguous, ceil sizes; CV score: per-fold (headline).'"""
    seed = f", seed {run['seed']}" if run.get("seed") is not None else ""
    tail = " (headline)" if headline else ""
    return (f"Folds: **{run['folds']}**{seed}, {run['fold_sizes']} sizes; "
            f"CV score: **{run['cv_score']}**{tail}.")


def markdown_report(report: dict) -> str:
    """The tables of one data set, one per (fold scheme, CV scoring), headline first."""
    d = report["data"]
    out = [
        f"### {report['dataset']}",
        "",
        f"{d['n_train']} training rows, {d['n_test']} test rows, {d['n_features']} features, "
        f"{d['n_labels']} labels ({d['mean_labels_per_row_train']:.2f} per training row); "
        f"rows without labels dropped: {d['dropped_unlabelled_train']} train, {d['dropped_unlabelled_test']} test; "
        f"CV fold rows {', '.join(map(str, d['fold_rows']))}.",
    ]
    for i, run in enumerate(report["runs"]):
        out += ["", run_title(run, i == 0), "", results_table(run["results"])]
    return "\n".join(out) + "\n"
