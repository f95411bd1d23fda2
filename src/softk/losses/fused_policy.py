r"""What policy-gradient training reads off the output layer, without the N×V logits.

GRPO and PPO need, per token, the log-probability of the token taken and the
entropy of the policy's distribution.  :func:`fused_linear_logprobs` computes
both from the hidden states and the output layer one chunk of rows at a time,
as :func:`~softk.losses.fused_linear_loss` computes a loss; its autograd rule
is :class:`softk._ops.fused_policy.FusedLinearLogprobs`.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from .._maps.simplex import entmax, entmax15, sparsemax
from .._ops.fused_policy import FusedLinearLogprobs, PolicyMap
from .._validate import check_alpha, check_choice, check_chunk_size, check_positive, check_tau, require
from .chunking import auto_chunk_size
from .fused_linear import _check_linear
from .targets import check_ignore_index

#: The maps :func:`fused_linear_logprobs` takes, and their α (None: given by the caller).
MAPS = {"softmax": 1.0, "sparsemax": 2.0, "entmax15": 1.5, "entmax": None}


def _policy_map(map, alpha, tau, softcap) -> PolicyMap:
    check_choice(map, tuple(MAPS), "map")
    if map == "entmax":
        if alpha is None:
            raise ValueError("map='entmax' needs alpha, a float >= 1 (1 is softmax, 1.5 entmax15, 2 sparsemax), got None")
        if isinstance(alpha, Tensor):
            raise TypeError("alpha must be a float here (one α for every row), got a tensor")
        alpha = check_alpha(alpha, None, -1)
    elif alpha is not None:
        raise ValueError(f"alpha applies to map='entmax' only, got alpha={alpha!r} with map={map!r}")
    else:
        alpha = MAPS[map]
    tau = check_tau(tau)
    softcap = None if softcap is None else check_positive(softcap, "softcap")
    # the exact closed forms where α names one (as softk.entmax does)
    probs = {1.0: None, 1.5: entmax15, 2.0: sparsemax}.get(alpha, functools.partial(entmax, alpha=alpha))
    return PolicyMap(float(alpha), float(tau), softcap, probs)


def _check_target(target, lead, vocab: int, ignore_index: int, device) -> None:
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor of class indices, got {type(target).__name__}")
    if target.dtype == torch.bool or target.is_floating_point() or target.is_complex():
        raise TypeError(f"target must be an integer tensor of class indices (e.g. torch.long), got dtype {target.dtype}")
    if target.shape != lead:
        raise ValueError(
            f"target must have shape {tuple(lead)} (input's shape without its last dimension), got {tuple(target.shape)}"
        )
    if target.device != device:
        raise ValueError(f"target must be on input's device ({device}), got {target.device}")
    keep = target != ignore_index
    bad = keep & ((target < 0) | (target >= vocab))
    require(~bad, lambda: (
        f"target holds class index {int(target[bad].reshape(-1)[0])}, outside [0, {vocab}) "
        f"for a weight with {vocab} classes (and not ignore_index={ignore_index})"
    ))


def fused_linear_logprobs(
    input: Tensor,
    weight: Tensor,
    target: Tensor,
    map: str = "softmax",
    bias=None,
    *,
    alpha=None,
    tau: float = 1.0,
    softcap=None,
    chunk_size=None,
    ignore_index: int = -100,
    entropy: bool = True,
):
    r"""Per-token log p(target) and the entropy of p = map(z/τ), z = input @ weight.T + bias, a chunk of rows at a time.

    With the logits z (after the soft cap c·tanh(z/c) when ``softcap`` is
    given) and p = map(z/τ) over the V classes:

    .. math:: \ell_i = \log p_{i, y_i}, \qquad
              H_i = \begin{cases} -\sum_j p_{ij} \log p_{ij} & \text{softmax (Shannon)} \\
              \bigl(1 - \sum_j p_{ij}^\alpha\bigr) / \bigl(\alpha(\alpha-1)\bigr) & \text{α-entmax (Tsallis)}
              \end{cases}

    H is the entropy the map maximises, p = argmax ⟨p, z/τ⟩ + H(p) over the
    simplex (the regulariser Ω = −H of :mod:`softk.threshold.families`):
    :math:`(1 - \sum p^2)/2` for sparsemax (α = 2), :math:`\tfrac43(1 - \sum p^{3/2})` for entmax15.

    The gradients are formed per chunk from the map's Jacobian,
    J = (diag(d) − d dᵀ/Σd)/τ with d = p for softmax and :math:`d = p^{2-\alpha}`
    on the support of α-entmax (0 off it):

    .. math:: \partial \ell/\partial z = J e_y / p_y, \qquad
              \partial H/\partial z = J\,\nabla_p H,

    which is (e_y − p)/τ and −p ⊙ (log p + H)/τ for softmax, times the soft
    cap's slope 1 − tanh²(z/c).  The backward recomputes each chunk's logits
    (two forward matmuls in all, as :func:`~softk.losses.fused_linear_loss`
    with reduction "none") and adds G W, Gᵀ X and Σ G into the gradients of
    ``input``, ``weight`` and ``bias``; no N×V tensor is ever held.

    Args:
        input: hidden states (..., H), floating.
        weight: (V, H), the output layer's weight (input's dtype and device).
        target: the tokens taken, class indices shaped ``input.shape[:-1]``
            (an integer tensor), or ``ignore_index``.
        map: "softmax", "sparsemax", "entmax15" or "entmax" (needs ``alpha``).
        bias: None or (V,).
        alpha: α >= 1 for map="entmax" (1 is softmax, 1.5 entmax15, 2
            sparsemax, which then run their closed forms).
        tau: temperature > 0.
        softcap: None, or c > 0: the logits become c·tanh(z/c) first.
        chunk_size: rows of logits held at once; None picks
            :func:`~softk.losses.chunking.auto_chunk_size`'s.
        ignore_index: rows whose target is this give log-probability 0 and
            entropy 0, and no gradient.
        entropy: False returns the log-probabilities alone (and skips the
            entropy's arithmetic).

    Returns ``(logprobs, entropy)``, each shaped ``input.shape[:-1]``, or
    ``logprobs`` alone with ``entropy=False``; in float32 for half inputs
    (the logits are formed in float32, and a ratio exp(ℓ − ℓ_old) needs
    more than half precision), in input's dtype otherwise.  Both are
    differentiable for ``input``, ``weight`` and ``bias`` (not twice, and not
    under the ``torch.func`` transforms, which raise).

    For the sparse maps a token outside the support (p_y = 0) has log-probability
    −inf, and its gradient is 0 (not NaN): log p_y is constant −inf in a
    neighbourhood of z.  Mask such tokens, or use softmax, where a ratio of
    probabilities must stay finite.

    >>> import torch
    >>> torch.manual_seed(0) and None
    >>> x, w = torch.randn(6, 4, dtype=torch.float64), torch.randn(10, 4, dtype=torch.float64)
    >>> t = torch.tensor([0, 3, 9, 2, 2, -100])
    >>> logp, ent = fused_linear_logprobs(x, w, t, chunk_size=4)
    >>> ref = torch.log_softmax(x @ w.T, -1)
    >>> bool(torch.allclose(logp[:5], ref[torch.arange(5), t[:5]])), logp[5].item()
    (True, 0.0)
    >>> bool(torch.allclose(ent[:5], -(ref.exp() * ref).sum(-1)[:5]))
    True
    """
    _check_linear(input, weight, bias)
    if torch._C._are_functorch_transforms_active():
        raise NotImplementedError(
            "fused_linear_logprobs does not run under torch.func transforms (grad, vmap, jacrev, jacfwd): its "
            "gradient is recomputed chunk by chunk in its own backward; apply the transform to the unfused "
            "log-probabilities (softk.log_softmax(x @ w.T) and the like), or call it outside the transform")
    spec = _policy_map(map, alpha, tau, softcap)
    chunk = check_chunk_size(chunk_size)
    ignore_index = check_ignore_index(ignore_index)
    if not isinstance(entropy, bool):
        raise TypeError(f"entropy must be a bool, got {type(entropy).__name__}")
    lead = input.shape[:-1]
    vocab = weight.shape[0]
    _check_target(target, lead, vocab, ignore_index, input.device)
    x = input.reshape(-1, input.shape[-1])
    t = target.reshape(-1).long()
    keep = t != ignore_index
    if chunk is None:
        chunk = auto_chunk_size(x.shape[0], x.shape[1], vocab, x.device.type)
    rows_kept = None
    if x.is_cpu and not torch.compiler.is_compiling():
        # ignored rows (prompt tokens, padding) add nothing: leave them out of
        # the matmuls (on the CPU, where reading the mask costs no device sync;
        # a batch with no kept row keeps its rows, as fused_linear_loss does)
        n = int(keep.sum())
        if 0 < n < keep.numel():
            rows_kept = keep.nonzero().squeeze(1)
            x, t, keep = x.index_select(0, rows_kept), t.index_select(0, rows_kept), keep.index_select(0, rows_kept)
    logp, ent = FusedLinearLogprobs.apply(x, weight, bias, t, keep, spec, chunk, entropy)
    outs = (logp, ent) if entropy else (logp,)
    if rows_kept is not None:
        outs = tuple(o.new_zeros(math.prod(lead)).index_copy(0, rows_kept, o) for o in outs)
    outs = tuple(o.reshape(lead) for o in outs)
    return outs if entropy else outs[0]
