"""The fused Fenchel–Young loss on the CPU's compiled kernels
(softk._backends.native.loss through softk._ops.fused_loss): loss values and gradients
against the NumPy float64 oracle for every family the kernels serve × class
index / dense / multi-hot targets with one k per row × the reductions × the
float dtypes, with ignore_index, ties, −inf masks, fully masked rows, NaN and
+inf rows, scores far from the origin over τ from 1e-3 to 10, and outputs
prefilled with NaN; the gradient against the unfused native backend bit for
bit where the maths is the same.  Autograd, compile and routing are in
test_losses_fused_autograd.py."""

import numpy as np
import pytest
import torch

import softk
from softk._backends import kernels
from softk.losses.fenchel_young import fenchel_young_loss

from .fused_loss_cases import FAMS, IGNORED, LABELS, N, R, assert_close, atol, dense_target, index_target, native_only, oracle_rows, rows
from .fused_loss_cases import fused_calls, nan_outputs  # noqa: F401  (fixtures)

pytestmark = [native_only, pytest.mark.usefixtures("nan_outputs")]


def _case(rng, label, kind, dtype, offset=1e4):
    """(x as float64 rows, target tensor, dense target as float64 rows, keep mask, k)."""
    xn = rows(rng, dtype, offset=offset)
    k = 2 if kind == "dense" and FAMS[label][0].capped else 1
    if kind == "index":
        t = index_target(rng)
        keep = t != -100
        return xn, torch.tensor(t), np.eye(N)[np.where(keep, t, 0)], keep, k
    y = dense_target(rng, xn, k)
    return xn, torch.tensor(y).to(dtype), y, np.ones(R, bool), k


def _run(x, target, label, k, tau, reduction="none", weights=None, ignore_index=-100):
    xt = x.clone().requires_grad_()
    with softk.use_backend("native"):
        loss = fenchel_young_loss(xt, target, FAMS[label][0], k, ignore_index=ignore_index, reduction=reduction,
                                  tau=tau)
    (loss if weights is None else loss * weights).sum().backward()
    return loss.detach(), xt.grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["index", "dense"])
@pytest.mark.parametrize("label", LABELS)
def test_rows_match_oracle(rng, fused_calls, label, kind, dtype):
    """Per-row loss and gradient, with a per-row incoming gradient, τ = 0.5."""
    if dtype in (torch.bfloat16, torch.float16) and (LABELS.index(label) + (kind == "dense")) % 2:
        pytest.skip("one half dtype per family and target kind (they take turns)")
    xn, target, y, keep, k = _case(rng, label, kind, dtype)
    x = torch.tensor(xn).to(dtype)
    w = torch.tensor(rng.uniform(0.5, 2.0, size=R)).to(dtype)
    loss, grad = _run(x, target, label, k, 0.5, weights=w)
    assert fused_calls and fused_calls[-1][:3] == (FAMS[label][0].name, dtype if dtype == torch.float64 else
                                                    torch.float32, kind)
    assert loss.dtype == grad.dtype == dtype
    ref_loss, ref_grad = oracle_rows(label, xn, y, keep, k, 0.5)
    assert_close(loss, ref_loss, dtype, atol=atol(dtype, 5))
    assert_close(grad, ref_grad * w.double().numpy()[:, None], dtype, atol=atol(dtype))
    assert np.isposinf(loss[[1, 2] if kind == "index" else [2]].double().numpy()).all()
    assert torch.isnan(loss[[4, 10]]).all() and torch.isnan(grad[[4, 10]]).all()
    if kind == "index":
        assert loss[IGNORED] == 0 and (grad[IGNORED] == 0).all()


@pytest.mark.parametrize("n", [300, 1024])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("label", ["sparsemax", "entmax15", "entmax1.3"])
def test_wide_rows_match_oracle(rng, fused_calls, label, dtype, n):
    """Rows wider than the narrow kernels take: the row solve, its gather of
    the candidates and its write of p (entmax α writes whole blocks where its
    candidates are dense, as in the row of small scores), with a partial last
    block at n = 300, and the adversarial rows of the narrow case."""
    xn = rows(rng, dtype, n=n)
    t = index_target(rng, n)
    keep = t != -100
    loss, grad = _run(torch.tensor(xn).to(dtype), torch.tensor(t), label, 1, 0.5)
    assert fused_calls and fused_calls[-1][0] == FAMS[label][0].name
    ref_loss, ref_grad = oracle_rows(label, xn, np.eye(n)[np.where(keep, t, 0)], keep, 1, 0.5)
    assert_close(loss, ref_loss, dtype, atol=atol(dtype, 5))
    assert_close(grad, ref_grad, dtype, atol=atol(dtype))


