"""The threshold-map core: p = f(x/τ − λ) with Σp = k.

``families`` says what each map is, ``solve`` finds λ, ``function`` holds the one
autograd function and the row conventions (masks, saturated and NaN rows).
"""

from .families import (
    ENTMAX15,
    EXP,
    LAPLACE,
    SIGMOID,
    SOFTMAX,
    SPARSE,
    SPARSEMAX,
    THRESHOLD_METHODS,
    Family,
    entmax_family,
)
from .function import ThresholdFunction, threshold_forward, threshold_map, threshold_vjp
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
    "ThresholdFunction",
    "threshold_forward",
    "threshold_map",
    "threshold_vjp",
    "solve_lambda",
]
