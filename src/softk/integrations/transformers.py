r"""Hugging Face causal language models trained on softk's fused linear loss.

``apply_softk(model, loss)`` makes ``model(input_ids, labels=labels)`` return

.. math:: \mathcal L = \frac{1}{n}\sum_{b,t\,:\,y_{b,t+1}\ne -100}
          \ell\big(W h_{b,t} + c,\; y_{b,t+1}\big)

(transformers' label shift: the hidden state at position t predicts label
t+1), computed by :func:`softk.losses.fused_linear_loss` from the hidden
states the LM head receives and the head's weight W (V, H) and bias c, a
chunk of rows at a time: the (B, T, V) logits are never held.  ℓ is
cross-entropy or a Fenchel–Young loss (sparsemax, entmax15, entmax-α, …);
n is the number of kept labels, or transformers' ``num_items_in_batch`` when
the caller passes it (the Trainer does, for gradient accumulation), in which
case the sum is divided by it exactly as ``ForCausalLMLoss`` does.

**How the patch is applied.** An instance-level ``forward`` wrapper (the
class and every other instance are untouched).  transformers' own hook,
``model.loss_function``, is called with the logits already computed, too late
to avoid them, so it is not used.  When ``labels`` is given the wrapper calls
the model's forward with ``labels=None`` and, for that call only, replaces
the LM head's forward by one that records its input (the final hidden
states) and returns a zero-stride placeholder instead of the logits.  It then
checks that the head was called exactly once and that the model returned the
head's output unchanged (so no soft-capping, scale, bias or slice was applied
that the fused loss would ignore), and computes the loss.  Without labels the
call goes straight to the model's forward: generation and inference are
unchanged.  :func:`remove_softk` (or leaving :func:`softk_loss`) undoes it.

**Mixture of experts.** A model that outputs its router's load-balancing
loss (``aux_loss``: Mixtral, Qwen-MoE, OLMoE, …) adds
``config.router_aux_loss_coef`` times it to its loss only when it is given
labels, which the wrapper withholds; the wrapper adds it to softk's loss
itself.  Such a model's tuple output (``return_dict=False``) begins with that
loss unnamed, so the wrapper asks for ``return_dict=True`` there.

**Logits.** When labels are given the output's ``logits`` is None (that is
the memory saved), unless ``apply_softk(..., return_logits=True)``, which
lets the head compute them as usual (the N×V tensor is then held, but the
loss is still softk's); with ``return_dict=False`` the tuple is
``(loss, *rest)``, as ``ModelOutput.to_tuple()`` drops a None.

**FSDP2.** When ``fully_shard`` was applied to the head itself (alone, or
grouped with the final norm as torchtitan does), its weight is whole only
inside its unit's forward.  The model's call of the head then goes to a
stand-in that records the hidden states without running the unit's hooks,
and the loss is computed as the head's forward, inside those hooks
(:mod:`softk.integrations.fsdp`): the unit gathers the weight once as it
would for the head (grouped with the norm, the norm's gather serves), gathers
it again in the backward and reduce-scatters its gradient.  A head in the
root's unit needs none of this: the root keeps its parameters gathered
through its forward, where the wrapper computes the loss.

Reference: Liger-Kernel's ``apply_liger_kernel_to_*`` (Hsu et al. 2024,
arXiv:2410.10989) patches each architecture's class forward; this wrapper is
architecture-agnostic instead.

>>> import torch
>>> from transformers import GPT2Config, GPT2LMHeadModel
>>> torch.manual_seed(0) and None
>>> cfg = GPT2Config(vocab_size=50, n_positions=16, n_embd=8, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
>>> model = GPT2LMHeadModel(cfg).eval()  # eval: no dropout, so the two calls agree
>>> ids = torch.randint(0, 50, (2, 6))
>>> reference = model(ids, labels=ids).loss
>>> with softk_loss(model, "cross_entropy"):
...     out = model(ids, labels=ids)
>>> out.logits is None, bool(torch.isclose(out.loss, reference))
(True, True)
>>> apply_softk(model, "sparsemax") is model
True
>>> model(ids, labels=ids).loss.backward()
>>> model.lm_head.weight.grad.shape
torch.Size([50, 8])
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import types
from typing import NamedTuple

import torch
from torch import nn

from .._validate import check_choice
from ..losses._options import FIELDS, loss_options
from ..losses._registry import DEFAULT_LOSS, LOSSES
from ..losses.fused_linear import fused_linear_loss
from .._dtensor import is_dtensor
from .fsdp import call_in_unit, is_fsdp_unit

__all__ = ["apply_softk", "remove_softk", "softk_loss", "SUPPORTED_LOSSES"]

# The losses of fused_linear_loss that take class-index targets (a causal LM's
# labels are one class per token; "soft_topk" needs k-hot rows).
SUPPORTED_LOSSES = tuple(name for name, kind in LOSSES.items() if kind.targets != "dense")
# The options apply_softk passes on: every option of fused_linear_loss that some
# supported loss takes, but the reduction, which is transformers'.
_OWN = {option for kind in LOSSES.values() for option in kind.options}
_LOSS_OPTIONS = tuple(sorted(
    name for name in FIELDS
    if name not in ("loss", "reduction")
    and (name not in _OWN or any(name in LOSSES[loss].options for loss in SUPPORTED_LOSSES))))
# Arguments a causal LM's forward passes on to its loss only (ForCausalLMLoss's keywords).
_LOSS_ONLY = ("num_items_in_batch", "shift_labels")

# Config fields of transformers models that transform the head's output
# before the loss, and the value at which they do nothing.  A model that does
# such a thing without a config field is caught at call time instead (the
# returned logits are not the head's output).
_LOGIT_TRANSFORMS = {
    "final_logit_softcapping": None,  # Gemma 2/3: cap * tanh(logits / cap)
    "logit_scale": 1,  # Cohere: logits * logit_scale
    "logits_scaling": 1,  # Granite: logits / logits_scaling
    "output_multiplier": 1,  # logits * output_multiplier
}


class _Patch(NamedTuple):
    loss: str
    options: dict  # keyword arguments of fused_linear_loss
    return_logits: bool
    previous_forward: object  # the instance-level forward found at apply time, or None


def apply_softk(model: nn.Module, loss: str = DEFAULT_LOSS, *, return_logits: bool = False, **loss_kwargs) -> nn.Module:
    """Make ``model``'s training loss softk's fused linear ``loss``; returns ``model`` (patched in place).

    Args:
        model: a transformers causal LM (``…ForCausalLM``, ``GPT2LMHeadModel``):
            an ``nn.Linear`` LM head from ``get_output_embeddings()`` (tied to
            the input embedding or not) and a forward taking ``labels``.
        loss: one of :data:`SUPPORTED_LOSSES`, as in
            :func:`softk.losses.fused_linear_loss`; default "cross_entropy"
            (the default of every softk entry point that takes a loss by name).
        return_logits: also compute and return the logits when labels are
            given (the N×V tensor is then held); default False (``logits`` is None).
        **loss_kwargs: ``alpha`` (loss="entmax"), ``k`` (loss="topk_softmax_ce"),
            ``suppression`` and ``adaptive`` (loss="ts2"), ``tau``,
            ``ignore_index`` (default -100, transformers' value),
            ``chunk_size`` and the knobs ``softcap``, ``label_smoothing``,
            ``class_weight`` and ``z_loss``, passed to
            :func:`~softk.losses.fused_linear_loss`.
            The reduction is transformers': mean over kept labels, or sum /
            ``num_items_in_batch``.

    Applying it to a patched model replaces the previous loss.  Raises
    TypeError/ValueError naming what it found for an unknown loss or option,
    a model without an LM head, a head that is not a plain ``nn.Linear``,
    a config that transforms the logits, or a forward without ``labels``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers causal LM), got {type(model).__name__}")
    patch = _Patch(_check_loss(loss), _check_options(loss, loss_kwargs), bool(return_logits), None)
    _lm_head(model)
    _check_config(model)
    if _slot(inspect.signature(model.forward), {}, "labels") is None:
        raise ValueError(f"{type(model).__name__}.forward takes no 'labels' argument: apply_softk needs a causal LM")
    if _is_patched(model):
        remove_softk(model)
    _install(model, patch._replace(previous_forward=model.__dict__.get("forward")))
    return model