@pytest.mark.parametrize("offset", [1e4, 1e5, 1e6])
@pytest.mark.parametrize("tau", [1e-3, 1.0, 10.0])
def test_far_from_the_origin(rng, offset, tau):
    """Scores 1e4..1e6 away from 0 (exact in float32) over τ from 1e-3 to 10:
    the kernel works with z − λ carried relative to the row, so the loss
    keeps the relative precision of the unshifted row's."""
    for label in LABELS:
        for dtype in (torch.float32, torch.float64):
            xn = rows(rng, dtype, offset=offset)[[0, 5, 6, 7]]
            xn[:3] = offset + np.round(xn[:3] * 16) / 16  # every row far away, exact in float32
            t = np.array([3, 2, 0, 5])
            x = torch.tensor(xn).to(dtype)
            assert (x.double().numpy() == xn).all()
            loss, grad = _run(x, torch.tensor(t), label, 1, tau)
            with np.errstate(over="ignore"):  # the oracle's bracket search overflows exp on the way
                ref_loss, ref_grad = oracle_rows(label, xn, np.eye(N)[t], np.ones(4, bool), 1, tau)
            # the oracle's own resolution far away: its λ is exact to (offset/τ)·2^-52
            slack = offset / tau * 2.0**-50
            assert_close(loss, ref_loss, dtype, atol=atol(dtype, 5) / tau + slack)
            assert_close(grad, ref_grad, dtype, atol=(atol(dtype) + slack) / tau)


@pytest.mark.parametrize("kind", ["index", "dense"])
@pytest.mark.parametrize("label", LABELS)
def test_reductions_and_ignore_index(rng, label, kind):
    """"mean" over the kept rows and "sum", ignore_index a valid class (2),
    values and gradients (the mean's 1/#kept is folded into the gradient)."""
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
    ref_rows, ref_grads = oracle_rows(label, xn, y, keep, k, 0.3)
    for reduction, scale in (("mean", 1 / keep.sum()), ("sum", 1.0)):
        loss, grad = _run(x, target, label, k, 0.3, reduction, ignore_index=2 if kind == "index" else -100)
        assert loss.dim() == 0
        np.testing.assert_allclose(loss.item(), ref_rows.sum() * scale, rtol=4e-6)
        np.testing.assert_allclose(grad.double().numpy(), ref_grads * scale, rtol=0, atol=4e-6)


