"""What each rank runs in tests/test_distributed.py (imported by the spawned processes).

Every rank builds the same full logits from a fixed seed, takes its own slice,
and compares softk.distributed's result with the single-device softk result
on the full logits (itself checked against the NumPy oracles elsewhere):
values, and gradients restricted to the rank's columns.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import softk
from softk import losses as L
from softk.distributed import vocab_parallel_loss, vocab_parallel_map

D = torch.float64
INF = float("inf")


def single_loss(loss, z, t, *, alpha=None, k=1, method="sparse", tau=1.0, ignore_index=-100, reduction="mean",
                suppression=None, adaptive=False):
    if loss == "cross_entropy":
        return L.cross_entropy(z, t, ignore_index=ignore_index, reduction=reduction, tau=tau)
    if loss == "softmax":
        return L.softmax_loss(z, t, ignore_index, reduction, tau)
    if loss == "sparsemax":
        return L.sparsemax_loss(z, t, ignore_index, reduction, tau)
    if loss == "entmax15":
        return L.entmax15_loss(z, t, ignore_index, reduction, tau)
    if loss == "entmax":
        return L.entmax_loss(z, t, alpha, ignore_index, reduction, tau)
    if loss == "soft_topk":
        return L.soft_topk_loss(z, t, k, method, tau, reduction)
    if loss == "ts2":
        return L.ts2_loss(z, t, suppression=1.0 if suppression is None else suppression, tau=tau, adaptive=adaptive,
                          ignore_index=ignore_index, reduction=reduction)
    return L.topk_softmax_cross_entropy(z, t, k, ignore_index, reduction, tau)


def single_map(name, z, *, k=1, tau=1.0, alpha=None):
    if name == "softmax":
        return softk.softmax(z, dim=-1, tau=tau)
    if name == "sparsemax":
        return softk.sparsemax(z, dim=-1, tau=tau)
    if name == "entmax15":
        return softk.entmax15(z, dim=-1, tau=tau)
    if name == "entmax":
        return softk.entmax(z, alpha=alpha, dim=-1, tau=tau)
    return softk.soft_topk(z, k, dim=-1, tau=tau, method=name)


def data(n, v, seed=0, masks=True):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, dtype=D, generator=g) * 2
    z[1, 3] = z[1, 5] = z[1].max() + 0.5  # a tie at the top
    z[2] = 0.25  # a flat row: every entry a candidate
    if masks:
        z[3, ::2] = -INF  # half masked
        z[4] = -INF  # fully masked
        z[5, :] = -INF
        z[5, v - 1] = 1.0  # one finite entry, on the last slice
    t = torch.randint(0, v, (n,), generator=g)
    if masks:
        t[3] = 1  # a finite class of the half-masked row
        t[6] = 0 if v > 0 else 0
        z[6, 0] = -INF  # the target's class is masked: loss +inf
    return z, t


def dense(n, v, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    y = torch.zeros(n, v, dtype=D)
    y.scatter_(1, torch.rand(n, v, generator=g).argsort(-1)[:, :k], 1.0)
    return y


def bounds(sizes, order):
    """(start, stop) of every rank's slice: rank r holds slice order[r] of the tiling by `sizes`."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(starts[order[r]], starts[order[r]] + sizes[order[r]]) for r in range(len(order))]


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, equal_nan=True, msg=lambda m: f"{what}: {m}")


LOSS_CASES = [
    ("cross_entropy", {}, "index"),
    ("softmax", {}, "index"),
    ("sparsemax", {}, "index"),
    ("entmax15", {}, "index"),
    ("entmax", {"alpha": 1.3}, "index"),
    ("entmax", {"alpha": 2.5}, "index"),
    ("topk_softmax_ce", {"k": 3}, "index"),
    ("ts2", {"suppression": 0.7}, "index"),
    ("ts2", {"adaptive": True}, "index"),
    ("sparsemax", {}, "dense"),
    ("entmax15", {}, "dense"),
    ("softmax", {}, "dense"),
    ("soft_topk", {"k": 3, "method": "sparse"}, "dense"),
    ("soft_topk", {"k": 1, "method": "exp"}, "dense"),
]


