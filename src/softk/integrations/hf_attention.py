r"""softk's attention inside Hugging Face transformers models.

:func:`register` adds four attention implementations to transformers'
attention interface (``transformers.AttentionInterface``, whose global
mapping ``ALL_ATTENTION_FUNCTIONS`` every model reads) and to its mask
interface (``AttentionMaskInterface``, with the "sdpa" mask builder: a
boolean keep-mask, or None and ``is_causal``):

=======================  =================================================
``softk_softmax``        softmax: the "sdpa" implementation's result
``softk_sparsemax``      sparsemax attention (Martins & Astudillo 2016)
``softk_entmax15``       1.5-entmax attention (Peters et al. 2019)
``softk_entmax_learned`` α-entmax with an α per head and layer, learned
                         (Correia et al. 2019); call :func:`learn_alpha`
                         on the model first
=======================  =================================================

(on transformers < 4.53, without a mask interface, the models' additive
masks are used as they are), so that ``AutoModelForCausalLM.from_config(config,
attn_implementation="softk_entmax15")`` (or ``model.set_attn_implementation``)
runs :func:`softk.attention.scaled_dot_product_attention`.  transformers is
an optional dependency (the ``hf`` extra); importing this module does not
import it.

Packed documents (several documents in one row, as
``DataCollatorWithFlattening`` makes them) attend only to themselves, as with
transformers' flash implementations, which read the packing from the same
signals: ``cu_seq_lens_q`` and ``cu_seq_lens_k`` among the attention kwargs,
or else, when the call brings no mask, ``position_ids`` of one row that
restart.  The "sdpa" mask builder looks for restarting positions only when
there is neither a cache nor a 2-D mask, and a training forward makes a cache
by default, so without this a packed row reached the maps with ``is_causal``
and each document attended to the ones before it.  The packing becomes a
block-diagonal boolean mask (causal within each document), intersected with
the model's own mask, rather than a call of :func:`softk.attention.varlen_attn`
per document: the mask keeps everything the dense call does (padding and
sliding-window masks, the soft cap, a position bias, the learned α) and is
exact, as hidden keys get weight exactly 0; its cost is that of the row's
causal attention, not of the documents alone.  Calls that are not packed keep
``is_causal`` and no mask.  Detecting restarting ``position_ids`` reads their
values (one synchronisation per forward on a GPU: every layer gets the same
tensor, whose document offsets are kept until the next) and is skipped under
``torch.compile``; there, pass the ``cu_seq_lens``
kwargs (``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``).

Attention dropout is not implemented: a model whose configuration sets it
(GPT-2's ``attn_pdrop``, Llama's ``attention_dropout``) raises a ValueError
in training mode; set it to 0.0.

>>> IMPLEMENTATIONS["softk_entmax15"]   # the map each registered name runs
'entmax15'
"""

from __future__ import annotations

import torch

# absolute imports: the module is also imported on its own (pytest's doctest
# collection) where softk.integrations has no __init__.py yet
from softk.attention import _context, scaled_dot_product_attention
from softk.nn.attention import ScaledDotProductAttention

IMPLEMENTATIONS = {
    "softk_softmax": "softmax",
    "softk_sparsemax": "sparsemax",
    "softk_entmax15": "entmax15",
    "softk_entmax_learned": "entmax",
}
LEARNED_ATTR = "softk_attention"  # the submodule learn_alpha adds to each attention layer


def _is_packed(position_ids, batch: int, length: int) -> bool:
    """transformers' flash-attention test for documents packed in one row: one
    row, several positions, and positions that are not min + 0, 1, 2, …"""
    if (position_ids is None or batch != 1 or length == 1 or position_ids.numel() != length  # not M-RoPE's 3 rows
            or torch.compiler.is_compiling()):  # reading the values would break the graph
        return False
    flat = position_ids.reshape(-1)
    return bool((flat != torch.arange(length, device=flat.device) + flat.min()).any())


