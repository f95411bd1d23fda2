"""The options of a loss taken by name, and the one function that checks them.

Every entry point that takes a loss by name builds its options with
:func:`loss_options`, passing the fields it accepts (the vocab-parallel loss
has no knobs and no chunk size, torchtitan's adapter a fixed
``ignore_index``); a field it does not pass keeps the default of
:class:`LossOptions`, the one set of defaults of them all.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from torch import Tensor

from .._validate import check_alpha, check_chunk_size, check_choice, check_module_k, check_tau
from ..threshold.families import THRESHOLD_METHODS
from ._knobs import Knobs, check_knobs
from ._registry import DEFAULT_LOSS, LOSSES, REQUIRED, LossKind
from ._ts2 import check_suppression
from .targets import check_ignore_index, check_reduction


class LossOptions(NamedTuple):
    """A loss name and its options, checked (see :func:`loss_options`).

    ``alpha``, ``k``, ``method``, ``suppression`` and ``adaptive`` belong to
    the losses whose :attr:`LossKind.options` list them; ``softcap``,
    ``label_smoothing``, ``class_weight`` and ``z_loss`` are the fused
    losses' knobs.  ``suppression`` None stands for TS²'s default (1.0, filled
    in by :func:`loss_options`)."""

    loss: str = DEFAULT_LOSS
    alpha: Optional[float] = None
    k: int = 1
    method: str = "exp"
    tau: float = 1.0
    ignore_index: int = -100
    reduction: str = "mean"
    chunk_size: Optional[int] = None
    softcap: Optional[float] = None
    label_smoothing: float = 0.0
    class_weight: Optional[Tensor] = None
    z_loss: float = 0.0
    suppression: Optional[float] = None
    adaptive: bool = False

    @property
    def kind(self) -> LossKind:
        return LOSSES[self.loss]

    @property
    def knobs(self) -> Knobs:
        return Knobs(self.softcap, self.label_smoothing, self.class_weight, self.z_loss)

    @property
    def sparse_grad(self) -> bool:
        """Whether the gradient is exactly 0 outside the union of the rows'
        supports and targets, so that the fused losses' backward may run on
        those columns only (:func:`softk._ops.fused_linear.live_columns`).
        Label smoothing and the z-loss give every class a gradient; the
        softcap and class weights keep zeros zero."""
        return self.kind.sparse_grad(self) and not self.label_smoothing and not self.z_loss


#: The defaults of every entry point that takes a loss by name.
DEFAULTS = LossOptions()

# The options that belong to some losses only (each LossKind.options says which), in the
# order they are checked: k's check reads the method.
_OWN = ("method", "alpha", "k", "suppression", "adaptive")


def _check_adaptive(adaptive, o):
    if not isinstance(adaptive, bool):
        raise TypeError(f"adaptive must be a bool, got {type(adaptive).__name__}")
    return adaptive


_CHECKS = {
    "method": lambda v, o: check_choice(v, tuple(THRESHOLD_METHODS), "method"),
    "alpha": lambda v, o: check_alpha(v, None, -1),
    "k": lambda v, o: check_module_k(v, o.method),
    "suppression": lambda v, o: check_suppression(v),
    "adaptive": _check_adaptive,
}
_NEEDS = {"alpha": "a float >= 1"}  # what a required option is, for the message


def _takers(option) -> str:
    return " and ".join(repr(name) for name, kind in LOSSES.items() if option in kind.options)


def loss_options(loss=DEFAULT_LOSS, *, dense=None, vocab=None, device=None, dtype=None, **given) -> LossOptions:
    """``loss`` (a name of :data:`~softk.losses._registry.LOSSES`) and the
    options ``given`` (fields of :class:`LossOptions`), checked: each raises
    a ValueError or TypeError that names it.

    An option of some losses only is refused with any other loss when set
    (``method`` is checked, and used by soft top-k only); one its loss needs
    and was not given takes the loss's default, or is refused (entmax's α).
    ``dense`` says whether the target is dense (class weights apply to class
    indices only; None: dense when the loss takes nothing else);
    ``class_weight`` must have ``vocab`` entries when that is given, and comes
    back a float tensor on ``device`` (float64 for ``dtype`` float64 scores).
    """
    check_choice(loss, tuple(LOSSES), "loss")
    kind = LOSSES[loss]
    o = LossOptions(loss, **given)
    own: dict[str, Any] = {}  # the checked options, each of its own type
    for name in _OWN:
        value = getattr(o, name)
        if name in kind.options:
            if value is None:
                value = kind.options[name]
            if value is REQUIRED:
                raise ValueError(f"loss={loss!r} needs {name}, {_NEEDS.get(name, 'a value')}, got None")
            own[name] = _CHECKS[name](value, o._replace(**own))
        elif name == "method":
            own[name] = _CHECKS[name](value, o)
        elif value != getattr(DEFAULTS, name):
            raise ValueError(f"{name} applies to loss={_takers(name)} only, got {name}={value!r} with loss={loss!r}")
    knobs = check_knobs(loss, softcap=o.softcap, label_smoothing=o.label_smoothing, class_weight=o.class_weight,
                        z_loss=o.z_loss, dense=kind.targets == "dense" if dense is None else dense, vocab=vocab,
                        device=device, dtype=dtype)
    if knobs.label_smoothing and not kind.smoothed:
        smoothed = [name for name, k in LOSSES.items() if k.smoothed]
        raise ValueError(f"label_smoothing is not defined for loss={loss!r}; it applies to {smoothed}, got "
                         f"label_smoothing={knobs.label_smoothing}")
    return o._replace(**own, **knobs._asdict(), reduction=check_reduction(o.reduction),
                      ignore_index=check_ignore_index(o.ignore_index), chunk_size=check_chunk_size(o.chunk_size),
                      tau=check_tau(o.tau))


#: The fields of :class:`LossOptions`, in order.
FIELDS = LossOptions._fields