def check_losses(rank, world, sizes, order):
    v = sum(sizes)
    lo, hi = bounds(sizes, order)[rank]
    explicit = order != list(range(world))
    for masks in (True, False):
        z, t = data(9, v, masks=masks)
        t_ign = t.clone()
        t_ign[[0, 7]] = -7
        for loss, kw, kind in LOSS_CASES:
            if kind == "dense":
                if masks and loss != "soft_topk":
                    continue  # a masked class with mass gives +inf; covered by the index cases
                y = dense(9, v, kw.get("k", 1))
                if loss != "soft_topk":
                    y = y / y.sum(1, keepdim=True)
                targets = [(y, -100)]
            else:
                targets = [(t, -100), (t_ign, -7)]
                if loss in ("topk_softmax_ce", "ts2") and masks:
                    # a kept fully masked row is NaN, with a NaN gradient (checked without masks);
                    # ignored, it and the row whose target is masked give 0 and no gradient
                    # (softmax's NaN on it, times its weight 0, was NaN; TS²'s penalty
                    # formed exp(+inf) on it)
                    t_pad = t_ign.clone()
                    t_pad[[4, 6]] = -7
                    targets = [(t_pad, -7)]
            if loss == "topk_softmax_ce":
                # Ties at the k-th place: the value is the same, but the gradient goes to
                # whichever tied entries topk returns (documented); keep the flat row out.
                z = z.clone()
                z[2] = torch.linspace(-1, 1, v, dtype=D)
            for target, ign in targets:
                for reduction in ("mean", "none"):
                    zf = z.clone().requires_grad_()
                    opts = dict(kw, tau=0.8, reduction=reduction)
                    if kind == "index":
                        opts["ignore_index"] = ign
                    ref = single_loss(loss, zf, target, **opts)
                    zl = z[:, lo:hi].clone().requires_grad_()
                    tl = target[:, lo:hi] if kind == "dense" else target
                    got = vocab_parallel_loss(zl, tl, loss, vocab_start=lo if explicit else None, **opts)
                    what = f"{loss} {kw} {kind} ign={ign} {reduction} masks={masks} rank {rank}"
                    _close(got, ref, what)
                    w = torch.linspace(0.5, 1.5, ref.numel(), dtype=D).reshape(ref.shape)
                    keep = torch.isfinite(ref) if reduction == "none" else None
                    if keep is not None:
                        w = torch.where(keep, w, 0.0)  # inf rows: gradient is finite, but inf * 0 is not
                        ref, got = torch.where(keep, ref, 0.0), torch.where(keep, got, 0.0)
                    (gf,) = torch.autograd.grad((ref * w).sum(), zf)
                    (gl,) = torch.autograd.grad((got * w).sum(), zl)
                    _close(gl, gf[:, lo:hi], what + " grad")


def check_float32(rank, world, sizes, order):
    """float32 slices against the float64 single-device loss: float32 rounding only."""
    v = sum(sizes)
    lo, hi = bounds(sizes, order)[rank]
    explicit = order != list(range(world))
    z, t = data(9, v, masks=False)
    for loss in ("cross_entropy", "sparsemax", "entmax15"):
        zf = z.clone().requires_grad_()
        ref = single_loss(loss, zf, t)
        zl = z[:, lo:hi].float().requires_grad_()
        got = vocab_parallel_loss(zl, t, loss, vocab_start=lo if explicit else None)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)
        (gf,) = torch.autograd.grad(ref, zf)
        (gl,) = torch.autograd.grad(got, zl)
        torch.testing.assert_close(gl.double(), gf[:, lo:hi], rtol=1e-4, atol=1e-6)


def check_offset_and_tau(rank, world, sizes, order):
    """float32 slices at an offset of 1e6 with τ = 0.3 against the float64
    oracle: the losses shift the concatenated row before dividing by τ, as
    the single-device losses do (x/τ first moved them by 1 %); cross_entropy
    divides first, as torch's cross_entropy(x/τ) does, and equals that."""
    import numpy as np

    from tests.oracle import losses as oracle

    v = sum(sizes)
    lo, hi = bounds(sizes, order)[rank]
    explicit = order != list(range(world))
    z, t = data(5, v, masks=False)
    x = (z + 1e6).float()  # 1e6 + z rounded to float32: the exact input of both sides
    y = np.eye(v)[t.numpy()]
    for loss, name in (("sparsemax", "sparsemax"), ("entmax15", "entmax"), ("softmax", "softmax")):
        got = vocab_parallel_loss(x[:, lo:hi], t, loss, tau=0.3, reduction="none", vocab_start=lo if explicit else None)
        ref = oracle.fy_loss(name, x.double().numpy(), y, tau=0.3, alpha=1.5 if name == "entmax" else None)
        np.testing.assert_allclose(got.double().numpy(), ref, rtol=4e-6, err_msg=f"{loss} rank {rank}")
    got = vocab_parallel_loss(x[:, lo:hi], t, "cross_entropy", tau=0.3, reduction="none",
                              vocab_start=lo if explicit else None)
    ref = torch.nn.functional.cross_entropy(x / 0.3, t, reduction="none")
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=0)
    # a masked class with weight 0 in a dense target: torch's 0·(−inf) = NaN, as cross_entropy gives
    zm = torch.zeros(1, v, dtype=D)
    zm[0, 1] = -INF
    ym = torch.zeros(1, v, dtype=D)
    ym[0, 0] = ym[0, 2] = 0.5
    got = vocab_parallel_loss(zm[:, lo:hi], ym[:, lo:hi], "cross_entropy", vocab_start=lo if explicit else None)
    assert torch.isnan(got) and torch.isnan(torch.nn.functional.cross_entropy(zm, ym))


