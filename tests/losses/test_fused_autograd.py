"""The fused Fenchel–Young loss on the CPU (softk._ops.fused_loss with the
native kernels) beyond its values: the eager path reaches the kernel and
runs no elementwise torch pass over the scores; gradcheck/gradgradcheck in
float64; create_graph gives the map's Jacobian as the Hessian; forward-mode
AD; torch.func falls back to the unfused path; torch.compile(fullgraph=True)
runs the custom op; the library path agrees with the eager one bit for bit;
fused_linear_loss's chunks take the fused kernel; value checks off the CPU
never read values."""

import numpy as np
import pytest
import torch
from torch.autograd import forward_ad
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

import softk
import softk._ops.op
from softk.losses import targets as tg
from softk.losses.fenchel_young import fenchel_young_loss

from ..oracle import maps as oracle
from .fused_loss_cases import FAMS, LABELS, N, native_only, oracle_rows, p_oracle, rows
from .fused_loss_cases import fused_calls  # noqa: F401  (fixture)

pytestmark = native_only

# Ops that make, view or reshape a tensor without a pass over its values.
_NO_PASS = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::view",
            "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::permute", "aten::movedim",
            "aten::expand", "aten::detach", "aten::alias", "aten::unsqueeze", "aten::squeeze", "aten::t"}


@pytest.mark.parametrize("loss", ["sparsemax", "entmax15", "entmax1.3", "softmax", "exp_dense", "topk_ce"])
def test_eager_path_runs_the_kernel_and_no_elementwise_pass(loss, fused_calls):
    """Forward and backward of a mean loss: no torch op reads or writes a
    tensor of the scores' shape (the kernel writes the gradient, the
    backward hands it on; the old path ran a dozen passes)."""
    x = torch.randn(8, 24, requires_grad=True)
    t = torch.randint(0, 24, (8,))
    multi = torch.zeros(8, 24)
    multi[:, :3] = 1
    fn = {
        "topk_ce": lambda: softk.losses.topk_softmax_cross_entropy(x, t, 5),
        "exp_dense": lambda: softk.losses.soft_topk_loss(x, multi, 3),
    }.get(loss) or (lambda: fenchel_young_loss(x, t, FAMS[loss][0]))
    with softk.use_backend("native"):
        fn().backward()
        x.grad = None
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            fn().backward()
    big = {e.name for e in prof.events() if e.name.startswith("aten::") and [8, 24] in e.input_shapes}
    assert big <= _NO_PASS, big - _NO_PASS
    assert not any(e.name.startswith("softk::") for e in prof.events())  # no custom op on the eager path
    assert x.grad.shape == x.shape and torch.isfinite(x.grad).all()
    if loss != "topk_ce":
        assert fused_calls


@pytest.mark.parametrize("kind", ["index", "dense"])
@pytest.mark.parametrize("label", LABELS)
def test_gradcheck_and_gradgradcheck_float64(rng, label, kind):
    fam, _, _ = FAMS[label]
    x = torch.tensor(rng.normal(size=(3, 6)) * 2, requires_grad=True)
    k = 2 if kind == "dense" and fam.capped else 1
    if kind == "index":
        target, reductions = torch.tensor([1, 5, -100]), ("mean", "none")
    else:
        y = oracle.soft_topk(rng.normal(size=(3, 6)), k, -1, 1.0, "sigmoid") if k > 1 else oracle.softmax(
            rng.normal(size=(3, 6)))
        target, reductions = torch.tensor(y), ("sum", "none")
    with softk.use_backend("native"):
        for reduction in reductions:
            f = lambda a: fenchel_young_loss(a, target, fam, k, reduction=reduction, tau=0.7)  # noqa: E731
            assert torch.autograd.gradcheck(f, (x,))
            assert torch.autograd.gradgradcheck(f, (x,))


