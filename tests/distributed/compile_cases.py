"""What each rank runs in tests/distributed/test_distributed_compile.py (imported by the spawned processes).

vocab_parallel_loss under each reduction and vocab_parallel_map under
torch.compile against the same calls eager, in float64: values and gradients
to 1e-12, through graphs that a recording backend received, that hold the
functional collectives and that ran in the compiled call (so the compiled
function traced the collectives and did not fall back to eager around them).

Dynamo starts afresh for each loss and each map.  A loss's three reductions
share its compiled frames, since the reduction only changes the last steps of
vocab_parallel_loss: the second and third compile only what differs.  A frame
past Dynamo's recompile limit raises instead of quietly running eagerly.
"""

from __future__ import annotations

import torch

from softk.distributed import vocab_parallel_loss, vocab_parallel_map

from . import dist_cases as C
from .recording import Recording

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

# -inf masked classes once, on the rows' own losses (a masked row's +inf would fill a mean or a sum)
REDUCTIONS = (("none", True), ("mean", False), ("sum", False))


def _value_and_grad(fn, x, weight):
    x = x.clone().requires_grad_()
    out = fn(x)
    (out * weight if out.dim() else out).sum().backward()
    return out.detach(), x.grad


def _check(fn, x, weight, rec, what, expect):
    want, gw = _value_and_grad(fn, x, weight)
    runs = list(rec.runs)
    got, g = _value_and_grad(torch.compile(fn, backend=rec), x, weight)
    ran = rec.ran_since(runs)
    assert expect <= ran, f"{what}: the compiled graphs that ran hold {ran or 'no'} collectives, not {expect}"
    torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{what} value: {m}")
    torch.testing.assert_close(g, gw, **TOL, msg=lambda m: f"{what} grad: {m}")
    # the same again eagerly, after compiling: c10d's collectives, the same result
    again, ga = _value_and_grad(fn, x, weight)
    torch.testing.assert_close(again, want, **TOL)
    torch.testing.assert_close(ga, gw, **TOL)


def check_compiled_losses(rank, world, sizes, order, backend):
    v = sum(sizes)
    lo, hi = C.bounds(sizes, order)[rank]
    weight = torch.linspace(0.5, 1.5, 9, dtype=C.D)
    data = {}
    for masks in (True, False):
        z, t = C.data(9, v, masks=masks)
        t[[0, 7]] = -100  # ignored rows
        data[masks] = z[:, lo:hi], t
    y = C.dense(9, v, 3)[:, lo:hi]
    for loss, kw, kind in LOSSES:
        torch._dynamo.reset()
        rec = Recording(backend)  # one per loss: its reductions reuse its frames
        expect = {"all_gather_into_tensor"} if loss == "topk_softmax_ce" else {"all_reduce"}
        for reduction, masks in REDUCTIONS:
            if kind == "dense" and masks:  # a dense target on masked classes is another test's business
                continue
            x, t = data[masks]
            target = t if kind == "index" else (y if kw.get("k", 1) == 3 else y / 3)

            def fn(x, loss=loss, kw=kw, target=target, reduction=reduction):
                return vocab_parallel_loss(x, target, loss, reduction=reduction, **kw)

            _check(fn, x, weight, rec, f"{loss} {kw} {kind} {reduction} masks={masks}", expect)


def check_compiled_maps(rank, world, sizes, order, backend):
    v = sum(sizes)
    lo, hi = C.bounds(sizes, order)[rank]
    z, _ = C.data(9, v, masks=False)
    weight = torch.randn(9, hi - lo, dtype=C.D, generator=torch.Generator().manual_seed(rank + 5))
    for name in ("softmax", "sparsemax", "entmax15"):
        torch._dynamo.reset()
        _check(lambda x, name=name: vocab_parallel_map(x, name), z[:, lo:hi], weight, Recording(backend),
               f"map {name}", {"all_reduce"})


def compile_checks(rank, world, sizes, order, backend):
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    check_compiled_losses(rank, world, sizes, order, backend)
    check_compiled_maps(rank, world, sizes, order, backend)
    C.check_counts(rank, world, sizes, order)  # eager, after compiling: the collectives counted as before
