"""softk's ``scaled_dot_product_attention``: torch's signature, with the map as an argument."""

from __future__ import annotations

from torch import Tensor

from . import _context
from .checks import check_call
from .op import attention as _attention


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale=None, enable_gqa: bool = False, *,
                                 map: str = "entmax15", alpha=None, softcap=None) -> Tensor:
    r"""Attention with a sparse map, ``map="entmax15"`` by default (torch's is softmax): O = map(scale·QKᵀ + M) V.

    .. math:: \begin{gathered} O_i = \sum_j p_{ij} v_j, \qquad p_{ij} = f(s_{ij} - \lambda_i), \quad \sum_j p_{ij} = 1,
              \\ s_{ij} = \mathrm{scale}\; q_i\cdot k_j + M_{ij}, \end{gathered}

    with :math:`f(u) = e^u` (softmax), :math:`\max(u, 0)` (sparsemax, Martins &
    Astudillo 2016, §4.3), :math:`(u/2)_+^2` (1.5-entmax) or
    :math:`[(\alpha-1)u]_+^{1/(\alpha-1)}` (α-entmax, Peters et al. 2019); a
    tensor α, one per head, may be learned (the adaptively sparse transformer
    of Correia et al. 2019).  Keys with :math:`s_{ij} \le \lambda_i` get exactly
    zero weight.

    The arguments and conventions are those of
    ``torch.nn.functional.scaled_dot_product_attention``:

    Args:
        query: (…, H, L, E).
        key: (…, H_kv, S, E).
        value: (…, H_kv, S, Ev).  The three share one floating dtype (float64,
            float32, float16, bfloat16; half precision accumulates in float32)
            and one device; the leading dimensions broadcast.
        attn_mask: None, a bool tensor (True = the key takes part) or a float
            tensor of the query's dtype added to the scores, broadcastable to
            (…, H, L, S).  It gets no gradient (one that requires grad is refused).
        dropout_p: must be 0.0: dropout on the attention weights is **not
            supported** (a ValueError says so).
        is_causal: hide key j from query i when j > i (torch's top-left
            alignment, also when L ≠ S); combined with ``attn_mask``.
        scale: the factor of q·k, default 1/√E.
        enable_gqa: grouped-query attention: H a multiple of H_kv, query head
            h reads key/value head h // (H / H_kv).  Without it H_kv must be
            H or 1.
        map: "softmax", "sparsemax", "entmax15" (default) or "entmax".
        alpha: α of map="entmax": a float (default 1.5), or a tensor of
            shape (H,), one α per head; a tensor that requires grad gets its
            gradient.  α must lie in (1, 2] for float32, float16 and
            bfloat16 inputs and in (1, 3] for float64
            (:func:`softk.attention.checks.alpha_range`; the range Correia
            et al. and AdaSplash learn α in is (1, 2]).  Above it the map
            is not Lipschitz at the support's edge and the rounding of q·k
            moves p and the gradients; use :func:`softk.entmax` on the
            scores there.
        softcap: None, or c > 0: the scaled products are capped to
            c·tanh(q·k·scale / c) before the mask and the map, as Gemma 2
            caps its attention logits; the gradients go through the cap.
            Every backend takes it (the fused Triton kernels too).

    Returns:
        (…, H, L, Ev) in the query's dtype.  ``map="softmax"`` is torch's
        SDPA.  A query row whose keys are all masked gives an output of 0
        and zero gradients (torch's SDPA gives NaN there on some backends);
        a row with a single key takes that key's value.

    Backends (chosen from ``softk.backend()``, see :mod:`softk.attention.op`):
    "torch" materialises the (…, H, L, S) scores and supports double
    backward; "auto" and "native" on the CPU, or any device without Triton,
    run blocks of keys and never hold the L×S scores; "auto" on CUDA and
    "triton" run the fused Triton kernels, float64 inputs the blocks of
    keys.
    The memory-efficient backends raise NotImplementedError on double
    backward.

    Example (a query that attends to one of three keys):

    >>> import torch, softk.attention as sa
    >>> q = torch.tensor([[[4.0, 0.0]]])                 # (H=1, L=1, E=2)
    >>> k = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])
    >>> v = torch.tensor([[[1.0], [2.0], [3.0]]])
    >>> sa.scaled_dot_product_attention(q, k, v, map="sparsemax", scale=1.0)
    tensor([[[1.]]])
    >>> sa.scaled_dot_product_attention(q, k, v, map="softmax", scale=1.0)
    tensor([[[1.0186]]])
    """
    route = _context.current()
    if route is not None:  # inside softk.distributed.context_parallel: this rank's shard of the sequence
        return route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, map=map, alpha=alpha,
                     softcap=softcap)
    _context.refuse_foreign("softk.attention.scaled_dot_product_attention")
    return local_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, map=map,
                           alpha=alpha, softcap=softcap)


def local_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask=None, dropout_p: float = 0.0,
                    is_causal: bool = False, scale=None, enable_gqa: bool = False, *, map: str = "entmax15",
                    alpha=None, softcap=None) -> Tensor:
    """:func:`scaled_dot_product_attention` on the tensors at hand, outside any context parallelism."""
    call = check_call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, map, alpha, softcap)
    return _attention(call)
