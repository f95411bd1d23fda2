r"""Where softk's attention meets context parallelism: a hook that :mod:`softk.distributed` fills.

Inside :func:`softk.distributed.context_parallel`, every call of
:func:`softk.attention.scaled_dot_product_attention` (and so every model
whose attention is softk's: the transformers integration, ``softk.nn``)
is a call on this rank's shard of the sequence, and goes to the
context-parallel attention that the context installed here.  Why a hook:
``softk.distributed`` sits above ``softk.attention`` (docs/architecture.md),
which may not import it.

torch's own ``context_parallel`` only reroutes
``torch.nn.functional.scaled_dot_product_attention`` (and torchtitan's CP
only its own attention modules, through torch's DTensor handlers); softk's
attention called there would attend to the local keys alone, a silently
wrong answer, so :func:`refuse_foreign` refuses it and names the context
to use.
"""

from __future__ import annotations

import sys

_route = None
_TORCH_CP = "torch.distributed.tensor.experimental._context_parallel._attention"


def set_route(route):
    """Install ``route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, *, map, alpha,
    softcap)`` for the calls that follow (None: none); returns the previous one."""
    global _route
    previous, _route = _route, route
    return previous


def current():
    """The installed route, or None."""
    return _route


def refuse_foreign(what: str) -> None:
    """Raise if torch's context parallelism is on (its SDPA patched by ``context_parallel``, or its
    DTensor attention handlers installed, as torchtitan's CP does) and softk's is not."""
    cp = sys.modules.get(_TORCH_CP)
    if cp is None or _route is not None:
        return
    import torch.nn.functional as F

    patched = F.scaled_dot_product_attention in getattr(cp, "_replaced_functions", {})
    handlers = getattr(getattr(getattr(cp, "DTensor", None), "_op_dispatcher", None), "_custom_op_handlers", {})
    if patched or any(op in handlers for op in getattr(cp, "custom_ops", ())):
        raise ValueError(
            f"{what} was called while torch's context parallelism is on, which shards the sequence but reroutes "
            "only torch's own SDPA: softk's attention would see this rank's keys alone.  Use "
            "softk.distributed.context_parallel(mesh, buffers=..., buffer_seq_dims=...) in place of torch's "
            "context_parallel (the same arguments; it enters torch's context and routes softk's attention through "
            "the group)"
        )