MAP_CASES = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.7}),
             ("entmax", {"alpha": 3.0}), ("sparse", {"k": 3}), ("exp", {"k": 1})]


def check_maps(rank, world, sizes, order):
    v = sum(sizes)
    lo, hi = bounds(sizes, order)[rank]
    z, _ = data(9, v)
    z[7] = float("nan")
    g = torch.randn(9, v, dtype=D, generator=torch.Generator().manual_seed(5))
    for name, kw in MAP_CASES:
        zf = z.clone().requires_grad_()
        ref = single_map(name, zf, tau=0.9, **kw)
        zl = z[:, lo:hi].clone().requires_grad_()
        got = vocab_parallel_map(zl, name, tau=0.9, **kw)
        _close(got, ref[:, lo:hi], f"map {name} {kw} rank {rank}")
        (gf,) = torch.autograd.grad((ref * g).sum(), zf)
        (gl,) = torch.autograd.grad((got * g[:, lo:hi]).sum(), zl)
        # Row 7 (NaN): softk's single-device backends disagree on its gradient (the
        # compiled kernels give NaN, the PyTorch path for entmax alpha > 2 gives 0);
        # vocab_parallel_map gives NaN.
        rows = [i for i in range(9) if i != 7]
        _close(gl[rows], gf[rows, lo:hi], f"map {name} {kw} grad rank {rank}")
        assert bool(torch.isnan(gl[7]).all())


class Counter:
    """Counts the collectives softk.distributed makes (wraps torch.distributed's functions)."""

    def __init__(self):
        self.calls = []

    def __enter__(self):
        self.saved = {n: getattr(dist, n) for n in ("all_reduce", "all_gather", "broadcast", "all_gather_into_tensor", "barrier")}
        for n, f in self.saved.items():
            setattr(dist, n, self._wrap(n, f))
        return self

    def _wrap(self, name, f):
        def g(*a, **k):
            self.calls.append(name)
            return f(*a, **k)
        return g

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(dist, n, f)


EXPECTED = {  # loss or map -> collectives in the forward (after the 1 agreement all-reduce)
    "cross_entropy": ["all_reduce"] * 2,
    "softmax": ["all_reduce"] * 2,
    "sparsemax": ["all_reduce", "all_reduce", "all_gather"],
    "entmax15": ["all_reduce", "all_reduce", "all_gather"],
    "entmax": ["all_reduce", "all_reduce", "all_gather"],
    "topk_softmax_ce": ["all_gather"],
}


def check_counts(rank, world, sizes, order):
    v = sum(sizes)
    lo, hi = bounds(sizes, order)[rank]
    for seed in (0, 1):  # different data, same count
        z, t = data(8, v, seed=seed, masks=bool(seed))
        for loss, kw in (("cross_entropy", {}), ("softmax", {}), ("sparsemax", {}), ("entmax15", {}),
                         ("entmax", {"alpha": 1.3}), ("topk_softmax_ce", {"k": 2})):
            zl = z[:, lo:hi].clone().requires_grad_()
            with Counter() as c:
                out = vocab_parallel_loss(zl, t, loss, **kw)
            assert c.calls == ["all_reduce"] + EXPECTED[loss], (loss, c.calls)
            with Counter() as c:
                out.backward()
            assert c.calls == [], (loss, "backward", c.calls)
        for name in ("softmax", "sparsemax", "entmax15"):
            zl = z[:, lo:hi].clone().requires_grad_()
            with Counter() as c:
                p = vocab_parallel_map(zl, name)
            assert c.calls == ["all_reduce"] + EXPECTED[name], (name, c.calls)
            with Counter() as c:
                p.sum().backward()
            assert c.calls == ["all_reduce"], (name, "backward", c.calls)