def remove_softk(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_softk`: ``model`` computes its own loss again (a no-op if it is not patched)."""
    if not _is_patched(model):
        return model
    own = model.__dict__.get("forward")
    if not getattr(getattr(own, "__func__", None), "_softk_wrapper", False):
        raise ValueError(
            f"{type(model).__name__}.forward was replaced after apply_softk (found {own!r}); "
            "undo that wrapper first, then remove_softk"
        )
    patch = model.__dict__.pop("_softk_patch")
    if patch.previous_forward is None:
        del model.forward
    else:
        model.forward = patch.previous_forward
    return model


@contextlib.contextmanager
def softk_loss(model: nn.Module, loss: str = DEFAULT_LOSS, **kwargs):
    """``with softk_loss(model, loss, **kwargs):`` :func:`apply_softk` inside the block, the previous loss after it."""
    previous = model.__dict__.get("_softk_patch") if isinstance(model, nn.Module) else None
    apply_softk(model, loss, **kwargs)
    try:
        yield model
    finally:
        remove_softk(model)
        if previous is not None:
            _install(model, previous._replace(previous_forward=model.__dict__.get("forward")))


# --- checks made once, at apply time -----------------------------------------------------------


def _check_loss(loss):
    if loss in LOSSES and loss not in SUPPORTED_LOSSES:
        raise ValueError(
            f"loss={loss!r} needs dense (k-hot) target rows, not a language model's token labels; "
            f"apply_softk takes one of {list(SUPPORTED_LOSSES)}"
        )
    return check_choice(loss, SUPPORTED_LOSSES, "loss")


def _check_options(loss, loss_kwargs):
    unknown = sorted(set(loss_kwargs) - set(_LOSS_OPTIONS))
    if unknown:
        hint = " (the reduction follows transformers: mean, or sum / num_items_in_batch)" if "reduction" in unknown else ""
        raise TypeError(f"apply_softk got unknown loss option(s) {unknown}; expected some of {list(_LOSS_OPTIONS)}{hint}")
    options = dict(loss_kwargs)
    loss_options(loss, dense=False, **options)
    return options


def _lm_head(model) -> nn.Linear:
    name = type(model).__name__
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        how = "has no get_output_embeddings()" if not callable(get) else "returned None from get_output_embeddings()"
        raise ValueError(
            f"model {name} {how}: it has no LM head; apply_softk needs a causal LM "
            "(e.g. LlamaForCausalLM, not the base LlamaModel)"
        )
    if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
        raise TypeError(
            f"{name}'s LM head (get_output_embeddings()) is a {type(head).__name__}, not a plain torch.nn.Linear: "
            "apply_softk can only fuse logits = hidden @ weight.T + bias"
        )
    return head


def _check_config(model):
    config = getattr(model, "config", None)
    configs = [config]
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        configs.append(get_text())
    for cfg in configs:
        for field, neutral in _LOGIT_TRANSFORMS.items():
            value = getattr(cfg, field, neutral)
            if value is not None and value != neutral:
                raise ValueError(
                    f"{type(model).__name__}'s config has {field}={value!r}: the model transforms its logits "
                    "after the LM head, which the fused loss cannot apply; apply_softk refuses it"
                )


# --- the forward wrapper ------------------------------------------------------------------------


def _is_patched(model) -> bool:
    return "_softk_patch" in getattr(model, "__dict__", {})


def _install(model, patch: _Patch) -> None:
    def forward(self, *args, **kwargs):
        return _patched_forward(self, args, kwargs)

    # Name, docstring and signature of the model's forward (the Trainer inspects the signature).
    functools.update_wrapper(forward, type(model).forward)
    forward._softk_wrapper = True  # type: ignore[attr-defined]  # marks softk's wrapper
    model._softk_patch = patch
    # A bound method: copy.deepcopy(model) rebinds it to the copy.
    model.forward = types.MethodType(forward, model)


def _patched_forward(model, args, kwargs):
    patch = model.__dict__["_softk_patch"]
    inner = patch.previous_forward or type(model).forward.__get__(model)
    try:
        bound = inspect.signature(inner).bind(*args, **kwargs)
    except TypeError:
        return inner(*args, **kwargs)  # the model's own error for a bad call
    where = _slot(bound.signature, bound.arguments, "labels")
    labels = where.get("labels")
    if labels is None:
        return inner(*args, **kwargs)
    where["labels"] = None
    num_items, shift_labels = (_take(bound, name) for name in _LOSS_ONLY)
    head = _lm_head(model)
    if is_fsdp_unit(head):
        return _unit_forward(model, head, inner, bound, labels, shift_labels, num_items, patch)
    with _capture_head(head, patch.return_logits) as seen:
        out = inner(*bound.args, **bound.kwargs)
    hidden, logits = _check_head_calls(model, head, seen, out)
    loss = _causal_lm_loss(hidden, head, labels, shift_labels, num_items, patch)
    return _with_loss(out, _plus_router_aux(model, out, loss), logits if patch.return_logits else None)


def _unit_forward(model, head, inner, bound, labels, shift_labels, num_items, patch):
    """The forward with labels when the head is an FSDP unit (``fully_shard(head)`` or ``fully_shard([norm, head])``).

    Outside its unit's forward the head's weight is a shard, so the loss is
    computed inside it (:func:`softk.integrations.fsdp.call_in_unit`).  The
    model's own call of the head is answered by a stand-in that does not run
    the unit's hooks: had it run them, the unit would all-gather for the
    placeholder and again for the loss.  With the head grouped with the final
    norm, the group is still gathered from the norm's forward (FSDP reshards a
    group once all of its modules have run), so the loss costs no all-gather
    at all; with the head alone, its unit gathers once, for the loss.  This
    runs inside the root's forward, before the root's post-forward would
    complete (and reshard) a group left incomplete.
    """
    with _stand_in_head(model, head) as seen:
        out = inner(*bound.args, **bound.kwargs)
    hidden, _ = _check_head_calls(model, head, seen, out)

    def forward(x):
        loss = _causal_lm_loss(x, head, labels, shift_labels, num_items, patch)
        # The logits, when kept, come from the same gathered weight (nn.Linear's own forward).
        return (loss, nn.Linear.forward(head, x)) if patch.return_logits else loss

    result = call_in_unit(head, forward, hidden)
    loss, logits = result if patch.return_logits else (result, None)
    if loss.dtype in (torch.float16, torch.bfloat16):
        loss = loss.float()  # a mixed precision policy's output_dtype may have cast it back
    return _with_loss(out, _plus_router_aux(model, out, loss), logits)


def _plus_router_aux(model, out, loss):
    """The loss a mixture-of-experts model returns with labels: its language
    model loss plus ``config.router_aux_loss_coef`` times the router's
    load-balancing loss, which such a model (Mixtral, Qwen-MoE, OLMoE, …)
    computes whenever it outputs router logits but adds to the loss only when
    it is given labels, which the wrapper withholds."""
    aux = getattr(out, "aux_loss", None)
    coef = getattr(getattr(model, "config", None), "router_aux_loss_coef", None)
    if aux is None or coef is None:
        return loss
    return loss + coef * aux.to(loss.device)


def _slot(signature, arguments, name):
    """The dict of a call's ``arguments`` that holds ``name``: the arguments themselves for a
    named parameter, the ``**kwargs`` dict otherwise (created if absent); None if neither exists."""
    if name in signature.parameters:
        return arguments
    for p in signature.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return arguments.setdefault(p.name, {})
    return None


def _take(bound, name):
    """Remove a loss-only argument from the call and return it (None if absent or not accepted)."""
    where = _slot(bound.signature, bound.arguments, name)
    return None if where is None else where.pop(name, None)


@contextlib.contextmanager
def _capture_head(head: nn.Linear, keep_logits: bool):
    """For one forward: record the head's input and return a placeholder (or the real logits)."""
    seen = []
    own = head.__dict__.get("forward")  # e.g. an accelerate hook's wrapper
    real = head.forward

    def forward(hidden):
        if keep_logits:
            out = real(hidden)
        else:  # zero-stride: shape (..., V), one element of memory
            out = hidden.new_zeros(()).expand(*hidden.shape[:-1], head.out_features)
        seen.append((hidden, out))
        return out

    head.forward = forward  # type: ignore[method-assign]  # on the instance, undone below
    try:
        yield seen
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own  # type: ignore[method-assign]


class _StandIn(nn.Module):
    """Takes the head's place in the model for one forward: records its input, returns the placeholder."""

    def __init__(self, head, seen):
        super().__init__()
        # Plain attributes, not a submodule: the stand-in must not add the head to the module tree twice.
        self.__dict__["_head"] = head
        self.__dict__["_seen"] = seen

    def forward(self, hidden):
        out = hidden.new_zeros(()).expand(*hidden.shape[:-1], self._head.out_features)
        self._seen.append((hidden, out))
        return out

    def __getattr__(self, name):  # weight, bias, in_features...: the head's, for a model that reads them
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_head"], name)


@contextlib.contextmanager
def _stand_in_head(model, head):
    """For one forward: every slot of the module tree that holds ``head`` holds a :class:`_StandIn`."""
    seen = []
    slots = [(parent, name) for parent in model.modules() for name, child in parent._modules.items() if child is head]
    if not slots:
        raise ValueError(
            f"{type(model).__name__}'s LM head (get_output_embeddings()) is not one of its submodules: "
            "apply_softk cannot take its place for the forward"
        )
    stand_in = _StandIn(head, seen)
    for parent, name in slots:
        parent._modules[name] = stand_in
    try:
        yield seen
    finally:
        for parent, name in slots:
            parent._modules[name] = head


def _check_head_calls(model, head, seen, out):
    name = type(model).__name__
    if len(seen) != 1:
        raise ValueError(
            f"{name}.forward called its LM head ({type(head).__name__}, get_output_embeddings()) {len(seen)} times; "
            "apply_softk needs exactly one call: a model that computes its logits another way "
            "(e.g. straight from the input embedding matrix) hides the weight it uses"
        )
    hidden, produced = seen[0]
    returned = out[0] if isinstance(out, tuple) else getattr(out, "logits", None)
    if isinstance(out, tuple) and len(out) > 1 and out[1] is produced:
        # a mixture-of-experts model's tuple without a loss starts with its router's
        # load-balancing loss, which a tuple does not name
        raise ValueError(
            f"{name}.forward returned a tuple whose first entry precedes the logits (a router's load-balancing "
            "loss): apply_softk adds it to the loss from a ModelOutput only; call the model with "
            "return_dict=True"
        )
    if returned is not produced:
        shape = tuple(getattr(returned, "shape", ()))
        found = "no logits" if returned is None else f"a {type(returned).__name__} of shape {shape}"
        raise ValueError(
            f"{name}.forward returned {found} instead of its LM head's output: it transforms the logits "
            "after the head (soft-capping, a scale, a bias or a vocabulary slice), which the fused loss "
            "would silently ignore; use the model's own loss (remove_softk)"
        )
    return hidden, produced


def _causal_lm_loss(hidden, head, labels, shift_labels, num_items, patch):
    """transformers' ForCausalLMLoss, fused: shift, ignore_index, mean or sum / num_items_in_batch."""
    weight, bias = head.weight, head.bias
    if is_dtensor(weight) and not is_dtensor(hidden):
        raise ValueError(
            f"the LM head's weight is a DTensor (placements {tuple(weight.placements)}) where the loss reads it: "
            "it is sharded by an FSDP unit around the head (not the root, not the head itself) or by tensor "
            "parallelism. apply_softk computes the loss inside the head's unit when fully_shard was applied to "
            "the head (fully_shard(model.lm_head), or fully_shard([final_norm, model.lm_head])), and reads the "
            "whole weight when the head is in the root's unit"
        )
    if weight.is_meta:
        raise ValueError("the LM head's weight is on the meta device (offloaded?): apply_softk needs it materialised")
    x = hidden.to(weight.device)
    cast = _autocast_dtype(x.device.type)
    if cast is not None:  # what nn.Linear would compute in under autocast
        x, weight = x.to(cast), weight.to(cast)
        bias = None if bias is None else bias.to(cast)
    ignore_index = patch.options.get("ignore_index", -100)
    if shift_labels is None:  # position t predicts label t+1; the last position predicts nothing
        target = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    else:
        target = shift_labels
    target = target.to(x.device)
    if target.shape != x.shape[:-1]:
        raise ValueError(
            f"labels give targets of shape {tuple(target.shape)} but the LM head saw hidden states of shape "
            f"{tuple(x.shape)} (logits_to_keep must be 0 when labels are given)"
        )
    reduction = "mean" if num_items is None else "sum"
    with torch.autocast(x.device.type, enabled=False):
        loss = fused_linear_loss(x, weight, target, loss=patch.loss, bias=bias, reduction=reduction, **patch.options)
    if loss.dtype in (torch.float16, torch.bfloat16):
        loss = loss.float()  # transformers computes the loss in float32
    if num_items is not None:
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    return loss


def _autocast_dtype(device_type):
    try:
        on = torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no device type
        on = torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled()
    if not on:
        return None
    try:
        return torch.get_autocast_dtype(device_type)
    except AttributeError:
        return torch.get_autocast_gpu_dtype() if device_type == "cuda" else torch.get_autocast_cpu_dtype()


def _with_loss(out, loss, logits):
    """The model's output with ``loss`` in front and ``logits`` (None unless kept)."""
    if isinstance(out, tuple):  # return_dict=False; out[0] was the head's output
        return (loss, *(() if logits is None else (logits,)), *out[1:])
    if dataclasses.is_dataclass(out):
        return dataclasses.replace(out, loss=loss, logits=logits)
    raise TypeError(
        f"{type(out).__name__} is neither a transformers ModelOutput nor a tuple: apply_softk cannot set its loss"
    )
