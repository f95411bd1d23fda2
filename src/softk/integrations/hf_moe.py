r"""Sparse routers in Hugging Face mixture-of-experts models.

``apply_softk_router(model, router)`` replaces the router of every MoE layer
of a transformers model by a softk map.  Each token's router logits s (the
layer's own ``F.linear(h, W, b)``) become

.. math:: p = \mathrm{map}(s/\tau), \qquad I = \operatorname{top}_{k_{\max}}(p), \qquad
          w_j = p_{I_j},

and the layer runs its experts on (I, w) as before: the returned weights are
the map's own, zero-padded to ``k_max`` columns.  With a sparse map
("sparsemax", "entmax15", "entmax", "budget", soft top-k "sparse") a token
uses as many experts as its scores justify, at most ``k_max``, and the
gradient reaches the router through the map's exact Jacobian.

**The contract.**  transformers v5 gives its MoE families one router:
``router(hidden) -> (router_logits[T, E], router_scores[T, k], router_indices[T, k])``
with the router weight ``weight`` (E, H), ``top_k`` and ``num_experts``
(Mixtral, Qwen2/Qwen3-MoE, OLMoE, GPT-OSS with its ``bias``, and the families
that copy them).  DeepSeek-V3's group-limited sigmoid router (and its copies)
is the second form, recognised by its ``e_score_correction_bias``: the map
then runs over the experts of the token's ``topk_group`` groups (chosen from
the map's weights plus the bias, as DeepSeek chooses them from its sigmoid
scores plus the bias), the bias steers which live experts are kept, and the
weights are scaled by ``routed_scaling_factor``.  Before patching, every
router is checked by running it and softk's rendering of it
(``router="topk_softmax"``) on random weights and inputs in float64: the
same experts, and the same weights to the precision the router computes in
(float64, or float32 for the routers that cast to it).  A router whose
routing differs is refused by its class name, never patched silently; so is
a module that holds ``experts`` but no router of that shape.

**How the patch is applied.**  Instance-level ``forward`` attributes on the
router and on its sibling ``experts`` module: the classes, the parameter
names and the hooks transformers records ``router_logits`` with are kept.
A learned α adds one parameter, ``softk_alpha_raw``, to each router.  A
deep copy of the model is patched on its own.
:func:`remove_softk_router` restores the model's own routers and experts.

**Zeros skip their expert.**  The experts' forward receives only the live
(token, slot) pairs, one slot per row, so whatever experts implementation the
model uses (eager, ``grouped_mm``, ``batched_mm``) runs no expert for a
zero weight.  This is exact, gradients included: a weight is 0 only where
the map's Jacobian row is 0.  The number of live pairs is data-dependent, so
``skip_zeros=False`` keeps the rectangular ``[T, k_max]`` layout (zero
weights computed and multiplied by 0): the model then compiles in one graph,
the controller included.

**The target.**  ``target=m`` keeps the mean number of live experts per
token near m with an integral controller on the temperature: each training
forward first takes the step ``log τ += rate · (m − active) / m``, with
``active`` the previous training forward's mean (a larger τ flattens the
scores and widens every sparse map's support).  τ and that mean are
buffers, ``softk_tau`` and ``softk_active``, so they are saved with the model.

**Balance.**  The ``router_logits`` a softk router returns are log p (−inf
where p = 0), normalised to sum 1, so the model's own load-balancing loss,
which applies softmax to them, reads the router's own map (the control
returns the model's logits unchanged).  Its expert-probability term is then
exact; its dispatch count takes each token's config ``top_k`` largest p, so
a token with fewer live experts than that also counts experts of weight 0.
:func:`switch_loss` is that loss with the dispatch counted exactly.
:func:`balance_loss` is a Fenchel–Young-style term: the Tsallis-α divergence
of the mean load from uniform, with the map's own α.  :func:`router_stats` gives each layer's
active experts per token (mean, p95), load per expert, its coefficient of
variation and the share of tokens whose top expert is over capacity.

References: Mixtral's and DeepSeek-V3's routers (transformers v5); ReMoE
(Wang et al., ICLR 2025) and DTop-p for adaptive-k routing; sparsemax and
entmax routers as in :func:`softk.route`.

>>> import torch
>>> from transformers import MixtralConfig, MixtralForCausalLM
>>> torch.manual_seed(0) and None
>>> cfg = MixtralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...                     num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
...                     num_experts_per_tok=2)
>>> model = apply_softk_router(MixtralForCausalLM(cfg), "sparsemax")
>>> loss = model(torch.randint(0, 32, (2, 5)), labels=torch.randint(0, 32, (2, 5))).loss
>>> loss.backward()
>>> [name for name, s in router_stats(model).items()]
['model.layers.0.mlp.gate']
>>> remove_softk_router(model) is model
True
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._maps.routing import probabilities
from .._validate import check_alpha, check_choice, check_tau
from ..nn.maps import _inverse_softplus
from ..threshold.families import THRESHOLD_METHODS

__all__ = ["apply_softk_router", "remove_softk_router", "router_stats", "balance_loss", "switch_loss", "ROUTERS"]


@dataclasses.dataclass(frozen=True)
class RouterMap:
    """One router of :data:`ROUTERS`: the method of :func:`softk.route` it runs, what it takes."""

    name: str
    method: str | None  # a method of softk.route; None: the one given as ``method=``
    options: tuple[str, ...]  # the keyword arguments it takes beyond the common ones
    balance_alpha: float | None  # the α of its Tsallis regulariser (1: Shannon); None: the layer's α
    doc: str
    control: bool = False  # the model's own routing, in the model's own precision

    def routing_method(self, opts) -> str:
        return opts["method"] if self.method is None else self.method

    def sparse(self, opts) -> bool:
        """Whether the map has exact zeros (a target count of experts is then meaningful)."""
        method = self.routing_method(opts)
        return not self.control and (method not in THRESHOLD_METHODS or THRESHOLD_METHODS[method].zero_below)


ROUTERS = {r.name: r for r in (
    RouterMap("topk_softmax", "softmax", (), 1.0, "the model's own router computed by softk: the control",
              control=True),
    RouterMap("sparsemax", "sparsemax", (), 2.0, "sparsemax over the experts"),
    RouterMap("entmax15", "entmax15", (), 1.5, "1.5-entmax over the experts"),
    RouterMap("entmax", "entmax", ("alpha", "learn_alpha"), None, "α-entmax, α fixed or learned per layer"),
    RouterMap("soft_topk", None, ("k", "method"), 2.0,
              "soft top-k with Σp = k (method exp, sigmoid, laplace or sparse)"),
    RouterMap("budget", "sparse", ("k",), 2.0, "budget sparsemax: 0 ≤ p ≤ 1, Σp = k"),
)}


@dataclasses.dataclass
class _State:
    """What a patched router keeps: its map, options, the model's own forwards."""

    router: RouterMap
    opts: dict
    k_max: int
    target: float | None
    rate: float
    own_router_forward: object  # the instance-level forward found at apply time, or None
    experts: nn.Module
    own_experts_forward: object
    module: nn.Module
    deepseek: bool
    normalize: bool
    scores_dtype: torch.dtype | None = None  # the model's scores dtype when it is not the logits'
    control_dtype: torch.dtype | None = None  # the control's working precision (None: the logits')
    last: dict | None = None  # the last forward's p, weights, indices (for stats and balance)

    def __deepcopy__(self, memo):
        # ``last`` holds the last forward's p with its autograd graph (the
        # losses read it), which deepcopy refuses; a copy starts with no
        # forward of its own
        new = object.__new__(type(self))
        memo[id(self)] = new
        for f in dataclasses.fields(self):
            setattr(new, f.name, None if f.name == "last" else copy.deepcopy(getattr(self, f.name), memo))
        return new

    def alpha(self):
        if self.opts.get("learn_alpha"):
            return 1 + F.softplus(self.module.softk_alpha_raw)
        return self.opts["alpha"]

    def tau(self):
        buffer = getattr(self.module, "softk_tau", None)
        return self.opts["tau"] if buffer is None else buffer


