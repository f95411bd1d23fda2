"""``torch.nn`` modules wrapping softk's functions (see each function for the maths)."""

from .maps import Entmax, Entmax15, Sparsemax, SoftTopK

__all__ = ["Sparsemax", "Entmax15", "Entmax", "SoftTopK"]
