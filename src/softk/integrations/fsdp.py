r"""softk's fused linear loss on an output layer sharded by FSDP2 (``torch.distributed.fsdp.fully_shard``).

Under FSDP2 a parameter is a DTensor shard outside its unit's forward.  The
unit's forward pre-hook all-gathers the unit's parameters and puts the full
tensors on the modules; its forward hook puts the shards back
(``reshard_after_forward``, the default for every unit but the root) and
registers the unit's pre-backward hook on the forward's output tensors, which
all-gathers again before the backward needs the weight; the tensors the
forward took get a post-backward hook, which reduce-scatters the gradient
into the sharded parameter's ``.grad``.  An LM head wrapped as a unit of its
own (``fully_shard(model.lm_head)``), or grouped with the final norm as
torchtitan does (``fully_shard([model.norm, model.lm_head])``), therefore
holds its full weight only while its unit's forward runs:
``fused_linear_loss(hidden, head.weight, target)`` called after it reads the
shard.

:func:`call_in_unit` runs a function *as* the module's forward: the module is
called (its ``__call__``, so FSDP's hooks run as for the module's own
forward) with its ``forward`` replaced by the function for that call.  The
function reads the full weight, the pre-forward's all-gather is the only one
of the forward (none at all when a grouped unit is already gathered because
the norm's forward ran), and the function's output (the loss) carries the
pre-backward hook.  This is the order FSDP's ``fully_shard`` documents for
chunked losses: the model's forward runs the norm, then the head is called
on its own.  :func:`fsdp_fused_linear_loss` is
:func:`softk.losses.fused_linear_loss` through it;
:func:`softk.integrations.transformers.apply_softk` uses it when the head is
an FSDP unit.

Nothing here imports ``torch.distributed.fsdp``: a module can only be an FSDP
unit once that package is loaded, which :func:`is_fsdp_unit` looks up in
``sys.modules``.
"""

from __future__ import annotations

import contextlib
import sys

from torch import nn

from .._dtensor import is_dtensor
from ..losses.fused_linear import fused_linear_loss

__all__ = ["fsdp_fused_linear_loss", "call_in_unit", "is_fsdp_unit", "check_weight"]


def is_fsdp_unit(module) -> bool:
    """True if ``fully_shard`` was applied to ``module`` itself, alone or in a list (``fully_shard([norm, head])``)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def call_in_unit(module: nn.Module, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` run as ``module``'s forward, inside the FSDP hooks of ``module``'s unit.

    ``module`` is called with its ``forward`` replaced by ``fn`` for this call
    only, so a hook registered on the module runs around ``fn``: FSDP's
    pre-forward (all-gather, unless the unit's parameters are already
    gathered; post-backward hook on the tensor arguments), then ``fn``, which
    reads the module's full parameters, then the post-forward (reshard;
    pre-backward hook on ``fn``'s output tensors).  ``fn`` receives the
    arguments as the hooks pass them on (FSDP may cast them with a mixed
    precision policy, and wraps them for its post-backward hook): it must
    compute from those, not from the caller's tensors.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    with _forward_replaced(module, fn):
        return module(*args, **kwargs)


def fsdp_fused_linear_loss(head: nn.Linear, input, target, **kwargs):
    """:func:`softk.losses.fused_linear_loss` of ``input`` through ``head``'s weight and bias,
    computed inside ``head``'s FSDP unit.

    Args:
        head: the output layer, an ``nn.Linear`` to which ``fully_shard`` was
            applied, alone (``fully_shard(head)``) or with other modules
            (``fully_shard([norm, head])``).  A module that is no FSDP unit
            is called the same way, its parameters being whole already.
        input, target, **kwargs: as for :func:`~softk.losses.fused_linear_loss`
            (``bias`` is the head's).

    Call it where the model would call the head: inside the root's forward
    when the head is grouped with the final norm, so that the group's
    all-gather for the norm serves the loss (called after the root's forward
    returns, the group has been resharded and gathers once more).  Its
    backward all-gathers the weight as the head's own backward would, and its
    gradient reaches the sharded parameter's ``.grad`` through FSDP's
    reduce-scatter.
    """
    if not isinstance(head, nn.Linear):
        raise TypeError(f"head must be a torch.nn.Linear (the output layer), got {type(head).__name__}")
    if "bias" in kwargs:
        raise TypeError("fsdp_fused_linear_loss takes the bias from head (head.bias); do not pass bias=")

    def loss(x):
        check_weight(head.weight, x)
        return fused_linear_loss(x, head.weight, target, bias=head.bias, **kwargs)

    return call_in_unit(head, loss, input)


SHARDED_WEIGHT = (
    "weight is a DTensor{placements} but input is a plain torch.Tensor: the output layer's weight is "
    "sharded (by FSDP's fully_shard outside its unit's forward, or by tensor parallelism). Under FSDP, compute "
    "the loss inside the head's unit: softk.integrations.fsdp.fsdp_fused_linear_loss(head, input, target, ...), "
    "or apply_softk(model, ...) for a transformers model; with tensor parallelism, use "
    "softk.distributed.vocab_parallel_fused_linear_loss on the local shard"
)


def check_weight(weight, input) -> None:
    """ValueError naming ``weight`` when it is a DTensor and ``input`` is not (an FSDP shard read outside its unit)."""
    if is_dtensor(weight) and not is_dtensor(input):
        placements = getattr(weight, "placements", None)
        raise ValueError(SHARDED_WEIGHT.format(placements=f" (placements {tuple(placements)})" if placements else ""))


@contextlib.contextmanager
def _forward_replaced(module, fn):
    own = module.__dict__.get("forward")  # an instance-level forward already there (another wrapper)
    module.forward = fn
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own