def apply_softk_router(model: nn.Module, router: str = "sparsemax", *, k_max: int | None = None,
                       tau: float = 1.0, target: float | None = None, rate: float = 0.05,
                       skip_zeros: bool = True, alpha: float | None = None, learn_alpha: bool = False,
                       k: float | None = None, method: str = "exp") -> nn.Module:
    """Replace the router of every MoE layer of ``model`` by the softk map ``router``; returns ``model``.

    Args:
        model: a transformers model (or any module) holding MoE layers whose
            router follows the v5 contract or DeepSeek-V3's form.
        router: a name of :data:`ROUTERS`: "sparsemax", "entmax15", "entmax",
            "soft_topk", "budget", or "topk_softmax" (the model's own routing
            rendered by softk, the control).
        k_max: experts per token at most, the width of the returned weights
            and indices; default the layer's own ``top_k``.  An int in [1, E].
        tau: initial temperature > 0 (the map runs on s/τ).
        target: a mean number of live experts per token in (0, k_max] kept
            by the controller; sparse maps only.  Default None (τ fixed).
        rate: the controller's step on log τ, > 0.
        skip_zeros: run no expert for a zero weight (default True).
        alpha: entmax's α, a float > 1 (router="entmax"; default 1.5).
        learn_alpha: learn α per layer, α = 1 + softplus(ρ) (router="entmax").
        k: Σp for "soft_topk" and "budget", in (0, E]; default the layer's ``top_k``.
        method: the soft top-k method (router="soft_topk").

    Applying it to a patched model replaces the previous router.  Raises
    ValueError naming the parameter for an unknown router or option, a bad
    value, or a model with no MoE layer, and naming the class for a router
    that does not follow a known contract.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers MoE model), got {type(model).__name__}")
    spec = ROUTERS[check_choice(router, tuple(ROUTERS), "router")]
    given = {"alpha": alpha, "learn_alpha": learn_alpha or None, "k": k, "method": None if method == "exp" else method}
    for name, value in given.items():
        if value is not None and name not in spec.options:
            raise ValueError(f"{name} applies to router={sorted(r for r, s in ROUTERS.items() if name in s.options)}, "
                             f"not router={router!r}")
    opts = {"tau": check_tau(tau), "method": check_choice(method, tuple(THRESHOLD_METHODS), "method"),
            "alpha": _entmax_alpha(alpha), "learn_alpha": bool(learn_alpha), "k": k}
    if not (isinstance(rate, numbers.Real) and not isinstance(rate, bool) and 0 < rate < math.inf):
        raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
    if not isinstance(skip_zeros, bool):
        raise TypeError(f"skip_zeros must be a bool, got {type(skip_zeros).__name__}")
    if target is not None and not spec.sparse(opts):
        raise ValueError(f"target needs a router with exact zeros; router={router!r}"
                         + (f" with method={method!r}" if router == "soft_topk" else "") + " has none")
    layers = _moe_layers(model)
    if not layers:
        raise ValueError(f"model ({type(model).__name__}) has no MoE layer: no module holds a router "
                         "(weight, top_k, num_experts) beside an experts module")
    plans = []
    for name, parent, attr in layers:
        module = getattr(parent, attr)
        own, own_experts = _own_forwards(module, parent.experts)
        width = module.top_k if k_max is None else k_max
        if isinstance(width, bool) or not isinstance(width, numbers.Integral) or not 1 <= width <= module.num_experts:
            raise ValueError(f"k_max must be an int in [1, num_experts] = [1, {module.num_experts}], got {width!r}")
        if target is not None and not (isinstance(target, numbers.Real) and 0 < target <= width):
            raise ValueError(f"target must be a number in (0, k_max] = (0, {width}], got {target!r}")
        mass = module.top_k if k is None else k
        if "k" in spec.options and not (isinstance(mass, numbers.Real) and 0 < mass <= module.num_experts):
            raise ValueError(f"k must be a number in (0, num_experts] = (0, {module.num_experts}], got {mass!r}")
        state = _State(spec, {**opts, "k": mass}, int(width), None if target is None else float(target),
                       float(rate), own, parent.experts, own_experts, module,
                       deepseek=hasattr(module, "e_score_correction_bias"),
                       normalize=bool(getattr(module, "norm_topk_prob", True)))
        _check_contract(name, module, state)
        plans.append((module, state))
    remove_softk_router(model)
    for module, state in plans:
        _install(module, state, skip_zeros)
    return model


def remove_softk_router(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_softk_router`: every router and its experts run the model's own code again
    (the parameters and buffers softk added are removed; a no-op on an unpatched model)."""
    for module in list(model.modules()):
        state = module.__dict__.pop("_softk", None)
        if state is None:
            continue
        _restore(module, state.own_router_forward)
        _restore(state.experts, state.own_experts_forward)
        state.experts.__dict__.pop("_softk_own", None)
        for name in ("softk_alpha_raw", "softk_tau", "softk_active"):
            module._parameters.pop(name, None)
            module._buffers.pop(name, None)
    return model


