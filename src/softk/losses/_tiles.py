r"""The fused loss's gradient on any block of classes from a few numbers per row.

For the losses whose map is a simplex map p = f(z/τ − λ) (softmax,
sparsemax, entmax15, α-entmax, and TS² through its sparsemax), the gradient
of a row's loss at class j depends on z_j and on a handful of numbers of the
row.  With m = max_j z_j/τ and d = f⁻¹(p_max) (so λ = m − d, the family's
:attr:`~softk.threshold.families.Family.f_inv`),

.. math:: p_j = f\bigl((z_j/\tau - m) + d\bigr),\qquad
          G_j = \frac{w}{\tau}\bigl(c_p\,p_j - c_y\,[j = y] - \tfrac{\varepsilon}{V} v_j\bigr)
                \;+\; (\text{z-loss}) \;+\; (\text{TS}^2\text{'s penalty}),

all times the softcap's derivative 1 − tanh²(z/c).  So the fused loss can
find (m, d) on whole rows in its forward and then form G one vocabulary block
at a time (:mod:`softk._ops.fused_walk`), writing the weight gradient of each
block once: no V × H accumulator.  The row is carried as (m, d) rather than
λ, so that z/τ − m is formed before the offset (as a log-softmax does) and
logits far from 0 keep their digits.

The coefficients:

* Fenchel–Young losses (and cross-entropy without class weights):
  c_p = w_y, c_y = (1 − ε) w_y, v_j = w_y, with w_y the class weight of the
  target (1 without) and ε the label smoothing: G = w_y (p − q)/τ,
  q = (1 − ε) e_y + ε/V;
* cross-entropy with class weights and smoothing (torch's formula
  −(1−ε) w_y log p_y − (ε/V) Σ_c w_c log p_c): c_p = (1 − ε) w_y + (ε/V) Σ_c w_c,
  c_y = (1 − ε) w_y, v_j = w_j;
* a dense target y: G = (p − q)/τ with q = (1 − ε) y + ε/V;
* the z-loss β·lse(z)²: 2β·lse(z)·softmax(z)_j on kept rows, not class-weighted;
* TS² (:mod:`._ts2`): s_j·(a_on if j ∈ supp p ∪ {y} else a_off), s = softmax(z),
  with the row's coefficients a_on, a_off from the forward.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from .._ops.fused_walk import add_at
from ..threshold.families import Family
from ._ts2 import CLAMP
from .targets import index_target


class TileMap(NamedTuple):
    """A loss's map as the walk over vocabulary blocks needs it: ``probs(z)``
    is p = map(z/τ) on whole rows, ``family`` gives f and f⁻¹, ``f_`` is f in
    place (None: ``family.f``, out of place); ``ts2`` marks TS²'s softmax
    penalty on top of its sparsemax."""

    probs: Callable[[Tensor], Tensor]
    family: Family
    ts2: bool = False
    f_: Optional[Callable[[Tensor], Tensor]] = None


class TileLoss:
    """The gradient of a fused loss (its options ``o``, knobs included) one
    block of classes at a time: :meth:`stats` on a chunk's whole rows in the
    forward, :meth:`grad` on any (rows × classes) tile after, for a
    vocabulary of ``vocab`` classes.  ``z_scale`` is the z-loss's factor (:func:`softk.losses.chunking.chunk_loss_fn`)."""

    def __init__(self, o, tmap: TileMap, vocab: int, z_scale=1.0):
        self.map = tmap
        self.vocab = vocab
        self.tau = o.tau
        self.cap, self.eps, self.class_weight, self.beta = o.knobs
        self.ce = o.kind.torch_cross_entropy
        self.ignore_index = o.ignore_index
        self.sparse = o.sparse_grad
        self.z_scale = z_scale
        self.suppression, self.adaptive = o.suppression, o.adaptive
        # the softmax statistics lse(z) (z-loss, TS²'s penalty)
        self.lse = bool(self.beta) or tmap.ts2

    def _capped(self, z: Tensor) -> Tensor:
        return z if self.cap is None else self.cap * torch.tanh(z / self.cap)

    def stats(self, z: Tensor, t: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """The rows' numbers (C, k) from a chunk's logits z (C, V) in a float
        dtype (bias included, before the softcap; not modified), and where
        the loss's gradient is sparse the mask p > 0 (C, V), else None."""
        zc = self._capped(z)
        s = zc / self.tau if self.tau != 1.0 else zc
        m = s.amax(1)
        p = self.map.probs(zc)
        d = self.map.family.f_inv(p.amax(1))  # type: ignore[misc]  # set for every tile map's family
        cols = [m, d]
        if self.lse:
            lse = torch.logsumexp(zc, 1)
            cols.append(lse)
        if self.map.ts2:
            cols += self._ts2_stats(zc, p, lse, t)
        live = (p > 0) if self.sparse else None
        return torch.stack(cols, 1), live

    def _ts2_stats(self, zc: Tensor, p: Tensor, lse: Tensor, t: Tensor) -> list:
        """TS²'s row coefficients (a_off, a_on) of s (see :mod:`._ts2`)."""
        idx, keep = index_target(zc, t, self.ignore_index)
        s = torch.exp(zc - lse.unsqueeze(1))
        on = p > 0
        on[torch.arange(zc.shape[0], device=zc.device), idx] = True
        m = torch.where(on, 0.0, s).sum(1)
        py = p.gather(1, idx.unsqueeze(1)).squeeze(1)
        weight = 1.0 - py if self.adaptive else torch.ones_like(m)
        c = torch.where(m <= CLAMP, self.suppression * weight / (1 - torch.clamp(m, max=CLAMP)), 0.0)
        return [c * (1 - m), -c * m]

    def grad(self, z: Tensor, lo: int, stats: Tensor, t: Tensor, row_weight: Tensor) -> Tensor:
        """G = ∂(Σ_i w_i L_i)/∂z on the tile z (R, B) of classes lo ... lo + B − 1
        (float32 or float64 logits, bias included, overwritten), from the rows'
        ``stats`` (R, k), targets ``t`` (R,) (class indices) or (R, B) (the
        tile's columns of a dense target) and weights ``row_weight`` (R,).
        Beside z and G it holds no tile-sized temporary unless the softcap,
        the z-loss or TS²'s penalty needs one."""
        b = z.shape[1]
        cap, eps, tau, ve = self.cap, self.eps, self.tau, self.eps / self.vocab
        dcap = None
        if cap is not None:
            th = torch.tanh(z.div_(cap))
            dcap = 1 - th * th
            zc = th.mul_(cap)
        else:
            zc = z
        # u = (z/τ − m) + d, in place unless z is read again (z-loss, TS²)
        u = zc if not self.lse else zc.clone()
        # s = softmax(z) from the row's lse(z), in place of z (not read after)
        sm = zc.sub_(stats[:, 2:3]).exp_() if self.lse else None
        del zc

        if tau != 1.0:
            u.div_(tau)
        u.sub_(stats[:, :1]).add_(stats[:, 1:2])
        g = self.map.f_(u) if self.map.f_ is not None else self.map.family.f(u)
        del u
        if t.is_floating_point():
            # G = (p − q)/τ, q = (1 − ε) y + ε/V
            rs = (row_weight / tau).unsqueeze(1)
            g.sub_(t if not eps else (1 - eps) * t + ve).mul_(rs)
            kept = row_weight
        else:
            keep = t != self.ignore_index
            idx = torch.where(keep, t, 0)
            kept = torch.where(keep, row_weight, 0.0)
            rs = kept / tau
            cw = self.class_weight
            wy = cw.to(g.dtype)[idx] if cw is not None else torch.ones_like(rs)
            at = idx - lo
            inside = keep & (at >= 0) & (at < b)
            on = None
            if self.map.ts2:  # supp p ∪ {y}
                on = g > 0
                on.scatter_(1, at.clamp(0, b - 1).unsqueeze(1), inside.unsqueeze(1) | on.gather(
                    1, at.clamp(0, b - 1).unsqueeze(1)))
            if self.ce and cw is not None and eps:
                # torch's weighted, smoothed cross-entropy
                g.mul_(((1 - eps) * wy + ve * cw.sum().to(g.dtype)).mul_(rs).unsqueeze(1))
                g.sub_(ve * cw.to(g.dtype)[lo:lo + b] * rs.unsqueeze(1))
            else:
                g.mul_((wy * rs).unsqueeze(1))
                if eps:
                    g.sub_((ve * wy * rs).unsqueeze(1))
            add_at(g, at, inside, -(1 - eps) * wy * rs)
            if on is not None:
                assert sm is not None  # TS² keeps the lse column
                # s·a_off on every class, then s·(a_on − a_off) added on supp p ∪ {y}
                a = (wy * kept).unsqueeze(1)
                g.addcmul_(sm, stats[:, 3:4] * a)
                delta = (stats[:, 4] - stats[:, 3]) * a[:, 0]
                if g.is_cpu:  # the support's few entries, gathered
                    r, j = on.nonzero(as_tuple=True)
                    g.index_put_((r, j), sm[r, j] * delta[r], accumulate=True)
                else:  # dense, with no wait for the device
                    g.addcmul_(sm, on * delta.unsqueeze(1))
        if self.beta:
            assert sm is not None  # the z-loss keeps the lse column
            lse = stats[:, 2:3]
            g.addcmul_(sm, (2 * self.beta * self.z_scale) * lse * kept.unsqueeze(1))
        if dcap is not None:
            g.mul_(dcap)
        return g

