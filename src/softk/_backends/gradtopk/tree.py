r"""GradTopK by a balanced tree of truncated log-space polynomial products.

The same quantities as the sequential scan (:mod:`.scan`), with
O(log n) levels of a few batched tensor ops each instead of n steps: the
algorithm for long rows and large k, and the one that suits a GPU.

With w = exp(z), a row's generating polynomial is Π_i (1 + w_i t), whose
degree-j coefficient is e_j(w).  Everything is kept as log coefficients.

* Inside pass.  Leaf i holds [0, z_i] (a masked entry, z_i = −inf, is the
  polynomial 1); the row is padded with such leaves to a power of two.  Level
  by level, siblings are multiplied and truncated at degree k:
  C[j] = logsumexp_a (A[a] + B[j − a]), all terms non-negative, each output
  shifted by its own maximum (torch.logsumexp), so nothing over- or underflows
  and an empty coefficient stays −inf.  The root holds log e_j(w), j ≤ k.
* Outside pass.  O_v = log-coefficients of Π over the leaves *not* under node
  v; O_child = O_parent · I_sibling.  A node of size s only keeps degrees
  k − min(s, k) .. k − 1 (the only ones that can reach degree k − 1 at one of
  its leaves: the window is exact, nothing is approximated).  At leaf i the
  window is the single degree k − 1, O_i = log e_{k−1}(w_{−i}), and
  p_i = exp(z_i + O_i − log e_k).
* The Hessian–vector product H g (the backward; p's jvp) pushes forward-mode
  tangents through the same products: dC[j] = Σ_a s_a (dA[a] + dB[j − a]) with
  s the softmax shares of the terms (0 where C = −inf), then
  H g = p ⊙ (g + dO − ⟨p, g⟩).

Work per row is O(n·k) terms (about 3 n k up and 3 n k down at n ≫ k, half
of them the −inf corners of the truncated products), depth 2·log2(n) levels;
the largest temporary is about n·(k + 1) float64 terms per row.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

NEG_INF = float("-inf")


def _windows(b: Tensor, off: int, count: int, width: int, fill: float) -> Tensor:
    """U[..., t, i'] = b[..., t + off − (count − 1) + i'] (``fill`` outside b),
    t < width, i' < count: the Toeplitz band a product reads, as a strided view
    (the summed index last, so the reductions run over contiguous memory)."""
    base = off - (count - 1)
    left = max(0, -base)
    start = base + left
    need = start + count + width - 1
    right = max(0, need - (left + b.shape[-1]))
    padded = F.pad(b, (left, right), value=fill)
    return padded[..., start:need].unfold(-1, count, 1)


def _product_block(a: Tensor, b: Tensor, off: int, width: int, da: Tensor | None, db: Tensor | None):
    """:func:`_product` on one block."""
    count = a.shape[-1]
    terms = _windows(b, off, count, width, NEG_INF) + a.flip(-1)[..., None, :]
    top = terms.amax(-1, keepdim=True)
    # an empty output (every term −inf) stays −inf: shift it by 0, not by −inf
    top.masked_fill_(top == NEG_INF, 0.0)
    terms = terms.sub_(top).exp_()
    total = terms.sum(-1, keepdim=True)
    c = (total.log() + top).squeeze(-1)
    if da is None:
        return c, None
    assert db is not None  # the tangents come in pairs
    # the terms' shares in each output (0/0 = NaN → 0 where the output is empty)
    share = terms.div_(total).nan_to_num_(nan=0.0)
    dterms = _windows(db, off, count, width, 0.0) + da.flip(-1)[..., None, :]
    return c, (share * dterms).sum(-1)


# Terms materialised at once by a product on the CPU, so that the five passes
# over them run in cache (the block size measured fastest: BENCHMARKS.md,
# GradTopK's tree).  On a GPU a level is one block: few large ops are what it
# is good at.
_CPU_BLOCK = 1 << 17


def _product(a: Tensor, b: Tensor, off: int, width: int, da: Tensor | None = None, db: Tensor | None = None):
    """C[t] = logsumexp_i (a[i] + b[t + off − i]), t < width (b is −inf outside
    its range), and, given tangents da/db, its tangent dC.  a, b: (R, m, ...)
    with broadcasting leading dims; on the CPU run in blocks of rows × nodes."""
    shape = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    per_node = width * a.shape[-1] * math.prod(shape[2:])
    if a.device.type != "cpu" or shape[0] * shape[1] * per_node <= _CPU_BLOCK:
        return _product_block(a, b, off, width, da, db)
    c = a.new_empty(shape + (width,))
    dc = None if da is None else torch.empty_like(c)
    step1 = max(1, _CPU_BLOCK // per_node)
    step0 = max(1, _CPU_BLOCK // (per_node * min(step1, shape[1])))
    for r0 in range(0, shape[0], step0):
        for m0 in range(0, shape[1], step1):
            part = (slice(r0, r0 + step0), slice(m0, m0 + step1))
            cp, dcp = _product_block(
                a[part], b[part], off, width, None if da is None else da[part], None if db is None else db[part]
            )
            c[part] = cp
            if dc is not None:
                dc[part] = dcp
    return c, dc


def _inside(z: Tensor, k: int, g: Tensor | None):
    """Levels of inside log-polynomials (and their tangents): list of (R, m, d + 1)."""
    r, n = z.shape
    size = 1 << max(0, (n - 1).bit_length())
    zp = F.pad(z, (0, size - n), value=NEG_INF)
    level = torch.stack([torch.zeros_like(zp), zp], -1)  # (R, size, 2): 1 + w_i t
    dlevel = None
    if g is not None:
        gp = F.pad(g, (0, size - n), value=0.0)
        dlevel = torch.stack([torch.zeros_like(gp), gp], -1)
    levels, dlevels = [level], [dlevel]
    while level.shape[1] > 1:
        d = level.shape[-1] - 1
        pair = level.unflatten(1, (-1, 2))
        dpair = None if dlevel is None else dlevel.unflatten(1, (-1, 2))
        width = min(2 * d, k) + 1
        level, dlevel = _product(
            pair[:, :, 0], pair[:, :, 1], 0, width,
            None if dpair is None else dpair[:, :, 0], None if dpair is None else dpair[:, :, 1],
        )
        levels.append(level)
        dlevels.append(dlevel)
    return levels, dlevels


def _outside(levels, dlevels, k: int):
    """Leaf outside values log e_{k−1}(w_{−i}) (R, size) and their tangents."""
    r, size = levels[0].shape[:2]
    width = min(size, k)
    lo = k - width
    out = torch.full((r, 1, width), NEG_INF, dtype=levels[0].dtype, device=levels[0].device)
    if lo == 0:
        out[..., 0] = 0.0  # the polynomial 1
    tangent = dlevels[0] is not None
    dout = torch.zeros_like(out) if tangent else None
    for depth in range(len(levels) - 2, -1, -1):
        ins = levels[depth]  # children (R, m, d + 1)
        m = ins.shape[1]
        sib = ins.unflatten(1, (-1, 2)).flip(2)  # (R, m/2, 2, d + 1): each child's sibling
        dsib = dlevels[depth].unflatten(1, (-1, 2)).flip(2) if tangent else None
        cwidth = min(1 << depth, k)
        clo = k - cwidth
        out, dout = _product(
            sib, out[:, :, None, :], clo - lo, cwidth, dsib, dout[:, :, None, :] if tangent else None  # type: ignore[index]
        )
        out = out.reshape(r, m, cwidth)
        dout = dout.reshape(r, m, cwidth) if tangent else None
        lo = clo
    return out[..., 0], (dout[..., 0] if tangent else None)  # type: ignore[index]  # dout is set with tangent


def solve_tree(z: Tensor, k: int, g: Tensor | None = None):
    """For rows z (R, n) of finite-or-(−inf) float64 entries with more than k
    finite ones: (log e_k (R,), p (R, n), H g (R, n) or None).  Other rows
    give values that the caller replaces by the row conventions."""
    r, n = z.shape
    top = z.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    zs = z - top  # log e_k shifts by k·top, p does not: keep the numbers small
    levels, dlevels = _inside(zs, k, g)
    root = levels[-1][:, 0]
    log_ek = root[:, k] if root.shape[-1] > k else torch.full_like(root[:, 0], NEG_INF)
    loo, dloo = _outside(levels, dlevels, k)
    # 0 < p < 1 exactly; rounding of the exponent can put a saturated p a few ulps above 1.
    p = torch.exp(zs + loo[:, :n] - log_ek[:, None]).clamp(max=1.0)
    value = log_ek + k * top.squeeze(-1)
    if g is None:
        return value, p, None
    mean = (p * g).sum(-1, keepdim=True)  # tangent of log e_k is <p, g>
    return value, p, p * (g + dloo[:, :n] - mean)
