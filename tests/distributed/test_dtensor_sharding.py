"""The DTensor sharding rules of the ``softk::`` row ops (softk._ops.sharding), called as ``torch.ops.softk.*``.

Batch shards and ``Replicate`` pass through (outputs placed like the input, a
summed loss ``Partial``); a class shard is gathered by DTensor first, and a
"mean" loss replicates its rows.  References: sparsemax, its backward and
its Fenchel–Young loss written here in plain float64 torch (sort and cumsum).
One rank in this process (default run) and two ranks over gloo (slow).
"""

from __future__ import annotations

import pytest
import torch

from .dist_harness import run
from ..oracle.sparsemax_torch import sparsemax as sparsemax_ref, sparsemax_loss_rows

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")

TOL = dict(rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------- references
def sparsemax_backward_ref(p, g):
    s = (p > 0).to(g.dtype)
    return s * (g - (g * s).sum(-1, keepdim=True) / s.sum(-1, keepdim=True))


def sparsemax_loss_ref(z, y):
    """Fenchel–Young with Ω = ½‖p‖²: ⟨z, p⟩ − ½‖p‖² + ½ − z_y, per row; its gradient p − e_y."""
    e = torch.nn.functional.one_hot(y, z.shape[-1]).to(z.dtype)
    return sparsemax_loss_rows(z, y), sparsemax_ref(z) - e


# ------------------------------------------------------------------ checks
def _register_ops():
    from softk._ops import entmax_alpha, fused_loss, op

    for m in (op, fused_loss, entmax_alpha):
        m._library()


def checks(mesh):
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    _register_ops()
    ops = torch.ops.softk
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64, generator=gen) * 2
    g = torch.randn(5, 7, dtype=torch.float64, generator=gen)
    y = torch.tensor([0, 6, 3, 3, 1])
    p_ref = sparsemax_ref(x)

    def dt(t, placements):
        return distribute_tensor(t, mesh, placements)

    def same(out, ref, placements, what):
        assert isinstance(out, DTensor), what
        assert tuple(out.placements) == tuple(placements), f"{what}: {out.placements}"
        torch.testing.assert_close(out.full_tensor(), ref, **TOL, msg=what)

    for pl in ([Shard(0)], [Replicate()]):
        # a map's forward and backward
        p = ops.threshold(dt(x, pl), "sparsemax", 2.0, 1, 1.0, "torch")
        same(p, p_ref, pl, f"threshold on {pl}")
        dx = ops.threshold_backward(p, dt(g, pl), "sparsemax", 2.0, 1.0, "torch")
        same(dx, sparsemax_backward_ref(p_ref, g), pl, f"threshold_backward on {pl}")
        # a second per-row input: α shaped (rows, 1), laid out like x's rows
        pa = ops.entmax_alpha(dt(x, pl), dt(torch.full((5, 1), 2.0, dtype=torch.float64), pl), 1.0)
        same(pa, p_ref, pl, f"entmax_alpha on {pl}")
        # the fused loss: per row, summed, averaged
        loss_ref, grad_ref = sparsemax_loss_ref(x, y)
        args = (None, "sparsemax", 2.0, 1, 1.0)
        loss, grad = ops.fenchel_young_fused(dt(x, pl), dt(y, pl), *args, "none", -100, False, "native", True)
        same(loss, loss_ref, pl, f"loss 'none' on {pl}")
        same(grad, grad_ref, pl, f"loss gradient on {pl}")
        loss, grad = ops.fenchel_young_fused(dt(x, pl), dt(y, pl), *args, "sum", -100, False, "native", True)
        same(loss, loss_ref.sum(), [Partial("sum")] if pl == [Shard(0)] else pl, f"loss 'sum' on {pl}")
        same(grad, grad_ref, pl, f"'sum' gradient on {pl}")
        # a shard's mean is not the mean: the rows are replicated first
        loss, grad = ops.fenchel_young_fused(dt(x, pl), dt(y, pl), *args, "mean", -100, False, "native", True)
        same(loss, loss_ref.mean(), [Replicate()], f"loss 'mean' on {pl}")
        same(grad, grad_ref / 5, [Replicate()], f"'mean' gradient on {pl}")

    # any leading dimension, not only the first
    x3 = x.reshape(1, 5, 7).expand(2, 5, 7).contiguous()
    same(ops.threshold(dt(x3, [Shard(1)]), "sparsemax", 2.0, 1, 1.0, "torch"), p_ref.expand(2, 5, 7), [Shard(1)],
         "threshold on Shard(1) of 3-d rows")

    # the class dimension: no rule offers it, DTensor gathers the classes
    p = ops.threshold(dt(x, [Shard(1)]), "sparsemax", 2.0, 1, 1.0, "torch")
    same(p, p_ref, [Replicate()], "threshold on Shard(-1)")
    loss, _ = ops.fenchel_young_fused(dt(x, [Shard(1)]), dt(y, [Replicate()]), None, "sparsemax", 2.0, 1, 1.0,
                                      "none", -100, False, "native", True)
    same(loss, sparsemax_loss_ref(x, y)[0], [Replicate()], "loss on Shard(-1)")


