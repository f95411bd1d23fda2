r"""The threshold families, public: what each map p = f(x/τ − λ), Σp = k *is*.

Each :class:`Family` carries f, f′ (also written through p, for the backward),
the potential's F, the conjugate ψ (the regulariser Ω(p) = Σψ(p_i)), how λ is
found, and which kernels serve it.  Use them where a function takes a family,
e.g. :func:`softk.losses.fenchel_young_loss`:

>>> import torch, softk
>>> softk.losses.fenchel_young_loss(torch.tensor([[0.0, 1.0, 3.0]]), torch.tensor([2]), softk.families.SPARSEMAX)
tensor(0.)
>>> softk.families.entmax(1.3).name
'entmax'
"""

from .threshold.families import ENTMAX15, EXP, KERNEL_IDS, LAPLACE, SIGMOID, SOFTMAX, SPARSE, SPARSEMAX  # noqa: F401
from .threshold.families import THRESHOLD_METHODS, Family  # noqa: F401
from .threshold.families import entmax_family as entmax

__all__ = ["Family", "SOFTMAX", "SPARSEMAX", "ENTMAX15", "EXP", "SIGMOID", "LAPLACE", "SPARSE", "THRESHOLD_METHODS", "KERNEL_IDS", "entmax"]