def router_stats(model: nn.Module, capacity_factor: float = 1.0) -> dict[str, dict]:
    """Each patched layer's routing at its last forward, by module name.

    Per layer: ``active_mean`` and ``active_p95`` (live experts per token),
    ``load`` (tokens per expert, a float tensor [E]), ``load_cv`` (its
    coefficient of variation), ``over_capacity`` (the share of tokens whose
    top expert received more than ``capacity_factor · T · k_max / E`` tokens),
    and ``tau`` (the temperature used).
    """
    if not (isinstance(capacity_factor, numbers.Real) and capacity_factor > 0):
        raise ValueError(f"capacity_factor must be a number > 0, got {capacity_factor!r}")
    stats = {}
    for name, module, state in _ran(model):
        w, idx = state.last["weights"], state.last["indices"]
        active = (w != 0).sum(-1).to(torch.float64)
        experts = module.num_experts
        load = _dispatched(module, state, torch.float64)
        capacity = capacity_factor * w.shape[0] * state.k_max / experts
        top = idx[:, 0]
        stats[name] = {
            "active_mean": float(active.mean()),
            "active_p95": float(torch.quantile(active, 0.95)),
            "load": load,
            "load_cv": float(load.std(correction=0) / load.mean()) if load.sum() > 0 else 0.0,
            "over_capacity": float((load[top] > capacity).to(torch.float64).mean()),
            "tau": float(state.last["tau"]),
        }
    return stats


