"""The fused Fenchel–Young loss on Triton (softk._ops.fused_loss) beyond its values:
that the public losses reach the kernel and keep a half input half (no
float32 tensor of its size), double backward against the torch backend in
float64, forward AD and torch.func, torch.compile(fullgraph=True), and a
compile of the kernel for sm_90 (ptxas)."""

import numpy as np
import pytest
import torch

from . import gpu_build
from torch.utils._python_dispatch import TorchDispatchMode

import softk
from softk.losses.fenchel_young import fenchel_young_loss
from ...oracle import maps as oracle
from softk._ops import fused_loss as fused_op
from .test_triton_fused_loss import FAMS, _assert_close, _oracle_rows, _rows

fused_op._library()  # registers softk::fenchel_young_fused (done on first use otherwise)


class _Ops(TorchDispatchMode):
    """Records (op, dtype, numel) of every tensor made outside the fused op."""

    def __init__(self):
        super().__init__()
        self.made, self.inside = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        fused = func is torch.ops.softk.fenchel_young_fused.default
        self.inside += fused
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            self.inside -= fused
        if not self.inside:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.made.append((str(func), t.dtype, t.numel()))
        return out


def test_fused_kernel_runs_and_keeps_half_inputs_half(rng, monkeypatch):
    """The public losses reach the fused kernel (and not the map's), and no
    tensor of the input's size is made in float32 for a bf16 input, forward
    or backward: the saved gradient is bf16."""
    import softk._backends.triton.loss as launcher
    from softk._backends import kernels

    calls = []
    run = launcher.fenchel_young_fused_rows

    def spy(x, target, scale, fam, *a, **kw):
        calls.append((fam, x.dtype, kw["want_grad"]))
        return run(x, target, scale, fam, *a, **kw)

    monkeypatch.setattr(launcher, "fenchel_young_fused_rows", spy)
    monkeypatch.setattr(kernels.get("threshold", "triton").impl, "forward", None)  # the unfused path would fail
    xn = _rows(rng, torch.bfloat16, n=24)[[0, 1, 5, 6]]
    x = torch.tensor(xn, dtype=torch.bfloat16, requires_grad=True)
    t = torch.tensor([3, 2, 0, -100])
    with softk.use_backend("triton"), _Ops() as ops:
        loss = (softk.losses.sparsemax_loss(x, t, tau=0.5) + softk.losses.entmax_loss(x, t, alpha=1.7)
                + fenchel_young_loss(x, t, FAMS["sigmoid"][0]))
        saved = [t for node in _fused_nodes(loss.grad_fn) for t in node.saved_tensors]
        loss.backward()
    assert calls == [(1, torch.bfloat16, True), (3, torch.bfloat16, True), (5, torch.bfloat16, True)]
    assert [s.dtype for s in saved if s is not None and s.dim() == 2] == [torch.bfloat16] * 6  # x and the gradient, 3 times
    big = [m for m in ops.made if m[2] >= x.numel()]
    assert big and all(dtype == torch.bfloat16 for _, dtype, _ in big), big
    # and x's size is allocated only by the kernel (its gradient), once per
    # loss, and by autograd's sum of the three: with an incoming gradient of
    # 1 on a CPU tensor the backward hands the saved gradient on as it is
    # (on CUDA it multiplies, one more buffer per loss, to read no value)
    allocs = sorted(op for op, _, _ in big if not op.startswith(("aten.permute", "aten.view", "aten.detach")))
    assert allocs == ["aten.add.Tensor"] * 2 + ["softk.fenchel_young_fused.default"] * 3, allocs
    ref = sum(_oracle_rows(lab, xn, np.eye(24)[np.where(t.numpy() >= 0, t.numpy(), 0)], t.numpy() >= 0, 1, tau)[1] / 3
              for lab, tau in (("sparsemax", 0.5), ("sigmoid", 1.0)))
    ref = ref + _oracle_rows_alpha(xn, t.numpy(), 1.7) / 3
    _assert_close(x.grad, ref, torch.bfloat16, atol=1e-5, roundings=3)
    # a dense bf16 target: read in bf16 too (the target's validation, in
    # softk.losses.targets, sums its rows in float64: not counted here)
    y = torch.tensor(oracle.softmax(np.where(np.isneginf(xn), -np.inf, rng.normal(size=xn.shape)))).to(torch.bfloat16)
    x.grad = None
    with softk.use_backend("triton"), _Ops() as ops:
        softk.losses.entmax15_loss(x, y).backward()
    assert calls[-1] == (2, torch.bfloat16, True)
    assert not [m for m in ops.made if m[2] >= x.numel() and m[1] == torch.float32]
    # without a gradient to make, none is written
    with torch.no_grad(), softk.use_backend("triton"):
        softk.losses.sparsemax_loss(x, t)
    assert calls[-1] == (1, torch.bfloat16, False)


