"""A drop-in for the entmax package (deep-spin/entmax), on softk's exact solvers.

``import softk.compat.entmax as entmax`` and code written for entmax 1.3 or
its master branch runs unchanged: the same modules (``activations``,
``root_finding``, ``losses``), public names, argument names, defaults and
conventions, and this package re-exports what entmax's ``__init__`` does.
docs/guides/from_entmax.md has the name-by-name table (entmax →
softk.compat.entmax → native softk).

Deliberate differences (each also in that guide):

* **No bisection.**  λ is exact (closed form on the support: sparsemax,
  entmax15, normmax at α = 2, budget) or found by safeguarded Newton to the
  dtype's precision.  ``n_iter`` and ``ensure_sum_one`` are accepted (``n_iter``
  None or an int >= 0) and unused; results sum to 1 (or the budget) to
  rounding.  ``k``, the partial-sort hint of ``sparsemax``/``entmax15`` and
  their losses, is accepted (None or an int >= 1) and changes nothing.
* **α = 1** in ``entmax_bisect`` is softmax (entmax's bisection returns the
  uniform distribution there).  **0 < α < 1** is computed exactly (the dense
  Tsallis map, every entry > 0; eager autograd only, no vmap/compile).
  **α <= 0** is refused with a ValueError.
* **normmax with α <= 1** is the argmax (uniform on ties): the maximiser of
  ⟨x, p⟩ − ||p||_α for α < 1 and the α → 1⁺ limit (entmax returns NaN or an
  unrelated dense vector for α < 1).
* **Gradients for every parameter**: a tensor α (entmax_bisect, normmax and
  their losses) or budget that requires grad gets its gradient (entmax gives
  none to normmax's α, the budget, or α in the losses).  Double backward, jvp
  and (for α >= 1) vmap and torch.compile work.
* **budget** must lie in [0, n] (n the size of ``dim``): above n no p <= 1 sums
  to it (entmax returns all ones); 0 gives zeros.
* **softk's row conventions**: ``-inf`` entries are removed exactly, a row with
  no finite entry gives zeros (entmax: a RuntimeError in sparsemax/entmax15,
  NaN from the bisection functions), NaN or +inf makes its row NaN;
  float16/bfloat16 are computed in float32.
* **Functional losses** return the per-sample tensor, or ``(loss, support_size)``
  with ``return_support_size=True``; master's functional losses return a
  ``(loss, None)`` pair even without it, 1.3's the tensor.  Losses are clamped
  at 0 (rounding never makes them negative).  Rows whose target equals a
  non-negative ``ignore_index`` need not hold a valid class (entmax's scatter
  fails on one).  A per-row α in ``entmax_bisect_loss`` (shape (n, 1)) works.
* **The support size** (``return_support_size=True``) counts the entries with
  p > 0; entmax counts those with X >= tau, which at an exact tie with the
  threshold includes entries whose p is 0.
* **Modules** check their arguments at construction, and accept an
  ``nn.Parameter`` α in the constructor (entmax assigns it before
  ``nn.Module.__init__``, which refuses a Parameter).
* **Errors**: where entmax raises, the exception is also of entmax's type
  (AssertionError for its asserts — reduction, batch sizes —, IndexError for
  a bad ``dim``, RuntimeError where torch failed inside entmax), and it is
  softk's ValueError/TypeError naming the parameter (a non-tensor X or
  target: TypeError and entmax's AttributeError); where entmax silently
  returned a wrong result, softk's ValueError.  An integer X is refused
  everywhere (entmax accepts it in entmax15 and three bisection maps).
* **Not provided**: the autograd ``Function`` classes (``SparsemaxFunction``,
  ``EntmaxBisectFunction``, ``...LossFunction``); call the functions.
  Nor entmax's private helpers ``_make_ix_like`` and ``_roll_last``.
  ``_sparsemax_threshold_and_support`` and ``_entmax_threshold_and_support``
  (private in entmax) are kept.

``__version__`` is the entmax API mirrored (master), not softk's version.
"""

__version__ = "1.4.dev0"

from .activations import Entmax15, Sparsemax, entmax15, sparsemax
from .losses import (Entmax15Loss, EntmaxBisectLoss, NormmaxBisectLoss, SparsemaxBisectLoss, SparsemaxLoss,
                     entmax15_loss, entmax_bisect_loss, normmax_bisect_loss, sparsemax_bisect_loss, sparsemax_loss)
from .root_finding import (BudgetBisect, EntmaxBisect, NormmaxBisect, SparsemaxBisect,
                           budget_bisect, entmax_bisect, normmax_bisect, sparsemax_bisect)

__all__ = [
    "sparsemax", "entmax15", "Sparsemax", "Entmax15",
    "sparsemax_bisect", "entmax_bisect", "normmax_bisect", "budget_bisect",
    "SparsemaxBisect", "EntmaxBisect", "NormmaxBisect", "BudgetBisect",
    "sparsemax_loss", "entmax15_loss", "sparsemax_bisect_loss", "entmax_bisect_loss", "normmax_bisect_loss",
    "SparsemaxLoss", "SparsemaxBisectLoss", "Entmax15Loss", "EntmaxBisectLoss", "NormmaxBisectLoss",
]
