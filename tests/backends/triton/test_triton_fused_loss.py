"""The fused Fenchel–Young loss kernel (softk._backends.triton.loss_kernel) through the
interpreter: loss values and gradients against the NumPy float64 oracle
(tests/oracle_losses.py for L, tests/oracle.py for p) and against the unfused
path ("torch" backend), for every family it serves, class-index and dense
targets, the reductions and ignore_index, masked / fully masked / NaN rows,
ties, a dominant entry, offsets of 1e4, τ ≠ 1 and float32/bf16/fp16, and
shapes.  The autograd side, dispatch and compilation are in
test_triton_fused_loss_autograd.py."""

import numpy as np
import pytest
import torch

import softk
from softk.losses.fenchel_young import fenchel_young_loss
from softk.threshold.families import KERNEL_IDS, by_name, entmax_family
from ...oracle import maps as oracle, losses as oracle_losses
from ...losses.fused_loss_cases import dense_target  # the same target rows as the native kernel's tests

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
EPS32 = float(np.finfo(np.float32).eps)
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


def _case(rng, label, kind, dtype):
    """(x, target tensor, dense target as float64 rows, keep mask, k)."""
    xn = _rows(rng, dtype)
    k = 2 if kind == "dense" and FAMS[label][0].capped else 1
    if kind == "index":
        t = _index_target(rng)
        keep = t != -100
        return xn, torch.tensor(t), np.eye(N)[np.where(keep, t, 0)], keep, k
    y = dense_target(rng, xn, k)
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
@pytest.mark.slow
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
        # the unfused path ("torch" backend) within rounding
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


@pytest.mark.parametrize("bad", [7, -1, 100])
def test_a_class_index_out_of_range_is_refused_on_the_fused_route(rng, bad):
    # the fused route checks the class indices without building the index:
    # out of [0, n) and not ignore_index (−100 here) is softk's ValueError
    x = torch.tensor(rng.normal(size=(4, 7)), dtype=torch.float32)
    with softk.use_backend("triton"):
        assert torch.isfinite(fenchel_young_loss(x, torch.tensor([0, -100, 6, 2]), FAMS["sparsemax"][0]))
        with pytest.raises(ValueError, match=rf"target holds class index {bad}, outside \[0, 7\)"):
            fenchel_young_loss(x, torch.tensor([0, bad, 6, -100]), FAMS["sparsemax"][0])


@pytest.mark.parametrize("label, kind", [("entmax15", "dense"), ("exp", "index"), ("sigmoid", "dense"),
                                         ("sparse", "index")])
@pytest.mark.slow
def test_looped_variant_matches_oracle(rng, label, kind):
    """Rows wider than one block (the last pass's loop over blocks of 16,
    the same per-block code as on chip), launched directly."""
    from softk._backends.triton.loss import fenchel_young_fused_rows

    fam = FAMS[label][0]
    xn = _rows(rng, torch.float32, n=40)
    k = 2 if kind == "dense" and fam.capped else 1
    if kind == "index":
        t = _index_target(rng, n=40)
        keep = t != -100
        y, target = np.eye(40)[np.where(keep, t, 0)], torch.tensor(np.where(keep, t, -1))
    else:
        keep = np.ones(R, bool)
        y = dense_target(rng, xn, k)
        target = torch.tensor(y, dtype=torch.float32)
    sel = [0, 1, 2, 4, 7]  # plain, masked, fully masked, NaN, 1e4 away (fewer rows: interpreter time)
    xn, y, keep, target = xn[sel], y[sel], keep[sel], target[sel]
    loss, grad = fenchel_young_fused_rows(torch.tensor(xn, dtype=torch.float32), target, torch.ones(1),
                                          KERNEL_IDS[fam.name], k, 0.5, fam.alpha_value, onchip=False, block=16)
    ref_loss, ref_grad = _oracle_rows(label, xn, y, keep, k, 0.5)
    _assert_close(loss, ref_loss, torch.float32, atol=2e-5)
    _assert_close(grad, ref_grad, torch.float32, atol=4e-6)


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


@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0, 3.0])
def test_one_hot_at_the_target_is_exactly_zero(alpha):
    """The fused Triton loss of a sparse map whose p is e_t is 0 exactly, not
    the ulp its sum leaves (entmax15 gave 1.19e-7), with a zero gradient;
    through the public loss, and on the looped variant (blocks of 2 lanes)."""
    x = torch.tensor([[0.0, 20.0, 0.5, -3.0], [7.0, -13.0, -12.5, 1.0], [5.0, 0.0, -1.0, 0.3]])
    y = torch.tensor([1, 0, 0])
    fam = softk.families.entmax(alpha)
    with softk.use_backend("triton"):
        xg = x.clone().requires_grad_()
        loss = fenchel_young_loss(xg, y, fam, reduction="none")
        loss.sum().backward()
    assert loss.tolist() == [0.0, 0.0, 0.0]
    assert xg.grad.abs().max().item() == 0.0
    from softk._backends.triton.loss import fenchel_young_fused_rows
    fid = KERNEL_IDS[fam.name]
    looped, grad = fenchel_young_fused_rows(x, y, torch.ones(1), fid, 1, 1.0, fam.alpha_value, onchip=False, block=2)
    assert looped.tolist() == [0.0, 0.0, 0.0] and grad.abs().max().item() == 0.0
    x2 = torch.tensor([[0.0, 1.0 / (alpha - 1) - 0.25, 0.0, -3.0]])  # not one-hot: L > 0
    with softk.use_backend("triton"):
        assert fenchel_young_loss(x2, torch.tensor([1]), fam).item() > 0


@pytest.mark.parametrize("n", [128, 1024])
def test_entmax15_gradient_on_near_equal_rows(n):
    # every entry in the support, λ far above the search's first point: the
    # closed form's cancelling discriminant made Σp − 1 (Σ of the gradient
    # p − y) 1.8e-4 at 1024 entries; its rounding through Σp is under 1e-6
    rng = np.random.default_rng(n)
    x = torch.tensor(rng.normal(size=(4, n)) * 1e-3, dtype=torch.float32)
    target = torch.tensor([0, 3, n - 1, 5])
    _, grad = _run(x, target, "entmax15", 1, 1.0)
    p = grad.double().numpy()
    p[np.arange(4), target.numpy()] += 1.0
    np.testing.assert_allclose(p.sum(-1), np.ones(4), rtol=0, atol=16 * EPS32)
    np.testing.assert_allclose(p, _p("entmax15", x.double().numpy(), 1, 1.0), rtol=4e-6, atol=4 * EPS32)


def test_sparsemax_gradient_on_a_wide_support_far_below_the_max():
    # one entry at ½, 1023 near 0: every entry in the support, λ near −½ in
    # the frame of the max, where its rounding (half an ulp of ½) reached
    # each of the 1024 entries: Σp − 1 was 2e-5; λ is now c + t with t found
    # in the frame of c, and Σp is a few ulps of 1
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 1024)) * 1e-4
    x[0, 7] = 0.5
    x[1, 100] = 0.9
    x = torch.tensor(x, dtype=torch.float32)
    target = torch.tensor([3, 100])
    _, grad = _run(x, target, "sparsemax", 1, 1.0)
    p = grad.double().numpy()
    p[np.arange(2), target.numpy()] += 1.0
    np.testing.assert_allclose(p.sum(-1), np.ones(2), rtol=0, atol=16 * EPS32)
    # each entry: z = x − max rounds to an ulp of ½ in float32, p ≈ 5e-4
    np.testing.assert_allclose(p, _p("sparsemax", x.double().numpy(), 1, 1.0), rtol=0, atol=4 * EPS32)