def balance_loss(model: nn.Module) -> Tensor:
    r"""Mean over the patched layers of the Tsallis-α divergence of the load from uniform.

    .. math:: D_\alpha(\bar p \,\|\, u) = \frac{\sum_e \bar p_e^{\alpha} - E^{1-\alpha}}{\alpha(\alpha-1)}
              \quad (\alpha \to 1: \mathrm{KL}(\bar p\|u)),
              \qquad \bar p = \frac{1}{T}\sum_t \frac{p_t}{\sum_e p_{t,e}},

    with α the map's own (1 for the control, 2 for sparsemax, budget and
    soft top-k, 1.5 for entmax15, the layer's α for entmax): the Bregman
    divergence of the map's regulariser, so it is 0 exactly at a balanced
    load and differentiable in the router weights (and in a learned α).
    Computed from each layer's last forward; 0 when there is none.
    """
    terms = []
    for _, _, state in _ran(model):
        p = state.last["p"]
        load = (p / p.sum(-1, keepdim=True)).mean(0)
        alpha = state.router.balance_alpha or state.alpha()
        experts = load.shape[-1]
        if isinstance(alpha, float) and alpha == 1.0:
            terms.append(torch.xlogy(load, load).sum() + math.log(experts))
        else:
            terms.append(((load ** alpha).sum() - experts ** (1 - alpha)) / (alpha * (alpha - 1)))
    if not terms:
        return torch.zeros(())
    return torch.stack(terms).mean()