@pytest.mark.parametrize("label", LABELS)
def test_create_graph_gives_the_map_jacobian_as_hessian(rng, label):
    """∇L = (p(x/τ) − y)/τ, so the Hessian is ∂p/∂x / τ: the map's own
    Jacobian (through its contract) and the oracle's by central differences."""
    fam, _, _ = FAMS[label]
    tau = 0.7
    xn = rng.normal(size=6)
    xn[2] = xn[4] + 0.3  # something in the support
    x = torch.tensor(xn, requires_grad=True)
    t = torch.tensor(4)
    with softk.use_backend("native"):
        (g,) = torch.autograd.grad(fenchel_young_loss(x, t, fam, tau=tau), x, create_graph=True)
        hess = torch.stack([torch.autograd.grad(g[i], x, retain_graph=True)[0] for i in range(6)])
        jac = torch.autograd.functional.jacobian(
            lambda v: softk._ops.op.threshold_map(v, fam, 1, 0, tau), x.detach())
    np.testing.assert_allclose(g.detach().numpy(), p_oracle(label, xn[None], 1, tau)[0] / tau - np.eye(6)[4] / tau,
                               atol=1e-12)
    np.testing.assert_allclose(hess.numpy(), jac.numpy() / tau, rtol=0, atol=1e-12)
    num = oracle.numerical_jacobian(lambda r: p_oracle(label, r[None], 1, tau)[0], xn)
    np.testing.assert_allclose(hess.numpy(), num / tau, rtol=0, atol=2e-6)
    assert np.abs(num).max() > 0.05  # the check has something to check


def test_forward_ad_tangent_and_torch_func_fallback(rng, fused_calls):
    """Forward AD on the eager path: the tangent is ⟨(p − y)/τ, v⟩ per row
    from the saved gradient.  torch.func transforms take the unfused path
    (the kernel is not called) with the same values."""
    xn = rng.normal(size=(3, 6))
    v = rng.normal(size=(3, 6))
    t = torch.tensor([1, 4, 0])
    x = torch.tensor(xn)
    fam = FAMS["sparsemax"][0]
    ref_rows, ref_grad = oracle_rows("sparsemax", xn, np.eye(6)[t.numpy()], np.ones(3, bool), 1, 0.5)
    with softk.use_backend("native"):
        with forward_ad.dual_level():
            loss = fenchel_young_loss(forward_ad.make_dual(x, torch.tensor(v)), t, fam, reduction="none", tau=0.5)
            tangent = forward_ad.unpack_dual(loss).tangent
        assert len(fused_calls) == 1
        per_row = torch.func.vmap(lambda r, c: fenchel_young_loss(r, c, fam, tau=0.5))(x, t)
        grad = torch.func.grad(lambda r: fenchel_young_loss(r, t, fam, reduction="sum", tau=0.5))(x)
        jvp = torch.func.jvp(lambda r: fenchel_young_loss(r, t, fam, reduction="sum", tau=0.5), (x,),
                             (torch.tensor(v),))[1]
    assert len(fused_calls) == 1
    np.testing.assert_allclose(tangent.numpy(), (ref_grad * v).sum(1), rtol=0, atol=1e-12)
    np.testing.assert_allclose(per_row.numpy(), ref_rows, rtol=1e-12)
    np.testing.assert_allclose(grad.numpy(), ref_grad, rtol=0, atol=1e-12)
    np.testing.assert_allclose(jvp.numpy(), (ref_grad * v).sum(), rtol=1e-12)


