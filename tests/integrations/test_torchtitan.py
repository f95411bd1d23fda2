"""softk.integrations.torchtitan: torchtitan's loss-object interface, on whole logits, DTensor logits and slices.

Sum reduction and division by global_valid_tokens, against the single-process
softk loss; 2 gloo ranks for the tensor-parallel forms (without torchtitan).
"""

from __future__ import annotations

import pytest
import torch

from softk import losses as L
from softk.integrations.torchtitan import IGNORE_INDEX, SoftkLoss

from ..distributed.dist_harness import run
from ..oracle.sparsemax_torch import sparsemax_loss_rows

D = torch.float64


def _data(v=11):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, v, dtype=D, generator=g) * 2
    t = torch.randint(0, v, (6,), generator=g)
    t[2] = IGNORE_INDEX
    return z, t


def test_whole_logits_sum_over_global_valid_tokens():
    z, t = _data()
    for loss, ref in (("cross_entropy", L.cross_entropy), ("sparsemax", L.sparsemax_loss), ("entmax15", L.entmax15_loss)):
        out, metrics = SoftkLoss(SoftkLoss.Config(loss=loss))(z, t, torch.tensor(5.0, dtype=D))
        assert metrics == {}
        torch.testing.assert_close(out, ref(z, t, reduction="sum") / 5)
    with pytest.raises(ValueError, match="global_vocab_size"):
        SoftkLoss(SoftkLoss.Config(global_vocab_size=12))(z, t)
    with pytest.raises(ValueError, match="loss must be one of"):
        SoftkLoss(SoftkLoss.Config(loss="sparsmax"))


def test_ts2_and_its_options():
    z, t = _data()
    for kw in ({}, {"suppression": 0.5, "adaptive": True}):
        got, _ = SoftkLoss(SoftkLoss.Config(loss="ts2", **kw))(z, t, torch.tensor(5.0, dtype=D))
        torch.testing.assert_close(got, L.ts2_loss(z, t, reduction="sum", **kw) / 5, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="suppression applies to loss='ts2' only"):
        SoftkLoss(SoftkLoss.Config(loss="sparsemax", suppression=0.5))


def test_entmax_without_alpha_is_refused_at_construction():
    """As fused_linear_loss refuses it: no α stands in for a forgotten one."""
    with pytest.raises(ValueError, match="loss='entmax' needs alpha"):
        L.fused_linear_loss(torch.zeros(2, 3, dtype=D), torch.zeros(4, 3, dtype=D), torch.zeros(2, dtype=torch.long),
                            "entmax")
    with pytest.raises(ValueError, match="loss='entmax' needs alpha"):
        SoftkLoss(SoftkLoss.Config(loss="entmax"))


def test_soft_topk_without_a_method_is_the_single_device_default():
    z, _ = _data()
    y = torch.zeros_like(z).scatter_(1, z.argsort(1)[:, :2], 1.0)
    got, _ = SoftkLoss(SoftkLoss.Config(loss="soft_topk", k=2))(z, y)
    torch.testing.assert_close(got, L.soft_topk_loss(z, y, 2, reduction="sum"), rtol=1e-12, atol=1e-12)