def switch_loss(model: nn.Module) -> Tensor:
    r"""Switch Transformer's load-balancing loss from the routers' own maps, the dispatch counted exactly.

    .. math:: E \sum_e f_e P_e, \qquad f_e = \frac{1}{T}\,\#\{(t, l) : w^{(l)}_{t,e} \ne 0\}, \qquad
              P_e = \frac{1}{T}\sum_{t, l} \frac{p^{(l)}_{t,e}}{\sum_{e'} p^{(l)}_{t,e'}},

    over the tokens t of every patched layer l (T rows in all), as
    transformers' ``load_balancing_loss_func`` pools its layers.  That
    function counts each token's config ``top_k`` largest p as dispatched;
    this one counts the experts the token runs, so a token with fewer live
    experts adds only those.  The two are equal when every token has at
    least ``top_k`` live experts and ``k_max`` is ``top_k``.  Differentiable
    in P (f is a count); computed from each layer's last forward; 0 when there
    is none.
    """
    counts, probabilities, rows = None, None, 0
    for _, module, state in _ran(model):
        p = state.last["p"]
        count = _dispatched(module, state, p.dtype)
        share = (p / p.sum(-1, keepdim=True)).sum(0)
        counts = count if counts is None else counts + count
        probabilities = share if probabilities is None else probabilities + share
        rows += p.shape[0]
    if counts is None or probabilities is None:
        return torch.zeros(())
    return counts.numel() * (counts / rows * probabilities / rows).sum()


def _dispatched(module, state, dtype) -> Tensor:
    """The live (token, expert) pairs of the layer's last forward, per expert."""
    weights, indices = state.last["weights"], state.last["indices"]
    live = weights != 0
    return torch.zeros(module.num_experts, dtype=dtype, device=weights.device).index_add_(
        0, indices[live], torch.ones(int(live.sum()), dtype=dtype, device=weights.device))


def _ran(model):
    """(name, module, state) of each patched router that has run a forward."""
    for name, module in model.named_modules():
        state = module.__dict__.get("_softk")
        if state is not None and state.last is not None:
            yield name, module, state


# --- finding the layers -------------------------------------------------------


def _moe_layers(model):
    """(name, parent, attribute) of every router: the child of a module holding
    ``experts`` that has ``weight``, ``top_k`` and ``num_experts``.  A module
    holding experts but no such router is refused by name."""
    found = []
    for parent_name, parent in model.named_modules():
        experts = getattr(parent, "experts", None)
        if not isinstance(experts, nn.Module):
            continue
        routers = [attr for attr, child in parent.named_children()
                   if child is not experts and all(hasattr(child, a) for a in ("weight", "top_k", "num_experts"))]
        if len(routers) != 1:
            raise ValueError(
                f"{parent_name or type(model).__name__} ({type(parent).__name__}) holds experts but "
                f"{'no router' if not routers else 'several routers'} with weight, top_k and num_experts "
                f"({', '.join(routers) or 'children: ' + ', '.join(n for n, _ in parent.named_children())}); "
                "softk replaces the transformers v5 router contract and DeepSeek-V3's router only")
        found.append((f"{parent_name}.{routers[0]}".lstrip("."), parent, routers[0]))
    return found


def _entmax_alpha(alpha):
    """entmax's α, checked as every softk entry point checks it, and > 1: α = 1 is
    softmax, which has no zeros (the control is ``router="topk_softmax"``)."""
    if alpha is None:
        return 1.5
    alpha = check_alpha(alpha, None, -1)
    if alpha == 1:
        raise ValueError("alpha must be > 1 for router='entmax' (alpha = 1 is softmax: router='topk_softmax')")
    return alpha


def _own_forwards(module, experts):
    """The instance-level forwards (None: the class's) the router and its experts had before softk."""
    state = module.__dict__.get("_softk")
    if state is not None:
        return state.own_router_forward, state.own_experts_forward
    return module.__dict__.get("forward"), experts.__dict__.get("forward")


def _restore(module, own):
    if own is None:
        module.__dict__.pop("forward", None)
    else:
        module.forward = own


# --- the router ---------------------------------------------------------------


def _probabilities(state, logits):
    """p = map(s/τ) over the last dim, in float32 at least."""
    if state.router.control:  # in the precision the model's own router computes in
        z = logits.to(state.control_dtype or logits.dtype)
        return torch.sigmoid(z) if state.deepseek else torch.softmax(z, -1)
    z = logits if logits.dtype == torch.float64 else logits.float()
    tau = state.tau()
    if isinstance(tau, Tensor):  # the controller's buffer: divided here, so no host read checks it
        z, tau = z * (1 / tau.to(z.dtype)), 1.0  # a new tensor, not the buffer the controller updates
    alpha = state.alpha()
    alpha = alpha.to(z.dtype) if isinstance(alpha, Tensor) else alpha
    return probabilities(z, state.router.routing_method(state.opts), state.opts["k"], dim=-1, tau=tau, alpha=alpha)


