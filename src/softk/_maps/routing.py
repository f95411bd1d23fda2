r"""Routing for mixture-of-experts layers: the k experts of each token and
their gate weights, from any map of softk.

A router scores n experts per token and sends the token to k of them, with a
weight per chosen expert:

.. math:: p = \mathrm{map}(x/\tau), \qquad I = \operatorname{top}_k(x), \qquad
          w_j = p_{I_j} \; \Big(/ \textstyle\sum_{j} p_{I_j} \text{ if normalize}\Big).

Every map of softk is monotone in the scores, so the k largest scores are the
k largest weights: I is the top-k of x (ties to the lower index, as
:func:`softk.hard_topk`).  The common routers are special cases:

* ``method="softmax"`` (DeepSeek-style: softmax over all experts, then top-k),
  and with ``normalize=True`` exactly Mixtral's softmax over the top-k logits;
* ``method="sparsemax"`` / ``"entmax15"`` / ``"entmax"``: a weight is exactly
  0 where the map's support is smaller than k, so a token uses as many
  experts as its scores justify (at most k) — a router with a dynamic k;
* the soft top-k methods (``"exp"``, ``"sigmoid"``, ``"laplace"``,
  ``"sparse"``): p has Σp = k and 0 ≤ p ≤ 1, each weight says how surely that
  expert is among the k.

The weights carry the map's gradient (through the gather, into the map's own
backward); the indices carry none.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._validate import check_choice, check_dim, check_input, check_k, check_tau
from .simplex import entmax, entmax15, softmax, sparsemax
from ..threshold.families import THRESHOLD_METHODS
from .soft_topk import soft_topk

SIMPLEX_MAPS = {"softmax": softmax, "sparsemax": sparsemax, "entmax15": entmax15}
METHODS = tuple(SIMPLEX_MAPS) + ("entmax",) + tuple(THRESHOLD_METHODS)


class Route(NamedTuple):
    """The gate weights and the chosen experts, both shaped like the scores
    with ``dim`` of size k (``indices`` int64, ``weights`` in the scores' dtype)."""

    weights: Tensor
    indices: Tensor


def route(scores: Tensor, k: int, method: str = "softmax", *, dim: int = -1, tau: float = 1.0,
          alpha=None, normalize: bool = False) -> Route:
    r"""The top-k experts of each row of ``scores`` and their weights under ``method``.

    .. math:: w_j = p_{I_j}, \quad p = \mathrm{map}(x/\tau), \quad I = \operatorname{top}_k(x)

    Args:
        scores: router logits, any shape with the experts along ``dim``.
        k: experts per token, an int in [1, n].
        method: "softmax", "sparsemax", "entmax15", "entmax" (with ``alpha``),
            or a soft top-k method "exp", "sigmoid", "laplace", "sparse"
            (then Σp = k over all experts).
        dim: the experts' dimension.
        tau: temperature > 0.
        alpha: entmax's α (a float >= 1) for ``method="entmax"``.
        normalize: divide the k weights by their sum (a row whose weights are
            all 0 keeps zeros).  With "softmax" this is softmax over the top-k
            logits (Mixtral).

    Returns:
        ``Route(weights, indices)``.  Ties go to the lower index.  ``-inf``
        scores are masked: a row with fewer than k finite scores also lists
        masked experts, with weight 0.  A row with a NaN or +inf score has
        NaN weights.

    >>> import torch, softk
    >>> r = softk.route(torch.tensor([[0.0, 2.0, 1.9, -1.0]]), k=2, method="sparsemax")
    >>> r.indices.tolist(), [round(w, 4) for w in r.weights[0].tolist()]
    ([[1, 2]], [0.55, 0.45])
    >>> softk.route(torch.tensor([[0.0, 3.0, 1.0, -1.0]]), k=2, method="sparsemax").weights
    tensor([[1., 0.]])
    """
    check_input(scores, "scores")
    dim = check_dim(scores, dim)
    check_choice(method, METHODS, "method")
    k = check_k(k, scores.shape[dim] if scores.dim() else 1)
    tau = check_tau(tau, allow_grad=True, x=scores)
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    if alpha is not None and method != "entmax":
        raise ValueError(f"alpha applies to method='entmax' only, got method={method!r}")
    p = probabilities(scores, method, k, dim=dim, tau=tau, alpha=alpha)
    # A stable descending sort: ties to the lower index, as hard_topk.
    indices = torch.sort(scores.detach(), dim=dim, descending=True, stable=True).indices.narrow(dim, 0, k)
    weights = p.gather(dim, indices)
    if normalize:
        total = weights.sum(dim, keepdim=True)
        weights = weights / torch.where(total > 0, total, torch.ones_like(total))
    return Route(weights, indices)


def probabilities(scores: Tensor, method: str, k=None, *, dim: int = -1, tau=1.0, alpha=None) -> Tensor:
    """The router's map of ``scores`` over the experts (``dim``): p of every
    expert under ``method`` (one of :data:`METHODS`), before any top-k.  ``k``
    is Σp for the soft top-k methods (any real in (0, n]), ``alpha`` entmax's α
    (default 1.5).  Arguments are checked by the map called."""
    if method == "entmax":
        return entmax(scores, 1.5 if alpha is None else alpha, dim=dim, tau=tau)
    if method in SIMPLEX_MAPS:
        return SIMPLEX_MAPS[method](scores, dim=dim, tau=tau)
    return soft_topk(scores, k, dim=dim, tau=tau, method=method)