class _Passthrough(TorchFunctionMode):
    """A mode that changes nothing but sends softk to the library path."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("label", LABELS)
def test_library_path_matches_the_eager_path_bit_for_bit(rng, label):
    """Under a mode the call takes the custom op softk::fenchel_young_fused
    (the same kernel): the same loss and gradient, bit for bit."""
    fam = FAMS[label][0]
    xn = rows(rng, torch.float64)
    t = torch.tensor(rng.integers(0, N, size=len(xn)))
    t[3] = -100
    out = []
    for mode in (None, _Passthrough()):
        x = torch.tensor(xn, requires_grad=True)
        with softk.use_backend("native"):
            if mode is None:
                loss = fenchel_young_loss(x, t, fam, tau=0.5)
            else:
                with mode:
                    loss = fenchel_young_loss(x, t, fam, tau=0.5)
        loss.backward()
        out.append((loss.detach(), x.grad))
    assert torch.equal(out[0][0], out[1][0]) or (out[0][0].isnan() & out[1][0].isnan())
    assert torch.equal(out[0][1].nan_to_num(7.0), out[1][1].nan_to_num(7.0))


def test_compiled_loss_runs_the_fused_kernel(rng, fused_calls):
    """torch.compile(fullgraph=True) on the CPU: the kernel call stays inside
    the custom op, forward and backward, with exact values."""
    torch._dynamo.reset()
    xn = rng.normal(size=(4, 9))
    x = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
    t = torch.tensor([0, 3, 8, -100])
    with softk.use_backend("native"):
        f = torch.compile(lambda a, b: softk.losses.entmax15_loss(a, b, tau=0.5) * 2, fullgraph=True,
                          backend="aot_eager")
        loss = f(x, t)
    loss.backward()
    assert fused_calls
    xn = x.detach().double().numpy()
    keep = t.numpy() >= 0
    ref_rows, ref_grad = oracle_rows("entmax15", xn, np.eye(9)[np.where(keep, t.numpy(), 0)], keep, 1, 0.5)
    np.testing.assert_allclose(loss.item(), 2 * ref_rows.sum() / 3, rtol=4e-6)
    np.testing.assert_allclose(x.grad.double().numpy(), 2 * ref_grad / 3, rtol=0, atol=4e-6)


@pytest.mark.parametrize("loss", ["sparsemax", "soft_topk", "cross_entropy"])
def test_fused_linear_loss_chunks_take_the_fused_kernel(rng, loss, fused_calls):
    """Each chunk's loss is the public loss on its logits, so it reaches the
    fused kernel; "cross_entropy" is the default and is torch's own, and
    "sparsemax" on the CPU forms its rows and live columns from the support
    (softk.losses._fy_live), with no call of the fused kernel."""
    x = torch.tensor(rng.normal(size=(10, 4)), requires_grad=True)
    w = torch.tensor(rng.normal(size=(7, 4)), requires_grad=True)
    if loss == "soft_topk":
        t = torch.zeros(10, 7, dtype=torch.float64)
        t[:, :2] = 1
        kw = {"k": 2}
    else:
        t, kw = torch.tensor(rng.integers(0, 7, size=10)), {}
    with softk.use_backend("native"):
        out = softk.losses.fused_linear_loss(x, w, t, **({"loss": loss} if loss != "cross_entropy" else {}),
                                             chunk_size=3, **kw)
        out.backward()
        chunks = len(fused_calls)
        ref = {"sparsemax": softk.losses.sparsemax_loss, "cross_entropy": torch.nn.functional.cross_entropy,
               "soft_topk": lambda z, y: softk.losses.soft_topk_loss(z, y, 2)}[loss]
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        ref(xr @ wr.T, t).backward()
    assert chunks == (4 if loss == "soft_topk" else 0)  # 10 rows in chunks of 3
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-12, atol=1e-12)


def test_value_checks_off_the_cpu_read_no_values(monkeypatch):
    """On a device tensor (meta here) the target checks are device-side
    assertions (softk._validate.require), never a host read: a convention
    documented in softk.losses.targets."""
    calls = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg="": calls.append(msg))
    x = torch.empty(4, 5, device="meta")
    tg.index_target(x, torch.zeros(4, dtype=torch.long, device="meta"), -100)
    tg.distribution_target(x, torch.empty(4, 5, device="meta"), 1, capped=False)
    tg.distribution_target(x, torch.empty(4, 5, device="meta"), 2, capped=True)
    assert len(calls) == 5  # one index check, then entries + row sums twice
    # cross_entropy: class weights asserted; class indices are torch's own kernel's to check
    softk.losses.cross_entropy(x, torch.zeros(4, dtype=torch.long, device="meta"), torch.ones(5, device="meta"))
    softk.losses.cross_entropy(x, torch.empty(4, 5, device="meta"))
    assert len(calls) == 8


def test_eager_losses_import_neither_dynamo_nor_triton():
    """A fresh process: the fused losses, Su's loss and fused_linear_loss on
    CPU tensors import neither torch._dynamo nor triton and register no op."""
    import subprocess
    import sys

    if not hasattr(softk._ops.op, "_PATHS"):
        pytest.skip("the maps' op layer here registers torch.library ops on first use (before the lean path)")
    code = (
        "import sys, torch, softk\n"
        "x = torch.randn(4, 10, requires_grad=True); t = torch.randint(0, 10, (4,))\n"
        "m = torch.zeros(4, 10); m[:, :2] = 1\n"
        "softk.losses.entmax_loss(x, t, alpha=1.3).backward()\n"
        "softk.losses.soft_topk_loss(x, m, k=m.sum(1, keepdim=True)).backward()\n"
        "softk.losses.topk_softmax_cross_entropy(x, t, 3).backward()\n"
        "(g,) = torch.autograd.grad(softk.losses.sparsemax_loss(x, t), x, create_graph=True); g.sum().backward()\n"
        "softk.losses.fused_linear_loss(torch.randn(4, 3), torch.randn(10, 3, requires_grad=True), t).backward()\n"
        "print('torch._dynamo' in sys.modules, 'triton' in sys.modules,\n"
        "      hasattr(torch.ops.softk, 'fenchel_young_fused'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**__import__("os").environ, "SOFTK_BACKEND": "native"})
    assert done.stdout.split() == ["False", "False", "False"], done.stdout + done.stderr