def _logits(module, hidden):
    if hasattr(module, "e_score_correction_bias"):  # DeepSeek routes in float32
        return F.linear(hidden.float(), module.weight.float())
    return F.linear(hidden, module.weight, getattr(module, "bias", None))


def _route(module, state, logits):
    """(p, weights, indices): the map, and its top-k_max entries among the live experts."""
    p = _probabilities(state, logits)
    if state.deepseek:
        bias = module.e_score_correction_bias
        groups = module.num_group if hasattr(module, "num_group") else module.n_group
        experts = module.num_experts
        choice = (p + bias).view(-1, groups, experts // groups)
        group_scores = choice.topk(2, dim=-1)[0].sum(-1)
        chosen = torch.topk(group_scores, k=module.topk_group, dim=-1, sorted=False)[1]
        allowed = torch.zeros_like(group_scores).scatter_(1, chosen, 1).bool()
        allowed = allowed.unsqueeze(-1).expand(-1, groups, experts // groups).reshape(-1, experts)
        if not state.router.control:  # the map over the chosen groups' experts
            p = _probabilities(state, logits.masked_fill(~allowed, -math.inf))
        live = allowed & (p > 0) if state.router.sparse(state.opts) else allowed
        indices = torch.topk((p + bias).masked_fill(~live, -math.inf), k=state.k_max, dim=-1, sorted=False)[1]
        weights = p.gather(1, indices) * live.gather(1, indices)
        if state.router.control and state.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return p, weights * module.routed_scaling_factor, indices
    indices = torch.topk(p, state.k_max, dim=-1)[1]
    weights = p.gather(1, indices)
    if state.router.control and state.normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return p, weights, indices


class _LogOfMap(torch.autograd.Function):
    """log p with the gradient g/p on the support and 0 off it: softmax(log p) = p
    then carries p's exact gradient (a plain log would give 0 · ∞ = NaN there)."""

    @staticmethod
    def forward(p):
        return torch.log(p)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return torch.where(p > 0, g / torch.where(p > 0, p, 1), 0)


def _router_forward(self, hidden_states):
    state = self.__dict__["_softk"]
    if state.target is not None and self.training:
        _controller_step(self, state)
    hidden = hidden_states.reshape(-1, self.weight.shape[-1])
    logits = _logits(self, hidden)
    p, weights, indices = _route(self, state, logits)
    if state.router.control:
        logits_out = logits
    else:
        logits_out = _LogOfMap.apply(p / p.sum(-1, keepdim=True)).to(logits.dtype)
    tau = state.tau()
    state.last = {"p": p, "weights": weights.detach(), "indices": indices,
                  "tau": tau.detach().clone() if isinstance(tau, Tensor) else tau}
    if state.target is not None and self.training:
        with torch.no_grad():
            self.softk_active.copy_((weights.detach() != 0).sum(-1).to(self.softk_active.dtype).mean())
    return logits_out, weights.to(state.scores_dtype or logits.dtype), indices


def _controller_step(module, state):
    """log τ += rate · (m − active) / m, from the previous training forward's count.

    Applied before τ is read, never after: a compiled graph that mutates a
    buffer after reading it may recompute the read in its backward from the
    mutated value."""
    with torch.no_grad():
        active = module.softk_active
        step = torch.exp(state.rate * (state.target - active) / state.target)
        module.softk_tau.mul_(torch.where(torch.isnan(active), torch.ones_like(step), step))


# --- the experts --------------------------------------------------------------


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The model's experts on the live (token, slot) pairs only, one slot per row."""
    own = self.__dict__["_softk_own"]
    live = top_k_weights != 0
    if bool(live.all()):
        return own(hidden_states, top_k_index, top_k_weights)
    token, slot = live.nonzero(as_tuple=True)
    out = own(hidden_states[token], top_k_index[token, slot].unsqueeze(-1),
              top_k_weights[token, slot].unsqueeze(-1))
    return torch.zeros_like(hidden_states).index_add(0, token, out.to(hidden_states.dtype))


def _install(module, state, skip_zeros):
    module.__dict__["_softk"] = state
    if state.opts["learn_alpha"]:
        module.register_parameter("softk_alpha_raw", nn.Parameter(torch.tensor(
            _inverse_softplus(state.opts["alpha"] - 1), device=module.weight.device)))
    if state.target is not None:
        module.register_buffer("softk_tau", torch.tensor(state.opts["tau"], device=module.weight.device))
        module.register_buffer("softk_active", torch.tensor(math.nan, device=module.weight.device))
    module.forward = types.MethodType(_router_forward, module)
    if skip_zeros:
        experts = state.experts
        experts.__dict__["_softk_own"] = state.own_experts_forward or types.MethodType(type(experts).forward, experts)
        experts.forward = types.MethodType(_experts_forward, experts)


# --- the contract check -------------------------------------------------------


def _check_contract(name, module, state):
    """Run the module's own forward and softk's rendering of it (``topk_softmax``)
    on random weights and inputs in float64, in the precision the router computes
    in (the logits' or float32): refuse a router whose routing differs from both."""
    refusal = (f"{name} ({type(module).__name__}) does not route as the transformers v5 router contract "
               "or DeepSeek-V3's group-limited router does, so softk will not replace it")
    weight = module.weight

    def own(hidden):
        if state.own_router_forward is not None:
            return state.own_router_forward(hidden)
        return type(module).forward(module, hidden)

    generator = torch.Generator().manual_seed(0)
    params = {"weight": torch.randn(weight.shape, generator=generator, dtype=torch.float64)}
    if isinstance(getattr(module, "bias", None), Tensor):
        params["bias"] = torch.randn(module.bias.shape, generator=generator, dtype=torch.float64)
    if state.deepseek:
        params["e_score_correction_bias"] = torch.randn(module.e_score_correction_bias.shape,
                                                        generator=generator, dtype=torch.float64) / 10
    params = {k: v.to(weight.device) for k, v in params.items()}
    hidden = torch.randn(16, weight.shape[-1], generator=generator, dtype=torch.float64).to(weight.device)
    saved = {k: getattr(module, k) for k in params}
    try:
        with torch.no_grad():
            first = own(hidden[:2].to(weight.dtype))  # the scores' dtype, in the router's own dtype
            if not isinstance(first, tuple) or len(first) != 3:
                raise ValueError(f"its forward returns {type(first).__name__}, not (logits, scores, indices)")
            state.scores_dtype = None if first[1].dtype == first[0].dtype else first[1].dtype
            for k, v in params.items():
                _assign(module, k, v)
            expected = own(hidden)
            logits = _logits(module, hidden)
            for work in (None, torch.float32):
                control = dataclasses.replace(state, router=ROUTERS["topk_softmax"], target=None, k_max=module.top_k,
                                              control_dtype=work)
                _, weights, indices = _route(module, control, logits)
                if _same_routing(expected, logits, weights, indices, work):
                    state.control_dtype = work
                    return
    except Exception as error:  # a forward that breaks on the contract's inputs is not the contract
        raise ValueError(f"{refusal}: {type(error).__name__}: {error}") from None
    finally:
        for k, v in saved.items():
            _assign(module, k, v)
    raise ValueError(f"{refusal}: on random inputs its (scores, indices) differ from softmax-then-top-k"
                     f"{' with renormalisation' if state.normalize else ''}")


def _same_routing(expected, logits, weights, indices, work):
    """The same experts, and the same weights to the precision the router works in."""
    own_logits, own_scores, own_indices = expected
    rtol, atol = (1e-12, 1e-15) if work is None else (4 * torch.finfo(work).eps, torch.finfo(work).eps)
    if own_logits.shape != logits.shape or own_indices.shape != indices.shape:
        return False
    order, own_order = indices.sort(-1), own_indices.sort(-1)
    return (torch.allclose(own_logits.double(), logits.double())
            and torch.equal(order.values, own_order.values)
            and torch.allclose(weights.gather(1, order.indices).double(),
                               own_scores.gather(1, own_order.indices).double(), rtol=rtol, atol=atol))


def _assign(module, name, value):
    if name in module._parameters:
        module._parameters[name] = value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[name] = value