def _expect(exc, match, fn):
    try:
        fn()
    except exc as e:
        assert match in str(e), f"expected {match!r} in {e!r}"
        return
    raise AssertionError(f"no {exc.__name__} ({match!r})")


def check_errors(rank, world, sizes, order):
    """Each bad call raises on every rank; the next good call proves no rank is left behind."""
    v = sum(sizes)
    lo, hi = bounds(sizes, list(range(world)))[rank]
    z, t = data(4, v, masks=False)
    zl = z[:, lo:hi]

    def good():
        out = vocab_parallel_loss(zl, t, "sparsemax")
        _close(out, L.sparsemax_loss(z, t), "good call after an error")

    bad_t = t.clone()
    bad_t[1] = v
    _expect(ValueError, f"outside [0, {v})", lambda: vocab_parallel_loss(zl, bad_t, "sparsemax"))
    good()
    neg = t.clone()
    if rank == world - 1:
        neg[0] = -3  # only the last rank sees a bad target
    _expect(ValueError, "-3" if rank == world - 1 else f"rank {world - 1}", lambda: vocab_parallel_loss(zl, neg, "softmax"))
    good()
    wrong = [0] + [lo + 1] * (world - 1)
    _expect(ValueError, "vocab_start and the slice sizes disagree",
            lambda: vocab_parallel_loss(zl, t, "sparsemax", vocab_start=wrong[rank] if rank else 0))
    good()
    _expect(ValueError, "on every rank or on none",
            lambda: vocab_parallel_loss(zl, t, "sparsemax", vocab_start=0 if rank == 0 else None))
    good()
    zd = zl.float() if rank == 1 else zl
    _expect(ValueError, "dtype differs", lambda: vocab_parallel_loss(zd, t, "entmax15"))
    good()
    zs = torch.cat([zl, zl[:1]]) if rank == 0 else zl
    ts = torch.cat([t, t[:1]]) if rank == 0 else t
    _expect(ValueError, "rows", lambda: vocab_parallel_loss(zs, ts, "entmax15"))
    good()
    _expect(ValueError, "k must be in [1, V]", lambda: vocab_parallel_map(zl, "sparse", k=v + 1))
    good()
    _expect(ValueError, "not available vocab-parallel", lambda: vocab_parallel_map(zl, "exp", k=2))
    good()
    _expect(ValueError, "not available vocab-parallel",
            lambda: vocab_parallel_loss(zl, dense(4, v, 2)[:, lo:hi], "soft_topk", k=2, method="sigmoid"))
    good()
    name = "sparsemax" if rank == 0 else "sparsmax"
    _expect(ValueError, "loss must be one of" if rank else "rank 1", lambda: vocab_parallel_loss(zl, t, name))
    good()
    y = dense(4, v, 2)[:, lo:hi]  # rows sum to 2, not 1
    _expect(ValueError, "row sums", lambda: vocab_parallel_loss(zl, y, "sparsemax"))
    good()
    tt = t.clone()
    if rank == 0:
        tt[0] = (tt[0] + 1) % v
    _expect(ValueError, "target", lambda: vocab_parallel_loss(zl, tt, "sparsemax"))
    good()


def check_subgroup(rank, world):
    """Ranks 0 and 2 of 3 form a tensor-parallel group; rank 1 is not in it."""
    sub = dist.new_group([0, 2])
    v = 11
    z, t = data(5, v, masks=False)
    if rank == 1:
        _expect(ValueError, "not a member", lambda: vocab_parallel_loss(z, t, "sparsemax", group=sub))
        return
    lo, hi = (0, 4) if rank == 0 else (4, v)
    zl = z[:, lo:hi].clone().requires_grad_()
    out = vocab_parallel_loss(zl, t, "entmax15", group=sub)
    zf = z.clone().requires_grad_()
    ref = L.entmax15_loss(zf, t)
    _close(out, ref, "subgroup")
    (gl,) = torch.autograd.grad(out, zl)
    (gf,) = torch.autograd.grad(ref, zf)
    _close(gl, gf[:, lo:hi], "subgroup grad")
    p = vocab_parallel_map(z[:, lo:hi], "sparsemax", group=sub)
    _close(p, softk.sparsemax(z, dim=-1)[:, lo:hi], "subgroup map")


