"""The fused Fenchel–Young loss kernel (softk.triton.loss_kernel) through the
interpreter: loss values and gradients against the NumPy float64 oracle
(tests/oracle_losses.py for L, tests/oracle.py for p) and against the unfused
route ("torch" backend), for every family it serves, class-index and dense
targets, the reductions and ignore_index, masked / fully masked / NaN rows,
ties, a dominant entry, offsets of 1e4, τ ≠ 1 and float32/bf16/fp16; that the
kernel runs (and nothing shaped like a half input is made in float32); double
backward, forward AD, torch.func and torch.compile; a compile for sm_90."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import softk
from softk.losses.fenchel_young import fenchel_young_loss
from softk.threshold.families import KERNEL_IDS, by_name, entmax_family
from softk.triton import loss_op  # noqa: F401  (registers softk::fenchel_young_fused)
from .. import oracle, oracle_losses

# label -> (family, oracle name, α)
FAMS = {
    "softmax": (by_name("softmax"), "softmax", None),
    "sparsemax": (by_name("sparsemax"), "sparsemax", None),
    "entmax15": (by_name("entmax15"), "entmax", 1.5),
    "entmax1.3": (entmax_family(1.3), "entmax", 1.3),
    "entmax2.5": (entmax_family(2.5), "entmax", 2.5),
    "exp": (by_name("exp"), "exp", None),
    "sigmoid": (by_name("sigmoid"), "sigmoid", None),
    "laplace": (by_name("laplace"), "laplace", None),
    "sparse": (by_name("sparse"), "sparse", None),
}
LABELS = sorted(FAMS)
R, N = 10, 13
IGNORED = 9  # the row whose class index is ignore_index


def _p(label, xn, k, tau):
    """The oracle's map p(x/τ) on rows (float64)."""
    _, name, alpha = FAMS[label]
    if name == "softmax":
        return oracle.softmax(xn, tau=tau)
    if name == "sparsemax":
        return oracle.sparsemax(xn, tau=tau)
    if name == "entmax":
        return oracle.entmax(xn, alpha, tau=tau)
    return oracle.soft_topk(xn, k, -1, tau, name)


def _rows(rng, dtype, n=N):
    """Adversarial rows, exactly representable in ``dtype`` (returned as float64)."""
    x = rng.normal(size=(R, n)) * 2
    x[1, ::3] = -np.inf  # masked entries (the index target of row 1 is one)
    x[2] = -np.inf  # fully masked
    x[3] = -np.inf
    x[3, 4] = 0.5  # a single finite entry
    x[4, 7] = np.nan  # a broken row
    x[5] = x[5] * 0.05
    x[5, 2] = 30.0  # one dominant entry
    x[6] = rng.integers(-1, 2, size=n) * 0.5  # ties
    x[7] = 1e4 + x[7]  # far from the origin
    x[8] = x[8] * 1e-3  # small scores (τ small relative to the spread)
    return torch.tensor(x).to(dtype).double().numpy()


def _index_target(rng, n=N):
    t = rng.integers(0, n, size=R)
    t[1], t[2], t[3] = 0, 0, 4  # masked class (+inf), fully masked (+inf), the one finite entry (0)
    t[IGNORED] = -100
    return t


def _dense_target(rng, xn, k):
    """Rows of the map's domain, zero on masked classes, except rows 2 (and 3
    for k > 1) which put mass on masked classes (+inf); row 6 a multi-hot."""
    masked = np.isneginf(xn)
    scores = np.where(masked, -np.inf, rng.normal(size=xn.shape) * 2)
    scores[2] = rng.normal(size=xn.shape[1])
    if k > 1:
        scores[3] = rng.normal(size=xn.shape[1])
    y = oracle.softmax(scores) if k == 1 else oracle.soft_topk(scores, k, -1, 1.0, "sigmoid")
    y[6] = 0.0
    y[6, np.flatnonzero(~masked[6])[:k]] = 1.0
    # Rows summing to k exactly in float32 (multiples of 2^-20, one entry
    # inside (0, 1) taking the remainder): L is then shift invariant, so an
    # oracle row far from the origin does not weigh the rounding of Σy by λ.
    y = np.round(y * 2.0**20) / 2.0**20
    j = np.argmax(y * (1 - y), axis=1)
    y[np.arange(len(y)), j] += k - y.sum(1)
    return y