def test_every_row_ignored_gives_nan_mean_and_zero_gradient():
    x = torch.randn(4, 6)
    loss, grad = _run(x, torch.full((4,), -100), "sparsemax", 1, 1.0, "mean")
    assert torch.isnan(loss) and (grad == 0).all()
    loss, grad = _run(x, torch.full((4,), -100), "softmax", 1, 1.0, "sum")
    assert loss == 0 and (grad == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_multi_hot_rows_with_one_k_per_row(rng, fused_calls, dtype):
    """soft_topk_loss with k = target.sum(1): one k per row goes to the kernel."""
    xn = rows(rng, dtype)[[0, 1, 5, 6, 7, 8]]
    y = np.zeros_like(xn)
    counts = [1, 3, 2, 4, 1, 5]
    for i, c in enumerate(counts):
        y[i, np.flatnonzero(np.isfinite(xn[i]))[:c]] = 1.0
    x = torch.tensor(xn).to(dtype)
    target = torch.tensor(y).to(dtype)
    k = target.sum(1, keepdim=True)
    for reduction in ("none", "mean"):
        xt = x.clone().requires_grad_()
        with softk.use_backend("native"):
            loss = softk.losses.soft_topk_loss(xt, target, k=k, tau=0.7, reduction=reduction)
        loss.sum().backward()
        assert fused_calls[-1] == ("exp", dtype, "dense", True)
        ref_loss, ref_grad = oracle_rows("exp", xn, y, np.ones(6, bool), np.array(counts), 0.7)
        scale = 1 / 6 if reduction == "mean" else 1.0
        ref = ref_loss if reduction == "none" else ref_loss.mean()
        assert_close(loss.detach(), ref, dtype, atol=atol(dtype, 5))
        assert_close(xt.grad, ref_grad * scale, dtype, atol=atol(dtype))
    # a k that is not an integer (or needs a gradient) stays on the unfused path
    n_calls = len(fused_calls)
    with softk.use_backend("native"):
        softk.losses.soft_topk_loss(x, target * 0.75, k=k * 0.75)
        softk.losses.soft_topk_loss(x, target, k=k.clone().requires_grad_())
    assert len(fused_calls) == n_calls


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("label", LABELS)
def test_gradient_is_the_unfused_native_gradient_bit_for_bit(rng, label, reduction, monkeypatch):
    """At τ = 1 the fused kernel's p is the forward's (the same solver, in
    the same order) and its gradient is the unfused path's (p − y)·g, bit
    for bit; the loss (Σ F(z − λ) there, ⟨z, p⟩ − Ω(p) on the unfused path)
    agrees to rounding."""
    kind = "dense" if label == "exp" else "index"
    xn, target, y, keep, k = _case(rng, label, kind, torch.float32)
    x = torch.tensor(xn, dtype=torch.float32)
    fused = _run(x, target, label, k, 1.0, reduction)
    monkeypatch.setattr(kernels.get("fenchel_young", "native"), "serves", lambda *a: "off")  # the unfused loss
    unfused = _run(x, target, label, k, 1.0, reduction)
    assert torch.equal(fused[1].isnan(), unfused[1].isnan())
    ok = ~fused[1].isnan()
    assert torch.equal(fused[1][ok], unfused[1][ok])
    torch.testing.assert_close(fused[0], unfused[0], rtol=2e-6, atol=2e-6, equal_nan=True)


def test_shapes_one_d_size_one_and_classes_on_dim_1(rng):
    fam = FAMS["entmax15"][0]
    with softk.use_backend("native"):
        xn = rng.normal(size=7)
        x = torch.tensor(xn, requires_grad=True)
        loss = fenchel_young_loss(x, torch.tensor(3), fam, tau=0.5)
        loss.backward()
        ref_rows, ref_grad = oracle_rows("entmax15", xn[None], np.eye(7)[[3]], np.ones(1, bool), 1, 0.5)
        np.testing.assert_allclose(loss.item(), ref_rows[0], rtol=1e-12)
        np.testing.assert_allclose(x.grad.numpy(), ref_grad[0], rtol=0, atol=1e-12)

        x1 = torch.tensor([[2.0], [-1.0]], requires_grad=True)  # one class: p = 1, L = 0
        loss = fenchel_young_loss(x1, torch.tensor([0, 0]), fam, reduction="none")
        loss.sum().backward()
        assert (loss == 0).all() and (x1.grad == 0).all()

        xn = rng.normal(size=(2, 5, 3))
        t = np.array([[0, 4, 2], [1, 1, 3]])
        x3 = torch.tensor(xn, requires_grad=True)
        loss = fenchel_young_loss(x3, torch.tensor(t), fam, reduction="none")
        (loss * torch.arange(6.0, dtype=torch.float64).view(2, 3)).sum().backward()
    ref_rows, ref_grad = oracle_rows("entmax15", np.moveaxis(xn, 1, -1).reshape(6, 5), np.eye(5)[t.reshape(-1)],
                                     np.ones(6, bool), 1, 1.0)
    assert loss.shape == (2, 3)
    np.testing.assert_allclose(loss.detach().numpy().reshape(-1), ref_rows, rtol=1e-12)
    expect = np.moveaxis((ref_grad * np.arange(6.0)[:, None]).reshape(2, 3, 5), -1, 1)
    np.testing.assert_allclose(x3.grad.numpy(), expect, rtol=0, atol=1e-12)


def test_bad_targets_raise_softk_messages_from_the_kernel(fused_calls):
    """The kernel checks the target values in its pass; the messages are the
    unfused path's (built by the Python checks, only when one fails)."""
    x = torch.randn(3, 4)
    cases = [
        (softk.losses.sparsemax_loss, (x, torch.tensor([0, 4, 1])), "outside \\[0, 4\\)"),
        (softk.losses.sparsemax_loss, (x, torch.tensor([0, -3, 1])), "class index -3"),
        (softk.losses.softmax_loss, (x, torch.tensor([[0.5, 0.5, 0, 0]] * 2 + [[0.5, 0.6, 0, 0]])), "row sums"),
        (softk.losses.softmax_loss, (x, torch.tensor([[1.5, -0.5, 0, 0]] * 3)), ">= 0 everywhere"),
        (softk.losses.softmax_loss, (x, torch.tensor([[float("nan"), 1, 0, 0]] * 3)), "finite"),
    ]
    multi = torch.tensor([[1.0, 1, 0, 0]] * 3)
    for fn, args, match in cases:
        for backend in ("native", "torch"):
            with softk.use_backend(backend), pytest.raises(ValueError, match=match):
                fn(*args)
    with softk.use_backend("native"), pytest.raises(ValueError, match="lie in \\[0, 1\\]"):
        softk.losses.soft_topk_loss(x, torch.tensor([[2.0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]]), k=2)
    with softk.use_backend("native"), pytest.raises(ValueError, match="k=3"):
        softk.losses.soft_topk_loss(x, multi, k=3)
    # a half input with a half target: checked in Python (the kernel reads float32 rows)
    for dtype in (torch.bfloat16, torch.float16):
        with softk.use_backend("native"), pytest.raises(ValueError, match="row sums"):
            softk.losses.softmax_loss(x.to(dtype), torch.tensor([[0.5, 0.6, 0, 0]] * 3).to(dtype))
    assert any(c[2] == "dense" for c in fused_calls) and any(c[2] == "index" for c in fused_calls)


@pytest.mark.parametrize("loss", ["softmax_loss", "sparsemax_loss", "entmax15_loss", "entmax_loss", "soft_topk_loss",
                                  "topk_softmax_cross_entropy", "cross_entropy"])
def test_empty_batch_and_empty_class_dim(loss):
    """An empty batch gives torch's empty reductions (a 0/0 mean is NaN) with
    a gradient; an empty class dimension is refused, naming it."""
    fn = getattr(softk.losses, loss)
    kw = {"k": 1} if loss in ("soft_topk_loss", "topk_softmax_cross_entropy") else {}
    for shape in ((0, 5), (2, 5, 0)):
        x = torch.randn(shape, requires_grad=True)
        t = torch.zeros(shape[:1] + shape[2:], dtype=torch.long) if loss != "soft_topk_loss" else torch.zeros(shape)
        with softk.use_backend("native"):
            for reduction, expect in (("mean", "nan"), ("sum", 0.0), ("none", None)):
                out = fn(x, t, reduction=reduction, **kw)
                if expect is None:
                    assert out.shape == t.shape[:1] + t.shape[2:] if loss == "soft_topk_loss" else out.shape == t.shape
                elif expect == "nan":
                    assert out.dim() == 0 and torch.isnan(out)
                else:
                    assert out.item() == 0
            fn(x, t, reduction="sum", **kw).backward()
        assert x.grad.shape == x.shape
    for shape in ((3, 0), (0,), (2, 0, 3)):
        x = torch.randn(shape)
        t = torch.zeros(shape[:1] + shape[2:] if len(shape) > 1 else (), dtype=torch.long)
        if loss == "soft_topk_loss":
            t = torch.zeros(shape)
        with softk.use_backend("native"), pytest.raises(ValueError, match="at least one class along dim"):
            fn(x, t, **kw)


@pytest.mark.parametrize("label", ["sparsemax", "softmax"])
def test_rows_split_between_threads_give_the_same_numbers(rng, label):
    """Enough elements for OpenMP threads: every row is computed on its own,
    so per-row losses and the gradient do not depend on the thread count;
    the reduced loss (double partial sums per thread) agrees to rounding."""
    x = torch.tensor(rng.normal(size=(300, 200)), dtype=torch.float32)
    t = torch.tensor(rng.integers(0, 200, size=300))
    threads = torch.get_num_threads()
    out = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out[n] = (_run(x, t, label, 1, 1.0), _run(x, t, label, 1, 1.0, "mean"))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out[1][0][0], out[2][0][0]) and torch.equal(out[1][0][1], out[2][0][1])
    assert torch.equal(out[1][1][1], out[2][1][1])
    torch.testing.assert_close(out[1][1][0], out[2][1][0], rtol=1e-7, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0, 3.0])
def test_one_hot_at_the_target_is_exactly_zero(dtype, alpha):
    """A sparse map whose p is e_t has L = Ω(e_t) − Ω(e_t) + ⟨e_t − e_t, z⟩ = 0
    exactly; the fused sum must not leave its cancellation's ulp.  Scores
    lead by 20, beyond any of these α's one-hot margin 1/(α − 1)."""
    x = torch.tensor([[0.0, 20.0, 0.5, -3.0], [7.0, -13.0, -12.5, 1.0]], dtype=dtype)
    y = torch.tensor([1, 0])
    fam = softk.families.entmax(alpha)
    with softk.use_backend("native"):
        xg = x.clone().requires_grad_()
        loss = fenchel_young_loss(xg, y, fam, reduction="none")
        loss.sum().backward()
    assert loss.tolist() == [0.0, 0.0]
    assert xg.grad.abs().max().item() == 0.0
    # one entry off the lead by less than the margin: not one-hot, L > 0
    x2 = torch.tensor([[0.0, 1.0 / (alpha - 1) - 0.25, 0.0, -3.0]], dtype=dtype)
    with softk.use_backend("native"):
        assert fenchel_young_loss(x2, torch.tensor([1]), fam).item() > 0
