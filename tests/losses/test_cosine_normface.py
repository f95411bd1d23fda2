"""CosineClassifier / cosine_logits, NormFace's loss bound (verified numerically on
a regular simplex) and Feature Incay, against NumPy references."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from softk import losses
from softk.nn import CosineClassifier


def _regular_simplex(n):
    """n unit vectors in R^n with pairwise cosine -1/(n-1): centred basis vectors."""
    v = np.eye(n) - 1.0 / n
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_cosine_logits_match_numpy(rng):
    f, w = rng.normal(size=(5, 3)), rng.normal(size=(4, 3))
    ref = 7.5 * (f / np.linalg.norm(f, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    out = losses.cosine_logits(torch.tensor(f), torch.tensor(w), 7.5)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-14)


@pytest.mark.parametrize("n", [2, 3, 5, 10, 50])
@pytest.mark.parametrize("scale", [1.0, 4.0, 16.0])
def test_normface_bound_attained_on_regular_simplex(n, scale):
    """Features equal to their class vectors on a regular simplex reach the bound."""
    simplex = torch.tensor(_regular_simplex(n))
    head = CosineClassifier(n, n, scale=scale).double()
    with torch.no_grad():
        head.weight.copy_(simplex)
    ce = F.cross_entropy(head(simplex), torch.arange(n)).item()
    bound = losses.normface_loss_bound(scale, n)
    # written out independently: log(1 + (n-1) exp(-s n/(n-1)))
    assert bound == pytest.approx(math.log(1 + (n - 1) * math.exp(-scale * n / (n - 1))), rel=1e-14)
    assert ce == pytest.approx(bound, rel=1e-12)


@pytest.mark.parametrize("n", [3, 10])
def test_normface_bound_holds_for_random_heads(rng, n):
    """No choice of unit features and class vectors goes below the bound."""
    scale = 5.0
    bound = losses.normface_loss_bound(scale, n)
    for d in (n, 2 * n):
        for _ in range(20):
            w = torch.tensor(rng.normal(size=(n, d)))
            f = w + 0.3 * torch.tensor(rng.normal(size=(n, d)))  # features near their class vector
            ce = F.cross_entropy(losses.cosine_logits(f, w, scale), torch.arange(n)).item()
            assert ce >= bound * (1 - 1e-12)


def test_normface_min_scale_inverts_bound():
    for n in (2, 10, 1000):
        for eps in (1e-3, 0.1):
            s = losses.normface_min_scale(n, eps)
            assert losses.normface_loss_bound(s, n) == pytest.approx(eps, rel=1e-10)
            # the range of cosine logits is s n/(n-1): the CE margin bound in disguise
            assert s * n / (n - 1) == pytest.approx(losses.cross_entropy_margin(n, eps), rel=1e-12)


def test_cosine_classifier_scale_options(rng):
    head = CosineClassifier(6, 10)
    assert head.weight.shape == (10, 6) and head.scale == pytest.approx(losses.normface_min_scale(10, 0.01))
    assert "scale=6.118" in repr(head)
    learn = CosineClassifier(6, 10, scale=3.0, learn_scale=True)
    assert isinstance(learn.log_scale, torch.nn.Parameter)
    x = torch.randn(4, 6)
    out = learn(x)
    assert out.abs().max().item() <= 3.0 + 1e-6
    out.sum().backward()
    assert learn.log_scale.grad is not None and learn.weight.grad is not None
    # logits in [-s, s], and zero features give zero logits, not NaN
    fixed = CosineClassifier(6, 10, scale=2.0)
    assert torch.equal(fixed(torch.zeros(1, 6)), torch.zeros(1, 10))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cosine_logits_half(dtype, rng):
    f, w = torch.tensor(rng.normal(size=(3, 4)), dtype=dtype), torch.tensor(rng.normal(size=(5, 4)), dtype=dtype)
    out = losses.cosine_logits(f, w, 4.0)
    assert out.dtype == dtype
    assert torch.equal(out, losses.cosine_logits(f.float(), w.float(), 4.0).to(dtype))


def test_cosine_bad_arguments():
    with pytest.raises(ValueError, match="scale must be"):
        CosineClassifier(3, 4, scale=-1.0)
    with pytest.raises(ValueError, match="beyond float32"):  # was an inf scale, and inf logits
        CosineClassifier(3, 4, scale=1e308, learn_scale=True)
    with pytest.raises(ValueError, match="num_classes must be"):
        CosineClassifier(3, 0)
    with pytest.raises(ValueError, match="weight must have shape"):
        losses.cosine_logits(torch.zeros(2, 3), torch.zeros(4, 2), 1.0)
    with pytest.raises(ValueError, match="num_classes must be >= 2"):
        losses.normface_loss_bound(1.0, 1)
    with pytest.raises(ValueError, match="scale must be"):
        losses.normface_loss_bound(0.0, 3)


# ------------------------------------------------------------- Feature Incay
def test_feature_incay_matches_numpy_and_gradient(rng):
    fn = rng.normal(size=(6, 4))
    ref = 1.0 / (fn**2).sum(1)
    f = torch.tensor(fn, requires_grad=True)
    np.testing.assert_allclose(losses.feature_incay(f, reduction="none").detach().numpy(), ref, rtol=1e-15)
    out = losses.feature_incay(f)
    assert out.item() == pytest.approx(ref.mean(), rel=1e-15)
    out.backward()
    # d/df 1/|f|^2 = -2 f / |f|^4, averaged over the 6 rows
    np.testing.assert_allclose(f.grad.numpy(), -2 * fn / ((fn**2).sum(1, keepdims=True) ** 2) / 6, rtol=1e-13)
    np.testing.assert_allclose(losses.feature_incay(f.detach().T, dim=0, reduction="sum").item(), ref.sum(), rtol=1e-14)
    assert losses.feature_incay(torch.zeros(1, 3), reduction="none").item() == math.inf
    with pytest.raises(ValueError, match="reduction must be"):
        losses.feature_incay(f, reduction="avg")


@pytest.mark.parametrize("learn_scale", [False, True])
def test_cosine_classifier_repr_gives_no_warning(learn_scale):
    # a learnable scale was read with float() on a tensor that requires grad
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = repr(CosineClassifier(3, 3, learn_scale=learn_scale))
    assert f"learn_scale={learn_scale}" in text
