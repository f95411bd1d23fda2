"""Transitional re-exports (removed once every importer moved to rows/torch_path/op)."""

from .rows import compute_dtype, row_status  # noqa: F401
from .torch_path import forward as threshold_forward  # noqa: F401
from .torch_path import vjp_from_slope as threshold_vjp  # noqa: F401
from .op import threshold_map  # noqa: F401