def _fused_nodes(fn, seen=None):
    seen = set() if seen is None else seen
    if fn is None or fn in seen:
        return []
    seen.add(fn)
    own = [fn] if "FusedFenchelYoung" in type(fn).__name__ else []
    return own + [m for nxt, _ in fn.next_functions for m in _fused_nodes(nxt, seen)]


def _oracle_rows_alpha(xn, t, alpha):
    keep = t >= 0
    y = np.eye(xn.shape[1])[np.where(keep, t, 0)]
    return np.where(keep[:, None], oracle.entmax(xn, alpha) - y, 0.0)


@pytest.mark.parametrize("label", ["softmax", "entmax15", "sigmoid"])
def test_double_backward_matches_the_torch_backend_in_float64(rng, label):
    """create_graph=True recomputes the gradient through the map's contract:
    the Hessian-vector product equals the "torch" backend's in float64 up
    to float32 rounding (Triton does not serve float64)."""
    xn = rng.normal(size=(3, 7)).astype(np.float32).astype(np.float64) * 2
    xn[1, 2] = -np.inf
    t = torch.tensor([2, 0, -100])
    v = rng.normal(size=(3, 7))
    out = {}
    for backend, dtype in (("triton", torch.float32), ("torch", torch.float64)):
        x = torch.tensor(xn, dtype=dtype, requires_grad=True)
        with softk.use_backend(backend):
            loss = fenchel_young_loss(x, t, FAMS[label][0], tau=0.7)
            (g,) = torch.autograd.grad(loss, x, create_graph=True)
            (hv,) = torch.autograd.grad((g * torch.tensor(v, dtype=dtype)).sum(), x)
        out[backend] = g.detach().double().numpy(), hv.double().numpy()
    np.testing.assert_allclose(out["triton"][0], out["torch"][0], rtol=0, atol=2e-7)
    # entries of H are O(1/τ²) and p is exact to ~1e-7 in float32
    np.testing.assert_allclose(out["triton"][1], out["torch"][1], rtol=0, atol=2e-6)
    assert np.abs(out["torch"][1]).max() > 0.05  # the check has something to check


def test_forward_ad_and_torch_func(rng):
    """Forward AD through the fused kernel (tangent ⟨G, v⟩ from the saved
    gradient); torch.func transforms take the unfused path, same values."""
    import torch.autograd.forward_ad as fwAD

    xn = rng.normal(size=(3, 6)).astype(np.float32).astype(np.float64)
    v = rng.normal(size=(3, 6))
    t = torch.tensor([1, 4, 0])
    x = torch.tensor(xn, dtype=torch.float32)
    fam = FAMS["sparsemax"][0]
    y = np.eye(6)[t.numpy()]
    ref_rows, ref_grad = _oracle_rows("sparsemax", xn, y, np.ones(3, bool), 1, 1.0)
    with softk.use_backend("triton"):
        with fwAD.dual_level():
            loss = fenchel_young_loss(fwAD.make_dual(x, torch.tensor(v, dtype=torch.float32)), t, fam,
                                      reduction="none")
            tangent = fwAD.unpack_dual(loss).tangent
        per_row = torch.func.vmap(lambda r, c: fenchel_young_loss(r, c, fam))(x, t)
        grad = torch.func.grad(lambda r: fenchel_young_loss(r, t, fam, reduction="sum"))(x)
    np.testing.assert_allclose(tangent.double().numpy(), (ref_grad * v).sum(1), rtol=0, atol=2e-6)
    np.testing.assert_allclose(per_row.double().numpy(), ref_rows, rtol=4e-6, atol=2e-6)
    np.testing.assert_allclose(grad.double().numpy(), ref_grad, rtol=0, atol=2e-6)


