"""softcap: the scaled scores capped to c·tanh(s/c) before the mask and the
map (Gemma 2), on every backend, against an explicit float64 computation."""

import pytest
import torch
from torch.autograd import gradcheck

import softk
from softk.attention import scaled_dot_product_attention as sdpa

from ..oracle import attention as ora

BACKENDS = ["torch", "native"]


def _leaves(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 6, 8, generator=g, dtype=dtype) * 2
    k = torch.randn(2, 2, 9, 8, generator=g, dtype=dtype) * 2
    v = torch.randn(2, 2, 9, 5, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "entmax"])
def test_softcap_is_the_capped_scores_map(backend, name):
    q, k, v = _leaves()
    c, scale = 0.8, 0.5
    mask = torch.rand(2, 4, 6, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    alpha = torch.tensor([1.3, 1.5, 1.7, 2.0], dtype=torch.float64) if name == "entmax" else None
    with softk.use_backend(backend):
        got = sdpa(q, k, v, mask, scale=scale, enable_gqa=True, map=name, alpha=alpha, softcap=c)
    # the NumPy oracle on the capped scores: q = the capped scores and k = the
    # identity make its q·kᵀ exactly those scores
    capped = c * torch.tanh((q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * scale / c)
    eye = torch.eye(9, dtype=torch.float64).expand(2, 4, 9, 9)
    ref, _ = ora.attention(capped.numpy(), eye.numpy(), v.repeat_interleave(2, 1).numpy(), mask.numpy(), False, 1.0,
                           name, None if alpha is None else alpha.numpy())
    ref = torch.from_numpy(ref)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_softcap_gradients(backend):
    q, k, v = (t[:1, :2, :4, :3].clone().requires_grad_(True) for t in _leaves(2))
    with softk.use_backend(backend):
        assert gradcheck(lambda q, k, v: sdpa(q, k, v, is_causal=True, map="entmax15", softcap=0.6), (q, k, v))


@pytest.mark.parametrize("softcap, err", [(0.0, ValueError), (-1.0, ValueError), (float("inf"), ValueError),
                                          ("1", TypeError), (True, TypeError)])
def test_bad_softcap_is_refused(softcap, err):
    q, k, v = _leaves()
    with pytest.raises(err, match="softcap must be"):
        sdpa(q, k, v, enable_gqa=True, softcap=softcap)