def check_broken_rows(rank, world, sizes, order):
    """Rows holding +inf or NaN (on one rank's slice) are NaN, loss and every
    gradient entry, as on one device; an ignored one gives 0.  The top-k
    cross-entropy gave a +inf row an infinite loss, and the ranks without
    the +inf a finite gradient."""
    v = sum(sizes)
    lo, hi = bounds(sizes, order)[rank]
    explicit = order != list(range(world))
    z, t = data(6, v, masks=False)
    z[0, 0] = INF
    z[1, v - 1] = float("nan")
    z[2, v // 2] = INF
    t = t.clone()
    t[2] = -100
    for reduction in ("none", "sum"):
        zf = z.clone().requires_grad_()
        ref = single_loss("topk_softmax_ce", zf, t, k=3, reduction=reduction)
        zl = z[:, lo:hi].clone().requires_grad_()
        got = vocab_parallel_loss(zl, t, "topk_softmax_ce", k=3, reduction=reduction,
                                  vocab_start=lo if explicit else None)
        what = f"broken rows {reduction} rank {rank}"
        _close(got, ref, what)
        (gf,) = torch.autograd.grad(ref.sum(), zf)
        (gl,) = torch.autograd.grad(got.sum(), zl)
        _close(gl, gf[:, lo:hi], what + " grad")


def all_checks(rank, world, sizes, order):
    check_losses(rank, world, sizes, order)
    check_broken_rows(rank, world, sizes, order)
    check_float32(rank, world, sizes, order)
    check_offset_and_tau(rank, world, sizes, order)
    check_maps(rank, world, sizes, order)
    check_counts(rank, world, sizes, order)
    check_errors(rank, world, sizes, order)  # contiguous slices of `sizes`, whatever `order` is
    check_fused(rank, world, sizes, order)
    if world == 3:
        check_subgroup(rank, world)


def check_fused_against(ref_fn, x, w, b, t, bounds_r, explicit, what, loss, **kwargs):
    """vocab_parallel_fused_linear_loss(x, this rank's rows of w and b, t, loss, **kwargs), in chunks
    of 3 rows, against ``ref_fn(x, w, b)`` on one device: the value and the gradients of x
    and of this rank's rows (``bounds_r`` = (lo, hi))."""
    from softk.distributed import vocab_parallel_fused_linear_loss

    lo, hi = bounds_r
    xf, wf, bf = (a.clone().requires_grad_() for a in (x, w, b))
    ref = ref_fn(xf, wf, bf)
    gx, gw, gb = torch.autograd.grad(ref, (xf, wf, bf))
    xl, wl, bl = x.clone().requires_grad_(), w[lo:hi].clone().requires_grad_(), b[lo:hi].clone().requires_grad_()
    tl = t[:, lo:hi] if t.is_floating_point() else t  # a dense target is sliced like the weight
    out = vocab_parallel_fused_linear_loss(xl, wl, tl, loss, bl, vocab_start=lo if explicit else None,
                                           chunk_size=3, **kwargs)
    _close(out, ref, what)
    hx, hw, hb = torch.autograd.grad(out, (xl, wl, bl))
    _close(hx, gx, what + " grad input")
    _close(hw, gw[lo:hi], what + " grad weight")
    _close(hb, gb[lo:hi], what + " grad bias")


def check_fused(rank, world, sizes, order):
    """W sharded by vocabulary: loss and gradients equal the single-device fused/unfused ones."""
    from softk.distributed import vocab_parallel_fused_linear_loss

    v = sum(sizes)
    lo, hi = bounds(sizes, order)[rank]
    explicit = order != list(range(world))
    g = torch.Generator().manual_seed(11)
    x = torch.randn(10, 4, dtype=D, generator=g)
    w = torch.randn(v, 4, dtype=D, generator=g)
    b = torch.randn(v, dtype=D, generator=g)
    t = torch.randint(0, v, (10,), generator=g)
    t[3] = -100
    for loss, kw in (("sparsemax", {}), ("cross_entropy", {}), ("entmax", {"alpha": 1.4})):
        for reduction in ("mean", "sum"):
            def ref(xf, wf, bf):
                return single_loss(loss, xf @ wf.T + bf, t, reduction=reduction, **kw)

            check_fused_against(ref, x, w, b, t, (lo, hi), explicit, f"fused {loss} {reduction} rank {rank}",
                                loss=loss, reduction=reduction, **kw)
    xs = torch.cat([x, x[:1]]) if rank == 0 else x
    ts = torch.cat([t, t[:1]]) if rank == 0 else t
    _expect(ValueError, "number of rows", lambda: vocab_parallel_fused_linear_loss(xs, w[lo:hi], ts, "sparsemax"))
