r"""The losses that are taken by name, and what each one is: the one table :data:`LOSSES`.

Every entry point that takes a loss by name (``fused_linear_loss``,
``nn.FusedLinearLoss``, ``vocab_parallel_loss``,
``vocab_parallel_fused_linear_loss``, the DTensor entry, ``apply_softk``,
torchtitan's ``SoftkLoss`` and ``megatron_loss``) reads it here, through a
:class:`LossKind`: the public function the name stands for, the options it
takes and their defaults, the target kinds, the threshold family of its map
and the one-pass forms of the fused loss.  A name is a record, never a
string that some other module switches on: a loss added here reaches every
entry point, and one that an entry point cannot serve is refused there by
what the record says (its targets, its family), not by a list of names.

The options themselves, checked once for every entry point, are
:class:`softk.losses._options.LossOptions`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple, Optional

import torch
from torch import Tensor

from .._maps.simplex import entmax, entmax15, softmax, sparsemax
from .._maps.soft_topk import soft_topk
from ..threshold.entmax_anchor import needs_anchor
from ..threshold.families import ENTMAX15, SOFTMAX, SPARSEMAX, THRESHOLD_METHODS, Family, entmax_by_alpha
from ._cross_entropy import ce_in_place, cross_entropy
from ._fy_live import live_in_place
from ._topk_softmax_ce import topk_softmax_cross_entropy
from ._tiles import TileMap
from ._ts2 import ts2_in_place, ts2_loss
from .simplex_losses import entmax15_loss, entmax_loss, softmax_loss, sparsemax_loss
from .topk_loss import soft_topk_loss

if TYPE_CHECKING:
    from ._options import LossOptions

#: An option a loss cannot do without (entmax's α): no default.
REQUIRED = object()

# A public loss's parameter that is named otherwise among the options (torch's ``weight``).
_FIELD_OF = {"weight": "class_weight"}
_PARAMETERS: dict = {}  # LossKind.parameters, per function


class LossKind(NamedTuple):
    """One loss name: what it computes, what it takes, and how the fused and
    vocab-parallel losses run it.  Every function field takes the checked
    :class:`~softk.losses._options.LossOptions` ``o``."""

    name: str
    function: Callable  # the public loss of softk.losses this name stands for
    # the options beyond the shared ones, each with its default here (REQUIRED: none)
    options: Mapping[str, object]
    targets: str  # "index" (class indices), "dense" (rows summing to k) or "both"
    # The threshold family of the loss's map: label smoothing's Ω(q), and the λ
    # that the vocab-parallel loss finds (None: the loss has no threshold map).
    family: Callable[["LossOptions"], Optional[Family]]
    # The number of classes with p > 0 in each row of z (C, V), p the loss's map
    # at z/τ (the fused loss's statistics).
    support: Callable[["LossOptions", Tensor], Tensor]
    # Whether the gradient is exactly 0 outside the union of the rows' supports
    # and targets (before the knobs), so that the fused backward may run on
    # those columns only.
    sparse_grad: Callable[["LossOptions"], bool]
    smoothed: bool = False  # takes label smoothing (the loss at (1 − ε)y + ε/V)
    # Torch's cross-entropy: −log p_y with no Ω(y) term, and class weights and
    # label smoothing by F.cross_entropy's own formula (the function takes
    # them; every other loss is weighted and smoothed row by row around it).
    torch_cross_entropy: bool = False
    # The fused loss's one-pass forms, where they exist (the chunk's rows and
    # its gradient without autograd): ``in_place(o)`` overwrites the logits
    # with G; ``live_in_place(o)`` returns G on its live columns only.
    in_place: Optional[Callable[["LossOptions"], Callable]] = None
    live_in_place: Optional[Callable[["LossOptions"], Callable]] = None
    # The loss's map as the fused loss's walk over vocabulary blocks takes it
    # (:class:`softk.losses._tiles.TileMap`): the gradient of a block of
    # classes from a few numbers per row.  None (or a None result): the walk
    # does not serve this loss, or these options.
    tiles: Optional[Callable[["LossOptions"], Optional[TileMap]]] = None

    @property
    def parameters(self) -> tuple:
        """(the function's parameter, the option it reads) for each parameter after
        (input, target), read off its signature once."""
        found = _PARAMETERS.get(self.function)
        if found is None:
            names = list(inspect.signature(self.function).parameters)[2:]
            found = _PARAMETERS[self.function] = tuple((p, _FIELD_OF.get(p, p)) for p in names)
        return found

    @property
    def public_name(self) -> str:
        """The name of :attr:`function` in :mod:`softk.losses` (the DTensor entry's key)."""
        return self.function.__name__

    def arguments(self, o: "LossOptions", **override) -> dict:
        """The keyword arguments of :attr:`function` from ``o`` (``override`` replaces some)."""
        kw = {p: getattr(o, name) for p, name in self.parameters}
        kw.update(override)
        return kw

    def rows(self, o: "LossOptions") -> Callable[[Tensor, Tensor], Tensor]:
        """``fn(logits (C, V), target) -> (C,)``: :attr:`function` with reduction "none"."""
        kw = self.arguments(o, reduction="none")
        return lambda z, t: self.function(z, t, **kw)


def _count(p: Tensor) -> Tensor:
    return (p > 0).sum(-1)


def _always(o) -> bool:
    return True


def _never(o) -> bool:
    return False


def _ce_in_place(o):
    return ce_in_place(o.ignore_index, o.tau)


def _live(fmap, family):
    return lambda o: live_in_place(fmap, family, o.ignore_index, o.tau)


def _tiles(fmap, family, f_):
    return lambda o: TileMap(lambda z: fmap(z, tau=o.tau), family, f_=f_)


# the families' f in place, for the walk's tiles
_EXP_ = torch.Tensor.exp_


def _relu_(u):
    return u.clamp_(min=0.0)


def _half_square_(u):
    return u.clamp_(min=0.0).square_().mul_(0.25)


def _entmax_tiles(o):
    # near α = 1 (and above 2) p = f(z/τ − λ) from a float λ loses digits (the
    # solver's anchored form is needed): the row-chunk pass serves those α
    if needs_anchor(o.alpha):
        return None
    return TileMap(lambda z: entmax(z, o.alpha, tau=o.tau), entmax_by_alpha(o.alpha))


_KINDS = (
    LossKind("cross_entropy", cross_entropy, {}, "both", lambda o: SOFTMAX,
             lambda o, z: _count(softmax(z, tau=o.tau)), _never, smoothed=True, torch_cross_entropy=True,
             in_place=_ce_in_place, tiles=_tiles(softmax, SOFTMAX, _EXP_)),
    LossKind("softmax", softmax_loss, {}, "both", lambda o: SOFTMAX,
             lambda o, z: _count(softmax(z, tau=o.tau)), _never, smoothed=True, in_place=_ce_in_place,
             tiles=_tiles(softmax, SOFTMAX, _EXP_)),
    LossKind("sparsemax", sparsemax_loss, {}, "both", lambda o: SPARSEMAX,
             lambda o, z: _count(sparsemax(z, tau=o.tau)), _always, smoothed=True,
             live_in_place=_live(sparsemax, SPARSEMAX), tiles=_tiles(sparsemax, SPARSEMAX, _relu_)),
    LossKind("entmax15", entmax15_loss, {}, "both", lambda o: ENTMAX15,
             lambda o, z: _count(entmax15(z, tau=o.tau)), _always, smoothed=True,
             live_in_place=_live(entmax15, ENTMAX15), tiles=_tiles(entmax15, ENTMAX15, _half_square_)),
    # (loss_options leaves no required option None: α is a number here)
    LossKind("entmax", entmax_loss, {"alpha": REQUIRED}, "both", lambda o: entmax_by_alpha(o.alpha),  # type: ignore[arg-type]
             lambda o, z: _count(entmax(z, o.alpha, tau=o.tau)), _always, smoothed=True, tiles=_entmax_tiles),
    # soft top-k: the family is the method's; its gradient is sparse with "sparse" (clip) only
    LossKind("soft_topk", soft_topk_loss, {"k": 1, "method": "exp"}, "dense", lambda o: THRESHOLD_METHODS[o.method],
             lambda o, z: _count(soft_topk(z, o.k, tau=o.tau, method=o.method)), lambda o: o.method == "sparse"),
    # Su's top-k softmax cross-entropy: no threshold map, and exactly min(k, V) classes in the softmax
    LossKind("topk_softmax_ce", topk_softmax_cross_entropy, {"k": 1}, "index", lambda o: None,
             lambda o, z: torch.full(z.shape[:-1], min(o.k, z.shape[-1]), device=z.device), _always),
    # TS²: its first term is the sparsemax loss; its penalty gives every class a gradient
    # (loss_options fills in the suppression's default: it is a number here)
    LossKind("ts2", ts2_loss, {"suppression": 1.0, "adaptive": False}, "index", lambda o: SPARSEMAX,
             lambda o, z: _count(sparsemax(z, tau=o.tau)), _never,
             in_place=lambda o: ts2_in_place(o.ignore_index, o.tau, o.suppression, o.adaptive),  # type: ignore[arg-type]
             tiles=lambda o: TileMap(lambda z: sparsemax(z, tau=o.tau), SPARSEMAX, ts2=True, f_=_relu_)),
)

#: The one table of loss names.
LOSSES: dict = {kind.name: kind for kind in _KINDS}
#: The default ``loss`` of every entry point: torch's, Megatron's and Liger's.
DEFAULT_LOSS = "cross_entropy"