def _case(rng, label, kind, dtype):
    """(x, target tensor, dense target as float64 rows, keep mask, k)."""
    xn = _rows(rng, dtype)
    k = 2 if kind == "dense" and FAMS[label][0].capped else 1
    if kind == "index":
        t = _index_target(rng)
        keep = t != -100
        return xn, torch.tensor(t), np.eye(N)[np.where(keep, t, 0)], keep, k
    y = _dense_target(rng, xn, k)
    return xn, torch.tensor(y, dtype=torch.float32), y, np.ones(R, bool), k


def _oracle_rows(label, xn, y, keep, k, tau):
    """Per-row L and the per-row gradient (p − y)/τ (0 on ignored rows)."""
    _, name, alpha = FAMS[label]
    loss = oracle_losses.fy_loss(name, xn, y, k, tau, alpha, keep=keep)
    grad = np.where(keep[:, None], (_p(label, xn, k, tau) - y) / tau, 0.0)
    return loss, grad


def _run(x, target, label, k, tau, reduction="none", weights=None, backend="triton"):
    xt = x.clone().requires_grad_()
    with softk.use_backend(backend):
        loss = fenchel_young_loss(xt, target, FAMS[label][0], k, reduction=reduction, tau=tau)
    (loss if weights is None else loss * weights).sum().backward()
    return loss.detach(), xt.grad


def _tol(dtype, roundings=1):
    """Relative tolerance: float32 arithmetic inside, and each rounding to a
    half dtype costs up to half its eps, except that Triton's interpreter
    truncates float32 -> bf16 (a whole eps; the GPU rounds to nearest, and
    fp16 is rounded to nearest in both).  A half gradient scaled by a per-row
    incoming gradient is rounded twice: once when the kernel writes
    (p − y)/τ, once in the backward's product."""
    half_eps = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-11}
    return 4e-6 if dtype == torch.float32 else roundings * half_eps[dtype]


def _assert_close(out, ref, dtype, atol, roundings=1):
    out = out.double().numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=_tol(dtype, roundings), atol=atol, equal_nan=True)


@pytest.mark.parametrize("kind", ["index", "dense"])
@pytest.mark.parametrize("label", LABELS)
def test_rows_match_oracle_and_the_unfused_route(rng, label, kind):
    # float32 for every family, and a half dtype taking turns (both for each target kind)
    i = LABELS.index(label) + (kind == "dense")
    for dtype in (torch.float32, (torch.bfloat16, torch.float16)[i % 2]):
        xn, target, y, keep, k = _case(rng, label, kind, dtype)
        x = torch.tensor(xn).to(dtype)
        w = torch.tensor(rng.uniform(0.5, 2.0, size=R), dtype=dtype)  # per-row incoming gradient
        tau = 0.5  # τ ≠ 1, exact in binary: x/τ is what the oracle sees, also at 1e4
        loss, grad = _run(x, target, label, k, tau, weights=w)
        assert loss.dtype == grad.dtype == dtype
        ref_loss, ref_grad = _oracle_rows(label, xn, y, keep, k, tau)
        _assert_close(loss, ref_loss, dtype, atol=2e-5)
        _assert_close(grad, ref_grad * w.double().numpy()[:, None], dtype, atol=4e-6, roundings=2)
        assert np.isposinf(loss[[1, 2] if kind == "index" else [2]].double().numpy()).all()
        assert torch.isnan(loss[4]) and torch.isnan(grad[4]).all()
        if kind == "index":
            assert loss[IGNORED] == 0 and (grad[IGNORED] == 0).all()
        # the unfused route ("torch" backend) within rounding
        u_loss, u_grad = _run(x, target, label, k, tau, weights=w, backend="torch")
        _assert_close(loss, u_loss.double().numpy(), dtype, atol=2e-5)
        _assert_close(grad, u_grad.double().numpy(), dtype, atol=4e-6, roundings=3)


