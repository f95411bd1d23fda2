"""What each rank runs in tests/distributed/test_distributed_compile.py (imported by the spawned processes).

vocab_parallel_loss and vocab_parallel_map under torch.compile against the
same calls eager, in float64: values and gradients to 1e-12, through graphs
that a recording backend received and that hold the functional collectives
(so the compiled function traced the collectives and did not fall back to
eager around them).
"""

from __future__ import annotations

import torch

from softk.distributed import vocab_parallel_loss, vocab_parallel_map

from . import dist_cases as C

TOL = dict(rtol=1e-12, atol=1e-12, equal_nan=True)

LOSSES = [
    ("cross_entropy", {}, "index"),
    ("softmax", {}, "index"),
    ("sparsemax", {}, "index"),
    ("entmax15", {}, "index"),
    ("entmax", {"alpha": 1.3}, "index"),
    ("topk_softmax_ce", {"k": 3}, "index"),
    ("ts2", {"adaptive": True}, "index"),
    ("sparsemax", {}, "dense"),
    ("soft_topk", {"k": 3, "method": "sparse"}, "dense"),
]


def _collectives(graphs):
    """The functional collectives in ``graphs``, with those of an autograd rule's forward and backward subgraphs."""
    mods = [m for gm in graphs for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]
    return {str(n.target).split(".")[1] for m in mods for n in m.graph.nodes if "_c10d_functional" in str(n.target)}


def _compiled(fn, backend):
    """``fn`` under torch.compile, after a fresh Dynamo, and the list of graphs its backend receives."""
    torch._dynamo.reset()
    graphs = []

    def recording(gm, inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, inputs)

    return torch.compile(fn, backend=recording), graphs


def _value_and_grad(fn, x, weight):
    x = x.clone().requires_grad_()
    out = fn(x)
    (out * weight if out.dim() else out).sum().backward()
    return out.detach(), x.grad


def _check(fn, x, weight, backend, what, expect):
    want, gw = _value_and_grad(fn, x, weight)
    cfn, graphs = _compiled(fn, backend)
    got, g = _value_and_grad(cfn, x, weight)
    assert graphs, f"{what}: nothing was compiled"
    assert expect <= _collectives(graphs), (what, _collectives(graphs))
    torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{what} value: {m}")
    torch.testing.assert_close(g, gw, **TOL, msg=lambda m: f"{what} grad: {m}")
    # the same again eagerly, after compiling: c10d's collectives, the same result
    again, ga = _value_and_grad(fn, x, weight)
    torch.testing.assert_close(again, want, **TOL)
    torch.testing.assert_close(ga, gw, **TOL)


def check_compiled_losses(rank, world, sizes, order, backend, reduction):
    v = sum(sizes)
    lo, hi = C.bounds(sizes, order)[rank]
    masks = reduction == "none"  # -inf masked classes once, on the rows' own losses
    z, t = C.data(9, v, masks=masks)
    t[[0, 7]] = -100  # ignored rows
    y = C.dense(9, v, 3)
    weight = torch.linspace(0.5, 1.5, 9, dtype=C.D)
    for loss, kw, kind in LOSSES:
        if kind == "dense":
            if masks:  # a dense target on masked classes is another test's business
                continue
            target = y[:, lo:hi] if kw.get("k", 1) == 3 else y[:, lo:hi] / 3
        else:
            target = t
        expect = {"all_gather_into_tensor"} if loss == "topk_softmax_ce" else {"all_reduce"}

        def fn(x, loss=loss, kw=kw, target=target):
            return vocab_parallel_loss(x, target, loss, reduction=reduction, **kw)

        _check(fn, z[:, lo:hi], weight, backend, f"{loss} {kw} {kind} {reduction} masks={masks}", expect)


def check_compiled_maps(rank, world, sizes, order, backend):
    v = sum(sizes)
    lo, hi = C.bounds(sizes, order)[rank]
    z, _ = C.data(9, v, masks=False)
    weight = torch.randn(9, hi - lo, dtype=C.D, generator=torch.Generator().manual_seed(rank + 5))
    for name in ("softmax", "sparsemax", "entmax15"):
        _check(lambda x, name=name: vocab_parallel_map(x, name), z[:, lo:hi], weight, backend, f"map {name}",
               {"all_reduce"})


PARTS = ("none", "mean", "sum", "maps")  # the losses under each reduction, then the maps


def compile_checks(rank, world, sizes, order, backend, part):
    if part == "maps":
        check_compiled_maps(rank, world, sizes, order, backend)
        C.check_counts(rank, world, sizes, order)  # eager, after compiling: the collectives counted as before
    else:
        check_compiled_losses(rank, world, sizes, order, backend, part)
