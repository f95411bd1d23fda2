r"""Held-out metrics of a language model's next-token distribution, after
Martins et al. 2020 ("Sparse Text Generation", §5), for distributions with
exact zeros.

For a row p ∈ Δ^V and the observed next token y:

* **ε-perplexity**: :math:`\exp(-\tfrac1n\sum\log\frac{p_y+ε}{1+Vε})`, the
  perplexity of p smoothed by ε so that a zero on the observed token costs
  :math:`\log((1+Vε)/ε)` instead of infinity;
* **sparsemax score**: :math:`1-\tfrac12\lVert p-e_y\rVert^2 = p_y+\tfrac12(1-\lVert p\rVert^2)`,
  1 for a one-hot p on y (Blondel et al. 2020);
* **Jensen–Shannon divergence** to the one-hot target, natural log (at most
  log 2): :math:`\tfrac12 KL(p\Vert m)+\tfrac12 KL(e_y\Vert m)`, m = (p + e_y)/2;
* **accuracy** of argmax p; **support** size #{j : p_j > 0};
* **ECE** of the top-1 confidence max p (15 equal-width bins).

:class:`Accumulator` sums them over chunks of rows so that no (tokens × V)
tensor is held; :func:`distinct_n` is the diversity of generated text.

>>> import torch
>>> p = torch.tensor([[0.5, 0.5, 0.0]]); y = torch.tensor([2])
>>> acc = Accumulator(eps=1e-3); acc.add(p, y)
>>> r = acc.result()
>>> round(r["eps_perplexity"], 2), r["sparsemax_score"], r["support_mean"]   # (1 + 3e-3)/1e-3
(1003.0, 0.25, 2.0)
>>> distinct_n([[1, 2, 1, 2]], 2)   # bigrams 12, 21, 12: two distinct of three
0.6667
"""

from __future__ import annotations

import math

import torch

from .common import calibration_error


def row_metrics(p: torch.Tensor, y: torch.Tensor, eps: float) -> dict:
    """Per-row tensors (float64) of the module's quantities for p (n, V) and targets y (n,)."""
    V = p.shape[-1]
    py = p.gather(-1, y[:, None]).squeeze(-1).double()
    sq = (p * p).sum(-1, dtype=torch.float64)  # row sums in float64 without a float64 copy of p
    confidence, top = p.max(-1)
    m_y = 0.5 * (py + 1)  # m = (p + e_y)/2 is p/2 off the target
    # KL(p||m) = Σ_j p_j log(p_j/m_j) with 0·log 0 = 0; off y, p_j/m_j = 2
    kl_p = (p.sum(-1, dtype=torch.float64) - py) * math.log(2.0) + torch.where(py > 0, py * torch.log(py / m_y), 0.0)
    kl_e = -torch.log(m_y)  # KL(e_y||m) = log(1/m_y)
    return {
        "log_eps": torch.log((py + eps) / (1 + V * eps)),
        "sparsemax_score": py + 0.5 * (1 - sq),
        "js_divergence": 0.5 * (kl_p + kl_e),
        "correct": (top == y).double(),
        "confidence": confidence.double(),
        "support": (p > 0).sum(-1).double(),
    }


class Accumulator:
    """Running sums of :func:`row_metrics` over chunks; :meth:`result` gives the means,
    the support's mean and 95th percentile, the ECE, and the softmax perplexity
    when :meth:`add` was also given the softmax log-probability of y."""

    def __init__(self, eps: float):
        self.eps = float(eps)
        self.n = 0
        self.sums = {"log_eps": 0.0, "sparsemax_score": 0.0, "js_divergence": 0.0}
        self.support: list[torch.Tensor] = []
        self.confidence: list[torch.Tensor] = []
        self.correct: list[torch.Tensor] = []
        self.softmax_nll: float | None = None  # None until add() is given the softmax log-probabilities

    def add(self, p: torch.Tensor, y: torch.Tensor, softmax_logp_y: torch.Tensor | None = None) -> None:
        rows = row_metrics(p, y, self.eps)
        self.n += len(y)
        for key in self.sums:
            self.sums[key] += float(rows[key].sum())
        self.support.append(rows["support"])
        self.confidence.append(rows["confidence"])
        self.correct.append(rows["correct"])
        if softmax_logp_y is not None:
            self.softmax_nll = (self.softmax_nll or 0.0) - float(softmax_logp_y.double().sum())

    def result(self) -> dict:
        n = max(self.n, 1)
        support, correct = torch.cat(self.support), torch.cat(self.correct)
        out = {
            "eps_perplexity": math.exp(-self.sums["log_eps"] / n),
            "sparsemax_score": self.sums["sparsemax_score"] / n,
            "js_divergence": self.sums["js_divergence"] / n,
            "accuracy": float(correct.sum()) / n,
            "support_mean": float(support.mean()),
            "support_p95": float(torch.quantile(support, 0.95)),
            "ece": calibration_error(torch.cat(self.confidence), correct),
            "tokens": self.n,
        }
        if self.softmax_nll is not None:
            out["softmax_perplexity"] = math.exp(self.softmax_nll / n)
        return out


def distinct_n(sequences, n: int) -> float:
    """Distinct n-grams over all n-grams of the token sequences (Li et al. 2016), 4 decimals."""
    grams = [tuple(s[i:i + n]) for s in sequences for i in range(len(s) - n + 1)]
    return round(len(set(grams)) / len(grams), 4) if grams else 0.0