def _segments(cu, length: int, name: str, check: bool = True):
    """(length,) document index of each row, its row within the document, and
    the documents' lengths, from the cumulative offsets ``cu`` (0 … length)."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2 or cu.dtype.is_floating_point:
        raise ValueError(f"{name} must be a 1-D integer tensor of cumulative offsets 0 … {length}, got "
                         f"{cu!r}")
    if check and not torch.compiler.is_compiling() and (cu[0] != 0 or cu[-1] != length or (cu.diff() < 0).any()):
        raise ValueError(f"{name} must start at 0, never decrease and end at the packed length {length} "
                         f"(one packed row), got {cu.tolist()}")
    idx = torch.arange(length, device=cu.device)
    doc = torch.searchsorted(cu[1:].contiguous(), idx, right=True)
    return doc, idx - cu[doc], cu.diff()


def _packed_keep(query, key, attention_mask, causal: bool, kwargs):
    """The (L, S) bool mask of a packed row, or None when the call is not packed.

    Packed as transformers' flash implementations read it: ``cu_seq_lens_q`` and
    ``cu_seq_lens_k`` among the kwargs (``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``),
    else, with no mask, ``position_ids`` of one row that restart.  Query i of
    document d sees key j of d, and with ``causal`` only those up to its own
    position (bottom-right aligned: j − k_d ≤ i − q_d + S_d − L_d)."""
    length, keys = query.shape[2], key.shape[2]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None or cu_k is not None:
        if cu_q is None or cu_k is None:
            raise ValueError("packed sequences need both cu_seq_lens_q and cu_seq_lens_k")
        if query.shape[0] != 1:
            raise ValueError(f"packed sequences (cu_seq_lens_q/k) must be one row: batch size 1, got "
                             f"{query.shape[0]}")
        cu_q, cu_k = cu_q.to(query.device), cu_k.to(query.device)
    elif attention_mask is None and keys == length and kwargs.get("position_ids") is not None:
        return _packed_by_positions(kwargs["position_ids"], query, causal)
    else:
        return None
    return _document_mask(cu_q, cu_k, length, keys, causal)


# The last position_ids seen and the document offsets read from them: every
# layer of one forward gets the same tensor, so its values are read (a device
# sync on a GPU) once per forward; the small offsets are kept, not the mask.
_LAST_POSITIONS: list = []


def _packed_by_positions(position_ids, query, causal: bool):
    length = query.shape[2]
    key = (position_ids._version, length, query.shape[0], query.device)
    if _LAST_POSITIONS and _LAST_POSITIONS[0] is position_ids and _LAST_POSITIONS[1] == key:
        cu = _LAST_POSITIONS[2]
    else:
        cu = None
        if _is_packed(position_ids, query.shape[0], length):
            # as transformers' prepare_fa_kwargs_from_position_ids: a document starts where the position is lowest
            pos = position_ids.reshape(-1).to(query.device)
            starts = (pos == pos.min()).nonzero().reshape(-1)
            if starts.numel() and starts[0] == 0:
                cu = torch.cat([starts, starts.new_tensor([length])])
        if not torch.compiler.is_compiling():
            _LAST_POSITIONS[:] = [position_ids, key, cu]
    return None if cu is None else _document_mask(cu, cu, length, length, causal, check=False)


def _document_mask(cu_q, cu_k, length: int, keys: int, causal: bool, check: bool = True):
    doc_q, row_q, len_q = _segments(cu_q, length, "cu_seq_lens_q", check)
    doc_k, row_k, len_k = _segments(cu_k, keys, "cu_seq_lens_k", check)
    if len_q.numel() != len_k.numel():
        raise ValueError(f"cu_seq_lens_q and cu_seq_lens_k must count the same documents, got {len_q.numel()} "
                         f"and {len_k.numel()}")
    keep = doc_q[:, None] == doc_k[None, :]
    if causal:
        keep &= row_k[None, :] <= (row_q + (len_k - len_q)[doc_q])[:, None]
    return keep


def _attention_function(map_name: str):
    def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                  **kwargs):
        """transformers' attention signature: query (B, H, L, E), key/value (B, H_kv, S, ·)
        -> (output (B, L, H, Ev), None: the weights are not returned)."""
        softcap = kwargs.get("softcap")  # Gemma 2's attn_logit_softcapping: c·tanh(s/c) before the mask
        if dropout:
            raise ValueError(
                f"softk's attention does not implement attention dropout (got dropout={dropout}); set the model "
                "config's attention dropout (attention_dropout, attn_pdrop) to 0.0, or call model.eval()"
            )
        causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        if _context.current() is not None:  # context parallel: this rank's shard of one sequence
            _refuse_under_context_parallel(kwargs)
            kwargs = {}  # the shard's position_ids are not consecutive, but they are not packed documents
        else:  # as transformers' sdpa: a mask, when given, already holds the causal pattern
            causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
        mask = attention_mask
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(query.dtype)
        keep = _packed_keep(query, key, attention_mask, causal, kwargs)
        if keep is not None:  # packed documents: each sees only its own keys (causal within it)
            mask = keep if mask is None else (mask & keep if mask.dtype == torch.bool
                                               else mask.masked_fill(~keep, float("-inf")))
            causal = False
        bias = kwargs.get("position_bias")
        if bias is not None:  # T5-style: added to the scores, with the mask's −inf where a key is hidden
            if causal:
                hide = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).triu(1)
                mask, causal = (~hide if mask is None else mask & ~hide), False
            bias = bias.to(query.dtype)
            mask = bias if mask is None else (torch.where(mask, bias, float("-inf")) if mask.dtype == torch.bool
                                              else bias + mask)
        args = (query, key, value, mask, 0.0, causal, scaling, query.shape[1] != key.shape[1])
        if map_name == "entmax":
            layer = getattr(module, LEARNED_ATTR, None)
            if layer is None:
                raise ValueError(f"attn_implementation='softk_entmax_learned' needs a learned α on each attention "
                                 f"layer: call softk.integrations.hf_attention.learn_alpha(model) first "
                                 f"({type(module).__name__} has none)")
            out = layer(*args, softcap=softcap)
        else:
            out = scaled_dot_product_attention(*args, map=map_name, softcap=softcap)
        return out.transpose(1, 2).contiguous(), None

    attention.__name__ = attention.__qualname__ = f"softk_{map_name}_attention"
    return attention


def _refuse_under_context_parallel(kwargs) -> None:
    # a model's structure, the same on every rank (a padding mask, which may differ, reaches the
    # context-parallel call instead, which refuses it on every rank at once)
    if kwargs.get("position_bias") is not None or kwargs.get("cu_seq_lens_q") is not None:
        raise ValueError("softk's attention under softk.distributed.context_parallel takes one sequence per row: "
                         "no position bias or packed documents (cu_seq_lens_q/k)")


def _mask_under_context_parallel(sdpa_mask):
    """transformers' sdpa mask, except under context parallelism with no padding: none (the
    attention's own causal mask runs over the whole sequence; the shard's position_ids are not
    consecutive, which transformers would read as packed documents).  A padded batch keeps its
    mask, which the context-parallel call refuses on every rank; a sliding window is refused."""

    def mask(*args, **kwargs):
        if _context.current() is None:
            return sdpa_mask(*args, **kwargs)
        config = kwargs.get("config")
        if getattr(config, "sliding_window", None) is not None:
            raise ValueError(f"softk's attention under context parallelism does not run sliding-window attention "
                             f"(config.sliding_window = {config.sliding_window})")
        padding = kwargs.get("attention_mask")
        if padding is not None and not bool(padding.all()):
            return sdpa_mask(*args, **kwargs)
        return None

    return mask


def register() -> tuple:
    """Register softk's attention implementations with transformers (idempotent);
    returns their names.  Raises ImportError naming the ``hf`` extra when
    transformers is not installed."""
    try:
        from transformers import AttentionInterface
    except ImportError as exc:
        raise ImportError("softk's Hugging Face integration needs transformers with its attention interface: "
                          "pip install 'softk[hf]'") from exc
    try:  # transformers >= 4.53 builds masks per implementation: take sdpa's (bool, or None and is_causal)
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # older: a 4-D additive mask (finfo.min where hidden), which the maps take as it is
        AttentionMaskInterface = sdpa_mask = None  # type: ignore[misc, assignment]
    for name, map_name in IMPLEMENTATIONS.items():
        AttentionInterface.register(name, _attention_function(map_name))
        if AttentionMaskInterface is not None:
            AttentionMaskInterface.register(name, _mask_under_context_parallel(sdpa_mask))
    return tuple(IMPLEMENTATIONS)


def _heads(module) -> int | None:
    for obj, attr in ((module, "num_heads"), (module, "num_attention_heads"),
                      (getattr(module, "config", None), "num_attention_heads")):
        value = getattr(obj, attr, None)
        if isinstance(value, int):
            return value
    return None


def learn_alpha(model: torch.nn.Module, alpha: float = 1.5) -> int:
    """Give every attention layer of ``model`` (each submodule whose class name
    ends in "Attention" and that knows its number of heads) a learnable α per
    head, initialised at ``alpha`` (a :class:`softk.nn.ScaledDotProductAttention`
    stored as its ``softk_attention`` submodule, so the α are parameters of
    the model, saved with it), for ``attn_implementation="softk_entmax_learned"``.
    Returns the number of layers given one."""
    layers = [m for m in model.modules() if type(m).__name__.endswith("Attention") and _heads(m)]
    if not layers:
        raise ValueError(f"learn_alpha found no attention layer (a submodule named *Attention with num_heads or "
                         f"config.num_attention_heads) in {type(model).__name__}")
    for m in layers:
        if getattr(m, LEARNED_ATTR, None) is None:
            p = next(m.parameters(), None)
            layer = ScaledDotProductAttention("entmax", alpha, num_heads=_heads(m), learnable=True)
            m.add_module(LEARNED_ATTR, layer.to(p.device) if p is not None else layer)
    return len(layers)


def learned_alphas(model: torch.nn.Module) -> list:
    """The learned α of each layer (a list of per-head lists), in module order."""
    return [m.alpha.detach().tolist() for name, m in model.named_modules() if name.endswith(LEARNED_ATTR)]
