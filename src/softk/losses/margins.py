r"""How far apart the scores must be for cross-entropy to reach a given value.

With n classes and target t, cross-entropy is
:math:`\log\bigl(1 + \sum_{i\ne t} e^{s_i - s_t}\bigr)
\ge \log\bigl(1 + (n-1)\,e^{-(s_{\max} - s_{\min})}\bigr)`,
since every term is at least :math:`e^{s_{\min} - s_{\max}}`.  So a loss of ε
needs a score range (the seed's margin bound, softmax/cross-entropy post)

.. math:: s_{\max} - s_{\min} \;\ge\; \log(n-1) - \log(e^{\varepsilon} - 1),

attained by s_t = s_min + range and every other score at s_min.  With a
temperature the scores are x/τ, so the raw range must be τ times this.  The
bound grows like log n and like log(1/ε): bounded scores (e.g. cosine logits
with a fixed scale, :func:`normface_min_scale`) put a floor under the loss.
"""

from __future__ import annotations

import math
import numbers

from .._validate import check_positive, finite


def _check_n(num_classes) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral):
        raise TypeError(f"num_classes must be an int, got {type(num_classes).__name__}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    return int(num_classes)


def cross_entropy_margin(num_classes: int, loss: float) -> float:
    r"""Smallest score range :math:`s_{\max} - s_{\min}` at which cross-entropy can be ``loss``
    (ε): :math:`\log(n - 1) - \log(e^\varepsilon - 1)`.  It is <= 0 when ε >= log n: equal scores
    already give log n.

    >>> round(cross_entropy_margin(10, 0.01), 4)  # log 9 - log(e^0.01 - 1)
    6.7974
    >>> cross_entropy_margin(2, math.log(2))  # two equal scores already give log 2
    0.0
    """
    n = _check_n(num_classes)
    eps = check_positive(loss, "loss")
    # log(e^ε − 1) = ε + log(1 − e^{−ε}): no overflow for a large ε
    return math.log(n - 1) - (eps + math.log1p(-math.exp(-eps)) if eps > 1 else math.log(math.expm1(eps)))


def cross_entropy_floor(num_classes: int, margin: float) -> float:
    r"""Smallest cross-entropy reachable with score range ``margin``:
    :math:`\log(1 + (n - 1)\, e^{-\mathrm{margin}})`; the inverse of :func:`cross_entropy_margin`.

    >>> round(cross_entropy_floor(10, 0.0), 6)  # all scores equal: log 10
    2.302585
    """
    n = _check_n(num_classes)
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not finite(margin):
        raise TypeError(f"margin must be a finite number, got {margin!r}")
    a = math.log(n - 1) - float(margin)  # the floor is softplus(a), formed without overflow
    return a + math.log1p(math.exp(-a)) if a > 0 else math.log1p(math.exp(a))
