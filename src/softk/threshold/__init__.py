"""The threshold-map core: p = f(x/τ − λ) with Σp = k.

``families`` says what each map is, ``solve`` finds λ, ``rows`` holds the row
prelude and conventions, ``torch_path`` the reference forward and backward,
and ``op`` the one autograd contract that every backend runs under
(:mod:`softk.dispatch` picks the backend).
"""

from .families import ENTMAX15, EXP, LAPLACE, SIGMOID, SOFTMAX, SPARSE, SPARSEMAX, THRESHOLD_METHODS  # noqa: F401
from .families import Family, entmax_family  # noqa: F401
from .solve import solve_lambda
from .op import threshold_map

__all__ = [
    "Family",
    "EXP",
    "SIGMOID",
    "LAPLACE",
    "SPARSE",
    "SOFTMAX",
    "SPARSEMAX",
    "ENTMAX15",
    "THRESHOLD_METHODS",
    "entmax_family",
    "solve_lambda",
    "threshold_map",
]