def _two_ranks(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    checks(init_device_mesh("cpu", (world,)))


# -------------------------------------------------------------------- tests
def test_every_row_op_has_a_rule_and_attention_none():
    pytest.importorskip("torch.distributed.tensor")
    from torch.distributed.tensor import DTensor

    import softk._ops as ops_pkg
    import importlib
    import pkgutil

    from softk._ops import sharding

    for m in pkgutil.iter_modules(ops_pkg.__path__):
        mod = importlib.import_module(f"softk._ops.{m.name}")
        if hasattr(mod, "_library"):
            mod._library()
    funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    names = [n.partition("::")[2] for n in torch._C._dispatch_get_all_op_names() if n.startswith("softk::")]
    assert {"threshold", "threshold_backward", "fenchel_young_fused", "attention"} <= set(names)
    for name in names:
        overload = getattr(torch.ops.softk, name).default
        assert (overload in funcs) == (name not in sharding.NOT_ROWS), name


def test_rules_on_a_one_rank_mesh(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        checks(init_device_mesh("cpu", (1,)))
        # two mesh dimensions: each keeps the rule's choice for its own placement
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        x = torch.randn(4, 6, dtype=torch.float64)
        xd = distribute_tensor(x, init_device_mesh("cpu", (1, 1)), [Shard(0), Shard(1)])
        p = torch.ops.softk.threshold(xd, "sparsemax", 2.0, 1, 1.0, "torch")
        assert tuple(p.placements) == (Shard(0), Replicate())
        torch.testing.assert_close(p.full_tensor(), sparsemax_ref(x), **TOL)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_rules_on_two_ranks(tmp_path):
    run(2, _two_ranks, tmp_path)


def test_rules_wait_for_the_first_dtensor():
    """The library path does not import torch.distributed.tensor for the rules'
    sake; ops it registered earlier get them when a DTensor first reaches softk."""
    pytest.importorskip("torch.distributed.tensor")
    import sys

    from .. import safety_net

    code = """
import os, sys, torch
from softk._ops import op
op._library()
assert "torch.distributed.tensor" not in sys.modules, "the library path imported DTensor"
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
assert torch.ops.softk.threshold.default not in funcs
import softk
x = distribute_tensor(torch.randn(4, 6, dtype=torch.float64), init_device_mesh("cpu", (1,)), [Shard(-1)])
softk.sparsemax(x)
assert torch.ops.softk.threshold.default in funcs, "no rule after the first DTensor"
dist.destroy_process_group()
print("ok")
# checked: leave without the interpreter's teardown, where gloo's stray thread
# can abort a finished process (as tests/distributed/dist_harness.py does)
sys.stdout.flush()
os._exit(0)
"""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**__import__("os").environ, "PORT": str(port)}
    out = safety_net.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
