r"""The kernels: forward p = f(z − λ), Σp = k, and backward from the saved p.

Sparsemax, entmax15 and α-entmax with 1.125 ≤ α ≤ 2 take the lean forward
of :mod:`.lean` instead (rows of up to :data:`.function.LEAN_MAX` entries: one
read, the search on the row's candidates; wider rows :mod:`.lean_wide`: two
reads), and exp, sigmoid and laplace top-k that of :mod:`.lean_topk` up to
the same width; the forward below serves every other family and width, and
those where a launch variant is asked for (``onchip``/``block``).

A program holds ``ROWS`` rows as a [ROWS, BLOCK] tile (the launcher,
:func:`.function._config`, gives narrow rows a tile of a fixed number of
entries: a 64-wide row shares its program with 15 others in the forward).  Every per-row quantity
below (max, counts, λ, the bracket, the pass count) is a [ROWS, 1] column,
every reduction runs along the row, and the λ search loops while any row of
the program still searches, the others keeping their λ: a row's result and
pass count are those it would get in a program of its own (bit for bit in
the interpreter; on a GPU the order of a row's float sums follows the
compiled layout, so another ROWS may round them differently).  Rows of up to
the launcher's on-chip limit (:func:`.function._config`) entries are loaded once into registers
(``ONCHIP``: the block is the next power of two ≥ n) and every pass below
runs on that copy; wider rows are read in blocks of ``BLOCK`` in a loop, one
row per program, so any width works (no 65,536 limit).  Arithmetic is
float32 whatever the input dtype.

λ is kept as a pair of floats (c, t), λ = c + t, re-centred after every step
(an exact two-sum), and every entry is evaluated as u = (z − c) − t.  c sits
next to λ, so z − c is exact for the entries that decide λ and u keeps its
relative precision even where λ is far from 0 or from the row max.  The
bracket [lo, hi] (g(lo) ≥ k ≥ g(hi), g(λ) = Σ f(z − λ)) is kept relative to
max z, and "a few ulps" means 4 float32 eps of |λ − max z| (+ 1 for the
capped families, whose f has unit width).

Forward, in passes over the row ("pass" = one read of the row, or one sweep
over the register copy; a program's pass covers all of its rows, and the
count below is each row's own):

1. one pass: max, min, finite count, a NaN/+inf flag, and (softmax, exp) the
   row's logsumexp with an online max;
2. the search for λ, one pass per step; every evaluated point tightens the
   bracket:

   * softmax: none (λ = lse(z) − log k from pass 1);
   * sparsemax: Michelot's iteration λ ← (Σ_{z>λ} z − k)/#{z>λ} from
     λ0 = max − k: Newton from the left on a convex g, never overshoots, exact
     once the support stops changing (checked by the next pass);
   * entmax15: Newton on √g from λ0 = max − 2√k (convex, nearly linear, never
     overshoots), and each pass also solves Σ((z−λ)/2)² = k in closed form on
     its support; that candidate is accepted when the count of entries above
     it equals the support it came from (counted in the next pass);
   * entmax α ≤ 2: Newton on g^(1/q) (q = 1/(α−1)) from λ0 = max − k^(α−1)/(α−1),
     stopping when the step is a few ulps;
     α > 2 (f' is infinite at the edge of the support, g^(1/q) not convex):
     the same Newton step unless it is under 1/64 of the bracket, else false
     position on g^(1/q) (Illinois), plus the bracket midpoint in the same
     pass; it stops only when the bracket itself is a few ulps wide;
   * exp (soft top-k): λ ← lse_{z<λ}(z) − log(k − #{z≥λ}) from λ0 = lse(z) − log k
     (Newton in e^{−λ} on a concave function: never overshoots; the
     unsaturated lse has its own max so it cannot underflow); exact when the
     saturated count stops changing, or when #sat reaches k;
   * sigmoid: Newton on log(A + a) − log(B + b), A = Σ_{u<0} f, B = Σ_{u≥0} (1 − f)
     (a, b the integer part of the balance A − B = k − #{u ≥ 0}), nearly
     linear even when every entry is far from λ; sums kept with their own max;
   * laplace: the exact root on the current upper set (a quadratic in e^λ,
     solved in log space), exact when the upper set stops changing;
   * sparse (clip): Newton on the piecewise-linear g, exact when the
     saturated and linear counts stop changing.

   The capped families (exp, sigmoid, laplace, sparse) also evaluate a second
   point in the same pass from the second step on (the bracket midpoint; for
   exp the midpoint between the lower bound and the iterate), so the bracket
   at least halves every pass even where Newton crawls (entries far apart,
   τ → 0); the next point is the better of the two Newton proposals.  A
   proposal outside the bracket, or any step after ``NEWTON_CAP``, is
   replaced by bisection; the loop stops at ``MAXIT`` passes whatever
   happens, with λ inside the bracket.
3. one pass writing p (or the row conventions: NaN rows, ≤ k finite entries).

Passes over the row, forward, including 1 and 3: a few per family on typical
rows (BENCHMARKS.md has the counts per family, typical and worst, taken
through the interpreter), and never more than 2 + ``MAXIT`` = 62.  The previous kernels took 62 for
every family but softmax (60 bisection steps), and 3 for softmax.  The passes
with a second point (exp, sigmoid, laplace, sparse, entmax α > 2) cost twice
the arithmetic of a plain pass, not twice the memory traffic.

Backward: Σ d·g and Σ d, then d (g − Σdg/Σd)/τ, with d = f'(u) read off the
saved p (the same formulas as ``Family.d_from_p``); one read of p and g for
on-chip rows, two otherwise; the same ROWS rows per program as the forward.
Sigmoid and laplace (``Family.slope_from_x``) read the input x as well and
form d = f′(u) from it (:mod:`.backward`).

Family ids: 0 softmax, 1 sparsemax, 2 entmax15, 3 entmax α, 4 exp (soft top-k),
5 sigmoid, 6 laplace, 7 sparse (capped simplex).

Where the code is: :mod:`.forward` (the forward kernel), :mod:`.passes` (its
passes over the row), :mod:`.search` (the λ search), :mod:`.family_math`
(f, f′ and the per-family sums) and :mod:`.backward` (the backward kernel).
This module only gathers the two kernels for the launchers in function.py.
"""

from .backward import threshold_bwd_kernel
from .forward import threshold_fwd_kernel

__all__ = ["threshold_fwd_kernel", "threshold_bwd_kernel"]