@pytest.mark.parametrize("kind", ["index", "dense"])
@pytest.mark.parametrize("label", ["softmax", "laplace"])
def test_reductions_and_ignore_index_match_oracle(rng, label, kind):
    # finite rows only (the means are finite), τ = 0.3; ignore_index is a
    # valid class (2), so rows whose class is 2 are the ignored ones
    xn, target, y, keep, k = _case(rng, label, kind, torch.float32)
    sel = [0, 1, 5, 6, 8, IGNORED]
    xn, y = xn[sel], y[sel]
    x = torch.tensor(xn, dtype=torch.float32)
    if kind == "index":
        t = target.numpy()[sel]
        t[1], t[3], t[5] = 1, 2, 2  # row 1 on a finite class; rows 3 and 5 ignored
        target, keep = torch.tensor(t), t != 2
        y = np.eye(N)[t]
    else:
        target, keep = target[sel], np.ones(len(sel), bool)
    rows, grads = _oracle_rows(label, xn, y, keep, k, 0.3)
    for reduction, scale in (("mean", 1 / keep.sum()), ("sum", 1.0)):
        xt = x.clone().requires_grad_()
        with softk.use_backend("triton"):
            loss = fenchel_young_loss(xt, target, FAMS[label][0], k, ignore_index=2 if kind == "index" else -100,
                                      reduction=reduction, tau=0.3)
        loss.backward()
        assert loss.dim() == 0
        np.testing.assert_allclose(loss.item(), rows.sum() * scale, rtol=4e-6)
        np.testing.assert_allclose(xt.grad.double().numpy(), grads * scale, rtol=0, atol=4e-6)


def test_half_mean_gradient_is_rounded_once_and_all_ignored_mean_is_nan(rng):
    # the mean's 1/#kept is folded into the kernel's gradient: with the
    # usual incoming gradient 1 the half gradient is rounded once
    xn = _rows(rng, torch.float16)[[0, 5, 6, 8]]
    t = torch.tensor([3, 0, 7, 1])
    x = torch.tensor(xn, dtype=torch.float16, requires_grad=True)
    with softk.use_backend("triton"):
        loss = fenchel_young_loss(x, t, FAMS["sparsemax"][0], tau=0.5)
    loss.backward()
    _, ref = _oracle_rows("sparsemax", xn, np.eye(N)[t.numpy()], np.ones(4, bool), 1, 0.5)
    _assert_close(x.grad, ref / 4, torch.float16, atol=0.0)
    # every row ignored: the mean is 0/0 = NaN, as torch's; the gradient 0
    x.grad = None
    with softk.use_backend("triton"):
        loss = fenchel_young_loss(x, torch.full((4,), -100), FAMS["softmax"][0])
    loss.backward()
    assert torch.isnan(loss) and (x.grad == 0).all()


@pytest.mark.parametrize("label, kind", [("entmax15", "dense"), ("exp", "index"), ("sigmoid", "dense"),
                                         ("sparse", "index")])