def _ranks(rank, world):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    z, t = _data()
    lo, hi = (0, 6) if rank == 0 else (6, 11)  # torchtitan's ceil-division shards, as DTensor's
    for loss, kw, ref in (("cross_entropy", {}, lambda x: L.cross_entropy(x, t, reduction="sum")),
                          ("entmax", {"alpha": 1.3}, lambda x: L.entmax_loss(x, t, 1.3, reduction="sum")),
                          ("topk_softmax_ce", {"k": 3}, lambda x: L.topk_softmax_cross_entropy(x, t, 3, reduction="sum"))):
        zf = z.clone().requires_grad_()
        want = ref(zf) / 4
        (gf,) = torch.autograd.grad(want, zf)
        cfg = SoftkLoss.Config(loss=loss, global_vocab_size=11, **kw)
        zd = distribute_tensor(z, mesh, [Shard(-1)]).requires_grad_()
        got, _ = SoftkLoss(cfg)(zd, t, torch.tensor(4.0, dtype=D))
        assert type(got) is torch.Tensor, type(got)
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-10)
        (gd,) = torch.autograd.grad(got, zd)
        torch.testing.assert_close(gd.full_tensor(), gf, rtol=1e-10, atol=1e-10)
        zl = z[:, lo:hi].clone().requires_grad_()
        got2, _ = SoftkLoss(cfg, group=dist.group.WORLD)(zl, t, torch.tensor(4.0, dtype=D))
        torch.testing.assert_close(got2, want.detach(), rtol=1e-10, atol=1e-10)
        (gl,) = torch.autograd.grad(got2, zl)
        torch.testing.assert_close(gl, gf[:, lo:hi], rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_dtensor_and_slices_on_two_ranks(tmp_path):
    run(2, _ranks, tmp_path)


# ------------------------------------------------- against torchtitan itself
def _titan():
    return pytest.importorskip("torchtitan.components.loss", reason="torchtitan is not installed (the torchtitan extra)")


def _data3(dtype=torch.float32, v=11):
    """(B, L, V) logits and (B, L) labels, as torchtitan's LM head and data loader make them."""
    g = torch.Generator().manual_seed(1)
    z = (torch.randn(2, 4, v, dtype=torch.float64, generator=g) * 2).to(dtype)
    t = torch.randint(0, v, (2, 4), generator=g)
    t[0, 1] = t[1, 3] = IGNORE_INDEX
    return z, t


def _value_and_grad(fn, z, *args):
    zr = z.clone().requires_grad_()
    out = fn(zr, *args)
    (g,) = torch.autograd.grad(out.full_tensor() if hasattr(out, "full_tensor") else out, zr)
    return out, g


def test_cross_entropy_as_torchtitan_on_whole_logits():
    """(B, L, V) logits, ignored labels, float32 and bfloat16 (torchtitan sums in float32)."""
    tt = _titan()
    # bfloat16: both sum in float32 and round the gradient to bfloat16 once; one ulp (2^-7) apart at most
    for dtype, tol, atol in ((torch.float32, 1e-6, 1e-6), (torch.bfloat16, 2 ** -7, 0.0)):
        z, t = _data3(dtype)
        n = torch.tensor(6.0)
        want, gw = _value_and_grad(lambda x: tt.CrossEntropyLoss(tt.CrossEntropyLoss.Config())(x, t, n)[0], z)
        got, g = _value_and_grad(lambda x: SoftkLoss(SoftkLoss.Config(loss="cross_entropy"))(x, t, n)[0], z)
        assert got.dtype == want.dtype == torch.float32 and g.dtype == gw.dtype == dtype
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(g, gw, rtol=tol, atol=atol)
        # and the bare function, with no global_valid_tokens
        torch.testing.assert_close(SoftkLoss()(z, t)[0], tt.cross_entropy_loss(z, t), rtol=1e-6, atol=1e-6)


def test_as_chunked_loss_wrappers_loss_fn():
    """ChunkedLossWrapper builds SoftkLoss from its Config and runs lm_head + loss chunk by chunk."""
    tt = _titan()
    if not hasattr(tt, "ChunkedLossWrapper"):
        pytest.skip("this torchtitan has no ChunkedLossWrapper")
    torch.manual_seed(0)
    head = torch.nn.Linear(5, 11, bias=False)
    _, t = _data3()
    hidden = torch.randn(2, 4, 5)
    results = []
    for inner in (tt.CrossEntropyLoss.Config(), SoftkLoss.Config(loss="cross_entropy")):
        wrapper = tt.ChunkedLossWrapper(tt.ChunkedLossWrapper.Config(num_chunks=2, loss_fn=inner))
        wrapper.set_lm_head(head)
        h = hidden.clone().requires_grad_()
        loss, metrics = wrapper(h, t, torch.tensor(6.0))
        loss.backward()
        results.append((wrapper.loss_fn, loss.detach(), h.grad, head.weight.grad.clone(), metrics))
        head.weight.grad = None
    (_, *want), (built, *got) = results
    assert isinstance(built, SoftkLoss)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def _titan_dtensor(mesh):
    """torchtitan's vocabulary-parallel cross-entropy (its "partial_dtensor" backend, mesh axis "tp")
    against the adapter on Shard(-1) logits, with plain and DTensor labels."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed import utils as tu

    z, t = _data3()
    before = tu.get_spmd_backend()
    tu.set_spmd_backend("partial_dtensor")
    try:
        for labels in (t, distribute_tensor(t, mesh, [Replicate()])):
            zd = distribute_tensor(z, mesh, [Shard(2)])
            want, gw = _value_and_grad(lambda x: cross_entropy_loss(x, labels), zd)
            got, g = _value_and_grad(lambda x: SoftkLoss(SoftkLoss.Config(global_vocab_size=11))(x, labels)[0], zd)
            assert type(got) is type(want), (type(got), type(want))
            if isinstance(want, DTensor):
                assert got.placements == want.placements
                got, want = got.full_tensor(), want.full_tensor()
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
            assert g.placements == gw.placements == (Shard(2),)
            torch.testing.assert_close(g.full_tensor(), gw.full_tensor(), rtol=1e-6, atol=1e-6)
    finally:
        tu.set_spmd_backend(before)


def test_cross_entropy_as_torchtitan_on_vocab_sharded_dtensor_one_rank(tmp_path):
    _titan()
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        _titan_dtensor(init_device_mesh("cpu", (1,), mesh_dim_names=("tp",)))
    finally:
        dist.destroy_process_group()


def _titan_ranks(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    _titan_dtensor(init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)))


@pytest.mark.slow
def test_cross_entropy_as_torchtitan_on_vocab_sharded_dtensor_two_ranks(tmp_path):
    _titan()
    run(2, _titan_ranks, tmp_path)


# ------------------------------------------------------------ torch.compile
def _sparsemax_loss_ref(z, y):
    """Fenchel–Young with Ω = ½‖p‖², summed over the rows whose label is not ignored (float64, sort and cumsum)."""
    keep = y != IGNORE_INDEX
    return torch.where(keep, sparsemax_loss_rows(z, torch.where(keep, y, 0)), 0.0).sum()


@pytest.mark.parametrize("loss, backend", [("cross_entropy", "inductor"), ("sparsemax", "aot_eager")])
def test_compiled_as_torchtitans_compile_config(loss, backend):
    """compile_config (torchtitan's fields enable, components, backend) compiles the loss of plain logits:
    value and gradient as the float64 references, through a graph the backend received."""
    from types import SimpleNamespace

    graphs = []

    def recording(gm, inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, inputs)

    z, t = _data3(torch.float64)
    n = torch.tensor(6.0, dtype=D)
    cc = SimpleNamespace(enable=True, components=["loss"], backend=recording)
    fn = SoftkLoss(SoftkLoss.Config(loss=loss), compile_config=cc)
    if loss == "cross_entropy":
        ref = lambda x: torch.nn.functional.cross_entropy(x.flatten(0, 1), t.flatten(), reduction="sum") / n
    else:
        ref = lambda x: _sparsemax_loss_ref(x.flatten(0, 1), t.flatten()) / n
    got, g = _value_and_grad(lambda x: fn(x, t, n)[0], z)
    want, gw = _value_and_grad(ref, z)
    assert graphs, "the loss did not run under torch.compile"
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, gw, rtol=1e-12, atol=1e-12)
    # not asked to: eager
    assert SoftkLoss(SoftkLoss.Config(loss=loss), compile_config=SimpleNamespace(enable=False, components=["loss"])
                     ).fn.__name__ == "_loss"


def test_built_with_torchtitans_compile_config():
    tt = _titan()
    from torchtitan.config import CompileConfig

    cc = CompileConfig(enable=True, components=["loss"], backend="aot_eager")
    z, t = _data3()
    n = torch.tensor(6.0)
    ours = SoftkLoss.Config(loss="cross_entropy").build(compile_config=cc)
    theirs = tt.CrossEntropyLoss.Config().build(compile_config=cc)
    assert ours._compiled is not None
    got, g = _value_and_grad(lambda x: ours(x, t, n)[0], z)
    want, gw = _value_and_grad(lambda x: theirs(x, t, n)[0], z)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g, gw, rtol=1e-6, atol=1e-6)


COMPILED_LOSSES = {"cross_entropy": {}, "sparsemax": {}, "entmax15": {}, "topk_softmax_ce": {"k": 3}}


def _compiled_ranks(rank, world):
    """compile_config on two ranks: class-sharded DTensor logits (a 1-D mesh, a (1, 2) mesh whose first
    dimension shards the rows, and a (2, 1) mesh whose rows are on the two ranks, so that the compiled
    loss's sum over them is a real reduction) and plain (B, L, V/tp) slices with group=, compiled
    against eager in float64, for each loss.  Dynamo starts afresh for each loss, and its input kinds
    share what they can of its compiled frames; each compiled call must run compiled graphs that hold
    the loss's collective."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from ..distributed.recording import Recording

    torch._dynamo.config.fail_on_recompile_limit_hit = True  # no quiet fall-back to eager
    # each input kind compiles for its own shapes, as after a reset: a second shape would otherwise
    # recompile the shared frames with dynamic shapes, a slower path that the test does not aim at
    torch._dynamo.config.automatic_dynamic_shapes = False
    mesh = init_device_mesh("cpu", (world,))
    mesh2 = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    mesh3 = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))  # the rows really on 2 ranks
    z, t = _data3(D)  # (2, 4, 11), two ignored labels
    lo, hi = (0, 6) if rank == 0 else (6, 11)  # DTensor's uneven shards of 11 classes
    n = torch.tensor(6.0, dtype=D)
    inputs = {
        "dtensor": (lambda: distribute_tensor(z, mesh, [Shard(-1)]).requires_grad_(), None),
        "dtensor 2-D mesh": (lambda: distribute_tensor(z, mesh2, [Shard(0), Shard(-1)]).requires_grad_(), None),
        "dtensor rows over the ranks": (lambda: distribute_tensor(z, mesh3, [Shard(0), Shard(-1)]).requires_grad_(),
                                        None),
        "slice": (lambda: z[..., lo:hi].clone().requires_grad_(), dist.group.WORLD),
    }
    for loss, kw in COMPILED_LOSSES.items():
        torch._dynamo.reset()
        rec = Recording("aot_eager")
        cfg = SoftkLoss.Config(loss=loss, global_vocab_size=11, **kw)
        cc = SimpleNamespace(enable=True, components=["loss"], backend=rec)
        want_op = "all_gather_into_tensor" if loss == "topk_softmax_ce" else "all_reduce"
        for kind, (make, group) in inputs.items():
            def value_and_grad(fn):
                x = make()
                out, _ = fn(x, t, n)
                assert type(out) is torch.Tensor, (kind, type(out))
                (g,) = torch.autograd.grad(out, x)
                return out.detach(), g.full_tensor() if hasattr(g, "full_tensor") else g

            want, gw = value_and_grad(SoftkLoss(cfg, group=group))
            runs = list(rec.runs)
            got, g = value_and_grad(SoftkLoss(cfg, group=group, compile_config=cc))
            ran = rec.ran_since(runs)
            assert want_op in ran, (loss, kind, "the compiled graphs that ran hold", ran)
            what = f"{loss} {kind} rank {rank}"
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"{what}: {m}")
            torch.testing.assert_close(g, gw, rtol=1e-12, atol=1e-12, msg=lambda m: f"{what} grad: {m}")


@pytest.mark.slow
def test_compiled_dtensor_and_slices_equal_eager_on_two_ranks(tmp_path):
    run(2, _compiled_ranks, tmp_path)
