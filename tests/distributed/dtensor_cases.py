"""What each rank runs in tests/distributed/test_distributed_dtensor.py (DTensor logits).

Every rank builds the same full logits, distributes them with
``distribute_tensor(z, mesh, [Shard(1)])`` (uneven shards as DTensor makes
them: 19 classes over 3 ranks are 7, 7, 5) and compares the public softk
functions on the DTensor with the same functions on the full tensor, values
and gradients (float64, 1e-10).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

import softk
from softk import losses as L
from softk.distributed import vocab_parallel_entropy, vocab_parallel_logprobs

from .dist_cases import Counter, _expect, data, dense

D = torch.float64
INF = float("inf")


def rows(v, seed=0):
    """dist_cases.data plus a -inf stretch across every shard boundary and a row whose support is on one rank."""
    z, t = data(10, v, seed=seed)
    z[7, 3 : v - 3] = -INF  # crosses the boundaries at 7, 10 and 14
    t[7] = 1
    z[8] = -4.0
    z[8, v - 3 :] = torch.tensor([3.0, 2.5, 2.9], dtype=D)  # the support of every sparse map: the last shard
    t[8] = v - 2
    t[9] = -100  # an ignore_index row
    return z, t


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, equal_nan=True, msg=lambda m: f"{what}: {m}")


LOSSES = [
    ("cross_entropy", lambda x, t, **kw: L.cross_entropy(x, t, **kw), "index"),
    ("softmax_loss", lambda x, t, **kw: L.softmax_loss(x, t, **kw), "index"),
    ("sparsemax_loss", lambda x, t, **kw: L.sparsemax_loss(x, t, **kw), "index"),
    ("entmax15_loss", lambda x, t, **kw: L.entmax15_loss(x, t, **kw), "index"),
    ("entmax_loss", lambda x, t, **kw: L.entmax_loss(x, t, 1.7, **kw), "index"),
    ("topk_softmax_cross_entropy", lambda x, t, **kw: L.topk_softmax_cross_entropy(x, t, 3, **kw), "index"),
    ("soft_topk_loss", lambda x, y, **kw: L.soft_topk_loss(x, y, 3, "sparse", **kw), "dense"),
    ("ts2_loss", lambda x, t, **kw: L.ts2_loss(x, t, suppression=0.7, **kw), "index"),
    ("ts2_loss adaptive", lambda x, t, **kw: L.ts2_loss(x, t, adaptive=True, **kw), "index"),
    ("sparsemax_loss dense", lambda x, y, **kw: L.sparsemax_loss(x, y, **kw), "dense"),
]

MAPS = [
    ("softmax", lambda x: softk.softmax(x, -1, tau=0.9)),
    ("log_softmax", lambda x: softk.log_softmax(x, -1, tau=0.9)),
    ("sparsemax", lambda x: softk.sparsemax(x)),
    ("entmax15", lambda x: softk.entmax15(x, tau=0.9)),
    ("entmax", lambda x: softk.entmax(x, alpha=1.3)),
    ("soft_topk", lambda x: softk.soft_topk(x, 3, method="sparse")),
]


def check_losses(mesh, v, rank):
    z, t = rows(v)
    for name, f, kind in LOSSES:
        if kind == "dense":
            zz = z.clone()
            zz[7] = zz[6] = 0.5  # a masked class with mass gives +inf; the index cases cover the masks
            k = 3 if name == "soft_topk_loss" else 1
            y = dense(10, v, k)
            target = y if k == 3 else y / y.sum(1, keepdim=True)
        else:
            zz, target = z, t
            if name == "topk_softmax_cross_entropy":
                zz = z.clone()
                zz[2] = torch.linspace(-1, 1, v, dtype=D)  # no tie at the k-th place
                zz[4] = zz[7] = zz[6] = 0.3 * torch.arange(v, dtype=D)  # no fully masked row (NaN there)
            if name.startswith("ts2_loss"):
                # a fully masked row's loss is NaN, and the gradient a NaN loss takes
                # is not defined: give that row scores (the other masks stay)
                zz = z.clone()
                zz[4] = 0.3 * torch.arange(v, dtype=D)
        for reduction in ("mean", "sum", "none"):
            for ctx in (False, True):
                kw = {"reduction": reduction, "tau": 0.8}
                zf = zz.clone().requires_grad_()
                ref = f(zf, target, **kw)
                zd = distribute_tensor(zz, mesh, [Shard(-1)]).requires_grad_()
                if ctx:
                    with loss_parallel():
                        got = f(zd, target, **kw)
                else:
                    got = f(zd, target, **kw)
                what = f"{name} {reduction} loss_parallel={ctx} rank {rank}"
                assert isinstance(got, DTensor) and got.placements == (Replicate(),), (what, got)
                full = got.full_tensor()
                _close(full, ref, what)
                w = torch.linspace(0.5, 1.5, ref.numel(), dtype=D).reshape(ref.shape)
                w = torch.where(torch.isfinite(ref), w, 0.0)
                (gf,) = torch.autograd.grad((torch.where(torch.isfinite(ref), ref, 0.0) * w).sum(), zf)
                wd = distribute_tensor(w, mesh, [Replicate()])
                masked = torch.where(torch.isfinite(full), 1.0, 0.0)
                (gd,) = torch.autograd.grad((got * distribute_tensor(masked, mesh, [Replicate()]) * wd).sum(), zd)
                assert isinstance(gd, DTensor) and gd.placements == (Shard(1),), (what, gd)
                _close(gd.full_tensor(), gf, what + " grad")


def check_maps(mesh, v, rank):
    z, _ = rows(v)
    g = torch.randn(10, v, dtype=D, generator=torch.Generator().manual_seed(3))
    for name, f in MAPS:
        zf = z.clone().requires_grad_()
        ref = f(zf)
        zd = distribute_tensor(z, mesh, [Shard(-1)]).requires_grad_()
        got = f(zd)
        assert isinstance(got, DTensor) and got.placements == (Shard(1),), (name, got)
        _close(got.full_tensor(), ref, f"map {name} rank {rank}")
        gg = torch.where(torch.isfinite(ref), g, 0.0)
        (gf,) = torch.autograd.grad((torch.where(torch.isfinite(ref), ref, 0.0) * gg).sum(), zf)
        fin = distribute_tensor(torch.isfinite(ref).to(D), mesh, [Shard(1)])
        out = got * fin if name == "log_softmax" else got
        if name == "log_softmax":
            out = torch.where(fin.full_tensor() > 0, got.full_tensor(), 0.0)
            (gd,) = torch.autograd.grad((out * gg).sum(), zd)
        else:
            (gd,) = torch.autograd.grad((out * distribute_tensor(gg, mesh, [Shard(1)])).sum(), zd)
        assert gd.placements == (Shard(1),), (name, gd.placements)
        _close(gd.full_tensor(), gf, f"map {name} grad rank {rank}")


def _ref_entropy(p, a):
    if a == 1:
        return -torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0).sum(-1)
    s = torch.where(p > 0, p, 0.0).pow(a).sum(-1)
    return torch.where(s == 0, 0.0, (1 - s) / (a * (a - 1)))


def check_rl(mesh, v, rank):
    z, t = rows(v)
    tg = z.argmax(-1)  # in every map's support: a finite log-probability and gradient
    tg[9] = -100  # an ignored row
    zg = z.clone()
    zg[4] = 0.1 * torch.arange(v, dtype=D)  # no fully masked row (torch's NaN gradient convention there)
    tg[4] = v - 1
    group = mesh.get_group(0)
    for mp, alpha, ref_map, a in (("softmax", None, lambda x: softk.softmax(x, tau=0.7), 1),
                                  ("sparsemax", None, lambda x: softk.sparsemax(x, tau=0.7), 2),
                                  ("entmax", 1.6, lambda x: softk.entmax(x, alpha=1.6, tau=0.7), 1.6)):
        what = f"rl {mp} rank {rank}"
        for z, labels, grad in ((z, t, False), (zg, tg, True)):
            zf = z.clone().requires_grad_()
            p = ref_map(zf)
            keep = labels != -100
            pt = p.gather(-1, torch.where(keep, labels, 0).unsqueeze(-1)).squeeze(-1)
            ref_lp = torch.where(keep, torch.log(pt), 0.0)
            if mp == "softmax":  # -cross_entropy: NaN on a fully masked row, as torch's
                ref_lp = torch.where(keep & (z == -INF).all(-1), float("nan"), ref_lp)
            ref_h = _ref_entropy(p, a)
            zd = distribute_tensor(z, mesh, [Shard(-1)]).requires_grad_()
            lp = vocab_parallel_logprobs(zd, labels, map=mp, alpha=alpha, tau=0.7)
            h = vocab_parallel_entropy(zd, mp, alpha=alpha, tau=0.7)
            assert lp.placements == (Replicate(),) and h.placements == (Replicate(),)
            _close(lp.full_tensor(), ref_lp, what + " logprobs")
            _close(h.full_tensor(), ref_h, what + " entropy")
            # the local form: this rank's slice and the group
            lp2 = vocab_parallel_logprobs(zd.to_local().detach(), labels, group, map=mp, alpha=alpha, tau=0.7)
            _close(lp2, ref_lp.detach(), what + " local form")
            if not grad:
                continue
            w = torch.linspace(0.5, 1.5, 10, dtype=D)
            (gf,) = torch.autograd.grad((ref_lp * w).sum() + (ref_h * w.flip(0)).sum(), zf)
            wd = distribute_tensor(w, mesh, [Replicate()])
            (gd,) = torch.autograd.grad((lp * wd).sum() + (h * distribute_tensor(w.flip(0), mesh, [Replicate()])).sum(), zd)
            assert gd.placements == (Shard(1),)
            _close(gd.full_tensor(), gf, what + " grad")


EXPECTED_FWD = {  # after the agreement all-reduce
    "cross_entropy": ["all_reduce"] * 2,
    "sparsemax_loss": ["all_reduce", "all_reduce", "all_gather"],
    "entmax15_loss": ["all_reduce", "all_reduce", "all_gather"],
    "topk_softmax_cross_entropy": ["all_gather"],
}


def check_counts(mesh, v, rank):
    z, t = rows(v, seed=1)
    for name, f, kind in LOSSES:
        if name not in EXPECTED_FWD:
            continue
        zd = distribute_tensor(z, mesh, [Shard(-1)]).requires_grad_()
        with Counter() as c:
            out = f(zd, t)
        assert c.calls == ["all_reduce"] + EXPECTED_FWD[name], (name, c.calls)
        with Counter() as c:
            out.backward()
        assert c.calls == [], (name, "backward", c.calls)
    for name, f in MAPS:
        zd = distribute_tensor(z, mesh, [Shard(-1)]).requires_grad_()
        with Counter() as c:
            p = f(zd)
        want = ["all_reduce"] * 3 if name in ("softmax", "log_softmax") else ["all_reduce"] * 3 + ["all_gather"]
        assert c.calls == want, (name, c.calls)
        with Counter() as c:
            p.to_local().sum().backward()
        assert c.calls == ["all_reduce"], (name, "backward", c.calls)


def check_other_placements(mesh, v, rank, world):
    z, t = rows(v)
    n = 10
    zf = z.clone().requires_grad_()
    ref = L.sparsemax_loss(zf, t)
    (gf,) = torch.autograd.grad(ref, zf)
    for pl in ([Replicate()], [Shard(0)]):
        zd = distribute_tensor(z, mesh, pl).requires_grad_()
        got = L.sparsemax_loss(zd, t)
        assert got.placements == (Replicate(),), (pl, got.placements)
        _close(got.full_tensor(), ref, f"sparsemax_loss {pl}")
        (gd,) = torch.autograd.grad(got, zd)
        assert gd.placements == tuple(pl), (pl, gd.placements)
        _close(gd.full_tensor(), gf, f"sparsemax_loss {pl} grad")
        p = softk.entmax15(zd)
        assert p.placements == tuple(pl)
        _close(p.full_tensor(), softk.entmax15(z), f"entmax15 {pl}")
        r = L.cross_entropy(zd, t, reduction="none")
        _close(r.full_tensor(), L.cross_entropy(z, t, reduction="none"), f"cross_entropy none {pl}")
    del n
    # bad input: Partial logits, class indices sharded where the classes are, a dense target placed otherwise
    zp = DTensor.from_local(z / world, mesh, [Partial()])
    _expect(ValueError, "Partial", lambda: L.sparsemax_loss(zp, t))
    _expect(ValueError, "Partial", lambda: softk.sparsemax(zp))
    zd = distribute_tensor(z, mesh, [Shard(-1)])
    td = distribute_tensor(t, mesh, [Shard(0)])
    _expect(ValueError, "class indices must be replicated there", lambda: L.cross_entropy(zd, td))
    yd = distribute_tensor(dense(10, v, 3), mesh, [Replicate()])
    _expect(ValueError, "placed like the logits", lambda: L.soft_topk_loss(zd, yd, 3, "sparse"))
    _expect(ValueError, "label_smoothing", lambda: L.cross_entropy(zd, t, label_smoothing=0.1))
    # a replicated DTensor target works as a plain one does
    _close(L.cross_entropy(zd, distribute_tensor(t, mesh, [Replicate()])).full_tensor(), L.cross_entropy(z, t), "dt target")


def all_checks(rank, world, v):
    mesh = init_device_mesh("cpu", (world,))
    check_losses(mesh, v, rank)
    check_maps(mesh, v, rank)
    check_rl(mesh, v, rank)
    check_counts(mesh, v, rank)
    check_other_placements(mesh, v, rank, world)
    dist.barrier()


def mesh_2d_checks(rank, world, v):
    """A (2, 2) mesh: rows sharded on mesh dimension 0, classes on mesh dimension 1 (and the reverse order)."""
    mesh = init_device_mesh("cpu", (2, 2))
    z, t = rows(v)
    for pl in ([Shard(0), Shard(1)], [Shard(1), Shard(0)], [Replicate(), Shard(1)]):
        for name, f in (("cross_entropy", L.cross_entropy), ("entmax15_loss", L.entmax15_loss)):
            for reduction in ("mean", "sum", "none"):
                zf = z.clone().requires_grad_()
                ref = f(zf, t, reduction=reduction)
                zd = distribute_tensor(z, mesh, pl).requires_grad_()
                got = f(zd, t, reduction=reduction)
                what = f"2d {pl} {name} {reduction} rank {rank}"
                full = got.full_tensor()
                _close(full, ref, what)
                w = torch.where(torch.isfinite(ref), torch.linspace(0.5, 1.5, ref.numel(), dtype=D).reshape(ref.shape), 0.0)
                (gf,) = torch.autograd.grad((torch.where(torch.isfinite(ref), ref, 0.0) * w).sum(), zf)
                keep = distribute_tensor(torch.isfinite(ref).to(D) * w, mesh, [Replicate(), Replicate()])
                (gd,) = torch.autograd.grad((got * keep).sum(), zd)
                assert gd.placements == tuple(pl), (what, gd.placements)
                _close(gd.full_tensor(), gf, what + " grad")
        p = softk.sparsemax(distribute_tensor(z, mesh, pl))
        assert p.placements == tuple(pl)
        _close(p.full_tensor(), softk.sparsemax(z), f"2d {pl} sparsemax")
    dist.barrier()