def test_looped_variant_matches_oracle(rng, label, kind):
    """Rows wider than one block (the last pass's loop over blocks of 16,
    the same per-block code as on chip), launched directly."""
    from softk.triton.loss import fenchel_young_fused_rows

    fam = FAMS[label][0]
    xn = _rows(rng, torch.float32, n=40)
    k = 2 if kind == "dense" and fam.capped else 1
    if kind == "index":
        t = _index_target(rng, n=40)
        keep = t != -100
        y, target = np.eye(40)[np.where(keep, t, 0)], torch.tensor(np.where(keep, t, -1))
    else:
        keep = np.ones(R, bool)
        y = _dense_target(rng, xn, k)
        target = torch.tensor(y, dtype=torch.float32)
    sel = [0, 1, 2, 4, 7]  # plain, masked, fully masked, NaN, 1e4 away (fewer rows: interpreter time)
    xn, y, keep, target = xn[sel], y[sel], keep[sel], target[sel]
    loss, grad = fenchel_young_fused_rows(torch.tensor(xn, dtype=torch.float32), target, torch.ones(1),
                                          KERNEL_IDS[fam.name], k, 0.5, fam.alpha_value, onchip=False, block=16)
    ref_loss, ref_grad = _oracle_rows(label, xn, y, keep, k, 0.5)
    _assert_close(loss, ref_loss, torch.float32, atol=2e-5)
    _assert_close(grad, ref_grad, torch.float32, atol=4e-6)


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
    import softk.triton.loss as launcher
    from softk import dispatch

    calls = []
    run = launcher.fenchel_young_fused_rows

    def spy(x, target, scale, fam, *a, **kw):
        calls.append((fam, x.dtype, kw["want_grad"]))
        return run(x, target, scale, fam, *a, **kw)

    monkeypatch.setattr(launcher, "fenchel_young_fused_rows", spy)
    monkeypatch.setattr(dispatch.TritonBackend, "forward", None)  # the unfused route would fail
    xn = _rows(rng, torch.bfloat16, n=24)[[0, 1, 5, 6]]
    x = torch.tensor(xn, dtype=torch.bfloat16, requires_grad=True)
    t = torch.tensor([3, 2, 0, -100])
    with softk.use_backend("triton"), _Ops() as ops:
        loss = (softk.losses.sparsemax_loss(x, t, tau=0.5) + softk.losses.entmax_loss(x, t, alpha=1.7)
                + fenchel_young_loss(x, t, FAMS["sigmoid"][0]))
        saved = [t for node in _fused_nodes(loss.grad_fn) for t in node.saved_tensors]
        loss.backward()
    assert calls == [(1, torch.bfloat16, True), (3, torch.bfloat16, True), (5, torch.bfloat16, True)]
    assert [s.dtype for s in saved if s.dim() == 2] == [torch.bfloat16] * 6  # x and the gradient, 3 times
    big = [m for m in ops.made if m[2] >= x.numel()]
    assert big and all(dtype == torch.bfloat16 for _, dtype, _ in big), big
    # and x's size is allocated only by the kernel (its gradient) and the
    # backward's product (the gradient handed on), once per loss, and by
    # autograd's sum of the three
    allocs = sorted(op for op, _, _ in big if not op.startswith(("aten.permute", "aten.view", "aten.detach")))
    assert allocs == ["aten.add.Tensor"] * 2 + ["aten.mul.Tensor"] * 3 + ["softk.fenchel_young_fused.default"] * 3, allocs
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
def test_double_backward_matches_the_torch_route_in_float64(rng, label):
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
    """Forward AD through the fused route (tangent ⟨G, v⟩ from the saved
    gradient); torch.func transforms take the unfused route, same values."""
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
    import softk.triton.loss as launcher

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
import sys, warnings
warnings.simplefilter("ignore")
import importlib, pathlib, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from softk.triton.function import MAXIT, NEWTON_CAP, ONCHIP_MAX, _config
from softk.triton.loss_kernel import fenchel_young_fwd_kernel

def build(fn, sig, cs, warps):
    sig = dict(sig, **{c: "constexpr" for c in cs})
    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})

# a trivial kernel first: where even it fails there is no toolchain (ptxas) here
tmp = tempfile.mkdtemp()
pathlib.Path(tmp, "probe_copy_fl.py").write_text(
    "import triton\nimport triton.language as tl\n\n@triton.jit\ndef copy(X, Y):\n    tl.store(Y, tl.load(X))\n")
