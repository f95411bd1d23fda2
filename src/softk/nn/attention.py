"""``softk.attention.scaled_dot_product_attention`` as a module, with an optional
learnable α per head (the adaptively sparse transformer of Correia et al. 2019)."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from ..attention import MAPS, scaled_dot_product_attention
from .._validate import check_choice
from ..attention.checks import ALPHA_RANGE


# The learnable α stays inside the range every attention backend takes in
# float32 (softk.attention.checks.ALPHA_RANGE: 1 < α ≤ 2), by a sigmoid
# between its ends, as Correia et al.'s α = 1 + sigmoid(ρ); the lower end is
# 1 + 2⁻²⁰, not 1, so that a sigmoid that underflows still gives an α > 1.
ALPHA_MIN, ALPHA_MAX = 1.0 + 2.0**-20, ALPHA_RANGE[torch.float32][1]


def _logit(y: torch.Tensor) -> torch.Tensor:
    return torch.log(y) - torch.log1p(-y)


class ScaledDotProductAttention(nn.Module):
    r"""``softk.attention.scaled_dot_product_attention`` as a module, ``map="entmax15"`` by default (torch's is softmax).

    ``forward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
    scale=None, enable_gqa=False)`` takes the function's arguments in its
    order (see there for shapes and conventions); the map is fixed at
    construction.

    Args:
        map: "softmax", "sparsemax", "entmax15" (default) or "entmax".
        alpha: α of map="entmax": a float > 1 (default 1.5), or with
            ``learnable=True`` the initial α, a float or one float per head.
        num_heads: H, needed with ``learnable=True`` (one α per head).
        learnable: learn α per head, kept inside (1, 2] by the
            parametrisation α_h = ALPHA_MIN + (ALPHA_MAX − ALPHA_MIN)·sigmoid(ρ_h)
            with ALPHA_MIN = 1 + 2⁻²⁰ and ALPHA_MAX = 2 (ρ is the stored
            parameter ``alpha_raw``): Correia et al.'s 1 + sigmoid(ρ), the
            range the attention backends take in float32
            (:data:`softk.attention.checks.ALPHA_RANGE`).

    >>> import torch
    >>> attn = ScaledDotProductAttention("entmax", alpha=1.5, num_heads=2, learnable=True)
    >>> attn.alpha
    tensor([1.5000, 1.5000], grad_fn=<AddBackward0>)
    >>> q = torch.randn(3, 2, 5, 4)
    >>> out = attn(q, q, q, is_causal=True)
    >>> out.sum().backward(); attn.alpha_raw.grad.shape
    torch.Size([2])
    """

    def __init__(self, map: str = "entmax15", alpha=None, num_heads: int | None = None, learnable: bool = False):
        super().__init__()
        self.map = check_choice(map, MAPS, "map")
        self.learnable = bool(learnable)
        if not self.learnable:
            # the function's own checks, once, on a tiny float64 call: float64 takes the widest α range,
            # and each call checks its own dtype's (a type checker cannot count the generator's three tensors)
            scaled_dot_product_attention(*(torch.zeros(1, 1, 1, dtype=torch.float64) for _ in range(3)),  # type: ignore[arg-type]
                                         map=map, alpha=alpha)
            self._alpha = alpha
            return
        if map != "entmax":
            raise ValueError(f"learnable=True learns entmax's α: map must be 'entmax', got {map!r}")
        if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
            raise ValueError(f"num_heads must be an int >= 1 with learnable=True, got {num_heads!r}")
        # checked and mapped to the parameter in float64: rounded to float32 first, an α just above
        # ALPHA_MIN (1.000001) became the bound itself and was refused
        init = torch.as_tensor(1.5 if alpha is None else alpha, dtype=torch.float64)
        if init.dim() == 0:
            init = init.expand(num_heads)
        if tuple(init.shape) != (num_heads,):
            raise ValueError(f"alpha must be a float or {num_heads} floats (one per head), got shape "
                             f"{tuple(init.shape)}")
        if not bool(((init > ALPHA_MIN) & (init < ALPHA_MAX)).all()):
            raise ValueError(f"alpha must lie strictly between {ALPHA_MIN} and {ALPHA_MAX} with learnable=True, "
                             f"got {init.tolist()}")
        self.alpha_raw = nn.Parameter(_logit((init - ALPHA_MIN) / (ALPHA_MAX - ALPHA_MIN)).to(torch.float32))

    @property
    def alpha(self):
        """α: a per-head tensor (learnable), else the constructor's value."""
        if self.learnable:
            return ALPHA_MIN + (ALPHA_MAX - ALPHA_MIN) * torch.sigmoid(self.alpha_raw)
        return self._alpha

    def forward(self, query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                scale=None, enable_gqa: bool = False, softcap=None):
        alpha = self.alpha
        if isinstance(alpha, torch.Tensor):
            alpha = alpha.to(torch.float64 if query.dtype == torch.float64 else torch.float32)
        return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                            map=self.map, alpha=alpha, softcap=softcap)

    def extra_repr(self) -> str:
        if self.learnable:
            # float32's 7 digits: rounded to 4, α = 1.0000015 printed as 1.0, softmax
            return f"map='entmax', alpha=[{', '.join(f'{a:.7g}' for a in self.alpha.tolist())}], learnable=True"
        return f"map={self.map!r}" + (f", alpha={self._alpha}" if self._alpha is not None else "")
