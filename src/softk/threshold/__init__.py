"""The threshold-map core: p = f(x/τ − λ) with Σp = k, as mathematics.

``families`` says what each map is, ``solve`` finds λ (``fast_paths``,
``entmax_anchor`` its exact special cases), ``rows`` holds the row prelude
and conventions and ``entmax_alpha`` the map and ∂p/∂α for a tensor α.
Nothing here picks a backend: :mod:`softk._backends` runs these maths (the
torch kernel, :mod:`softk._backends.torch.threshold`, is the reference
forward and backward), and :mod:`softk._ops` holds the
autograd rules every backend runs under (``threshold_map``).  The bottom
floor: every package may import it, and it imports only ``softk._validate``.
"""

from .families import ENTMAX15, EXP, LAPLACE, SIGMOID, SOFTMAX, SPARSE, SPARSEMAX, THRESHOLD_METHODS  # noqa: F401
from .families import Family, entmax_family  # noqa: F401
from .solve import solve_lambda

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
]