def test_compiled_loss_runs_the_fused_kernel(rng, monkeypatch):
    """torch.compile(fullgraph=True): the kernel launch stays inside the
    custom op softk::fenchel_young_fused, forward and backward."""
    import softk._backends.triton.loss as launcher

    calls = []
    run = launcher.fenchel_young_fused_rows
    monkeypatch.setattr(launcher, "fenchel_young_fused_rows", lambda *a, **kw: calls.append(1) or run(*a, **kw))
    torch._dynamo.reset()
    xn = rng.normal(size=(4, 9)).astype(np.float32).astype(np.float64)
    x = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
    t = torch.tensor([0, 3, 8, -100])
    with softk.use_backend("triton"):
        f = torch.compile(lambda a, b: softk.losses.entmax15_loss(a, b, tau=0.5) * 2, fullgraph=True)
        loss = f(x, t)
    loss.backward()
    assert calls
    keep = t.numpy() >= 0
    rows, grad = _oracle_rows("entmax15", xn, np.eye(9)[np.where(keep, t.numpy(), 0)], keep, 1, 0.5)
    np.testing.assert_allclose(loss.item(), 2 * rows.sum() / 3, rtol=4e-6)
    np.testing.assert_allclose(x.grad.double().numpy(), 2 * grad / 3, rtol=0, atol=4e-6)


_COMPILE = r"""
from softk._backends.triton.function import MAXIT, NEWTON_CAP, ONCHIP_MAX, _config
from softk._backends.triton.loss_kernel import fenchel_young_fwd_kernel

# every family (α > 2, with the anchor form, as well) on chip, looped and 8 rows per program (width
# 64), at the launcher's settings; the input dtypes and the kind of target take turns
dtypes = ("*fp32", "*bf16", "*fp16")
variants = [_config(ONCHIP_MAX, None, None), _config(ONCHIP_MAX + 1, None, None), _config(64, None, None)]
assert [v[3] for v in variants] == [1, 1, 8]
built = 0
for fam in range(8):
    for i, (onchip, blk, warps, rows) in enumerate(variants):
        for big in ((False, True) if fam == 3 else (False,)):
            ty = dtypes[(fam + i + big) % 3]
            dense = (fam + i) % 2 == 1
            sig = {"X": ty, "T": ty if dense else "*i64", "G": ty, "LOSS": "*fp32", "SCALE": "*fp32",
                   "R": "i32", "n": "i32", "k": "fp32", "inv_tau": "fp32", "am1": "fp32"}
            # α > 2 takes the anchor form (softk._backends.triton.anchor)
            # the lean search on chip for the maps that have it
            lean = onchip and fam in (1, 2, 3) and not big
            build(fenchel_young_fwd_kernel, sig, dict(FAM=fam, ROWS=rows, BLOCK=blk, ONCHIP=onchip, BIG=big, PROBE=fam >= 4 or big,
                  ANCHOR=big, NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, DENSE=dense, WANT_GRAD=fam != 7 or i == 0,
                  LEAN=lean), warps)
            built += 1
assert built == 27, built
print("OK")
"""


@pytest.mark.gpu_build
def test_fused_kernel_compiles_for_a_gpu():
    # The interpreter accepts code the compiler rejects: compile every family
    # on chip, looped and several rows per program for sm_90 (ptxas included), TRITON_INTERPRET unset.
    gpu_build.compile_for_gpu(_COMPILE)