sys.path.insert(0, tmp)
try:
    build(importlib.import_module("probe_copy_fl").copy, {"X": "*fp32", "Y": "*fp32"}, {}, 1)
except Exception as e:
    print("SKIP", type(e).__name__, e)
    sys.exit(0)

# every family (α > 2 as well) on chip and looped, at the launcher's settings;
# the input dtypes and the kind of target take turns
dtypes = ("*fp32", "*bf16", "*fp16")
variants = [_config(ONCHIP_MAX, None, None), _config(ONCHIP_MAX + 1, None, None)]
built = 0
for fam in range(8):
    for i, (onchip, blk, warps) in enumerate(variants):
        for big in ((False, True) if fam == 3 else (False,)):
            ty = dtypes[(fam + i + big) % 3]
            dense = (fam + i) % 2 == 1
            sig = {"X": ty, "T": ty if dense else "*i64", "G": ty, "LOSS": "*fp32", "SCALE": "*fp32",
                   "n": "i32", "k": "fp32", "inv_tau": "fp32", "alpha": "fp32"}
            build(fenchel_young_fwd_kernel, sig, dict(FAM=fam, BLOCK=blk, ONCHIP=onchip, BIG=big, PROBE=fam >= 4 or big,
                  NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, DENSE=dense, WANT_GRAD=fam != 7 or i == 0), warps)
            built += 1
assert built == 18, built
print("OK")
"""


def test_fused_kernel_compiles_for_a_gpu():
    # The interpreter accepts code the compiler rejects: compile every family
    # on chip and looped for sm_90 (ptxas included), TRITON_INTERPRET unset.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    if r.stdout.startswith("SKIP"):
        pytest.skip("no Triton GPU toolchain here: " + r.stdout.strip())
    assert r.stdout.strip().endswith("OK")


def test_shapes_one_d_size_one_and_classes_on_dim_1(rng):
    """A 1-D input (one row, a 0-d target), rows of one class, and (N, C, d)
    input whose class dimension is not last (rows are gathered first)."""
    fam = FAMS["entmax15"][0]
    with softk.use_backend("triton"):
        xn = rng.normal(size=7).astype(np.float32).astype(np.float64)
        x = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
        loss = fenchel_young_loss(x, torch.tensor(3), fam, tau=0.5)
        loss.backward()
        rows, grad = _oracle_rows("entmax15", xn[None], np.eye(7)[[3]], np.ones(1, bool), 1, 0.5)
        np.testing.assert_allclose(loss.item(), rows[0], rtol=4e-6)
        np.testing.assert_allclose(x.grad.double().numpy(), grad[0], rtol=0, atol=4e-6)

        x1 = torch.tensor([[2.0], [-1.0]], requires_grad=True)  # one class: p = 1, L = 0
        loss = fenchel_young_loss(x1, torch.tensor([0, 0]), fam, reduction="none")
        loss.sum().backward()
        assert (loss == 0).all() and (x1.grad == 0).all()

        xn = rng.normal(size=(2, 5, 3)).astype(np.float32).astype(np.float64)
        t = np.array([[0, 4, 2], [1, 1, 3]])
        x3 = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
        loss = fenchel_young_loss(x3, torch.tensor(t), fam, reduction="none")
        (loss * torch.arange(6.0).view(2, 3)).sum().backward()
    rows, grad = _oracle_rows("entmax15", np.moveaxis(xn, 1, -1).reshape(6, 5), np.eye(5)[t.reshape(-1)],
                              np.ones(6, bool), 1, 1.0)
    assert loss.shape == (2, 3)
    np.testing.assert_allclose(loss.detach().double().numpy().reshape(-1), rows, rtol=4e-6, atol=1e-6)
    expect = np.moveaxis((grad * np.arange(6.0)[:, None]).reshape(2, 3, 5), -1, 1)
    np.testing.assert_allclose(x3.grad.double().numpy(), expect, rtol=0, atol=2e-5)
