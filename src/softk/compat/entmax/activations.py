"""entmax.activations on softk: ``sparsemax``, ``entmax15`` and their modules.

Same names, arguments and defaults as the entmax package (master, which adds
``return_support_size`` to 1.3's signatures).  ``k``, entmax's partial-sort
hint, is checked and otherwise ignored: softk's exact solvers give the same
result whatever it is.
"""

from __future__ import annotations

import torch
from torch import nn

from ..._maps.simplex import entmax15 as _entmax15
from ..._maps.simplex import sparsemax as _sparsemax
from ..._maps.support import support as _support
from ._checks import check_k_hint, check_module_dim, check_x_dim, support_size

__all__ = ["sparsemax", "entmax15", "Sparsemax", "Entmax15"]


def sparsemax(X, dim=-1, k=None, return_support_size=False):
    """sparsemax: the Euclidean projection onto the simplex, ``softk.sparsemax(X, dim)``.

    Solves  min_p ||x − p||²  s.t.  p >= 0, sum(p) == 1  (Martins & Astudillo, 2016).

    Args:
        X: the input tensor.
        dim: the dimension along which to apply sparsemax.
        k: entmax's partial-sort hint (None or an int >= 1); accepted, no effect.
        return_support_size: also return the number of non-zeros along ``dim``
            (an int64 tensor with size 1 there).

    >>> import torch
    >>> sparsemax(torch.tensor([-2.0, 0.0, 0.5]), dim=0)
    tensor([0.0000, 0.2500, 0.7500])
    """
    dim = check_x_dim(X, dim)
    check_k_hint(k)
    P = _sparsemax(X, dim)
    return (P, support_size(P, dim)) if return_support_size else P


def entmax15(X, dim=-1, k=None, return_support_size=False):
    """1.5-entmax, exactly: ``softk.entmax15(X, dim)``.

    Solves  max_p ⟨x, p⟩ − H_1.5(p)  s.t.  p >= 0, sum(p) == 1  (Peters et al., 2019).
    Arguments as :func:`sparsemax`.

    >>> import torch
    >>> entmax15(torch.tensor([-2.0, 0.0, 0.5]), dim=0)
    tensor([0.0000, 0.3260, 0.6740])
    """
    dim = check_x_dim(X, dim)
    check_k_hint(k)
    P = _entmax15(X, dim)
    return (P, support_size(P, dim)) if return_support_size else P


class _Activation(nn.Module):
    def __init__(self, dim=-1, k=None, return_support_size=False):
        super().__init__()
        check_k_hint(k)
        self.dim, self.k, self.return_support_size = check_module_dim(dim), k, return_support_size

    def extra_repr(self) -> str:
        return f"dim={self.dim}, k={self.k}, return_support_size={self.return_support_size}"


class Sparsemax(_Activation):
    """:func:`sparsemax` as a module (arguments checked at construction)."""

    def forward(self, X):
        return sparsemax(X, dim=self.dim, k=self.k, return_support_size=self.return_support_size)


class Entmax15(_Activation):
    """:func:`entmax15` as a module (arguments checked at construction)."""

    def forward(self, X):
        return entmax15(X, dim=self.dim, k=self.k, return_support_size=self.return_support_size)


# entmax's private threshold helpers, kept so that code (and entmax's own
# test-suite) calling them runs: (tau, support_size) with dim kept, such that
# sparsemax(X) = clamp(X − tau, 0) and, for entmax's pre-halved X,
# entmax15(2X) = clamp(X − tau, 0)².
def _sparsemax_threshold_and_support(X, dim=-1, k=None):
    dim = check_x_dim(X, dim)
    s = _support(X, "sparsemax", dim=dim)
    return _reproducing(s.lam, X, dim), s.size.unsqueeze(dim)


def _entmax_threshold_and_support(X, dim=-1, k=None):
    dim = check_x_dim(X, dim)
    s = _support(X, "entmax15", dim=dim, tau=0.5)  # λ of entmax15(2X) in 2X's units
    return _reproducing(s.lam / 2, X, dim), s.size.unsqueeze(dim)


def _reproducing(lam, X, dim):
    """λ with dim kept, in X's dtype; on a row of one finite entry, where
    softk.support gives −inf (every finite entry has p = 1), max X − 1, which
    gives that p = 1 in both identities above, and 0 on a row with none
    (p = 0 there)."""
    top = X.detach().amax(dim).to(lam.dtype)
    lam = torch.where(lam == float("-inf"), torch.where(torch.isfinite(top), top - 1, 0.0), lam)
    return lam.unsqueeze(dim).to(X.dtype)
